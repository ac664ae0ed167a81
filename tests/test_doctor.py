"""torch-backends doctor: each backend in its own subprocess, each failure its own status.

Assertions are about statuses, levels and reasons, never about timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import Registry, Verdict

from .conftest import WriteFn

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
"""


@pytest.fixture
def project(tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write("proj/fakes/tbr_doctor_fakes.py", FAKES)
    write("proj/fakes/tbr_doctor_broken.py", "raise ImportError('a missing shared library')\n")
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
    verdicts = {v.name: v for v in tbr.doctor(names, registry=project, timeout=60, jobs=2)}
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
    assert verdicts["wrong"].reason.startswith("forward differs from eager beyond rtol=")
    assert "does not require grad" in verdicts["forward_only"].reason
    assert verdicts["aborts"].reason.startswith("killed by SIGABRT")
    assert verdicts["hangs"].reason == "no verdict after 60 s at level 3 (forward); killed"
    assert "a missing shared library" in verdicts["broken_import"].reason
    assert verdicts["needs_trt"].reason == "missing tbr_no_such_tensorrt"
    assert verdicts["fallback"].member == "fine"  # the member the chain would use
    # Best first: the working ones lead, the timeout comes last.
    order = [v.status for v in tbr.doctor(names, registry=project, timeout=60)]
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
    assert verdict.speedup == pytest.approx(verdict.eager_seconds / verdict.per_call_seconds, 1e-2)


def test_verdicts_are_remembered_until_something_changes(
    project: Registry, tmp_path: Path, write: WriteFn
) -> None:
    [first] = tbr.doctor(["explodes"], registry=project)
    assert (first.status, first.cached) == ("compile-error", False)
    [again] = tbr.doctor(["explodes"], registry=project)
    assert (again.status, again.cached) == ("compile-error", True)
    # Another manifest content is another key: probed again.
    fixed = MANIFEST.replace('"tbr_doctor_fakes:explode"', '"tbr_doctor_fakes:fine"')
    write("proj/backends.toml", fixed)
    project.refresh()
    [changed] = tbr.doctor(["explodes"], registry=project)
    assert (changed.status, changed.cached) == ("ok", False)
    [fresh] = tbr.doctor(["explodes"], registry=project, fresh=True)
    assert fresh.cached is False
    cache = tmp_path / "cache" / "torch-backend-registry"
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    [entry] = (cache / "verdicts").iterdir()
    assert oct(entry.stat().st_mode & 0o777) == "0o600"


def test_a_corrupt_cache_is_ignored_and_rebuilt(project: Registry, tmp_path: Path) -> None:
    tbr.doctor(["needs_trt"], registry=project)
    [entry] = (tmp_path / "cache" / "torch-backend-registry" / "verdicts").iterdir()
    entry.write_bytes(b"\x00{not an entry")
    [verdict] = tbr.doctor(["needs_trt"], registry=project)
    assert (verdict.status, verdict.cached) == ("unavailable", False)
    [again] = tbr.doctor(["needs_trt"], registry=project)
    assert (again.status, again.cached) == ("unavailable", True)


def test_a_chain_may_skip_members_doctor_found_failing(
    project: Registry, write: WriteFn, tmp_path: Path
) -> None:
    import logging

    import torch

    # The final manifest first: its content is part of what a verdict is remembered by.
    write(
        "proj/backends.toml",
        MANIFEST + '[backends.careful]\nchain = ["explodes", "fine"]\nskip-known-failures = true\n',
    )
    project.refresh()
    tbr.doctor(["explodes"], registry=project)  # remembered: compile-error here
    tbr.install(project)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch_backend_registry")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        torch._dynamo.reset()
        torch.compile(torch.nn.Linear(2, 2), backend="careful")(torch.ones(1, 2))
    finally:
        logger.removeHandler(handler)
    assert any("skipping 'explodes': doctor found compile-error here" in r for r in records)
    assert any("compiled with 'fine'" in r for r in records)


def test_the_command_prints_a_table_or_json_and_exits_1_on_any_failure(
    project: Registry, tmp_path: Path
) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "torch_backend_registry", "doctor", *args],
            cwd=tmp_path / "proj",
            env=environ,
            capture_output=True,
            text=True,
            timeout=600,
        )

    good = doctor("fine", "leaks")
    assert good.returncode == 0, good.stderr
    lines = good.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "LEVEL", "SECONDS", "REASON"]
    assert [line.split()[:2] for line in lines[1:]] == [["fine", "ok"], ["leaks", "ok"]]
    bad = doctor("fine", "explodes", "--json")
    assert bad.returncode == 1
    rows = json.loads(bad.stdout)
    assert [(r["name"], r["status"], r["level"]) for r in rows] == [
        ("fine", "ok", 4),
        ("explodes", "compile-error", 3),
    ]
    assert {"name", "status", "level", "reason", "seconds"} <= set(rows[0])
    # Remembered: explain and list show the last verdict here.
    explained = subprocess.run(
        [sys.executable, "-m", "torch_backend_registry", "explain", "explodes", "--no-torch"],
        cwd=tmp_path / "proj", env=environ, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    [said] = [line for line in explained.splitlines() if line.startswith("  doctor:")]
    assert said.startswith("  doctor:      compile-error: BackendCompilerFailed")
    assert said.endswith("RuntimeError: no GPU here (last probe here, forward level)")
    listed = subprocess.run(
        [sys.executable, "-m", "torch_backend_registry", "list", "--no-torch", "--json"],
        cwd=tmp_path / "proj", env=environ, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    doctor_of = {row["name"]: row["doctor"] for row in json.loads(listed)}
    assert doctor_of["explodes"]["status"] == "compile-error"
    assert doctor_of["wrong"] is None
    table = subprocess.run(
        [sys.executable, "-m", "torch_backend_registry", "list", "--no-torch"],
        cwd=tmp_path / "proj", env=environ, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert table[0].split() == ["NAME", "TAGS", "SOURCE", "TARGET", "DOCTOR"]
    assert next(row for row in table if row.startswith("explodes")).endswith("compile-error")


def test_a_users_own_model_can_be_the_probe(project: Registry, write: WriteFn) -> None:
    # The probe runs in the project's folder, where `python -m` finds this module.
    write(
        "proj/tbr_doctor_model.py",
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
    [missing] = tbr.doctor(["fine"], registry=project, model="tbr_no_such_module:make")
    assert missing.status == "compile-error"
    assert missing.reason.startswith("the model could not be built: ModuleNotFoundError")


def test_a_verdict_is_an_immutable_value_that_survives_json() -> None:
    verdict = Verdict("fast", "ok", 5, seconds=1.5, speedup=2.0)
    remembered = Verdict.from_json(verdict.as_json(), cached=True)
    assert remembered == verdict  # `cached` tells them apart, and takes no part in comparing
    assert (remembered.cached, verdict.cached) == (True, False)
    assert hash(remembered) == hash(verdict)
    assert list(verdict.as_json()) == [
        "name", "status", "level", "reason", "seconds", "member", "compile_seconds",
        "per_call_seconds", "eager_seconds", "speedup", "cached", "level_name",
    ]  # fmt: skip
    assert verdict.as_json()["level_name"] == verdict.level_name == "bench"
    assert "cached" not in verdict.facts()
    with pytest.raises(AttributeError):
        verdict.status = "crashed"
    with pytest.raises(TypeError):
        Verdict.from_json({"name": "fast"})  # a remembered verdict missing its status
