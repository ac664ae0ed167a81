"""Which backends work here: each probed in a subprocess with a time limit; verdicts remembered.

A backend that crashes the interpreter, calls ``os.abort()``, hangs or leaks a
thread affects only its own subprocess (killed with its whole process group
at the time limit). Verdicts are cached per backend definition and
environment, so a second run is instant and any change probes again.
"""

from __future__ import annotations

import os
import sys
import time
from _thread import allocate_lock

from ._cache import enabled, verdicts_path
from ._definition import Frozen
from ._probe import MARK, level_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Sequence
    from typing import Any

    from ._definition import BackendDefinition
    from ._registry import Registry

#: Every status a verdict can have, best first (the order tables are sorted in).
STATUSES = (
    "ok",
    "unavailable",
    "import-error",
    "compile-error",
    "wrong-result",
    "backward-error",
    "crashed",
    "timeout",
)
#: Seconds a backend may take before it is killed.
DEFAULT_TIMEOUT = 300.0


class Verdict(Frozen):
    """What probing one backend found.

    ``status`` is one of :data:`STATUSES`; ``level`` the last level reached
    (1 requirements, 2 import, 3 forward, 4 backward, 5 bench); ``member`` the
    member a chain used; the ``*_seconds`` and ``speedup`` come with ``bench``;
    ``cached`` tells a remembered verdict (and takes no part in comparing two).
    """

    __slots__ = (  # noqa: RUF023 - the order of the fields, of repr() and of the JSON
        "name",
        "status",
        "level",
        "reason",
        "seconds",
        "member",
        "compile_seconds",
        "per_call_seconds",
        "eager_seconds",
        "speedup",
        "_cached",
    )

    name: str
    status: str
    level: int
    reason: str
    seconds: float
    member: str | None
    compile_seconds: float | None
    per_call_seconds: float | None
    eager_seconds: float | None
    speedup: float | None
    _cached: bool

    def __init__(
        self,
        name: str,
        status: str,
        level: int,
        reason: str = "",
        seconds: float = 0.0,
        member: str | None = None,
        compile_seconds: float | None = None,
        per_call_seconds: float | None = None,
        eager_seconds: float | None = None,
        speedup: float | None = None,
        cached: bool = False,
    ) -> None:
        super().__init__(
            name=name,
            status=status,
            level=level,
            reason=reason,
            seconds=seconds,
            member=member,
            compile_seconds=compile_seconds,
            per_call_seconds=per_call_seconds,
            eager_seconds=eager_seconds,
            speedup=speedup,
            _cached=cached,
        )

    #: What is remembered of a verdict, and read back: every field but ``cached``.
    FACTS = __slots__[:-1]

    @property
    def cached(self) -> bool:
        return self._cached

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def level_name(self) -> str:
        return level_name(self.level)

    def facts(self) -> dict[str, Any]:
        """Every field but ``cached``: what is remembered of a verdict."""
        return {fact: getattr(self, fact) for fact in self.FACTS}

    def as_json(self) -> dict[str, Any]:
        return {**self.facts(), "cached": self.cached, "level_name": self.level_name}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, cached: bool = False) -> Verdict:
        return cls(**{k: v for k, v in data.items() if k in cls.FACTS}, cached=cached)


class Probe:
    """How to probe: the same for every backend of one run."""

    __slots__ = ("bench", "device", "fresh", "jobs", "model", "timeout")

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        bench: bool = False,
        model: str | None = None,
        device: str = "cpu",
        jobs: int | None = None,
        fresh: bool = False,
    ) -> None:
        self.timeout = timeout
        self.bench = bench
        self.model = model
        self.device = device
        self.jobs = jobs
        self.fresh = fresh


# ----------------------------------------------------------------------------- running


def run(
    registry: Registry,
    names: Sequence[str] | None,
    probe: Probe,
    on_progress: Callable[[str, int, float], None] | None = None,
) -> list[Verdict]:
    """Probe ``names`` (default: every listed backend), in parallel where cores allow."""
    from concurrent.futures import ThreadPoolExecutor

    names = list(names) if names is not None else registry.list_backends()
    cache = VerdictCache(registry)
    results: dict[str, Verdict] = {}
    todo = []
    for name in names:
        cached = None if probe.fresh else cache.get(name, probe)
        if cached is not None:
            results[name] = cached
        else:
            todo.append(name)
    # Compiling takes a core: leave one free; timing wants the machine alone.
    cores = os.cpu_count() or 1
    jobs = probe.jobs or (1 if probe.bench else max(1, cores // 2))
    config = registry.probe_config()
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1))) as pool:
        futures = {name: pool.submit(_probe_one, name, config, probe, on_progress) for name in todo}
        for name, future in futures.items():
            results[name] = verdict = future.result()
            cache.put(name, probe, verdict)
    return sorted((results[n] for n in names), key=_rank)


def _rank(verdict: Verdict) -> tuple[int, float, str]:
    speed = -(verdict.speedup or 0.0)
    return STATUSES.index(verdict.status), speed, verdict.name


def _probe_one(
    name: str,
    config: dict[str, Any],
    probe: Probe,
    on_progress: Callable[[str, int, float], None] | None,
) -> Verdict:
    # Here, not at the top: a listing that shows a remembered verdict imports this
    # module, and needs none of what probing does.
    import json
    import subprocess
    import tempfile
    import threading

    request = {
        **config,
        "name": name,
        "bench": probe.bench,
        "model": probe.model,
        "device": probe.device,
    }
    started = time.perf_counter()
    level = [0]
    final: list[dict[str, Any]] = []
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "torch_backend_registry._probe", json.dumps(request)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=config.get("cwd"),
            env=config.get("env"),
            text=True,
            # Its own process group: a hang is killed with whatever it started.
            start_new_session=True,
        )

        def read() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                if not line.startswith(MARK):
                    continue
                message = json.loads(line[len(MARK) :])
                if "level" in message:
                    level[0] = message["level"]
                    if on_progress is not None:
                        on_progress(name, level[0], time.perf_counter() - started)
                elif "verdict" in message:
                    final.append(message["verdict"])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            child.wait(timeout=probe.timeout)
        except subprocess.TimeoutExpired:
            _kill(child)
            reader.join(5)
            assert child.stdout is not None
            child.stdout.close()
            return Verdict(
                name,
                "timeout",
                level[0],
                f"no verdict after {probe.timeout:g} s at level {level[0]}"
                f" ({level_name(level[0])}); killed",
                round(time.perf_counter() - started, 3),
            )
        reader.join(5)
        _kill(child)  # threads or processes it left behind
        assert child.stdout is not None
        child.stdout.close()
        seconds = round(time.perf_counter() - started, 3)
        if final:
            data = final[-1]
            if data.get("status") == "crashed" and not data.get("level"):
                data = {**data, "level": level[0]}
            return Verdict.from_json({**data, "name": name})
        stderr.seek(0)
        tail = stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:]
        return Verdict(name, "crashed", level[0], _crash_reason(child.returncode, tail), seconds)


def _crash_reason(code: int | None, tail: list[str]) -> str:
    import signal

    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exited with status {code} without a verdict"
    return what + (f"; last words: {tail[0][:200]}" if tail else "")


def _kill(child: subprocess.Popen[str]) -> None:
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


# ----------------------------------------------------------------------------- the cache


class VerdictCache:
    """Verdicts by backend definition and environment, in the user's cache folder.

    The key holds what makes a verdict stale: the definition (target or chain,
    options, requires, where it came from), the manifest's content, the
    distribution's version, PyTorch's and Python's versions, the platform, the
    device and the model. A cache that is corrupt, from another version, not
    writable or untrusted (the trust rule) is ignored; ``TORCH_BACKENDS_NO_CACHE``
    turns it off.
    """

    VERSION = 1

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.path = verdicts_path()
        self.enabled = enabled()
        self._data: dict[str, Any] | None = None
        self._lock = allocate_lock()

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            from ._cache import read_entry

            loaded = read_entry(self.path) if self.enabled else None
            if not isinstance(loaded, dict):
                loaded = None
            verdicts = loaded.get("verdicts") if loaded is not None else None
            ok = loaded is not None and loaded.get("version") == self.VERSION
            self._data = verdicts if ok and isinstance(verdicts, dict) else {}
        return self._data

    def key(self, name: str, probe: Probe) -> str | None:
        try:
            definition = self.registry.backend_info(name)
        except Exception:
            return None
        return environment_key(definition, probe)

    def get(self, name: str, probe: Probe) -> Verdict | None:
        key = self.key(name, probe)
        found = self._load().get(key) if key else None
        if not isinstance(found, dict):
            return None
        try:
            verdict = Verdict.from_json(found, cached=True)
        except TypeError:
            return None
        if probe.bench and verdict.ok and verdict.speedup is None:
            return None  # a verdict without timings does not answer --bench
        return verdict

    def put(self, name: str, probe: Probe, verdict: Verdict) -> None:
        key = self.key(name, probe)
        if not self.enabled or key is None:
            return
        with self._lock:
            data = self._load()
            data[key] = verdict.facts()
            self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        from ._cache import write_entry

        write_entry(self.path, {"version": self.VERSION, "verdicts": data})


def environment_key(definition: BackendDefinition, probe: Probe) -> str:
    """A content key for a verdict: the definition, its manifest's bytes, the environment.

    The facts themselves, written out, rather than a digest of them: nothing to
    import for hashing where a listing shows a remembered verdict.
    """
    import binascii

    from ._torch import torch_version

    manifest = b""
    if definition.source.path is not None:
        try:
            with open(definition.source.path, "rb") as handle:
                manifest = handle.read(2**21)
        except OSError:
            pass
    uname = getattr(os, "uname", None)
    if uname is not None:
        machine = uname().machine  # what platform.machine() gives, without importing platform
    else:  # pragma: no cover - Windows
        import platform

        machine = platform.machine()
    facts = {
        "name": definition.name,
        "target": definition.target,
        "chain": definition.chain,
        "options": repr(sorted(definition.options.items(), key=repr)),
        "requires": definition.requires,
        "source": [definition.source.kind, definition.source.distribution],
        "version": definition.source.version,
        "manifest": [len(manifest), binascii.crc32(manifest)],
        "torch": torch_version(),
        "python": sys.version,
        "platform": [sys.platform, machine],
        "device": probe.device,
        "model": probe.model,
    }
    return repr(sorted(facts.items()))


def last_verdict(registry: Registry, name: str) -> Verdict | None:
    """The remembered verdict of ``name`` for this environment (CPU, built-in model)."""
    return VerdictCache(registry).get(name, Probe())


def known_failure(registry: Registry, name: str) -> Verdict | None:
    """The remembered verdict of ``name`` here when it is a failure; ``None`` otherwise."""
    verdict = last_verdict(registry, name)
    return verdict if verdict is not None and verdict.status not in ("ok", "unavailable") else None
