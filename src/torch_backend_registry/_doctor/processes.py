"""The probe processes, seen from doctor: one server that imports PyTorch once and forks a
fresh process for each backend, each watched with a time limit.

Doctor waits for a probe to end (the server tells it), never for its output, has its
session killed at the time limit and keeps the tail of what it printed: a probe that
crashes, hangs, prints without end or leaves processes behind affects only its verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .options import ModelError
from .probe import BOOT, kill_session
from .verdicts import FAILURES, Verdict, level_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Progress = Callable[[str, int, float, bool], None]

#: The most of a backend's own output kept, for the reason of a crash.
TAIL = 64 * 1024
#: The longest line on a probe's report channel that is read.
REPORT = 16 * 2**20
#: Seconds to wait, once a probe process ended, for its last report.
GRACE = 2.0
#: Seconds the server may take to start (Python, PyTorch), and a probe to reach its first
#: report (its registry read, the model run eagerly) before the backend's time begins.
STARTUP = 60.0


class Server:
    """The probe server, importing PyTorch with the import path ``path`` in ``environ`` from
    the moment it is made; :meth:`probe` is called from a thread for each probe at once."""

    def __init__(self, path: list[str], environ: dict[str, str]) -> None:
        self._probes: dict[int, _Probe] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.broken: str | None = None
        #: How many runs use it (see :func:`.parent.start`).
        self.users = 0
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Only the server's own words go there (importing PyTorch): each probe has its own.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            env=environ,
        )
        boot = {"path": path, "socket": theirs.fileno()}
        theirs.close()
        stdin = self._process.stdin
        assert stdin is not None
        with contextlib.suppress(OSError), stdin:  # it died before reading: the socket says so
            stdin.write(json.dumps(boot).encode() + b"\n")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self._process.poll() is None and self.broken is None

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while message := self._socket.recv(65536):
                said = json.loads(message)
                if "ready" in said or "broken" in said:
                    self.broken = said.get("broken")
                    self._ready.set()
                    continue
                probe = self._probes[said["ended"]]  # each number is known before it is sent
                probe.code = said["code"]
                probe.ended.set()
        # The server is gone: every probe with it (its session killed them).
        self._process.wait()
        if not self._ready.is_set():
            self._stderr.seek(max(0, os.fstat(self._stderr.fileno()).st_size - TAIL))
            self.broken = _crash_reason(self._process.returncode, self._stderr.read())
            self._ready.set()
        with self._lock:
            for probe in self._probes.values():
                if not probe.ended.is_set():
                    probe.code = -9
                    probe.ended.set()

    def wait_ready(self) -> str | None:
        """Wait for the server to have imported PyTorch: ``None``, or why it could not."""
        if not self._ready.wait(STARTUP):
            self.broken = f"PyTorch did not import within {STARTUP:g} s"
        return self.broken

    def probe(
        self, name: str, config: dict[str, Any], on_progress: Progress, owner: object
    ) -> tuple[Verdict, Any, list[str]]:
        """Probe ``name`` as ``config`` says, in a process of its own: its verdict, the code it
        ran, the modules it found missing."""
        started, timeout = time.perf_counter(), config["timeout"]
        ends = [os.pipe() for _ in range(3)]  # the report channel, stdout, stderr
        # The configuration on a pipe of its own, never a command line: it holds the
        # registry's environment, which may be large and private. A thread writes it: a
        # pipe holds only so much until its reader reads, and a probe that never starts
        # reads nothing.
        config_end, config_in = os.pipe()
        threading.Thread(target=_write, args=(config_in, json.dumps(config)), daemon=True).start()
        probe = _Probe(owner, [r for r, _w in ends])
        with self._lock:
            number = len(self._probes)
            self._probes[number] = probe

        def progress(level: int, done: bool) -> None:
            on_progress(name, level, time.perf_counter() - started, done)

        try:
            request = json.dumps({"id": number, "name": name}).encode()
            socket.send_fds(self._socket, [request], [*(w for _r, w in ends), config_end])
        except OSError:
            probe.code = -9
            probe.ended.set()
        finally:
            for _r, w in ends:
                os.close(w)
            os.close(config_end)
        try:
            timed_out = not probe.wait(timeout, progress)
        finally:
            self._kill(number)  # at the time limit, on an interruption, or what it left behind
            probe.ended.wait(GRACE)
            until = time.monotonic() + GRACE  # a moment for the verdict
            while not probe.report and probe.open and (left := until - time.monotonic()) > 0:
                probe.read(left)
            for r, _w in ends:
                os.close(r)
        progress(probe.level, True)
        seconds = round(time.perf_counter() - started, 3)
        if "model_error" in probe.report:
            raise ModelError(probe.report["model_error"])
        crash = _crash_reason(probe.code, probe.tail)
        # Before its first report no code of the backend ran, only the model's.
        waited = timeout if probe.level else max(STARTUP, timeout)
        if not probe.level and not probe.report and config["model"] is not None:
            model = f"--model {config['model']!r}"
            if timed_out:
                raise ModelError(
                    f"{model} was not built and run within {waited:g} s, before any backend"
                    " ran; a longer --timeout gives it longer"
                )
            raise ModelError(f"{model} ended its probe before any backend ran: {crash}")
        if timed_out:
            reason = f"no verdict after {waited:g} s at level {probe.level}"
            reason = f"{reason} ({level_name(probe.level)}); killed"
            # It depends on the code run until then: fixed, it is probed again.
            return Verdict(name, "timeout", probe.level, reason, seconds), probe.ran, []
        if probe.report:
            data = {**probe.report["verdict"], "name": name}
            if data.get("status") == "crashed" and not data.get("level"):
                data["level"] = probe.level
            with contextlib.suppress(TypeError):  # not a verdict: the probe crashed
                verdict = _diagnosed(Verdict.from_json(data), probe.errors)
                return verdict, probe.report.get("code"), data.get("missing", [])
        return Verdict(name, "crashed", probe.level, crash, seconds), probe.ran, []

    def kill(self, owner: object) -> None:
        with self._lock:
            numbers = [n for n, p in self._probes.items() if p.owner is owner]
        for number in numbers:
            self._kill(number)

    def _kill(self, number: int) -> None:
        if not self._probes[number].ended.is_set():
            with contextlib.suppress(OSError):
                self._socket.send(json.dumps({"kill": number}).encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # it kills its probes, and ends
        try:
            # Not ready: still importing PyTorch, with no probe to end.
            self._process.wait(GRACE if self._ready.is_set() else 0)
        except Exception:
            kill_session(self._process.pid)
            self._process.wait()
        self._reader.join(GRACE)
        self._socket.close()
        self._stderr.close()


def _write(fd: int, text: str) -> None:
    with contextlib.suppress(OSError), open(fd, "wb") as stream:  # gone: nobody reads it
        stream.write(text.encode())


class _Probe:
    """One probe process: the run it belongs to, its exit code once ended, and what it says
    and prints, read by the thread that waits for it (not until its pipes close: a process
    the backend started may keep them open)."""

    def __init__(self, owner: object, fds: list[int]) -> None:
        self.owner = owner
        self.code: int | None = None
        self.ended = threading.Event()
        self.channel, _output, self.error_fd = fds
        self.open = list(fds)
        self.level = 0
        #: The code the probe had run at the last level it reported (``None`` before the
        #: first): what a verdict it gave no report of depends on.
        self.ran: list[Any] | None = None
        #: The probe's last report: its verdict (or why the model cannot be built), the code
        #: it ran.
        self.report: dict[str, Any] = {}
        #: The last of what it printed, and of what it printed to stderr alone.
        self.tail = bytearray()
        self.errors = bytearray()
        self._pending = bytearray()

    def wait(self, timeout: float, progress: Callable[[int, bool], None]) -> bool:
        """Read the pipes until the process ends, telling ``progress`` as it goes; ``False`` at
        the time limit. The limit counts from the first report, past running the model
        eagerly (given :data:`STARTUP` or the limit if longer): it is the backend's time."""
        deadline = time.monotonic() + max(STARTUP, timeout)
        told, next_tell = -1, 0.0
        while not self.ended.is_set():
            now = time.monotonic()
            if self.level and deadline - now > timeout:
                deadline = now + timeout  # the backend's time starts now
            if now >= deadline:
                return False
            if self.level != told or now >= next_tell:
                progress(self.level, False)
                told, next_tell = self.level, now + 0.25
            self.read(min(0.25, deadline - now))
        return True

    def read(self, seconds: float) -> None:
        if not self.open:
            self.ended.wait(seconds)
            return
        for fd in select.select(self.open, [], [], seconds)[0]:
            data = os.read(fd, 65536)
            if not data:
                self.open.remove(fd)
            elif fd == self.channel:
                self._report(data)
            else:
                self.tail += data
                del self.tail[:-TAIL]  # a backend may print without end: keep its last words
                if fd == self.error_fd:
                    self.errors += data
                    del self.errors[:-TAIL]

    def _report(self, data: bytes) -> None:
        self._pending += data
        *lines, rest = bytes(self._pending).split(b"\n")
        # A report runs as long as the code it lists (at most 10,000 files); past REPORT,
        # what runs on without an end is no report.
        self._pending = bytearray(rest[-REPORT:])
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if isinstance(message.get("level"), int):
                self.level = message["level"]
                self.ran = message.get("code") if isinstance(message.get("code"), list) else None
            if isinstance(message.get("verdict"), dict) or "model_error" in message:
                self.report = message


#: A reason that sends its reader elsewhere for the cause ("JIT compilation failed. See
#: diagnostics."): the probe's last words on stderr are that elsewhere.
_ELSEWHERE = re.compile(
    r"\bsee (the )?(diagnostics|above|logs?|output|stderr|console|messages)\b"
    r"|for (more )?(details|information)\b|check the log",
    re.IGNORECASE,
)
#: The header of one of Python's warnings (``file:line: SomeWarning: ...``).
_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
#: A line that says it is an error (``error: ...``; ``RuntimeError`` is no such word).
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)


def _diagnosed(verdict: Verdict, errors: bytes | bytearray) -> Verdict:
    """``verdict`` with the last lines the probe wrote to stderr that say something new (not
    Python's warnings nor the reason itself), where that is the diagnosis: a reason that
    points elsewhere, or a failed import (a plugin that prints "needs PyTorch 2.8.*, but
    2.13.0 is found", and then fails on something else)."""
    if verdict.status not in FAILURES:
        return verdict
    if verdict.status != "import-error" and not _ELSEWHERE.search(verdict.reason):
        return verdict
    kept: list[str] = []
    after_warning = False
    for line in errors.decode("utf-8", "replace").splitlines():
        if _WARNING.match(line):
            after_warning = True
        elif not (after_warning and line[:1].isspace()):
            after_warning = False
            if line.strip() and line.strip() not in verdict.reason:
                kept.append(line.strip())
    # A compiler's diagnostic ("source.mlir:2:3: error: unhandled torch type") comes
    # before the source line it is about and a caret under it: its own line says why.
    kept = [line for line in kept if not set(line) <= set("^~ ")]
    chosen = ([line for line in kept if _ERROR.search(line)] or kept)[-3:]
    said = " | ".join(line if len(line) <= 98 else line[:97] + "…" for line in chosen)
    if not said:
        return verdict
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; it printed: {said}")


def _crash_reason(code: int | None, tail: bytes | bytearray) -> str:
    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exited with status {code} without a verdict"
    words = [line for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
    return what + (f"; last words: {words[-1].strip()[:200]}" if words else "")
