"""torch-backends doctor: each backend in its own subprocess, each failure its own status.

Assertions are about statuses, levels, reasons, tables and exit codes, never about timings.
Every test of a process shares its forkserver: PyTorch is imported once a test process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import Registry, UnknownBackendError, Verdict
from torch_backend_registry._doctor.options import ModelError

from .conftest import Done, WriteFn, torch_backends

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

FAKES = """
import os, pathlib, signal, subprocess, sys, threading, time
import torch

HERE = pathlib.Path(__file__).parent

def explode(gm, example_inputs):
    raise RuntimeError("no GPU here")

def wrong(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return type(out)(o + 1 for o in out) if isinstance(out, (list, tuple)) else out + 1
    return run

def no_grad(gm, example_inputs):
    def run(*args):
        with torch.no_grad():
            return gm(*args)
    return run

def abort(gm, example_inputs):
    os.abort()

def segfault(gm, example_inputs):
    print("about to fault")
    os.kill(os.getpid(), signal.SIGSEGV)

def exit_at_once(gm, example_inputs):
    print("giving up")
    os._exit(3)

def hang(gm, example_inputs):
    time.sleep(3600)

def hang_with_a_helper(gm, example_inputs):
    # A helper in the probe's own session, then a hang: an interruption must end both.
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)"])
    (HERE / "hang.pids").write_text(f"{os.getpid()} {helper.pid}")
    time.sleep(3600)

def leak(gm, example_inputs):
    threading.Thread(target=time.sleep, args=(3600,)).start()  # never joined
    return gm.forward

def fine(gm, example_inputs):
    return gm.forward

def read_stdin(gm, example_inputs):
    # Nothing to read: an empty stdin at once, never a hang waiting for a terminal.
    assert sys.stdin.read() == "" and os.read(0, 1) == b""
    return gm.forward

def kill_the_server(gm, example_inputs):
    os.kill(os.getppid(), signal.SIGKILL)  # doctor's forkserver: others start, and end, still
    return gm.forward

def move(gm, example_inputs):
    os.chdir("/")  # the probe's own working folder: nobody else's
    return gm.forward

def helper(gm, example_inputs):
    # A helper left running in the probe's session (as a compiler's worker pool is).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)"])
    (HERE / "helper.pid").write_text(str(child.pid))
    return gm.forward

def escape(gm, example_inputs):
    # A helper in a session of its own, holding this process's output pipe; then a hang.
    helper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(90)"], start_new_session=True
    )
    (HERE / "escaped.pid").write_text(str(helper.pid))
    time.sleep(3600)

def chatty(gm, example_inputs):
    chunk = "x" * 1_000_000
    for _ in range(200):  # 200 MB, and not one newline
        sys.stdout.write(chunk)
    sys.stdout.flush()
    raise RuntimeError("after the noise")
"""

MANIFEST = """
python-path = ["fakes"]
[backends.explodes]
target = "tbr_doctor_fakes:explode"
[backends.wrong]
target = "tbr_doctor_fakes:wrong"
[backends.forward_only]
target = "tbr_doctor_fakes:no_grad"
[backends.aborts]
target = "tbr_doctor_fakes:abort"
[backends.segfaults]
target = "tbr_doctor_fakes:segfault"
[backends.exits]
target = "tbr_doctor_fakes:exit_at_once"
[backends.hangs]
target = "tbr_doctor_fakes:hang"
[backends.hangs_with_a_helper]
target = "tbr_doctor_fakes:hang_with_a_helper"
[backends.leaks]
target = "tbr_doctor_fakes:leak"
[backends.reads_stdin]
target = "tbr_doctor_fakes:read_stdin"
[backends.moves]
target = "tbr_doctor_fakes:move"
[backends.kills_the_server]
target = "tbr_doctor_fakes:kill_the_server"
[backends.leaves_a_helper]
target = "tbr_doctor_fakes:helper"
[backends.broken_import]
target = "tbr_doctor_broken:fn"
[backends.exits_on_import]
target = "tbr_doctor_exits:fn"
[backends.needs_trt]
target = "tbr_doctor_fakes:fine"
requires = ["tbr_no_such_tensorrt"]
[backends.fallback]
chain = ["needs_trt", "explodes", "fine"]
[backends.fine]
target = "tbr_doctor_fakes:fine"
aliases = ["fine_alias"]
[backends.escapes]
target = "tbr_doctor_fakes:escape"
[backends.chatty]
target = "tbr_doctor_fakes:chatty"
[backends.noisy_import]
target = "tbr_doctor_noisy:fn"
[backends.missing_module]
target = "tbr_doctor_no_such_module_zz:fn"
"""

NOISY = "import sys\nsys.stdout.write('loading kernels... ')\nraise ImportError('libfoo.so')\n"
SLOW = "import time\ndef fn(gm, inputs):\n    time.sleep(4)\n    return gm.forward\n"


def _command(tmp_path: Path) -> Callable[..., Done]:
    """``torch-backends ARGS`` run as a user would, in the project, with its own cache."""

    def run(*args: str) -> Done:
        cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
        return torch_backends(*args, cwd=tmp_path / "proj", env=cache, check=None)

    return run


@pytest.fixture
def project(tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write("proj/fakes/tbr_doctor_fakes.py", FAKES)
    write("proj/fakes/tbr_doctor_broken.py", "raise ImportError('a missing shared library')\n")
    write("proj/fakes/tbr_doctor_exits.py", "import sys\nsys.exit('cannot load: no licence')\n")
    write("proj/fakes/tbr_doctor_noisy.py", NOISY)
    write("proj/backends.toml", MANIFEST)
    return Registry(cwd=tmp_path / "proj", environ={}, sources=("project", "torch"))


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie, not yet reaped, has), given a moment: a
    signal is delivered after its sender goes on."""
    for _ in range(100):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_every_failure_gets_its_own_status_and_spares_the_others(project: Registry) -> None:
    expected = {
        "explodes": ("compile-error", "forward"),
        "wrong": ("wrong-result", "forward"),
        "forward_only": ("backward-error", "backward"),
        "aborts": ("crashed", "forward"),
        "segfaults": ("crashed", "forward"),
        "exits": ("crashed", "forward"),
        "hangs": ("timeout", "forward"),
        "leaks": ("ok", "backward"),
        "reads_stdin": ("ok", "backward"),
        "moves": ("ok", "backward"),
        "broken_import": ("import-error", "import"),
        "exits_on_import": ("import-error", "import"),
        "missing_module": ("import-error", "import"),
        "needs_trt": ("unavailable", "requirements"),
        "fallback": ("ok", "backward"),
        "fine": ("ok", "backward"),
    }
    # A time limit some four times what the slowest of the others takes on a loaded machine
    # (from the model built, some 0.5 s quiet); three at once, one of them the hang.
    verdicts = tbr.doctor(list(expected), registry=project, timeout=6, jobs=3)
    by_name = {v.name: v for v in verdicts}
    assert {name: (v.status, v.level_name) for name, v in by_name.items()} == expected
    assert "no GPU here" in by_name["explodes"].reason
    assert by_name["wrong"].reason.startswith("output 0 differs from eager beyond rtol=")
    assert "gives no backward pass" in by_name["forward_only"].reason
    assert by_name["aborts"].reason.startswith("killed by SIGABRT")
    assert by_name["segfaults"].reason == "killed by SIGSEGV; last words: about to fault"
    assert by_name["exits"].reason == (
        "exited with status 3 without a verdict; last words: giving up"
    )
    assert by_name["hangs"].reason == "no verdict after 6 s at level 3 (forward); killed"
    assert "a missing shared library" in by_name["broken_import"].reason
    assert "SystemExit: cannot load: no licence" in by_name["exits_on_import"].reason
    missing = "No module named 'tbr_doctor_no_such_module_zz'"
    assert by_name["missing_module"].reason.count(missing) == 1  # said once
    assert by_name["needs_trt"].reason == "missing tbr_no_such_tensorrt"
    assert by_name["fallback"].member == "fine"  # the member the chain would use
    assert by_name["fine"].reason == ""  # verified whole: nothing to add
    # Best first: the working ones lead, the timeout comes last.
    assert [v.status for v in verdicts[:5]] == ["ok"] * 5
    assert verdicts[-1].status == "timeout"


def test_pytorch_and_plugin_backends_are_probed_for_real(project: Registry) -> None:
    pytest.importorskip("openvino")
    registry = Registry(environ={}, sources=("entry-point", "torch"))
    verdicts = {
        v.name: v
        for v in tbr.doctor(["eager", "aot_eager", "inductor", "openvino"], registry=registry)
    }
    assert (verdicts["eager"].status, verdicts["aot_eager"].status) == ("ok", "ok")
    assert verdicts["inductor"].status == "ok"  # a C++ compiler is on these machines
    # OpenVINO compiles for inference only: its forward is right, its backward cannot run.
    assert (verdicts["openvino"].status, verdicts["openvino"].level) == ("backward-error", 4)
    assert "gives no backward pass" in verdicts["openvino"].reason


def test_a_users_own_model_can_be_the_probe(project: Registry, write: WriteFn) -> None:
    # The model's module is found as a target is: on the import path, or in a python-path folder.
    write(
        "proj/fakes/tbr_doctor_model.py",
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(1)\n"
        "    return torch.nn.Conv1d(2, 3, 3), (torch.randn(1, 2, 8),)\n",
    )
    [verdict] = tbr.doctor(["fine"], registry=project, model="tbr_doctor_model:make")
    assert (verdict.status, verdict.level) == ("ok", 4)
    if not __import__("torch").cuda.is_available():
        [no_gpu] = tbr.doctor(["fine"], registry=project, device="cuda")
        assert (no_gpu.status, no_gpu.reason) == ("unavailable", "no cuda device here")
    with pytest.raises(ModelError, match="no module 'tbr_no_such_module'"):
        tbr.doctor(["fine"], registry=project, model="tbr_no_such_module:make")


def test_a_model_that_cannot_run_is_the_users_error_not_the_backends(
    project: Registry, write: WriteFn
) -> None:
    write(
        "proj/fakes/tbr_doctor_models.py",
        "import torch\n"
        "def broken():\n"
        "    return torch.nn.Linear(2, 3), (torch.ones(1, 5),)  # the wrong width\n"
        "def not_a_pair():\n"
        "    return torch.nn.Linear(2, 3)\n"
        "def no_parameters():\n"
        "    return torch.nn.ReLU(), (torch.randn(4, 4),)\n"
        "class Raises(torch.autograd.Function):\n"
        "    forward = staticmethod(lambda ctx, x: x * 2)\n"
        "    def backward(ctx, grad):\n"
        "        raise RuntimeError('no way back')\n"
        "class NoBackward(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        "        return Raises.apply(super().forward(x))\n"
        "def no_backward():\n"
        "    return NoBackward(2, 3), (torch.ones(1, 2),)\n",
    )
    # Run eagerly before any backend is imported: no backend is blamed for the model.
    with pytest.raises(ModelError, match="cannot be run: RuntimeError: mat1 and mat2"):
        tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:broken")
    with pytest.raises(ModelError, match="not_a_pair"):
        tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:not_a_pair")
    with pytest.raises(ModelError, match=r"cannot be run: .*no way back"):
        tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:no_backward")
    with pytest.raises(ModelError, match="--device 'sideways'"):
        tbr.doctor(["fine"], registry=project, device="sideways")
    # Nothing to differentiate: the most it can say is that the forward pass is right.
    [plain] = tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:no_parameters")
    assert (plain.status, plain.level_name) == ("ok", "forward")
    assert "no backward to verify" in plain.reason


def test_a_verdict_is_an_immutable_value_that_json_carries_whole() -> None:
    verdict = Verdict("fast", "ok", 4, seconds=1.5, member="inductor", select="first")
    assert json.loads(json.dumps(verdict.as_json())) == {
        "name": "fast", "status": "ok", "level": 4, "reason": "", "seconds": 1.5,
        "member": "inductor", "via": None, "select": "first", "verify": None,
        "level_name": "backward",
    }  # fmt: skip
    assert hash(dataclasses.replace(verdict)) == hash(verdict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.status = "crashed"  # type: ignore[misc]


# ------------------------------------------------------------------ running code safely


def test_the_working_folder_is_on_no_import_path_of_the_probes(
    project: Registry, tmp_path: Path
) -> None:
    # Someone else's folder: a json.py there would run as whoever runs doctor there.
    marker = tmp_path / "planted-json-ran"
    (tmp_path / "proj" / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    [verdict] = tbr.doctor(["fine"], registry=project, level="forward")
    assert verdict.status == "ok"
    assert not marker.exists()


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="Python 3.10 has no PYTHONSAFEPATH: its forkserver searches the folder it starts in",
)
def test_a_script_of_its_own_starts_probes_from_no_working_folder_and_learns_its_mistake(
    project: Registry, tmp_path: Path, write: WriteFn
) -> None:
    # A process of its own, started in someone else's folder (nothing of it on its own
    # path): its forkserver starts there, and imports PyTorch. The script calls doctor()
    # without the guard multiprocessing asks for: each probe imports it again.
    marker = tmp_path / "planted-json-ran"
    (tmp_path / "proj" / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    script = write(
        "scripts/check_backends.py",
        "import sys\n"
        "from torch_backend_registry._cli import main\n"
        "sys.exit(main(['doctor', 'fine', '--level', 'forward']))\n",
    )
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    environ["PYTHONPATH"] = str(Path(tbr.__file__).parent.parent)  # this package, wherever
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path / "proj",
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    code = proc.wait(timeout=600)
    ended = time.monotonic()
    assert proc.stdout is not None
    printed = proc.stdout.read().decode()
    # Its output ends with it: the server it started holds no pipe of its own while PyTorch
    # is torn down there (`doctor | tee` waited seconds for that).
    assert time.monotonic() - ended < 1
    assert not marker.exists()
    assert code == 1, printed
    [row] = printed.splitlines()[1:]
    assert row.split()[:3] == ["fine", "crashed", "start"]
    assert 'guard the script\'s own code with `if __name__ == "__main__":`' in row


def test_the_probe_takes_its_configuration_off_the_command_line(
    project: Registry, tmp_path: Path, write: WriteFn
) -> None:
    write(
        "proj/fakes/tbr_doctor_spy.py",
        "import pathlib\n"
        "here = pathlib.Path(__file__).parent\n"
        "(here / 'cmdline').write_bytes(pathlib.Path('/proc/self/cmdline').read_bytes())\n"
        "def fn(gm, inputs):\n    return gm.forward\n",
    )
    (tmp_path / "proj" / "backends.toml").write_text(
        MANIFEST + '[backends.spy]\ntarget = "tbr_doctor_spy:fn"\n'
    )
    # Three 50 KB variables and a secret: more than a command line may hold, and private.
    environ = {f"TBR_BIG_{i}": "b" * 50_000 for i in range(3)}
    environ["TBR_SECRET"] = "hunter2-secret"
    spied = Registry(cwd=tmp_path / "proj", environ=environ, sources=("project", "torch"))
    [verdict] = tbr.doctor(["spy"], registry=spied, level="forward")
    assert verdict.status == "ok", verdict.reason
    cmdline = (tmp_path / "proj" / "fakes" / "cmdline").read_bytes()
    assert b"hunter2" not in cmdline
    assert b"b" * 1000 not in cmdline


def test_whatever_a_backend_does_doctor_returns_at_the_time_limit(
    project: Registry, tmp_path: Path
) -> None:
    found: list[Verdict] = []
    run = threading.Thread(
        target=lambda: found.extend(tbr.doctor(["escapes"], registry=project, timeout=5)),
        daemon=True,
    )
    run.start()
    try:
        run.join(60)  # a hang of doctor itself shows as this running out (the helper sleeps 90 s)
        assert not run.is_alive()
        assert [(v.status, v.level) for v in found] == [("timeout", 3)]
    finally:
        helper = tmp_path / "proj" / "fakes" / "escaped.pid"
        if helper.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(helper.read_text()), signal.SIGKILL)


def test_no_process_a_backend_started_in_its_session_outlives_its_probe(
    project: Registry, tmp_path: Path
) -> None:
    pid = tmp_path / "proj" / "fakes" / "helper.pid"
    try:
        [verdict] = tbr.doctor(["leaves_a_helper"], registry=project, level="forward")
        assert verdict.status == "ok", verdict.reason
        assert _gone(int(pid.read_text()))  # killed with the probe's session, not left to init
    finally:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.kill(int(pid.read_text()), signal.SIGKILL)


def test_an_interrupted_run_kills_its_probes_and_what_they_started(
    project: Registry, tmp_path: Path
) -> None:
    pids = tmp_path / "proj" / "fakes" / "hang.pids"
    returned = threading.Event()

    def interrupt() -> None:  # Ctrl-C, once the backend hangs (never once doctor returned)
        for _ in range(1200):
            if returned.is_set() or (pids.exists() and pids.read_text()):
                break
            time.sleep(0.05)
        if not returned.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        try:
            verdicts = tbr.doctor(["hangs_with_a_helper"], registry=project, timeout=120)
        except KeyboardInterrupt:
            verdicts = None
        finally:
            returned.set()
        assert verdicts is None, f"doctor returned before it was interrupted: {verdicts}"
        assert all(_gone(int(pid)) for pid in pids.read_text().split())
    finally:
        returned.set()
        for pid in pids.read_text().split() if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def test_what_a_backend_prints_is_kept_to_its_tail(project: Registry) -> None:
    tracemalloc.start()
    try:
        verdicts = {v.name: v for v in tbr.doctor(["chatty", "noisy_import"], registry=project)}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20  # while 200 MB went by
    assert verdicts["chatty"].status == "compile-error"
    assert "after the noise" in verdicts["chatty"].reason
    # A verdict travels on its own channel: output without a newline changes nothing.
    assert verdicts["noisy_import"].status == "import-error"
    assert "libfoo.so" in verdicts["noisy_import"].reason


# ------------------------------------------------------------------ what is probed


def test_a_backend_asked_for_by_two_names_is_probed_once(project: Registry) -> None:
    done: list[str] = []

    def progress(name: str, level: int, seconds: float, finished: bool) -> None:
        if finished:
            done.append(name)

    verdicts = tbr.doctor(["fine", "fine_alias"], registry=project, on_progress=progress)
    assert sorted((v.name, v.status) for v in verdicts) == [("fine", "ok"), ("fine_alias", "ok")]
    assert done == ["fine"]


def test_a_backend_registered_in_this_process_alone_is_refused(project: Registry) -> None:
    cwd = project.context.cwd
    registry = Registry(cwd=cwd, environ={}, sources=("runtime", "project", "torch"))
    registry.register_backend(lambda gm, inputs: gm.forward, name="only_in_here")
    with pytest.raises(tbr.BackendRegistryError, match="registered at runtime in this process"):
        tbr.doctor(["only_in_here"], registry=registry)


def test_without_names_it_probes_what_the_project_declares_and_what_that_runs(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    # A plugin the project's chain names, failing at the backward level.
    plugin = make_dist("tbr-doctor-plugin", "1.0", {"forward_only_ep": "tbr_doctor_fakes:no_grad"})
    (plugin.parent / "tbr_doctor_fakes.py").write_text(FAKES)
    write(
        "proj/backends.toml",
        '[backends.fine]\ntarget = "tbr_doctor_fakes:fine"\n'
        # A chain that verifies the backward skips the member that has none: training works.
        '[backends.train]\nchain = ["forward_only_ep", "fine"]\nverify = "backward"\n'
        '[backends.serve]\nby-device = { cpu = "eager", other = "aot_eager" }\n'
        # Named after serve, which is then the one that reaches eager first.
        '[backends.speedy]\nchain = ["eager", "fine"]\nselect = "fastest"\n',
    )
    done = _command(tmp_path)("doctor", "--json")
    rows = json.loads(done.stdout)["verdicts"]
    seen = {row["name"]: (row["status"], row["member"], row["via"]) for row in rows}
    # No other plugin, and none of PyTorch's backends but those the table runs.
    speedy = seen.pop("speedy")
    assert seen == {
        "fine": ("ok", None, None),
        "train": ("ok", "fine", None),
        "serve": ("ok", "eager", None),
        "eager": ("ok", None, "serve"),
        "aot_eager": ("ok", None, "serve"),
        "forward_only_ep": ("backward-error", None, "train"),
    }
    assert speedy[0] == "ok"
    assert speedy[1] in ("eager", "fine")  # whichever was faster here
    # Each chain as it runs: select = "fastest" verifies the forward at least.
    how = {row["name"]: (row["select"], row["verify"]) for row in rows if row["select"]}
    assert how == {"train": ("first", "backward"), "speedy": ("fastest", "forward")}
    # The member that fails is reported; the chain that skips it decides: it works.
    assert done.returncode == 0, done.stdout


# ------------------------------------------------------------------ arguments and output


def test_unknown_names_and_bad_arguments_fail_before_any_probe(project: Registry) -> None:
    with pytest.raises(UnknownBackendError, match="Did you mean 'fine'"):
        tbr.doctor(["fien"], registry=project)
    with pytest.raises(ValueError, match="timeout must be"):
        tbr.doctor(["fine"], registry=project, timeout=0)
    with pytest.raises(ValueError, match="level must be"):
        tbr.doctor(["fine"], registry=project, level="sideways")
    with pytest.raises(ModelError, match="expected MODULE:FACTORY"):
        tbr.doctor(["fine"], registry=project, model="no_colon")
    with pytest.raises(ValueError, match="jobs must be 1 or more"):
        tbr.doctor(["fine"], registry=project, jobs=0)


def test_one_name_and_a_timedelta_are_taken_as_verify_consistent_takes_them(
    project: Registry,
) -> None:
    from datetime import timedelta

    [one] = tbr.doctor("fine", registry=project, level="forward", timeout=timedelta(minutes=1))
    assert (one.name, one.status) == ("fine", "ok")
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        tbr.doctor(["fine"], registry=project, timeout="soon")  # type: ignore[arg-type]


# ------------------------------------------------------------------ real models, real reasons

#: Backends and models of the probes below, all probed in one run that the tests read.
REAL = """
import sys, time
import torch
from torch._dynamo.backends.common import aot_autograd

def _forward(gm, example_inputs):
    return gm.forward

def _doubled(gm, example_inputs):
    def run(*args):
        return [g * 2 if isinstance(g, torch.Tensor) else g for g in gm(*args)]
    return run

def _no_backward(gm, example_inputs):
    raise RuntimeError("no backward kernels for this graph")

# Built with PyTorch's aot_autograd, as real backends are, with a backward that doubles
# every gradient (right forward, wrong training), and one whose backward cannot compile.
doubles_gradients = aot_autograd(fw_compiler=_forward, bw_compiler=_doubled)
raises_in_backward = aot_autograd(fw_compiler=_forward, bw_compiler=_no_backward)

def points_elsewhere(gm, example_inputs):
    # As IREE prints it: the error, the (long) source line it is about, a caret under it.
    print("source.mlir:2:3: error: unhandled torch type: '!torch.none'", file=sys.stderr)
    print("  func.func @main(" + "%arg0: !torch.vtensor<[4,16],f32>, " * 12 + ")", file=sys.stderr)
    print("  ^", file=sys.stderr)
    raise RuntimeError("JIT compilation failed. See diagnostics.")
"""

MODELS = """
import torch

class Tagger(torch.nn.Module):
    # As a Hugging Face model: keyword inputs, a dict out, dropout (built in training mode).
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.3)
    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.drop(self.embed(input_ids)) * attention_mask}

def keyword_inputs():
    torch.manual_seed(0)
    return Tagger(), {"input_ids": torch.randn(2, 8), "attention_mask": torch.ones(2, 8)}

def module_alone():
    return torch.nn.Linear(2, 2)
"""

REAL_MANIFEST = """
python-path = ["fakes"]
[backends.doubles_gradients]
target = "tbr_doctor_real:doubles_gradients"
[backends.raises_in_backward]
target = "tbr_doctor_real:raises_in_backward"
[backends.points_elsewhere]
target = "tbr_doctor_real:points_elsewhere"
[backends.needs_other_torch]
target = "tbr_doctor_built_elsewhere:compile"
[backends.prints_why]
target = "tbr_doctor_prints_why:compile"
"""


@pytest.fixture(scope="module")
def real_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real") / "proj"
    fakes = root / "fakes"
    fakes.mkdir(parents=True)
    (fakes / "tbr_doctor_real.py").write_text(REAL)
    (fakes / "tbr_doctor_models.py").write_text(MODELS)
    (fakes / "tbr_doctor_built_elsewhere.py").write_text(
        "raise ImportError('_C.so: undefined symbol: _ZN3c104impl8GPUTrace13gpuTraceStateE')\n"
    )
    (fakes / "tbr_doctor_prints_why.py").write_text(
        "import os, sys\n"
        "print('needs PyTorch 2.8.*, but 2.13.0 is found', file=sys.stderr)\n"
        "os.exit(1)  # as one plugin does: the error it raises says nothing of why\n"
    )
    (root / "backends.toml").write_text(REAL_MANIFEST)
    return root


def _real(root: Path, names: list[str], **kwargs: Any) -> dict[str, Verdict]:
    registry = Registry(cwd=root, environ={}, sources=("project", "torch"))
    return {v.name: v for v in tbr.doctor(names, registry=registry, jobs=2, **kwargs)}


@pytest.fixture(scope="module")
def real_verdicts(real_project: Path) -> dict[str, Verdict]:
    names = ["doubles_gradients", "raises_in_backward", "points_elsewhere", "needs_other_torch"]
    names += ["prints_why", "eager"]
    return _real(real_project, names)


def test_the_backward_level_compares_gradients(real_verdicts: dict[str, Verdict]) -> None:
    doubled = real_verdicts["doubles_gradients"]
    assert (doubled.status, doubled.level_name) == ("wrong-result", "backward")
    assert doubled.reason.startswith("gradient 0 differs from eager beyond rtol=")
    raises = real_verdicts["raises_in_backward"]
    assert (raises.status, raises.level_name) == ("backward-error", "backward")
    assert "no backward kernels for this graph" in raises.reason
    assert (real_verdicts["eager"].status, real_verdicts["eager"].level_name) == (
        "ok",
        "backward",
    )


def test_a_reason_that_points_elsewhere_carries_what_the_probe_printed(
    real_verdicts: dict[str, Verdict],
) -> None:
    elsewhere = real_verdicts["points_elsewhere"]
    assert elsewhere.status == "compile-error"
    assert elsewhere.reason == (
        "BackendCompilerFailed: backend='points_elsewhere' raised: RuntimeError: JIT compilation"
        " failed. See diagnostics.; it printed: source.mlir:2:3: error: unhandled torch type:"
        " '!torch.none'"
    )
    printed = real_verdicts["prints_why"]
    assert printed.status == "import-error"
    assert "no attribute 'exit'" in printed.reason
    assert "it printed: needs PyTorch 2.8.*, but 2.13.0 is found" in printed.reason
    other = real_verdicts["needs_other_torch"]
    assert other.status == "import-error"
    assert "built for another PyTorch than the one installed here" in other.reason


def test_a_model_of_keyword_inputs_that_draws_random_numbers_is_judged_as_a_chain_would(
    real_project: Path,
) -> None:
    verdicts = _real(real_project, ["eager", "aot_eager"], model="tbr_doctor_models:keyword_inputs")
    for verdict in verdicts.values():  # eager itself included: never wrong against itself
        assert (verdict.status, verdict.level_name) == ("ok", "backward")
        # Dropout draws the same random numbers as eager's from the same generator state, so
        # the values are verified in full, as a chain verifies them: nothing left to say.
        assert verdict.reason == ""
    with pytest.raises(ModelError, match=r"returned Linear; it must return \(model, inputs\)"):
        _real(real_project, ["eager"], model="tbr_doctor_models:module_alone")


# ------------------------------------------------------------------ other environments, the command


def test_a_later_run_probes_in_the_environment_this_process_has_then(
    project: Registry, tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        "proj/fakes/tbr_doctor_env.py",
        "import os\n"
        "def fn(gm, inputs):\n"
        "    for var, value in (('TBR_MARK', 'on'), ('TORCH_BACKENDS_DENY', 'tbr-none')):\n"
        "        if os.environ.get(var) != value:\n"
        "            raise RuntimeError(f'{var} is {os.environ.get(var)!r}')\n"
        "    return gm.forward\n",
    )
    (tmp_path / "proj" / "backends.toml").write_text(
        MANIFEST + '[backends.env_spy]\ntarget = "tbr_doctor_env:fn"\n'
    )
    registry = Registry(cwd=tmp_path / "proj", environ={}, sources=("project", "torch"))
    [before] = tbr.doctor(["env_spy"], registry=registry, level="forward")
    assert before.status == "compile-error"
    assert before.reason.endswith("RuntimeError: TBR_MARK is None")
    monkeypatch.setenv("TBR_MARK", "on")  # as torchrun or a job script sets a variable
    [after] = tbr.doctor(["env_spy"], registry=registry, level="forward")
    assert after.reason.endswith("RuntimeError: TORCH_BACKENDS_DENY is None")
    monkeypatch.setenv("TORCH_BACKENDS_DENY", "tbr-none")  # this package's own, too
    [ours] = tbr.doctor(["env_spy"], registry=registry, level="forward")
    assert ours.status == "ok", ours.reason


def test_runs_side_by_side_and_a_forked_child_leave_each_others_probes_alone(
    project: Registry, tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    write("proj/fakes/tbr_doctor_slow.py", SLOW)
    write("proj/fakes/tbr_doctor_bad_model.py", "def make():\n    raise RuntimeError('no')\n")
    (tmp_path / "proj" / "backends.toml").write_text(
        MANIFEST + '[backends.slow]\ntarget = "tbr_doctor_slow:fn"\n'
    )
    registry = Registry(cwd=tmp_path / "proj", environ={}, sources=("project", "torch"))
    found: list[Verdict] = []
    slow = threading.Thread(
        target=lambda: found.extend(tbr.doctor(["slow"], registry=registry, level="forward"))
    )
    slow.start()
    time.sleep(1)  # while it is probed: another run's model fails, the environment changes,
    with pytest.raises(ModelError, match="cannot be built"):
        tbr.doctor(["fine"], registry=registry, model="tbr_doctor_bad_model:make")
    monkeypatch.setenv("TBR_ANOTHER_RUN", "1")
    [other] = tbr.doctor(["fine"], registry=registry, level="forward")
    child = os.fork()  # and a forked child ends as a program does, running its exit hooks
    if child == 0:  # pragma: no cover - the child only exits
        import atexit

        with contextlib.redirect_stderr(open(os.devnull, "w")):
            atexit._run_exitfuncs()
        os._exit(0)
    os.waitpid(child, 0)
    slow.join()
    assert other.status == "ok", other.reason
    assert [(v.status, v.reason) for v in found] == [("ok", "")]


def test_the_registrys_environment_and_policy_hold_in_the_probe(
    project: Registry, tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    extra = write(
        "site.toml",
        'python-path = ["proj/fakes"]\n[backends.only_here]\ntarget = "tbr_doctor_fakes:fine"\n',
    )
    make_dist("tbr-denied", "1.0", {"denied_ep": "tbr_doctor_fakes:explode"})
    environ = {"TORCH_BACKENDS_PATH": str(extra), "TORCH_BACKENDS_DENY": "tbr-denied"}
    own = Registry(cwd=tmp_path / "proj", environ=environ)
    [verdict] = tbr.doctor(["only_here"], registry=own, level="forward")  # not in os.environ
    assert verdict.status == "ok", verdict.reason
    with pytest.raises(UnknownBackendError, match="denied by TORCH_BACKENDS_DENY"):
        tbr.doctor(["denied_ep"], registry=own)


def test_the_command_prints_a_table_or_json_and_exits_1_on_any_failure(
    project: Registry, tmp_path: Path
) -> None:
    command = _command(tmp_path)
    good = command("doctor", "fine", "fallback")
    assert good.returncode == 0, good.stderr
    header, *rows = good.stdout.splitlines()
    assert header.split() == ["NAME", "STATUS", "LEVEL", "SECONDS", "REASON"]
    # A chain as it ran: the member it compiled with, its select and its verify.
    assert sorted(row.split()[:3] for row in rows) == [
        ["fallback", "->", "fine"],
        ["fine", "ok", "backward"],
    ]
    [chain] = [row for row in rows if row.startswith("fallback")]
    assert chain.endswith("select first, verify none")
    bad = command("doctor", "fine", "explodes", "fallback", "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert list(report) == ["verdicts"]
    rows = report["verdicts"]
    assert [(r["name"], r["status"], r["level"], r["member"]) for r in rows] == [
        ("fallback", "ok", 4, "fine"),
        ("fine", "ok", 4, None),
        ("explodes", "compile-error", 3, None),
    ]
    how = [(r["select"], r["verify"]) for r in rows]
    assert how == [("first", "none"), (None, None), (None, None)]
    assert {"name", "status", "level", "reason", "seconds"} <= set(rows[0])
    # Timing is tune's: --bench is a usage error that says so, and probes nothing.
    bench = command("doctor", "fine", "--bench")
    assert (bench.returncode, bench.stdout) == (2, "")
    assert bench.stderr == (
        "torch-backends: error: --bench is retired: doctor no longer times backends;"
        " 'torch-backends tune -- COMMAND' times a select = \"fastest\" chain's members on"
        " your own graphs\n"
    )
    assert "--bench" not in command("doctor", "--help").stdout
    # A report, not a memory: nothing of it shows in a listing.
    listed = command("list", "--no-torch", "--json").stdout
    assert all("doctor" not in row for row in json.loads(listed))
    assert command("list", "--no-torch").stdout.splitlines()[0].split() == [
        "NAME",
        "TAGS",
        "SOURCE",
        "TARGET",
    ]


def test_a_model_that_hangs_exits_or_kills_its_probe_is_the_users_error_not_the_backends(
    project: Registry, tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        "proj/fakes/tbr_doctor_dying_models.py",
        "import os, sys, time\ndef hangs():\n    time.sleep(600)\ndef exits():\n    os._exit(3)\n"
        "def gives_up():\n    sys.exit('no weights downloaded')\n",
    )
    command = _command(tmp_path)
    done = command("doctor", "fine", "--model", "tbr_doctor_dying_models:exits")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "torch-backends: error: --model 'tbr_doctor_dying_models:exits' ended its probe before"
        " any backend ran: exited with status 3 without a verdict\n"
    )
    done = command("doctor", "fine", "--model", "tbr_doctor_dying_models:gives_up")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "torch-backends: error: --model 'tbr_doctor_dying_models:gives_up' cannot be built:"
        " SystemExit: no weights downloaded\n"
    )
    # A model gets the start-up minute (or the time limit, if longer) to build and run.
    monkeypatch.setattr("torch_backend_registry._doctor.processes.STARTUP", 2.0)
    with pytest.raises(ModelError, match="was not built and run within 2 s, before any backend"):
        tbr.doctor(["fine"], registry=project, model="tbr_doctor_dying_models:hangs", timeout=1)


def test_the_command_judges_at_the_level_asked_and_names_a_bad_model(
    project: Registry, tmp_path: Path
) -> None:
    command = _command(tmp_path)

    def doctor(*args: str) -> Done:
        return command("doctor", *args)

    assert doctor("forward_only", "--level", "forward").returncode == 0
    assert doctor("forward_only").returncode == 1
    bad_arguments = (
        ("--timeout", "0"),
        ("--timeout", "inf"),
        ("--timeout", "soon"),
        ("--level", "sideways"),
        ("--jobs", "0"),
        ("--device", "sideways"),
    )
    for bad in bad_arguments:
        done = doctor("fine", *bad)
        assert done.returncode == 2, bad
    model = doctor("fine", "--model", "tbr_no_such_models:make")
    assert model.returncode == 2
    assert model.stderr.strip() == (
        "torch-backends: error: --model 'tbr_no_such_models:make': no module"
        " 'tbr_no_such_models' on the import path or in a python-path folder"
    )
    unknown = doctor("fien")
    assert unknown.returncode == 1
    assert "unknown backend 'fien'. Did you mean 'fine'?" in unknown.stderr


def test_only_a_named_or_declared_backend_that_is_unavailable_fails_the_run(
    tmp_path: Path, write: WriteFn
) -> None:
    # PyTorch's tvm is unavailable here (as its GPU backends are on a CPU): one the project
    # reaches is reported and passes; named, or a backend the project declares that cannot
    # run here, it fails the run.
    fine = 'python-path = ["fakes"]\n[backends.fine]\ntarget = "tbr_doctor_fakes:fine"\n'
    write("proj/fakes/tbr_doctor_fakes.py", FAKES)
    write("proj/backends.toml", f'{fine}[backends.fast]\nchain = ["tvm", "fine"]\n')
    command = _command(tmp_path)
    reached = command("doctor", "--json", "--level", "forward")
    status = {row["name"]: row["status"] for row in json.loads(reached.stdout)["verdicts"]}
    assert status == {"fine": "ok", "fast": "ok", "tvm": "unavailable"}
    assert reached.returncode == 0, reached.stdout + reached.stderr
    assert command("doctor", "tvm").returncode == 1
    needs_trt = 'target = "tbr_doctor_fakes:fine"\nrequires = ["tbr_no_such_tensorrt"]\n'
    write("proj/backends.toml", f"{fine}[backends.needs_trt]\n{needs_trt}")
    declared = command("doctor", "--json", "--level", "forward")
    assert {row["name"]: row["status"] for row in json.loads(declared.stdout)["verdicts"]} == {
        "fine": "ok",
        "needs_trt": "unavailable",
    }
    assert declared.returncode == 1


def test_a_model_beside_the_manifest_is_found_from_its_folder_and_a_loop_is_no_missing_part(
    tmp_path: Path,
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "models_here.py").write_text(
        "import torch\ndef make():\n    return torch.nn.Linear(2, 2), (torch.randn(1, 2),)\n"
    )
    (project / "backends.toml").write_text(
        '[backends.good]\ntarget = "torch._dynamo.backends.debugging:eager"\n'
        '[backends.loop]\nchain = ["loop2"]\n[backends.loop2]\nchain = ["loop"]\n'
        '[backends.broken]\ntargt = "models_here:make"\naliases = ["br"]\n'
    )
    done = torch_backends(
        *("doctor", "good", "loop", "broken", "br", "--json", "--model", "models_here:make"),
        *("--level", "forward", "--jobs", "2"),
        cwd=project,
        check=None,
    )
    verdicts = {v["name"]: v for v in json.loads(done.stdout)["verdicts"]}
    assert verdicts["good"]["status"] == "ok", done.stderr
    # A chain that names itself cannot be loaded as written: not "unavailable here".
    assert (verdicts["loop"]["status"], verdicts["loop"]["level_name"]) == (
        "import-error",
        "import",
    )
    assert "names itself" in verdicts["loop"]["reason"]
    # A table that cannot be used as written is a verdict too: the other names are probed.
    broken = verdicts["broken"]
    assert (broken["status"], broken["level_name"]) == ("import-error", "import")
    assert "backends.toml:8: backends.broken.targt: unknown key 'targt'" in broken["reason"]
    assert verdicts["br"]["reason"] == broken["reason"]  # asked by its alias: the same


def test_a_backend_that_kills_the_server_spares_the_probes_beside_it(project: Registry) -> None:
    # Last: the server starts again, and imports PyTorch again, for whatever comes after.
    names = ["kills_the_server", "fine"]  # side by side
    verdicts = tbr.doctor(names, registry=project, level="forward", jobs=2)
    assert {v.name: v.status for v in verdicts} == dict.fromkeys(names, "ok")
