"""torch-backends doctor: each backend in its own subprocess, each failure its own status.

Assertions are about statuses, levels and reasons, never about timings.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
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
import os, threading, time
import torch

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

def hang(gm, example_inputs):
    time.sleep(3600)

def leak(gm, example_inputs):
    threading.Thread(target=time.sleep, args=(3600,)).start()  # never joined
    return gm.forward

def fine(gm, example_inputs):
    return gm.forward

def escape(gm, example_inputs):
    # A helper in a session of its own, holding this process's output pipe; then a hang.
    import pathlib, subprocess, sys
    helper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(90)"], start_new_session=True
    )
    (pathlib.Path(__file__).parent / "helper.pid").write_text(str(helper.pid))
    time.sleep(3600)

def daemon(gm, example_inputs):
    # A helper that leaves its parent and its session (as a daemon does); then it works.
    import pathlib, subprocess, sys
    code = "import os, sys, time; os.fork() and os._exit(0); os.setsid(); "
    code += "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(90)"
    pid = pathlib.Path(__file__).parent / "daemon.pid"
    subprocess.run([sys.executable, "-c", code, str(pid)], start_new_session=True)
    while not pid.exists() or not pid.read_text():
        time.sleep(0.01)
    return gm.forward

def chatty(gm, example_inputs):
    import sys
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
[backends.hangs]
target = "tbr_doctor_fakes:hang"
[backends.leaks]
target = "tbr_doctor_fakes:leak"
[backends.broken_import]
target = "tbr_doctor_broken:fn"
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
[backends.daemon]
target = "tbr_doctor_fakes:daemon"
[backends.chatty]
target = "tbr_doctor_fakes:chatty"
[backends.noisy_import]
target = "tbr_doctor_noisy:fn"
[backends.missing_module]
target = "tbr_doctor_no_such_module_zz:fn"
[backends.fixable]
target = "tbr_doctor_fixable:compile"
"""

NOISY = "import sys\nsys.stdout.write('loading kernels... ')\nraise ImportError('libfoo.so')\n"
BROKEN = "def compile(gm, inputs):\n    raise RuntimeError('broken')\n"
FIXED = "def compile(gm, inputs):\n    return gm.forward  # fixed\n"
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
    write("proj/fakes/tbr_doctor_noisy.py", NOISY)
    write("proj/fakes/tbr_doctor_fixable.py", BROKEN)
    write("proj/backends.toml", MANIFEST)
    return Registry(cwd=tmp_path / "proj", environ={}, sources=("project", "torch"))


def test_every_failure_gets_its_own_status_and_spares_the_others(project: Registry) -> None:
    names = [
        "explodes",
        "wrong",
        "forward_only",
        "aborts",
        "hangs",
        "leaks",
        "broken_import",
        "needs_trt",
        "fallback",
        "fine",
    ]
    # A time limit some four times what the slowest of the others takes on a loaded machine.
    verdicts = {v.name: v for v in tbr.doctor(names, registry=project, timeout=8, jobs=2)}
    seen = {name: (v.status, v.level_name) for name, v in verdicts.items()}
    assert seen == {
        "explodes": ("compile-error", "forward"),
        "wrong": ("wrong-result", "forward"),
        "forward_only": ("backward-error", "backward"),
        "aborts": ("crashed", "forward"),
        "hangs": ("timeout", "forward"),
        "leaks": ("ok", "backward"),
        "broken_import": ("import-error", "import"),
        "needs_trt": ("unavailable", "requirements"),
        "fallback": ("ok", "backward"),
        "fine": ("ok", "backward"),
    }
    assert "no GPU here" in verdicts["explodes"].reason
    assert verdicts["wrong"].reason.startswith("forward output 0 differs from eager beyond rtol=")
    assert "gives no backward pass" in verdicts["forward_only"].reason
    assert verdicts["aborts"].reason.startswith("killed by SIGABRT")
    assert verdicts["hangs"].reason == "no verdict after 8 s at level 3 (forward); killed"
    assert "a missing shared library" in verdicts["broken_import"].reason
    assert verdicts["needs_trt"].reason == "missing tbr_no_such_tensorrt"
    assert verdicts["fallback"].member == "fine"  # the member the chain would use
    # Best first: the working ones lead, the timeout comes last.
    order = [v.status for v in tbr.doctor(names, registry=project, timeout=8)]
    assert order[:3] == ["ok", "ok", "ok"]
    assert order[-1] == "timeout"


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


def test_bench_times_compiling_and_a_call_against_eager(project: Registry) -> None:
    [verdict] = tbr.doctor(["fine"], registry=project, bench=True)
    assert (verdict.status, verdict.level_name) == ("ok", "bench")
    assert verdict.compile_seconds is not None
    assert verdict.compile_seconds > 0
    assert verdict.per_call_seconds is not None
    assert verdict.eager_seconds is not None
    # The speed-up is eager's time over the backend's, as rounded to three places.
    expected = verdict.eager_seconds / verdict.per_call_seconds
    assert verdict.speedup == pytest.approx(expected, rel=1e-2, abs=1e-3)


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
        "    return torch.nn.ReLU(), (torch.randn(4, 4, requires_grad=True),)\n",
    )
    # Run eagerly before any backend is imported: no backend is blamed for the model.
    with pytest.raises(ModelError, match="cannot be run: RuntimeError: mat1 and mat2"):
        tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:broken")
    with pytest.raises(ModelError, match="not_a_pair"):
        tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:not_a_pair")
    with pytest.raises(ModelError, match="--device 'sideways'"):
        tbr.doctor(["fine"], registry=project, device="sideways")
    # Nothing to differentiate: the most it can say is that the forward pass is right.
    [plain] = tbr.doctor(["fine"], registry=project, model="tbr_doctor_models:no_parameters")
    assert (plain.status, plain.level_name) == ("ok", "forward")


def test_a_model_of_a_project_of_thousands_of_modules_is_probed(
    project: Registry, write: WriteFn
) -> None:
    # Each report carries the code imported so far (a stamp of each project module): with
    # thousands of them (PyTorch built from source, a large checkout) it is larger than a
    # pipe's read, and must still arrive whole.
    names = [f"module_{i:04d}_of_a_large_checkout" for i in range(3000)]
    for name in names:
        write(f"proj/fakes/tbr_doctor_large/{name}.py", "X = 1\n")
    write("proj/fakes/tbr_doctor_large/__init__.py", "".join(f"from . import {n}\n" for n in names))
    write(
        "proj/fakes/tbr_doctor_large_model.py",
        "import torch, tbr_doctor_large\n"
        "def make():\n"
        "    torch.manual_seed(1)\n"
        "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),)\n",
    )
    [verdict] = tbr.doctor(["fine"], registry=project, model="tbr_doctor_large_model:make")
    assert (verdict.status, verdict.level) == ("ok", 4), verdict


def test_a_verdict_is_an_immutable_value_that_survives_json() -> None:
    verdict = Verdict("fast", "ok", 5, seconds=1.5, speedup=2.0)
    again = Verdict.from_json(verdict.as_json())
    assert again == verdict
    assert hash(again) == hash(verdict)
    assert list(verdict.as_json()) == [
        "name", "status", "level", "reason", "seconds", "member", "compile_seconds",
        "per_call_seconds", "eager_seconds", "speedup", "spread", "level_name",
    ]  # fmt: skip
    assert verdict.as_json()["level_name"] == verdict.level_name == "bench"
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.status = "crashed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Verdict.from_json({"name": "fast"})  # a report missing its status


# ------------------------------------------------------------------ running code safely


def test_the_working_folder_is_not_on_the_probes_import_path(
    project: Registry, tmp_path: Path
) -> None:
    # Someone else's folder: a json.py there would run as whoever runs doctor there.
    marker = tmp_path / "planted-json-ran"
    (tmp_path / "proj" / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    [verdict] = tbr.doctor(["fine"], registry=project)
    assert verdict.status == "ok"
    assert not marker.exists()


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
    [verdict] = tbr.doctor(["spy"], registry=spied)
    assert verdict.status == "ok", verdict.reason
    cmdline = (tmp_path / "proj" / "fakes" / "cmdline").read_bytes()
    assert b"hunter2" not in cmdline
    assert len(cmdline) < 2000


def test_whatever_a_backend_does_doctor_returns_at_the_time_limit(
    project: Registry, tmp_path: Path
) -> None:
    code = (
        "import sys, torch_backend_registry as t\n"
        f"r = t.Registry(cwd={str(tmp_path / 'proj')!r}, environ={{}}, sources=('project',))\n"
        "[v] = t.doctor(['escapes'], registry=r, timeout=5)\n"
        "print(v.status, v.level)\n"
    )
    try:
        # A hang of doctor itself shows as this running out (the helper sleeps 90 s).
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    finally:
        helper = tmp_path / "proj" / "fakes" / "helper.pid"
        if helper.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(helper.read_text()), signal.SIGKILL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["timeout", "3"]


def test_no_process_a_backend_started_outlives_its_probe(project: Registry, tmp_path: Path) -> None:
    pid = tmp_path / "proj" / "fakes" / "daemon.pid"
    try:
        [verdict] = tbr.doctor(["daemon"], registry=project, level="forward", timeout=20)
        assert verdict.status == "ok", verdict.reason
        with pytest.raises(ProcessLookupError):  # gone, not left to init
            os.kill(int(pid.read_text()), 0)
    finally:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.kill(int(pid.read_text()), signal.SIGKILL)


def test_what_a_backend_prints_is_kept_to_its_tail(project: Registry, tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import resource, torch_backend_registry as t
        r = t.Registry(cwd={str(tmp_path / "proj")!r}, environ={{}}, sources=("project",))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        verdicts = t.doctor(["chatty", "noisy_import"], registry=r, jobs=1)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        for v in verdicts:
            print(repr((v.name, v.status, v.reason)))
        print(grown // 1024)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    *verdicts, grown_mb = done.stdout.splitlines()
    assert int(grown_mb) < 100  # while 200 MB went by
    seen = {name: rest for name, *rest in map(ast.literal_eval, verdicts)}
    assert seen["chatty"][0] == "compile-error"
    assert "after the noise" in seen["chatty"][1]
    # A verdict travels on its own channel: output without a newline changes nothing.
    assert seen["noisy_import"][0] == "import-error"
    assert "libfoo.so" in seen["noisy_import"][1]


# ------------------------------------------------------------------ verdicts follow the code


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
    cache = Path(project.context.cwd or ".").parent / "cache" / "torch-backend-registry"
    assert not (cache / "verdicts").exists()  # nothing was probed


def test_one_name_and_a_timedelta_are_taken_as_verify_consistent_takes_them(
    project: Registry,
) -> None:
    from datetime import timedelta

    [one] = tbr.doctor("fine", registry=project, level="forward", timeout=timedelta(minutes=1))
    assert (one.name, one.status) == ("fine", "ok")
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        tbr.doctor(["fine"], registry=project, timeout="soon")  # type: ignore[arg-type]


def test_an_inference_backend_is_ok_at_the_forward_level(project: Registry) -> None:
    [backward] = tbr.doctor(["forward_only"], registry=project)
    [forward] = tbr.doctor(["forward_only"], registry=project, level="forward")
    assert (backward.status, forward.status, forward.level_name) == (
        "backward-error",
        "ok",
        "forward",
    )


def test_a_reason_says_its_cause_once(project: Registry) -> None:
    [verdict] = tbr.doctor(["missing_module"], registry=project)
    assert verdict.status == "import-error"
    assert verdict.reason.count("No module named 'tbr_doctor_no_such_module_zz'") == 1


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

# Built with PyTorch's aot_autograd, as real backends are, with a backward that doubles
# every gradient: right forward, wrong training.
doubles_gradients = aot_autograd(fw_compiler=_forward, bw_compiler=_doubled)

def points_elsewhere(gm, example_inputs):
    # As IREE prints it: the error, the (long) source line it is about, a caret under it.
    print("source.mlir:2:3: error: unhandled torch type: '!torch.none'", file=sys.stderr)
    print("  func.func @main(" + "%arg0: !torch.vtensor<[4,16],f32>, " * 12 + ")", file=sys.stderr)
    print("  ^", file=sys.stderr)
    raise RuntimeError("JIT compilation failed. See diagnostics.")

def stalls_once(gm, example_inputs):
    calls = []
    def run(*args):
        calls.append(1)
        if len(calls) == 1000:  # one round of the timing stalls, as on a busy machine
            time.sleep(0.2)
        return gm(*args)
    return run
"""

SLOWS_EAGER = """
import time
import torch

# Importing it slows every later call of an eager Linear (as a plugin's threads may).
_forward = torch.nn.Linear.forward
def _slow(self, x):
    time.sleep(0.002)
    return _forward(self, x)
torch.nn.Linear.forward = _slow

def compile(gm, example_inputs):
    return gm.forward
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
[backends.points_elsewhere]
target = "tbr_doctor_real:points_elsewhere"
[backends.stalls_once]
target = "tbr_doctor_real:stalls_once"
[backends.slows_eager]
target = "tbr_doctor_slows:compile"
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
    (fakes / "tbr_doctor_slows.py").write_text(SLOWS_EAGER)
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
    names = ["doubles_gradients", "points_elsewhere", "needs_other_torch", "prints_why", "eager"]
    return _real(real_project, names)


def test_the_backward_level_compares_gradients(real_verdicts: dict[str, Verdict]) -> None:
    doubled = real_verdicts["doubles_gradients"]
    assert (doubled.status, doubled.level_name) == ("wrong-result", "backward")
    assert doubled.reason.startswith("gradient 0 differs from eager beyond rtol=")
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
        assert verdict.reason.startswith("verified in shapes and types only: the model draws")
    with pytest.raises(ModelError, match=r"returned Linear; it must return \(model, inputs\)"):
        _real(real_project, ["eager"], model="tbr_doctor_models:module_alone")


# ------------------------------------------------------------------ other environments, the command
# Last, so that the tests above share their process's probe server: the tests below run
# doctor in another environment, or as the command does (its import path is another), and
# so start servers of their own, as another process would; the command's runs share one.


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
    # This package's own variables, too (its probe server is started without them).
    monkeypatch.setenv("TORCH_BACKENDS_DENY", "tbr-none")
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
    tbr.doctor(["fine"], registry=registry, level="forward")  # the server, warm
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
    [verdict] = tbr.doctor(["only_here"], registry=own)  # not in this process's environment
    assert verdict.status == "ok", verdict.reason
    with pytest.raises(UnknownBackendError, match="denied by TORCH_BACKENDS_DENY"):
        tbr.doctor(["denied_ep"], registry=own)


def test_the_command_prints_a_table_or_json_and_exits_1_on_any_failure(
    project: Registry, tmp_path: Path
) -> None:
    command = _command(tmp_path)
    good = command("doctor", "fine", "leaks")
    assert good.returncode == 0, good.stderr
    lines = good.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "LEVEL", "SECONDS", "REASON"]
    assert [line.split()[:2] for line in lines[1:]] == [["fine", "ok"], ["leaks", "ok"]]
    bad = command("doctor", "fine", "explodes", "--json")
    assert bad.returncode == 1
    rows = json.loads(bad.stdout)
    assert [(r["name"], r["status"], r["level"]) for r in rows] == [
        ("fine", "ok", 4),
        ("explodes", "compile-error", 3),
    ]
    assert {"name", "status", "level", "reason", "seconds"} <= set(rows[0])
    # A report, not a memory: nothing of it shows in a listing, and a run again probes again.
    listed = command("list", "--no-torch", "--json").stdout
    assert all("doctor" not in row for row in json.loads(listed))
    assert command("list", "--no-torch").stdout.splitlines()[0].split() == [
        "NAME",
        "TAGS",
        "SOURCE",
        "TARGET",
    ]


def _children() -> set[int]:
    """The processes this one started that are still running (or not yet waited for)."""
    found = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path("/proc", entry, "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.add(int(entry))
    return found


def test_a_run_refused_for_an_unknown_name_leaves_no_probe_server_behind(
    project: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe server starts before the names are checked (it imports PyTorch meanwhile);
    # a refused run must still let it go, or a process that runs the command again keeps
    # one server (and PyTorch's memory) per refused run.
    command = _command(tmp_path)
    assert "unknown backend 'no_such_backend'" in command("doctor", "no_such_backend").stderr
    monkeypatch.setenv("TBR_ANOTHER_SERVER", "1")  # the next run needs a server of its own
    before = _children()
    assert command("doctor", "fine").returncode == 0
    assert len(_children()) <= len(before)  # the new server replaced the refused run's


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
    tbr.doctor(["fine"], registry=project, level="forward")  # PyTorch imported meanwhile
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
    # PyTorch's GPU and third-party backends are unavailable on this CPU: a run over every
    # listed backend reports them and passes; one that names them, or whose manifest
    # declares one it cannot run, fails. (The plugins are left out to keep the run short.)
    fine = 'python-path = ["fakes"]\n[backends.fine]\ntarget = "tbr_doctor_fakes:fine"\n'
    write("proj/fakes/tbr_doctor_fakes.py", FAKES)
    write("proj/backends.toml", fine)
    env = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TORCH_BACKENDS_DENY": "openvino,iree-turbine",
    }

    def doctor(*args: str) -> Done:
        return torch_backends(
            "doctor", "--level", "forward", *args, cwd=tmp_path / "proj", env=env, check=None
        )

    everything = doctor("--json")
    status = {row["name"]: row["status"] for row in json.loads(everything.stdout)}
    assert status["fine"] == "ok"
    assert status["tvm"] == "unavailable"
    assert everything.returncode == 0, everything.stdout + everything.stderr
    assert doctor("tvm").returncode == 1
    needs_trt = 'target = "tbr_doctor_fakes:fine"\nrequires = ["tbr_no_such_tensorrt"]\n'
    write("proj/backends.toml", f"{fine}[backends.needs_trt]\n{needs_trt}")
    declared = doctor("--json")
    assert {row["name"]: row["status"] for row in json.loads(declared.stdout)}["needs_trt"] == (
        "unavailable"
    )
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
    verdicts = {v["name"]: v for v in json.loads(done.stdout)}
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


def test_bench_times_eager_before_any_backend_code_and_ranks_what_it_can(
    real_project: Path,
) -> None:
    # One thread a probe: the times are the backend's, not those of threads waiting for a
    # core that the machine's other work holds.
    one = {"OMP_NUM_THREADS": "1"}
    names = ["slows_eager", "stalls_once", "eager"]
    done = torch_backends("doctor", "--bench", "--json", *names, cwd=real_project, env=one)
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    # Eager was timed before the backend slowed eager's Linear: its speed-up is eager's own,
    # not some 50x from a slowed reference.
    assert rows["slows_eager"]["speedup"] < 5
    # One stalled round of fifteen does not decide the spread: it stalls some 20 times
    # longer than a round (10 ms), which the range from fastest to slowest would show as a
    # spread near 20; the middle half of the rounds moves little, even on a busy machine.
    assert rows["stalls_once"]["spread"] < 5
    table = torch_backends("doctor", "--bench", *names[1:], cwd=real_project, env=one).stdout
    assert "RANK" in table.splitlines()[0].split()
