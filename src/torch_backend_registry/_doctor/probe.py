"""The child side of ``doctor``: a server that forks a fresh process per backend, and the probe.

The server runs under ``python -I`` (no working folder on the import path, no ``PYTHON*``
variables), its configuration on stdin, never on the command line (which every user can
read). No backend's code is ever imported into it, so each probe starts where a fresh
interpreter that imported PyTorch would. A probe reports each level as it reaches it:
whatever kills it leaves the last level reported for the parent to tell.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import site
import socket
import statistics
import sys
import sysconfig
import time
import timeit

from .._errors import closest
from .._registry import Registry
from .._sources.finding import stamp
from .._torch import install
from .._verify import differ, leaves
from .model import Eager, causes, loss, one_line
from .options import ModelError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: What ``python -I -c`` runs: the import path the parent chose, then :func:`serve`.
BOOT = (
    "import json, sys; config = json.loads(sys.stdin.readline()); sys.path[:] = config['path'];"
    " from torch_backend_registry._doctor.probe import serve; serve(config)"
)
#: The most a message on the server's socket holds (a request: a name and its number).
MESSAGE = 64 * 1024
#: The timed rounds of a backend, and of eager, with ``bench``.
ROUNDS = 15


def serve(config: dict[str, Any]) -> None:
    """Import PyTorch, then fork a probe for each request on the socket until it closes.

    A request is ``{"id": N, "name": NAME}`` with the probe's report pipe, stdout, stderr
    and a pipe of its configuration attached; once that process ended, and whatever it
    left was killed, the server answers ``{"ended": N, "code": CODE}`` (negative: killed by
    that signal). ``{"kill": N}`` ends a probe and its session.
    """
    server = socket.socket(fileno=config["socket"])

    def say(**fields: Any) -> None:
        server.send(json.dumps(fields).encode())

    try:
        # What every probe needs, and no backend's code: PyTorch, its registry with its
        # own backends and the names of the entry points (none loaded), the validator.
        import torch._dynamo

        torch._dynamo.list_backends(exclude_tags=())
        from .._sources import schema  # noqa: F401
    except BaseException as exc:
        say(broken=one_line(exc))
        os._exit(0)

    say(ready=True)
    # What a probe leaves in a session of its own comes here once its parent is gone.
    _adopt_orphans()
    probes: dict[int, int] = {}  # pid -> request number, until it is reaped
    while True:
        while probes:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid not in probes:  # a process a probe left, ended
                continue
            kill_session(pid)  # what the probe left behind
            _kill_orphans(probes)  # and what it left elsewhere
            say(ended=probes.pop(pid), code=os.waitstatus_to_exitcode(status))
        if not select.select([server], [], [], 0.01)[0]:
            continue
        message, fds, _flags, _address = socket.recv_fds(server, MESSAGE, 4)
        if not message:  # the parent is gone
            break
        request = json.loads(message)
        if "kill" in request:
            for pid, number in probes.items():
                if number == request["kill"]:
                    kill_session(pid)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.setsid()  # its own session: a hang is killed with whatever it started
            _adopt_orphans()  # and what leaves it, it keeps until it ends
            server.close()
            channel, output, errors, asked = fds
            with os.fdopen(asked, "rb") as stream:
                probe_config = json.loads(stream.read())
            null = os.open(os.devnull, os.O_RDONLY)
            for fd, std in ((null, 0), (output, 1), (errors, 2)):
                os.dup2(fd, std)
                os.close(fd)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            main({**config, **probe_config, **request, "channel": channel})
        for fd in fds:
            os.close(fd)
        probes[pid] = request["id"]
    for pid in probes:
        kill_session(pid)
    for pid in probes:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    _kill_orphans({})
    os._exit(0)


def kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _adopt_orphans() -> None:
    """Become the parent of every process below this one whose own parent ends (Linux's
    child subreaper), rather than leave it to init: a backend's helper that starts a
    session of its own (a daemon, ``start_new_session=True``) is then still found."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _kill_orphans(probes: dict[int, int]) -> None:
    """Kill every child of this server that is no probe (what an ended probe left,
    adopted), and what each leaves in turn, until none is left."""
    for _ in range(1000):
        left = [pid for pid in _children() if pid not in probes]
        if not left:
            return
        for pid in left:
            kill_session(pid)  # the group it leads, if it leads one
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:  # once it is gone, its own children are this server's
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _children() -> list[int]:
    """The children of this process still running (Linux; none elsewhere)."""
    me, found = os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stream:
                    fields = stream.read().rpartition(b")")[2].split()
            except OSError:  # ended meanwhile
                continue
            if len(fields) > 1 and int(fields[1]) == me and fields[0] != b"Z":
                found.append(int(entry.name))
    return found


def probe(config: dict[str, Any], say: Callable[..., None]) -> dict[str, Any]:
    """Go through the levels for ``config["name"]``; the verdict as a dict. The model is run
    eagerly before any code of the backend is imported: what the backend does to this
    process cannot be taken for the model's fault."""
    name = config["name"]
    verdict = functools.partial(_verdict, name, time.perf_counter())
    registry = Registry(**config["registry"])
    try:
        info = registry.backend_info(name)
        # A chain that names itself cannot be loaded as written: not "unavailable here".
        loop = registry.index(with_torch=False).chain_problems().get(info.definition.name)
        if loop is not None:
            return verdict("import-error", 2, loop.message)
        why = registry.why_unavailable(info)
    except Exception as exc:  # the manifest holds it, but not as something usable
        return verdict("import-error", 2, one_line(exc))
    if why is not None:
        return verdict("unavailable", 1, why)
    import torch

    device = _device(config["device"] or "cpu")
    if device is None:
        return verdict("unavailable", 1, f"no {config['device']} device here")
    sys.path.extend(config["model_path"])  # last: as a python-path folder is
    eager = Eager(config["model"], device, config["level"] == "backward")
    # Eager is timed before any backend's code is loaded (a backend may start threads that
    # slow every later call): each row's speed-up is against the same eager.
    eager_times = _timed(eager, eager.model) if config["bench"] else []
    # The first report: doctor counts the backend's time limit from here, past starting
    # Python, importing PyTorch and running the model eagerly.
    say(level=2)
    try:
        registry.lookup_backend(name)
    except Exception as exc:
        return verdict("import-error", 2, one_line(exc), missing=_missing(exc))
    say(level=3)
    install(registry)  # torch.compile(backend=name) is what is probed
    try:
        compiled = torch.compile(eager.model, backend=name)
        start = time.perf_counter()
        out = eager(compiled)
        compile_seconds = time.perf_counter() - start
    except Exception as exc:
        return verdict("compile-error", 3, one_line(exc), missing=_missing(exc))
    # The member a chain used; a backend of no members may have a `used` of its own.
    member = getattr(registry.lookup_backend(name), "used", None)
    if member and info.definition.members:
        verdict = functools.partial(verdict, member=member)
    wrong = differ(leaves(eager.expected), leaves(out), "forward output", *eager.tolerance)
    if wrong is not None:
        return verdict("wrong-result", 3, wrong)
    reached = 3
    if eager.grads is not None:  # with level backward, where the model has a backward pass
        say(level=4)
        params = [p for p in eager.model.parameters() if p.requires_grad]
        total = loss(out)
        if total is None:
            said = "no output of the compiled model requires grad: it gives no backward pass"
            return verdict("backward-error", 4, said)
        try:
            got = torch.autograd.grad(total, params, allow_unused=True)
        except Exception as exc:
            return verdict("backward-error", 4, one_line(exc))
        pairs = [(e, g) for e, g in zip(eager.grads, got, strict=True) if e is not None]
        if not pairs:
            said = "no parameter gets a gradient run eagerly: there is no backward to compare"
            return verdict("ok", 3, said)
        if any(g is None for _e, g in pairs):
            return verdict("wrong-result", 4, "some gradients eager gives are missing")
        wrong = differ([e for e, _g in pairs], [g for _e, g in pairs], "gradient", *eager.tolerance)
        if wrong is not None:
            return verdict("wrong-result", 4, wrong)
        reached = 4
    if not config["bench"]:
        return verdict("ok", reached, eager.said)
    say(level=5)
    try:
        timed = _timed(eager, compiled)
    except Exception as exc:  # the backend works; only timing it failed
        return verdict("ok", reached, f"timing failed: {one_line(exc)}")
    eager_call, per_call = statistics.median(eager_times), statistics.median(timed)
    return verdict(
        "ok",
        5,
        eager.said,
        compile_seconds=round(compile_seconds, 4),
        per_call_seconds=per_call,
        eager_seconds=eager_call,
        speedup=round(eager_call / per_call, 3) if per_call > 0 else None,
        spread=round(max(_spread(eager_times), _spread(timed)), 3),
    )


def _verdict(
    name: str | None, started: float, status: str, level: int, reason: str = "", **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "level": level,
        "reason": reason,
        "seconds": round(time.perf_counter() - started, 3),
        **extra,
    }


def _device(spec: str) -> Any:
    """The device to probe on (``None``: there is none of that kind here)."""
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        kinds = ["cpu", "cuda", "xpu", "mps", "hip", "meta", "npu", "hpu", "mtia"]
        close = closest(spec.split(":")[0], kinds)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelError(f"--device {spec!r}: {one_line(exc)}{hint}") from exc
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not getattr(accelerator, "is_available", lambda: False)():
        return None
    return device


def _missing(exc: BaseException) -> list[str]:
    """The modules an exception says are not there (installing one changes the verdict)."""
    return [c.name for c in causes(exc) if isinstance(c, ModuleNotFoundError) and c.name]


def _code() -> list[list[object]] | None:
    """The stamps of the files of the modules imported that are neither Python's nor
    installed (a project's own code); ``None`` where it cannot be told: a verdict found
    then holds for this probe only, and is not remembered."""
    try:
        paths = sysconfig.get_paths()
        installed = [paths["stdlib"], paths["platstdlib"], *site.getsitepackages()]
        installed.append(site.getusersitepackages())
        installed.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ours
        # As written and as resolved: most files are skipped before a path is resolved.
        skipped = tuple({os.path.join(q, "") for p in installed for q in (p, os.path.realpath(p))})
        found = []
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if not isinstance(path, str) or path.startswith(skipped):
                continue
            if not os.path.realpath(path).startswith(skipped):
                found.append(stamp(path))
        return sorted(f for f in found if len(f) == 3)[:10_000]
    except Exception:
        return None


def _timed(eager: Eager, fn: Any) -> list[float]:
    """Seconds a call of ``fn`` takes, for each of :data:`ROUNDS` after a warming call. Each
    round is the mean of a batch of calls long enough (some 10 ms) that the clock and a
    stray interruption weigh little in it."""
    import torch

    timer = timeit.Timer(lambda: eager(fn))
    with torch.no_grad():
        calls = min(10_000, max(5, int(0.01 / max(timer.timeit(1), 1e-7))))
        return [seconds / calls for seconds in timer.repeat(ROUNDS, calls)]


def _spread(times: list[float]) -> float:
    """The interquartile range of the rounds over their median: one stalled round on a busy
    machine moves it little, where the range from fastest to slowest is decided by it."""
    low, middle, high = statistics.quantiles(times, n=4)
    return (high - low) / middle if middle > 0 else 0.0


def main(config: dict[str, Any]) -> None:
    channel = config["channel"]
    os.set_inheritable(channel, False)  # a backend's own children must not hold it open

    def say(**fields: Any) -> None:
        fields["code"] = _code()  # the code run so far: what a crash or a hang depends on
        # One JSON object a line, nothing else on the pipe to the parent.
        data = (json.dumps(fields) + "\n").encode()
        while data:
            data = data[os.write(channel, data) :]

    started = time.perf_counter()
    try:
        os.chdir(config["workdir"])  # the folder and the environment doctor was run in
        os.environ.clear()
        os.environ.update(config["process_environ"])
        result: dict[str, Any] = {"verdict": probe(config, say)}
    except ModelError as exc:
        result = {"model_error": str(exc)}
    except BaseException as exc:  # the verdict must reach the parent whatever happens
        result = {"verdict": _verdict(config["name"], started, "crashed", 0, one_line(exc))}
    say(**result)
    sys.stdout.flush()
    sys.stderr.flush()
    # At once: a thread the backend left running must not keep this process alive.
    os._exit(0)
