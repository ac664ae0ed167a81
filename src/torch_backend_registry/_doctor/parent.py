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
import re
import sys
import time

from .._errors import BackendRegistryError
from .verdicts import STATUSES, Verdict, Verdicts, level_name, subject

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Sequence
    from typing import Any

    from .._definition import BackendDefinition
    from .._registry import Registry

    Progress = Callable[[str, int, float, bool], None]

#: Seconds a backend may take before it is killed.
DEFAULT_TIMEOUT = 300.0
#: How far a backend must get to be ``ok``: forward (inference backends) or backward.
LEVELS = ("forward", "backward")
#: The most of a backend's own output kept, for the reason of a crash.
TAIL = 64 * 1024
#: Seconds to wait, once a probe process ended, for its last report.
GRACE = 2.0
#: Seconds a probe may take to start (Python, PyTorch), before a backend's time begins.
STARTUP = 60.0


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
        if not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs must be 1 or more, got {jobs!r}")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
        self.timeout = float(timeout)
        self.bench = bench
        self.model = model
        self.device = device
        self.level = level
        self.jobs = jobs
        self.fresh = fresh

    def facts(self, model_file: object, path: list[str]) -> dict[str, Any]:
        """What a verdict found by this probe depends on, besides the backend: the model and
        its file, the device and what makes one visible, the level, the time limit, and the
        import path the probe runs with."""
        visible = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
        accelerator = self.device != "cpu"
        return {
            "model": self.model,
            "model-file": model_file,
            "device": self.device,
            # Which accelerator: nodes sharing a home folder may hold different ones.
            "device-name": device_name(self.device) if accelerator else None,
            "visible": {v: os.environ.get(v) for v in visible} if accelerator else None,
            "level": self.level,
            "timeout": self.timeout,
            "path": path,
        }


def device_name(device: str) -> str | None:
    """The name of the accelerator ``device`` names here (``NVIDIA A100-SXM4-80GB``), or
    ``None`` where there is none or it cannot tell."""
    try:
        import torch

        kind = torch.device(device).type
        module = getattr(torch, kind, None)
        if module is None or not module.is_available():
            return None
        name = module.get_device_name(torch.device(device))
    except Exception:
        return None
    return name if isinstance(name, str) else None


def run(
    registry: Registry,
    names: Sequence[str] | None,
    probe: Probe,
    on_progress: Progress | None = None,
) -> list[Verdict]:
    """Probe ``names`` (default: every listed backend), in parallel where cores allow.

    A name that resolves to nothing raises :class:`UnknownBackendError` at once, one
    registered at runtime here (no other process has it) :class:`BackendRegistryError`,
    a model or device that cannot be used :class:`ModelError`. A name and its alias are
    probed once. An interruption kills every probe running.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .._sources.pytorch import torch_available

    if not torch_available():
        raise BackendRegistryError("doctor needs PyTorch to compile with: pip install torch")
    names = list(dict.fromkeys(names if names is not None else registry.list_backends()))
    first: dict[str, str] = {}  # each name -> the first asked name of its backend
    for name in names:
        definition = registry.backend_info(name).definition  # unknown names fail here
        if definition.source.kind == "runtime":
            raise BackendRegistryError(
                f"backend {name!r} is registered at runtime in this process, which no probe"
                " shares: declare it in a manifest to probe it"
            )
        first[name] = next((n for n in first if first[n] == n and _same(registry, n, name)), name)
    model_path, model_file = _find_model(registry, probe.model)
    path = _import_path()
    config = {
        "cwd": registry.context.cwd,
        "environ": dict(registry.context.environ),
        "files": None if registry.context.files is None else list(registry.context.files),
        "sources": list(registry.sources),
        "path": path,
        "model_path": model_path,
        "bench": probe.bench,
        "model": probe.model,
        "device": probe.device,
        "level": probe.level,
    }
    facts = probe.facts(model_file, path)
    memory = Verdicts(registry.context.cache)
    subjects = {name: subject(registry, name) for name in names if first[name] == name}
    results: dict[str, Verdict] = {}
    for name, judged in subjects.items():
        cached = None if probe.fresh else memory.get(judged, facts)
        if cached is not None and not (probe.bench and cached.ok and cached.speedup is None):
            results[name] = cached
            if on_progress is not None:
                on_progress(name, cached.level, 0.0, True)
    todo = [name for name in subjects if name not in results]
    # Compiling takes a core: leave one free; timing wants the machine alone.
    jobs = probe.jobs or (1 if probe.bench else max(1, (os.cpu_count() or 1) // 2))
    found: list[Any] = []
    running = _Running()
    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1)))
    futures = {
        name: pool.submit(_probe_one, name, config, probe, running, on_progress) for name in todo
    }
    try:
        for name, future in futures.items():
            verdict, code, missing = future.result()
            results[name] = _asked(verdict, probe, registry.backend_info(name).definition)
            found.append((subjects[name], facts, results[name], code, missing))
    except BaseException:  # a bad model, an interruption: nothing more is started or left
        for future in futures.values():
            future.cancel()
        running.kill_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        memory.remember(found)
    verdicts = [_named(results[first[name]], name) for name in names]
    return sorted(verdicts, key=_rank)


def _same(registry: Registry, one: str, other: str) -> bool:
    """Whether two names resolve to one definition (a backend and its alias)."""
    return registry.backend_info(one).definition == registry.backend_info(other).definition


def _asked(verdict: Verdict, probe: Probe, definition: BackendDefinition) -> Verdict:
    """A verdict held to what was asked.

    A backend runs in the probe and could say more: levels and timings nobody asked
    for, a member of a backend that has none.
    """
    facts = verdict.facts()
    top = 5 if probe.bench else 4 if probe.level == "backward" else 3
    facts["level"] = min(facts["level"], top)
    if not probe.bench:
        for fact in ("compile_seconds", "per_call_seconds", "eager_seconds", "speedup", "spread"):
            facts[fact] = None
    if not definition.members:
        facts["member"] = None
    return Verdict.from_json(facts)


class _Running:
    """The probe processes running, so that an interruption can end them all."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.children: set[subprocess.Popen[bytes]] = set()

    def add(self, child: subprocess.Popen[bytes]) -> None:
        with self.lock:
            self.children.add(child)

    def discard(self, child: subprocess.Popen[bytes]) -> None:
        with self.lock:
            self.children.discard(child)

    def kill_all(self) -> None:
        with self.lock:
            children = list(self.children)
        for child in children:
            _kill(child)


def _named(verdict: Verdict, name: str) -> Verdict:
    return Verdict.from_json({**verdict.facts(), "name": name}, cached=verdict.cached)


def _rank(verdict: Verdict) -> tuple[int, float, str]:
    speed = -(verdict.speedup or 0.0)
    return STATUSES.index(verdict.status), speed, verdict.name


def _import_path() -> list[str]:
    """This process's import path, less the working folder ``python -m`` or ``-c`` put first:
    a probe imports what the registry would here, and nothing a folder it runs in offers."""
    path = list(sys.path)
    main = sys.modules.get("__main__")
    by_module = getattr(main, "__spec__", None) is not None  # python -m: path[0] is the cwd
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:
        here = None
    if path and (path[0] == "" or (by_module and os.path.realpath(path[0]) == here)):
        path = path[1:]
    return [entry for entry in path if entry]


def _find_model(registry: Registry, spec: str | None) -> tuple[list[str], object]:
    """Where the model's module is (a python-path folder, or ``[]`` for the import path)
    and its file's stamp; :class:`ModelError` where it is nowhere."""
    if spec is None:
        return [], None
    from .._sources.finding import find

    module, _, factory = spec.partition(":")
    if not module or not factory:
        raise ModelError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. my_models:make")
    folders = list(
        dict.fromkeys(
            folder
            for d in registry.definitions((), with_torch=False)
            if d.source.path is not None
            for folder in d.search_path
        )
    )
    # As the probe finds it: on its import path (this one's, less the working folder),
    # else in a folder a manifest's backends search (a model beside the manifest included).
    top = module.split(".")[0]
    on_path = sys.modules.get(top) is not None or _on_path(top, _import_path()) is not None
    path = [] if on_path else [f for f in folders if find(top, [f]) is not None][:1]
    found = find(module, path) if on_path or path else None
    origin = getattr(found, "origin", None)
    if found is None or not isinstance(origin, str):
        raise ModelError(
            f"--model {spec!r}: no module {module!r} on the import path or in a python-path folder"
        )
    if not os.path.isfile(origin):  # built into Python, frozen: it changes with Python
        return path, [origin]
    info = os.stat(origin)
    return path, [origin, info.st_size, info.st_mtime_ns]


def _on_path(module: str, path: list[str]) -> Any:
    """The spec of top-level ``module`` on ``path`` alone (no finder of this process's)."""
    import importlib.machinery

    try:
        return importlib.machinery.PathFinder.find_spec(module, path)
    except (ImportError, ValueError):
        return None


def _probe_one(
    name: str,
    config: dict[str, Any],
    probe: Probe,
    running: _Running,
    on_progress: Progress | None,
) -> tuple[Verdict, Any, list[str]]:
    """One probe: its verdict, the code it ran, the modules it found missing."""
    import json
    import subprocess

    from .probe import BOOT

    started = time.perf_counter()
    channel, their_end = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", BOOT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(their_end,),
        cwd=config.get("cwd"),
        # Its own process group: a hang is killed with whatever it started.
        start_new_session=True,
    )
    running.add(child)
    os.close(their_end)
    assert child.stdin is not None
    assert child.stdout is not None
    assert child.stderr is not None

    def progress(level: int, done: bool) -> None:
        if on_progress is not None:
            on_progress(name, level, time.perf_counter() - started, done)

    watch = _Watch(channel, child.stdout.fileno(), child.stderr.fileno(), progress)
    watch.start()
    try:
        child.stdin.write(json.dumps({**config, "name": name, "channel": their_end}).encode())
        child.stdin.write(b"\n")
        child.stdin.close()
    except OSError:
        pass  # it died before reading: its exit says why
    try:
        timed_out = not _wait(child, watch, probe.timeout, progress)
    finally:
        _kill(child)  # at the time limit, on an interruption, or what it left behind
        running.discard(child)
        watch.finish(GRACE)
        os.close(channel)
        child.stdout.close()
        child.stderr.close()
    progress(watch.level, True)
    seconds = round(time.perf_counter() - started, 3)
    if watch.model_error is not None:
        raise ModelError(watch.model_error)
    if timed_out:
        reason = f"no verdict after {probe.timeout:g} s at level {watch.level}"
        reason = f"{reason} ({level_name(watch.level)}); killed"
        return Verdict(name, "timeout", watch.level, reason, seconds), None, []
    report = watch.report
    if isinstance(report.get("verdict"), dict):
        data = {**report["verdict"], "name": name}
        missing = data.pop("missing", None)
        if data.get("status") == "crashed" and not data.get("level"):
            data["level"] = watch.level
        try:
            verdict = Verdict.from_json(data)
        except TypeError:
            pass
        else:
            code = report.get("code")
            verdict = _diagnosed(verdict, watch.errors)
            return verdict, code, [m for m in missing or [] if isinstance(m, str)]
    reason = _crash_reason(child.returncode, watch.tail)
    return Verdict(name, "crashed", watch.level, reason, seconds), None, []


def _wait(
    child: subprocess.Popen[bytes],
    watch: _Watch,
    timeout: float,
    progress: Callable[[int, bool], None],
) -> bool:
    """Wait for the probe to end, telling ``progress`` about it as time passes; ``False``
    at the time limit. The limit counts from the probe's first report, past starting
    Python and importing PyTorch (within a minute or the limit, whichever is longer): it
    is the backend's time, not the probe's."""
    import subprocess

    deadline = time.monotonic() + max(STARTUP, timeout)
    while True:
        if watch.level and deadline - time.monotonic() > timeout:
            deadline = time.monotonic() + timeout  # the backend's time starts now
        progress(watch.level, False)
        try:
            child.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
            return True
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return False


class _Watch:
    """Reads a probe's report pipe and its output, in a thread, until told to stop: a pipe
    that a process the backend started keeps open must not keep doctor waiting."""

    def __init__(
        self, channel: int, output: int, errors: int, progress: Callable[[int, bool], None]
    ) -> None:
        import threading

        self.channel, self.output, self.error_fd = channel, output, errors
        self.progress = progress
        self.level = 0
        #: The probe's last report: its verdict, the code it ran.
        self.report: dict[str, Any] = {}
        self.model_error: str | None = None
        #: The last of what it printed, and of what it printed to stderr alone.
        self.tail = bytearray()
        self.errors = bytearray()
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
        return bool(self.report) or self.model_error is not None

    def _run(self) -> None:
        import select

        open_fds = [self.channel, self.output, self.error_fd]
        while open_fds and not self._stop.is_set():
            ready, _, _ = select.select(open_fds, [], [], 0.05)
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    open_fds.remove(fd)
                elif fd in (self.output, self.error_fd):
                    self.tail += data
                    del self.tail[:-TAIL]  # a backend may print without end: keep its last words
                    if fd == self.error_fd:
                        self.errors += data
                        del self.errors[:-TAIL]
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
                self.report = message
            if isinstance(message.get("model_error"), str):
                self.model_error = message["model_error"]


#: A reason that sends its reader elsewhere for the cause ("JIT compilation failed. See
#: diagnostics."): the probe's last words on stderr are that elsewhere.
_ELSEWHERE = re.compile(
    r"\bsee (the )?(diagnostics|above|logs?|output|stderr|console|messages)\b"
    r"|for (more )?(details|information)\b|check the log",
    re.IGNORECASE,
)


def _diagnosed(verdict: Verdict, errors: bytes | bytearray) -> Verdict:
    """``verdict`` with what the probe last wrote to stderr, where that is the diagnosis: a
    reason that points elsewhere, or a failed import (a plugin that prints why, "needs
    PyTorch 2.8.*, but 2.13.0 is found", and then fails on something else)."""
    if verdict.ok or verdict.status in ("unavailable", "timeout"):
        return verdict
    if verdict.status != "import-error" and not _ELSEWHERE.search(verdict.reason):
        return verdict
    said = _last_words(errors, verdict.reason)
    if not said:
        return verdict
    return Verdict.from_json({**verdict.facts(), "reason": f"{verdict.reason}; it printed: {said}"})


def _last_words(errors: bytes | bytearray, known: str, lines: int = 3) -> str:
    """The last few lines written to stderr that say something new: not Python's warnings
    (a file:line: SomeWarning: header and its source line), not what ``known`` holds."""
    kept: list[str] = []
    warning = re.compile(r"^\S.*:\d+: \w*Warning: ")
    after_warning = False
    for line in errors.decode("utf-8", "replace").splitlines():
        text = line.strip()
        if warning.match(line):
            after_warning = True
            continue
        if after_warning and line[:1].isspace():  # the source line a warning quotes
            continue
        after_warning = False
        if text and text not in known:
            kept.append(text)
    said = " | ".join(kept[-lines:])
    return said if len(said) <= 300 else "…" + said[-299:]


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
