"""The probe processes, seen from doctor: forked by multiprocessing's forkserver, each watched.

The forkserver imports PyTorch once (:data:`PRELOAD`) and forks a fresh process for each
probe. It is one for the whole process and keeps the environment it started with; each
probe applies its run's import path, working folder and environment, leads a session of
its own, killed when it ends, and prints to a pipe whose tail is kept. What that means and
what it cannot do (a daemon that leaves the session): docs/explanation/performance.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import probe
from .options import ModelError
from .verdicts import FAILURES, LEVELS, Verdict

Progress = Callable[[str, int, float, bool], None]

#: What the forkserver imports once, for every probe: PyTorch, what its compiler imports
#: on a first compile whatever the backend, and what a probe runs of this package. No
#: backend's code. (A module missing here is left out, and a probe imports what it needs.)
PRELOAD = [
    "torch_backend_registry._doctor.server",
    "torch",
    "torch._dynamo",
    "torch._functorch.aot_autograd",
    "torch.distributed.tensor.experimental",
    "torch.export",
    "torch_backend_registry._doctor.model",
    "torch_backend_registry._doctor.probe",
    "torch_backend_registry._sources.schema",
]
#: The most of a probe's output kept, for the reason of a crash.
TAIL = 64 * 1024
#: Seconds to read what a probe said once it ended (a process it started may hold its
#: output open without end).
GRACE = 2.0
#: Seconds a probe may take to reach its first report (its registry read, the model built
#: and run eagerly) before the backend's time begins.
STARTUP = 60.0
#: How the forkserver and its resource tracker are started: with this process's import path
#: (less the working folder) and none else, so that it imports this package and PyTorch
#: from where this process does; without this package's autoload (a probe installs its
#: run's registry itself); and without the tracker's warning of the semaphores a killed
#: probe left (a compiler's worker pool's): it removes them, and that is all there is to it.
_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"
_CONTEXT = multiprocessing.get_context("forkserver")
_STARTING = threading.Lock()


def start_server() -> None:
    """Start the forkserver, where it is not running: it imports PyTorch from now on."""
    _CONTEXT.set_forkserver_preload(PRELOAD)
    server = {
        "PYTHONPATH": os.pathsep.join(import_path()),
        "PYTHONSAFEPATH": "1",
        "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), _QUIET])),
        "TORCH_BACKENDS_AUTOLOAD": "0",
    }
    with _STARTING:  # the variables are the process's: set for the moment it starts
        saved = {key: os.environ[key] for key in server if key in os.environ}
        os.environ.update(server)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for key in server:
                os.environ.pop(key, None)
            os.environ.update(saved)


def run_probe(config: dict[str, Any], progress: Progress, stop: Any, name: str) -> Verdict:
    """Probe ``name`` as ``config`` says, in a process of its own, its ``timeout`` seconds
    from its first report, until ``stop`` (a :class:`threading.Event`) is set; its verdict.
    ``progress`` hears of each level, and of the end."""
    started, timeout = time.monotonic(), config["timeout"]
    config = {**config, "name": name}
    reports, reporter = _CONTEXT.Pipe(duplex=False)
    output, writer = _CONTEXT.Pipe(duplex=False)
    process = _CONTEXT.Process(target=probe.main, args=(config, reporter, writer))
    try:
        try:
            process.start()
        except OSError:  # the forkserver is gone (a probe killed it, say): once more
            start_server()
            process.start()
    except Exception as exc:  # it could not import PyTorch, say
        return Verdict(name, "crashed", 0, f"the probe could not start: {exc!r}")
    finally:
        reporter.close()
        writer.close()
    # Its end, as the kernel tells it where it can: the forkserver's word of it goes with
    # the forkserver, and a probe can kill that (its parent).
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or already gone
        pidfd = os.pidfd_open(process.ident or 0)
    ended = process.sentinel if pidfd is None else pidfd
    watched = _Watched(reports, output)
    deadline, told = started + max(STARTUP, timeout), 0.0
    try:
        while not stop.is_set() and not watched.ended:
            now = time.monotonic()
            if watched.level and deadline - now > timeout:
                deadline = now + timeout  # the backend's time starts at the first report
            if now >= deadline:
                break
            if now >= told:
                progress(name, watched.level, now - started, False)
                told = now + 0.25
            watched.read(ended, min(0.25, deadline - now))
    finally:
        code = _kill(process)
        reports.close()
        output.close()
        if pidfd is not None:
            os.close(pidfd)
    level, report, seconds = watched.level, watched.report, round(time.monotonic() - started, 3)
    progress(name, level, seconds, True)
    if "model_error" in report:
        raise ModelError(report["model_error"])
    crash = _crash_reason(code, watched.tail)
    if watched.ended and not watched.started:  # multiprocessing's preparing it failed
        said = f"the probe ended before it started ({crash}): {_UNGUARDED}"
        return Verdict(name, "crashed", 0, said, seconds)
    waited = timeout if level else max(STARTUP, timeout)
    if not level and not report and config["model"] is not None:
        model = f"--model {config['model']!r}"
        if not watched.ended:
            raise ModelError(
                f"{model} was not built and run within {waited:g} s, before any backend"
                " ran; a longer --timeout gives it longer"
            )
        raise ModelError(f"{model} ended its probe before any backend ran: {crash}")
    if not watched.ended:
        said = f"no verdict after {waited:g} s at level {level} ({LEVELS[level]}); killed"
        return Verdict(name, "timeout", level, said, seconds)
    if not report:
        return Verdict(name, "crashed", level, crash, seconds)
    facts = report["verdict"]  # a crash the probe caught says no level: its last one
    return _diagnosed(Verdict(name, **{**facts, "level": facts["level"] or level}), watched.tail)


class _Watched:
    """What a probe says (the last level it reached, its last report) and prints (the last
    :data:`TAIL` bytes), read as it comes; ``ended`` once its process has."""

    def __init__(self, reports: Any, output: Any) -> None:
        self.output = output
        self.open: list[Any] = [reports, output]
        self.level, self.tail, self.ended, self.started = 0, bytearray(), False, False
        self.report: dict[str, Any] = {}

    def read(self, sentinel: int, seconds: float) -> None:
        ready = multiprocessing.connection.wait([*self.open, sentinel], seconds)
        self._take([end for end in ready if end in self.open])
        if sentinel in ready:  # ended: what it said before is in the pipes
            self.ended, until = True, time.monotonic() + GRACE
            while self.open and time.monotonic() < until:
                if not (ready := multiprocessing.connection.wait(self.open, 0)):
                    break  # all read: a process it started may hold its output open
                self._take(ready)

    def _take(self, ready: list[Any]) -> None:
        for end in ready:
            try:
                if end is self.output:
                    if not (data := os.read(end.fileno(), 65536)):
                        raise EOFError
                    self.tail += data
                    del self.tail[:-TAIL]  # a backend may print without end: its last words
                elif "level" in (said := end.recv()):
                    self.level, self.started = said["level"], True
                else:
                    self.report = said
            except (EOFError, OSError):
                self.open.remove(end)


#: What a probe that ends before it starts most likely met: each imports the program's main
#: module again, as multiprocessing does, and one that calls doctor() unguarded fails so.
_UNGUARDED = (
    "if doctor() is called from a script, guard the script's own code with"
    ' `if __name__ == "__main__":` (each probe imports the script again, as'
    " multiprocessing's processes do)"
)


def _kill(process: Any) -> int | None:
    """End the probe's session (what it left behind too), and the probe; its exit code."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.exitcode is None:  # not reaped yet: its pid is still its own
        process.kill()
    process.join()
    code: int | None = process.exitcode
    process.close()
    return code


#: A reason that sends its reader elsewhere for the cause ("JIT compilation failed. See
#: diagnostics."): the probe's last words are that elsewhere.
_ELSEWHERE = re.compile(
    r"\bsee (the )?(diagnostics|above|logs?|output|stderr|console|messages)\b"
    r"|for (more )?(details|information)\b|check the log",
    re.IGNORECASE,
)
#: The header of one of Python's warnings (``file:line: SomeWarning: ...``).
_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
#: A line that says it is an error (``error: ...``; ``RuntimeError`` is no such word).
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)


def _diagnosed(verdict: Verdict, printed: bytes | bytearray) -> Verdict:
    """``verdict`` with the last lines the probe printed that say something new (not
    Python's warnings nor the reason itself), where that is the diagnosis: a reason that
    points elsewhere, or a failed import (a plugin that prints "needs PyTorch 2.8.*, but
    2.13.0 is found", and then fails on something else)."""
    if verdict.status not in FAILURES:
        return verdict
    if verdict.status != "import-error" and not _ELSEWHERE.search(verdict.reason):
        return verdict
    kept: list[str] = []
    after_warning = False
    for line in printed.decode("utf-8", "replace").splitlines():
        if _WARNING.match(line):
            after_warning = True
        elif not (after_warning and line[:1].isspace()):
            after_warning = False
            # A compiler's diagnostic ("source.mlir:2:3: error: unhandled torch type") comes
            # before the source line it is about and a caret under it: its own line says why.
            if not set(text := line.strip()) <= set("^~ ") and text not in verdict.reason:
                kept.append(text)
    chosen = ([line for line in kept if _ERROR.search(line)] or kept)[-3:]
    if not (said := " | ".join(line if len(line) <= 98 else line[:97] + "…" for line in chosen)):
        return verdict
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; it printed: {said}")


def _crash_reason(code: int | None, printed: bytes | bytearray) -> str:
    if code is not None and code < 0:
        what = f"killed by signal {-code}"
        with contextlib.suppress(ValueError):  # a number no signal of this system has
            what = f"killed by {signal.Signals(-code).name}"
    else:
        what = f"exited with status {code} without a verdict"
    words = [line for line in printed.decode("utf-8", "replace").splitlines() if line.strip()]
    return what + (f"; last words: {words[-1].strip()[:200]}" if words else "")


def import_path() -> list[str]:
    """This process's import path, less the working folder ``python -m`` or ``-c`` put first:
    a probe imports what the registry would here, and nothing a folder it runs in offers."""
    path = list(sys.path)
    # python -m: path[0] is the working folder.
    if path and getattr(sys.modules.get("__main__"), "__spec__", None) is not None:
        with contextlib.suppress(OSError):  # no working folder: none to leave out
            if os.path.realpath(path[0]) == os.path.realpath(os.getcwd()):
                path = path[1:]
    return [entry for entry in path if entry]  # "": the working folder, as -c puts it
