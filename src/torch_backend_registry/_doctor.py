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

from ._probe import MARK
from ._verdict import STATUSES, Verdict, level_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Sequence
    from typing import Any

    from ._registry import Registry

#: Seconds a backend may take before it is killed.
DEFAULT_TIMEOUT = 300.0


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

    def facts(self) -> dict[str, Any]:
        """What a verdict found by this probe depends on."""
        return {"model": self.model, "device": self.device, "timeout": self.timeout}


# ----------------------------------------------------------------------------- running


def run(
    registry: Registry,
    names: Sequence[str] | None,
    probe: Probe,
    on_progress: Callable[[str, int, float], None] | None = None,
) -> list[Verdict]:
    """Probe ``names`` (default: every listed backend), in parallel where cores allow."""
    from concurrent.futures import ThreadPoolExecutor

    from ._verdicts import Verdicts

    names = list(names) if names is not None else registry.list_backends()
    memory = Verdicts(registry.cache)
    facts = probe.facts()
    results: dict[str, Verdict] = {}
    subjects: dict[str, str | None] = {}
    todo = []
    for name in names:
        subject = subjects[name] = _subject(registry, name)
        cached = None if probe.fresh or subject is None else memory.get(subject, facts)
        if cached is not None and not (probe.bench and cached.ok and cached.speedup is None):
            results[name] = cached
        else:
            todo.append(name)
    # Compiling takes a core: leave one free; timing wants the machine alone.
    cores = os.cpu_count() or 1
    jobs = probe.jobs or (1 if probe.bench else max(1, cores // 2))
    config = {
        "cwd": registry.cwd,
        "environ": dict(registry.environ),
        "sources": list(registry.sources),
        "files": None,
    }
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1))) as pool:
        futures = {name: pool.submit(_probe_one, name, config, probe, on_progress) for name in todo}
        for name, future in futures.items():
            results[name] = verdict = future.result()
            known = subjects[name]
            if known is not None:
                memory.put(known, facts, verdict)
    return sorted((results[n] for n in names), key=_rank)


def _subject(registry: Registry, name: str) -> str | None:
    try:
        return registry.subject(name)
    except Exception:
        return None


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
            [sys.executable, "-m", "torch_backend_registry._probe"],
            stdin=subprocess.PIPE,
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
        assert child.stdin is not None
        try:
            child.stdin.write(json.dumps(request))
            child.stdin.close()
        except OSError:
            pass  # it died before reading: its exit says why
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
