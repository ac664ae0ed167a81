"""Which backends work here: each probed in a subprocess with a time limit; verdicts remembered.

A probe runs under ``python -I`` with the import path of this process (never
the working folder), its configuration on stdin, and reports on a pipe of its
own. A backend that crashes the interpreter, calls ``os.abort()``, hangs,
prints without end or leaves processes behind affects only its own probe:
``doctor`` waits for the probe process, never for its output, kills its whole
process group at the time limit, and keeps only the tail of what it printed.
A verdict is remembered by what it judges (``Registry.subject``: the identity
of what the name runs, its targets' files, this machine) and by how it was
found (model, device, level, time limit): any change probes again.
"""

from __future__ import annotations

import os
import sys
import time

from ._errors import BackendRegistryError
from ._verdict import STATUSES, Verdict, level_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Sequence
    from typing import Any

    from ._registry import Registry

    Progress = Callable[[str, int, float, bool], None]

#: Seconds a backend may take before it is killed.
DEFAULT_TIMEOUT = 300.0
#: How far a backend must get to be ``ok``: forward (inference backends) or backward.
LEVELS = ("forward", "backward")
#: The most of a backend's own output kept, for the reason of a crash.
TAIL = 64 * 1024
#: Seconds to wait, once a probe process ended, for its last report.
GRACE = 2.0


class ModelError(BackendRegistryError, ValueError):
    """The model given to doctor cannot be found or built (a usage error, not a verdict)."""


class Probe:
    """How to probe: the same for every backend of one run."""

    __slots__ = ("bench", "device", "fresh", "jobs", "level", "model", "timeout")

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        bench: bool = False,
        model: str | None = None,
        device: str = "cpu",
        level: str = "backward",
        jobs: int | None = None,
        fresh: bool = False,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
        self.timeout = float(timeout)
        self.bench = bench
        self.model = model
        self.device = device
        self.level = level
        self.jobs = jobs
        self.fresh = fresh

    def facts(self, model_file: object) -> dict[str, Any]:
        """What a verdict found by this probe depends on, besides the backend."""
        return {
            "model": self.model,
            "model-file": model_file,
            "device": self.device,
            "level": self.level,
            "timeout": self.timeout,
        }


def run(
    registry: Registry,
    names: Sequence[str] | None,
    probe: Probe,
    on_progress: Progress | None = None,
) -> list[Verdict]:
    """Probe ``names`` (default: every listed backend), in parallel where cores allow.

    A name that resolves to nothing raises :class:`UnknownBackendError` at once,
    a model that cannot be found or built :class:`ModelError`.
    """
    from concurrent.futures import ThreadPoolExecutor

    from ._pytorch import torch_available
    from ._verdicts import Verdicts

    if not torch_available():
        raise BackendRegistryError("doctor needs PyTorch to compile with: pip install torch")
    names = list(dict.fromkeys(names if names is not None else registry.list_backends()))
    for name in names:
        registry.backend_info(name)  # an unknown name fails here, with the closest names
    model_path, model_file = _find_model(registry, probe.model)
    facts = probe.facts(model_file)
    memory = Verdicts(registry.cache)
    results: dict[str, Verdict] = {}
    subjects = {name: registry.subject(name) for name in names}
    for name in names:
        cached = None if probe.fresh else memory.get(subjects[name], facts)
        if cached is not None and not (probe.bench and cached.ok and cached.speedup is None):
            results[name] = _named(cached, name)  # found under another name of the backend
    todo = [name for name in names if name not in results]
    # Compiling takes a core: leave one free; timing wants the machine alone.
    jobs = probe.jobs or (1 if probe.bench else max(1, (os.cpu_count() or 1) // 2))
    config = {
        "cwd": registry.cwd,
        "environ": dict(registry.environ),
        "sources": list(registry.sources),
        "path": _import_path(),
        "model_path": model_path,
        "bench": probe.bench,
        "model": probe.model,
        "device": probe.device,
        "level": probe.level,
    }
    found = []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1))) as pool:
        futures = {name: pool.submit(_probe_one, name, config, probe, on_progress) for name in todo}
        try:
            for name, future in futures.items():
                results[name] = verdict = future.result()
                found.append((subjects[name], facts, verdict))
        except ModelError:
            for future in futures.values():
                future.cancel()
            raise
    memory.remember(found)
    return sorted((results[n] for n in names), key=_rank)


def _named(verdict: Verdict, name: str) -> Verdict:
    return Verdict.from_json({**verdict.facts(), "name": name}, cached=verdict.cached)


def _rank(verdict: Verdict) -> tuple[int, float, str]:
    speed = -(verdict.speedup or 0.0)
    return STATUSES.index(verdict.status), speed, verdict.name


def _import_path() -> list[str]:
    """This process's import path, less the working folder ``python -m`` or ``-c`` put first:
    a probe imports what the registry would here, and nothing a folder it runs in offers."""
    path = list(sys.path)
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:
        here = None
    if path and (path[0] == "" or os.path.realpath(path[0]) == here):
        path = path[1:]
    return [entry for entry in path if entry]


def _find_model(registry: Registry, spec: str | None) -> tuple[list[str], object]:
    """Where the model's module is (a python-path folder, or ``[]`` for the import path)
    and its file's stamp; :class:`ModelError` where it is nowhere."""
    if spec is None:
        return [], None
    from ._finding import find

    module, _, factory = spec.partition(":")
    if not module or not factory:
        raise ModelError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. my_models:make")
    folders = list(
        dict.fromkeys(
            folder
            for d in registry.definitions((), with_torch=False)
            if d.source.path is not None
            for folder in d.python_path
        )
    )
    found = find(module)
    path: list[str] = []
    if found is None:
        top = module.split(".")[0]
        path = [f for f in folders if find(top, [f]) is not None][:1]
        found = find(module, path) if path else None
    origin = getattr(found, "origin", None)
    if found is None or not isinstance(origin, str):
        raise ModelError(
            f"--model {spec!r}: no module {module!r} on the import path or in a python-path folder"
        )
    info = os.stat(origin)
    return path, [origin, info.st_size, info.st_mtime_ns]


def _probe_one(
    name: str, config: dict[str, Any], probe: Probe, on_progress: Progress | None
) -> Verdict:
    import json
    import subprocess

    from ._probe import BOOT

    started = time.perf_counter()
    channel, their_end = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", BOOT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=(their_end,),
        cwd=config.get("cwd"),
        # Its own process group: a hang is killed with whatever it started.
        start_new_session=True,
    )
    os.close(their_end)
    assert child.stdin is not None
    assert child.stdout is not None

    def progress(level: int, done: bool) -> None:
        if on_progress is not None:
            on_progress(name, level, time.perf_counter() - started, done)

    watch = _Watch(channel, child.stdout.fileno(), progress)
    watch.start()
    try:
        child.stdin.write(json.dumps({**config, "name": name, "channel": their_end}).encode())
        child.stdin.write(b"\n")
        child.stdin.close()
    except OSError:
        pass  # it died before reading: its exit says why
    try:
        child.wait(timeout=probe.timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill(child)  # at the time limit, or what it left behind
    watch.finish(GRACE if not timed_out else 0.0)
    os.close(channel)
    child.stdout.close()
    progress(watch.level, True)
    seconds = round(time.perf_counter() - started, 3)
    if watch.model_error is not None:
        raise ModelError(watch.model_error)
    if timed_out:
        reason = f"no verdict after {probe.timeout:g} s at level {watch.level}"
        return Verdict(
            name, "timeout", watch.level, f"{reason} ({level_name(watch.level)}); killed", seconds
        )
    if watch.verdict is not None:
        data = {**watch.verdict, "name": name}
        if data.get("status") == "crashed" and not data.get("level"):
            data["level"] = watch.level
        try:
            return Verdict.from_json(data)
        except TypeError:
            pass
    return Verdict(
        name, "crashed", watch.level, _crash_reason(child.returncode, watch.tail), seconds
    )


class _Watch:
    """Reads a probe's report pipe and its output, in a thread, until told to stop: a pipe
    that a process the backend started keeps open must not keep doctor waiting."""

    def __init__(self, channel: int, output: int, progress: Callable[[int, bool], None]) -> None:
        import threading

        self.channel, self.output = channel, output
        self.progress = progress
        self.level = 0
        self.verdict: dict[str, Any] | None = None
        self.model_error: str | None = None
        self.tail = bytearray()
        self._pending = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the verdict, then stop reading."""
        deadline = time.monotonic() + grace
        while self._thread.is_alive() and time.monotonic() < deadline and not self._ended():
            time.sleep(0.02)
        self._stop.set()
        self._thread.join()

    def _ended(self) -> bool:
        return self.verdict is not None or self.model_error is not None

    def _run(self) -> None:
        import select

        open_fds = [self.channel, self.output]
        while open_fds and not self._stop.is_set():
            ready, _, _ = select.select(open_fds, [], [], 0.05)
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    open_fds.remove(fd)
                elif fd == self.output:
                    self.tail += data
                    del self.tail[:-TAIL]  # a backend may print without end: keep its last words
                else:
                    self._report(data)

    def _report(self, data: bytes) -> None:
        import json

        self._pending += data
        *lines, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest[-TAIL:])
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if isinstance(message.get("level"), int):
                self.level = message["level"]
                self.progress(self.level, False)
            if isinstance(message.get("verdict"), dict):
                self.verdict = message["verdict"]
            if isinstance(message.get("model_error"), str):
                self.model_error = message["model_error"]


def _crash_reason(code: int | None, tail: bytes | bytearray) -> str:
    import signal

    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exited with status {code} without a verdict"
    words = [line for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
    return what + (f"; last words: {words[-1].strip()[:200]}" if words else "")


def _kill(child: subprocess.Popen[bytes]) -> None:
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
