"""``select = "fastest"``: the fastest member that verifies, timed, remembered, and one choice
for every rank; and ``by-device`` entries with torch.compile's settings of their own.

Members of known speed are real compiler functions whose compiled graphs sleep; which member
ran is read from what the members did (``RAN``), never from the library's log."""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import BackendChainError, Registry

from .conftest import WriteFn, torch_backends

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

MEMBERS = """
import os, time, weakref
import torch

RAN = []        # the member whose compiled graph ran, each call
COMPILED = []   # the member asked to compile, each time
ALIVE = weakref.WeakValueDictionary()  # what each member compiled, while it lives

class Compiled:
    def __init__(self, name, gm, delay, change):
        self.name, self.gm, self.delay, self.change = name, gm, delay, change
    def __call__(self, *args):
        RAN.append(self.name)
        if self.delay:
            time.sleep(self.delay)
        out = self.gm(*args)
        return self.change(out) if self.change else out

def member(name, delay=0.0, change=None):
    def compiler(gm, example_inputs):
        COMPILED.append(name)
        compiled = Compiled(name, gm, delay() if callable(delay) else delay, change)
        ALIVE[f"{name}-{len(COMPILED)}"] = compiled
        return compiled
    compiler.__name__ = name
    return compiler

def _plus(amount):
    def change(out):
        if isinstance(out, (list, tuple)):
            return type(out)(o + amount for o in out)
        return out + amount
    return change

def _times(factor):
    def change(out):
        if isinstance(out, (list, tuple)):
            return type(out)(o * factor for o in out)
        return out * factor
    return change

fast = member("fast")
three_percent_off = member("three_percent_off", 0.0, _times(1.03))
slow = member("slow", 0.004)
slower = member("slower", 0.008)
wrong_and_fastest = member("wrong_and_fastest", 0.0, _plus(1.0))
near = member("near", 0.0036)

def fails(gm, example_inputs):
    COMPILED.append("fails")
    raise RuntimeError("no kernel for this device")

# Slow on the ranks it names in TBR_SLOW_ON (comma-separated), fast on the others.
def _slow_here():
    slow_on = os.environ.get("TBR_SLOW_ON", "").split(",")
    return 0.004 if os.environ.get("RANK", "0") in slow_on else 0.0
by_rank_a = member("by_rank_a", _slow_here)
by_rank_b = member("by_rank_b", lambda: 0.004 if _slow_here() == 0.0 else 0.0)
"""


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def members(make_module: Callable[..., str], module_name: str) -> ModuleType:
    import importlib

    return importlib.import_module(make_module(module_name, MEMBERS))


@pytest.fixture
def logged() -> Iterator[list[str]]:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch_backend_registry")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def fastest(
    write: WriteFn, members: ModuleType, chain: list[str], extra: str = "", **env: str
) -> tuple[Registry, str]:
    """A chain ``pick_UID`` of ``chain`` (the members module's functions) with select =
    "fastest", installed; the registry and the chain's name."""
    uid = uuid.uuid4().hex[:8]
    body = f"[backends.pick_{uid}]\nchain = [{', '.join(repr(f'{m}_{uid}') for m in chain)}]\n"
    body = body.replace("'", '"') + 'select = "fastest"\n' + extra
    body += "".join(
        f'[backends.{m}_{uid}]\ntarget = "{members.__name__}:{m}"\n' for m in dict.fromkeys(chain)
    )
    path = write("backends.toml", body)
    registry = Registry(cwd=path.parent, environ=env)
    tbr.install(registry)
    return registry, f"pick_{uid}"


def ran(members: ModuleType) -> list[str]:
    """The members whose compiled graph ran since last asked, without the suffix."""
    found = list(members.RAN)
    members.RAN.clear()
    return found


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# ------------------------------------------------------------------ the choice


def test_the_fastest_member_that_verifies_runs_the_graph_and_the_log_says_why(
    write: WriteFn, members: ModuleType, logged: list[str]
) -> None:
    _registry, name = fastest(write, members, ["slow", "wrong_and_fastest", "fails", "fast"])
    net, x = model(), torch.randn(5, 8)
    with torch.no_grad():
        out = torch.compile(net, backend=name)(x)
        assert torch.allclose(out, net(x))
        members.RAN.clear()
        torch.compile(net, backend=name)(x)
    assert ran(members) == ["fast"]
    assert any("skipping 'wrong_and_fastest" in r and "output 0 differs" in r for r in logged)
    assert any("skipping 'fails" in r and "no kernel for this device" in r for r in logged)
    [timed] = [r for r in logged if "; chose " in r]
    assert "slow_" in timed
    assert "fast_" in timed
    assert "x over 'slow_" in timed  # the speed-up over the first member that verified


def test_a_near_tie_keeps_the_order_the_chain_gives(write: WriteFn, members: ModuleType) -> None:
    # near is about 10% faster than slow: far less than min-speedup 2 asks, even where a
    # busy machine stretches one member's sleeps more than the other's.
    _registry, name = fastest(write, members, ["slow", "near"], "min-speedup = 2\n")
    with torch.no_grad():
        torch.compile(model(), backend=name)(torch.randn(5, 8))
        members.RAN.clear()
        torch.compile(model(), backend=name)(torch.randn(5, 8))
    assert ran(members) == ["slow"]


def test_a_training_step_is_timed_with_its_backward_and_trains(
    write: WriteFn, members: ModuleType, logged: list[str]
) -> None:
    _registry, name = fastest(write, members, ["slower", "fast"])
    net = model()
    twin = model()
    compiled = torch.compile(net, backend=name)
    x = torch.randn(5, 8)
    compiled(x).sum().backward()
    twin(x).sum().backward()
    for mine, theirs in zip(net.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(mine.grad, theirs.grad)
    members.RAN.clear()
    compiled(x).sum().backward()
    assert ran(members) == ["fast"]
    assert any("; chose 'fast_" in r for r in logged)


def test_every_member_failing_is_one_error_naming_each(write: WriteFn, members: ModuleType) -> None:
    _registry, name = fastest(write, members, ["fails", "wrong_and_fastest"])
    with pytest.raises(Exception, match="no member of fallback chain") as caught:
        torch.compile(model(), backend=name)(torch.randn(5, 8))
    error = getattr(caught.value, "inner_exception", caught.value)
    assert isinstance(error, BackendChainError)
    assert [member.split("_")[0] for member, _ in error.failures] == ["fails", "wrong"]


def test_the_members_not_chosen_and_what_they_compiled_do_not_live_on(
    write: WriteFn, members: ModuleType
) -> None:
    _registry, name = fastest(write, members, ["slow", "slower", "fast"])
    compiled = torch.compile(model(), backend=name)
    with torch.no_grad():
        compiled(torch.randn(5, 8))
    gc.collect()
    assert sorted(key.split("-")[0] for key in members.ALIVE) == ["fast"]


# ------------------------------------------------------------------ remembered


def test_a_choice_is_remembered_and_a_later_compile_compiles_only_the_chosen(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    _registry, name = fastest(write, members, ["slow", "fast"])
    with torch.no_grad():
        torch.compile(model(), backend=name)(torch.randn(5, 8))
    assert sorted(m.split("_")[0] for m in members.COMPILED) == ["fast", "slow"]
    # As a later process would: a registry read afresh, PyTorch's compile caches empty.
    torch._dynamo.reset()
    members.COMPILED.clear()
    tbr.install(Registry(cwd=tmp_path, environ={}))
    with torch.no_grad():
        torch.compile(model(), backend=name)(torch.randn(5, 8))
    assert [m.split("_")[0] for m in members.COMPILED] == ["fast"]
    explained = torch_backends("explain", name, cwd=tmp_path).stdout
    assert "  choices:     1 remembered here" in explained
    assert "fast_" in explained.split("choices:")[1]
    [choice] = json.loads(torch_backends("explain", name, "--json", cwd=tmp_path).stdout)["choices"]
    assert choice["member"].startswith("fast_")
    assert choice["first"].startswith("slow_")
    assert choice["speedup"] > 1.1
    # Asked to, it decides again.
    torch._dynamo.reset()
    members.COMPILED.clear()
    tbr.install(Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_SELECT": "fresh"}))
    with torch.no_grad():
        torch.compile(model(), backend=name)(torch.randn(5, 8))
    assert sorted(m.split("_")[0] for m in members.COMPILED) == ["fast", "slow"]


def test_what_decides_a_choice_decides_it_again_and_nothing_else_does(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    _registry, name = fastest(write, members, ["slow", "fast"])

    def compiles(size: int = 5, *, grad: bool = False) -> list[str]:
        torch._dynamo.reset()
        members.COMPILED.clear()
        tbr.install(Registry(cwd=tmp_path, environ={}))
        with torch.set_grad_enabled(grad):
            torch.compile(model(), backend=name)(torch.randn(size, 8))
        return sorted({m.split("_")[0] for m in members.COMPILED})

    assert compiles() == ["fast", "slow"]
    assert compiles() == ["fast"]  # the same graph: remembered
    assert compiles(size=7) == ["fast", "slow"]  # another shape
    assert compiles(grad=True) == ["fast", "slow"]  # a training step
    # A member's code edited: another member.
    path = Path(members.__file__ or "")
    path.write_text(path.read_text() + "\n# edited\n")
    assert compiles() == ["fast", "slow"]
    assert compiles() == ["fast"]
    # The chain's own keys.
    manifest = tmp_path / "backends.toml"
    manifest.write_text(
        manifest.read_text().replace('select = "fastest"', 'select = "fastest"\nmin-speedup = 1.2')
    )
    assert compiles() == ["fast", "slow"]


def test_a_graph_break_gives_graphs_decided_each_on_their_own(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    _registry, name = fastest(write, members, ["slow", "fast"])

    def f(x: Any) -> Any:
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return torch.tanh(y) + 1

    with torch.no_grad():
        torch.compile(f, backend=name)(torch.randn(5, 8))
    explained = json.loads(torch_backends("explain", name, "--json", cwd=tmp_path).stdout)
    assert len(explained["choices"]) == 2


def test_under_dynamic_shapes_one_choice_serves_every_size(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    _registry, name = fastest(write, members, ["slow", "fast"])
    for size in (5, 9):
        torch._dynamo.reset()
        members.COMPILED.clear()
        tbr.install(Registry(cwd=tmp_path, environ={}))
        with torch.no_grad():
            torch.compile(model(), backend=name, dynamic=True)(torch.randn(size, 8))
        compiled = sorted({m.split("_")[0] for m in members.COMPILED})
        assert compiled == (["fast", "slow"] if size == 5 else ["fast"])


# ------------------------------------------------------------------ the manifest


# Each case: a backend's table (its header on line 2), then the line, key and message.
WRONG = {
    "verify none": (
        'chain = ["e"]\nselect = "fastest"\nverify = "none"\n',
        5,
        "verify",
        "verifies",
    ),
    "min-speedup alone": ('chain = ["e"]\nmin-speedup = 1.2\n', 4, "min-speedup", "goes with"),
    "min-speedup below 1": (
        'chain = ["e"]\nselect = "fastest"\nmin-speedup = 0.9\n',
        5,
        "min-speedup",
        "1 or more",
    ),
    "select on a target": ('target = "m:f"\nselect = "fastest"\n', 4, "select", "goes with a"),
    "select misspelt": ('chain = ["e"]\nselect = "fastes"\n', 4, "select", "mean 'fastest'"),
    "device key misspelt": (
        'by-device = { cpu = { backend = "e", mdoe = "max-autotune" } }\n',
        3,
        "by-device.cpu.mdoe",
        "did you mean 'mode'",
    ),
    "device table without backend": (
        'by-device = { cpu = { mode = "max-autotune" } }\n',
        3,
        "by-device.cpu.backend",
        "needs",
    ),
    "device entry a number": ("by-device = { cpu = 3 }\n", 3, "by-device.cpu", "a backend's name"),
}


@pytest.mark.parametrize(("table", "line", "key", "said"), WRONG.values(), ids=WRONG)
def test_a_wrong_select_or_device_table_is_said_at_its_line(
    write: WriteFn, tmp_path: Path, table: str, line: int, key: str, said: str
) -> None:
    write("backends.toml", f"# the project's\n[backends.p]\n{table}")
    with pytest.warns(tbr.ManifestWarning, match="so backend 'p' is left out"):
        problems = Registry(cwd=tmp_path, environ={}).problems(with_torch=False)
    [problem] = [p for p in problems if p.key == f"backends.p.{key}"]
    assert (problem.line, problem.severity) == (line, "error")
    assert said in problem.message


def test_select_and_device_settings_read_as_written_and_reach_the_lock(
    write: WriteFn, tmp_path: Path
) -> None:
    write(
        "backends.toml",
        '[backends.p]\nchain = ["eager", "inductor"]\nselect = "fastest"\n'
        '[backends.d]\nby-device = { cpu = { backend = "inductor",'
        ' mode = "max-autotune-no-cudagraphs", options = { "trace.enabled" = false } },'
        ' other = "eager" }\n',
    )
    registry = Registry(cwd=tmp_path, environ={})
    chain = registry.backend_info("p")
    assert (chain.select, chain.min_speedup, chain.verify[0]) == ("fastest", 1.1, "forward")
    table = registry.backend_info("d")
    assert table.by_device == (("cpu", "inductor"), ("other", "eager"))
    assert dict(table.device_settings["cpu"]) == {
        "mode": "max-autotune-no-cudagraphs",
        "options": {"trace.enabled": False},
    }
    facts = registry.facts(with_torch=False)["backends"]
    assert facts["p"]["select"] == ["fastest", 1.1]
    assert facts["d"]["by-device"]["cpu"]["mode"] == "max-autotune-no-cudagraphs"


# ------------------------------------------------------------------ settings per device


def test_a_device_table_gives_its_graphs_its_own_mode_and_options(
    write: WriteFn, tmp_path: Path, make_module: Callable[..., str], module_name: str
) -> None:
    spy = make_module(
        module_name,
        "SEEN = []\n"
        "def spy(gm, example_inputs, mode=None, options=None):\n"
        "    SEEN.append((mode, options))\n"
        "    return gm.forward\n",
    )
    uid = uuid.uuid4().hex[:8]
    write(
        "backends.toml",
        f'[backends.spy_{uid}]\ntarget = "{spy}:spy"\n'
        f'[backends.auto_{uid}]\nby-device = {{ cpu = {{ backend = "spy_{uid}",'
        ' mode = "max-autotune", options = { level = 3 } } }\n',
    )
    registry = Registry(cwd=tmp_path, environ={})
    tbr.install(registry)
    torch.compile(torch.nn.Linear(4, 2), backend=f"auto_{uid}", options={"level": 1})(
        torch.randn(3, 4)
    )
    assert sys.modules[spy].SEEN == [("max-autotune", {"level": 3})]


# ------------------------------------------------------------------ PyTorch's own compilers


def test_real_compilers_in_a_fastest_chain_run_forward_and_train(
    write: WriteFn, members: ModuleType, tmp_path: Path, logged: list[str]
) -> None:
    uid = uuid.uuid4().hex[:8]
    write(
        "backends.toml",
        f'[backends.real_{uid}]\nchain = ["eager", "aot_eager", "inductor"]\nselect = "fastest"\n'
        'verify = "backward"\n',
    )
    tbr.install(Registry(cwd=tmp_path, environ={}))
    net, twin = model(), model()
    x = torch.randn(64, 8)
    compiled = torch.compile(net, backend=f"real_{uid}")
    with torch.no_grad():
        assert torch.allclose(compiled(x), twin(x), atol=1e-5)
    compiled(x).sum().backward()
    twin(x).sum().backward()
    for mine, theirs in zip(net.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-5)
    chose = [r for r in logged if "; chose " in r]
    assert len(chose) == 2  # no_grad and training: two graphs, decided each
    assert all(("eager " in r and "aot_eager " in r and "inductor " in r) for r in chose)


@pytest.mark.parametrize("autocast", [False, True], ids=["bfloat16", "autocast"])
def test_inductor_verifies_in_bfloat16_and_a_wrong_member_does_not(
    write: WriteFn, members: ModuleType, tmp_path: Path, logged: list[str], autocast: bool
) -> None:
    # Inductor rounds bfloat16 otherwise than eager, no further from float64: it passes
    # (where the tolerances alone refused it); a member 3% off does not.
    uid = uuid.uuid4().hex[:8]
    write(
        "backends.toml",
        f'[backends.low_{uid}]\nchain = ["wrong_{uid}", "inductor"]\nverify = "backward"\n'
        f'[backends.wrong_{uid}]\ntarget = "{members.__name__}:three_percent_off"\n',
    )
    tbr.install(Registry(cwd=tmp_path, environ={}))
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 256),
        torch.nn.LayerNorm(256),
    )
    x = torch.randn(64, 256)
    if not autocast:
        net, x = net.to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        torch.compile(net, backend=f"low_{uid}")(x).float().sum().backward()
    assert any(f"skipping 'wrong_{uid}'" in r for r in logged)
    assert any("compiled with 'inductor', backward verified against eager" in r for r in logged), (
        logged
    )


# ------------------------------------------------------------------ every rank one choice

RANKS = """
import json, logging, os, sys, time
import torch, torch.distributed as dist
import torch_backend_registry as tbr

logging.basicConfig(level=logging.INFO, format="%(message)s")
dist.init_process_group("gloo")
rank = dist.get_rank()
members = __import__(sys.argv[1])
tbr.install()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
with torch.no_grad():
    torch.compile(model, backend="pick")(torch.randn(4, 8))
    members.RAN.clear()
    torch.compile(model, backend="pick")(torch.randn(4, 8))
    first = list(members.RAN)
    compiled_first = list(members.COMPILED)
    # A graph only this rank compiles: rank 0 never chooses for it.
    members.RAN.clear()
    if rank == 1:
        torch.compile(torch.nn.Linear(8, 3), backend="pick")(torch.randn(4, 8))
alone = sorted(set(members.RAN))
with open(f"rank{rank}.json", "w") as out:
    json.dump({"ran": first, "compiled": compiled_first, "alone": alone}, out)
dist.barrier()
dist.destroy_process_group()
"""


def test_every_rank_runs_rank_zeros_choice_and_none_waits_for_ever(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    # by_rank_a is slow on rank 0 and by_rank_b on rank 1: deciding alone, the ranks would
    # differ. Rank 0 decides; rank 1 times nothing and runs its choice.
    write(
        "backends.toml",
        '[backends.pick]\nchain = ["a", "b"]\nselect = "fastest"\n'
        f'[backends.a]\ntarget = "{members.__name__}:by_rank_a"\n'
        f'[backends.b]\ntarget = "{members.__name__}:by_rank_b"\n',
    )
    script = write("ranks.py", RANKS)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")},
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TBR_SLOW_ON": "0",
        "TORCH_BACKENDS_SELECT_TIMEOUT": "3",
    }
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    done = subprocess.run(
        [*torchrun, str(script), members.__name__],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # On rank 0, a is slow: it chose b. Rank 1 runs b too, though a is faster there.
    assert zero["ran"] == one["ran"] == ["by_rank_b"]
    assert sorted(zero["compiled"]) == ["by_rank_a", "by_rank_b"]
    assert one["compiled"] == ["by_rank_b"]  # only rank 0's choice: nothing else compiled
    # What rank 0 never compiles: rank 1 waits its time limit, warns, and takes the first.
    assert one["alone"] == ["by_rank_a"]
    assert "heard no choice from rank 0 within 3 s" in done.stdout + done.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_check_import_refuses_settings_the_devices_backend_cannot_take(
    write: WriteFn, tmp_path: Path
) -> None:
    write(
        "backends.toml",
        '[backends.t]\nby-device = { cpu = { backend = "inductor", mode = "max-autotuen" },'
        ' other = "eager" }\n',
    )
    done = torch_backends("check", "--import", cwd=tmp_path, check=1)
    assert done.stdout.startswith(
        "backends.toml:2: error: backends.t.by-device.cpu: Unrecognized mode=max-autotuen"
    )
