"""``select = "fastest"``: the fastest member that verifies, timed, remembered, and one choice
for every rank; and ``by-device`` entries with torch.compile's settings of their own.

Members of known speed are real compiler functions whose compiled graphs sleep; which member
ran is read from what the members did (``RAN``), never from the library's log."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import BackendChainError, Registry

from .conftest import WriteFn, run_forked, run_ranks, torch_backends

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

OPTIONS = []   # what each compile was given by torch.compile (options=...)

def member(name, delay=0.0, change=None):
    def compiler(gm, example_inputs, **options):
        COMPILED.append(name)
        OPTIONS.append(options)
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

def detached(gm, example_inputs):
    # Fast, and right in values, but its outputs start a graph of their own: the gradients
    # reach no input, as an inference compiler's stub backward would give.
    COMPILED.append("detached")
    def run(*args):
        RAN.append("detached")
        out = gm(*args)
        return type(out)(o.detach().requires_grad_(o.requires_grad) for o in out)
    return run

def flaky(after):
    # Verifies (its first call is right), then raises at call ``after``.
    def compiler(gm, example_inputs):
        calls = []
        def run(*args):
            calls.append(1)
            if len(calls) >= after:
                raise RuntimeError(f"device lost at call {len(calls)}")
            return gm(*args)
        return run
    return compiler

flaky_2, flaky_3, flaky_4, flaky_5 = (flaky(n) for n in (2, 3, 4, 5))

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
    # The state that changes which member is fastest: autocast, matmul precision,
    # deterministic algorithms, PyTorch's thread count.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiles() == ["fast", "slow"]
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        assert compiles() == ["fast", "slow"]
    finally:
        torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(True)
    try:
        assert compiles() == ["fast", "slow"]
    finally:
        torch.use_deterministic_algorithms(False)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert compiles() == ["fast", "slow"]
    finally:
        torch.set_num_threads(threads)
    assert compiles() == ["fast"]  # back as it was: remembered
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
if rank == 1:  # a deployment's override on one rank: its chain 'solo' lists no 'b'
    os.environ["TORCH_BACKENDS_PATH"] = os.path.abspath("override.toml")
members = __import__(sys.argv[1])
tbr.install()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())

def post_pass(graph):  # a function in what torch.compile is given: no address in the key
    return graph

def on_this_device(x):  # dynamo writes the device's index into the graph's code
    return x.sum() + torch.arange(4, device=f"cpu:{rank}").float().sum()

def reduced(x):  # a collective in the graph: every rank runs it together, none times it
    import torch.distributed._functional_collectives as collectives
    return collectives.all_reduce(x * 2, "sum", dist.group.WORLD) + 1

found = {}
with torch.no_grad():
    torch.compile(model, backend="pick")(torch.randn(4, 8))
    members.RAN.clear()
    torch.compile(model, backend="pick")(torch.randn(4, 8))
    found["ran"] = list(members.RAN)
    found["compiled"] = list(members.COMPILED)
    x = torch.randn(4, 8)
    for case, compiled, given in (
        ("options", torch.compile(model, backend="pick", options={"post": post_pass}), x),
        ("index", torch.compile(on_this_device, backend="pick"), torch.randn(4)),
        ("solo", torch.compile(model, backend="solo"), x),
        ("reduced", torch.compile(reduced, backend="pick"), torch.ones(4) * (rank + 1)),
    ):
        torch._dynamo.reset()
        compiled(given)  # decided (on rank 0: every member timed)
        members.RAN.clear()
        compiled(given)  # what it runs with
        found[case] = sorted(set(members.RAN))
    # A graph only this rank compiles: rank 0 never chooses for it.
    members.RAN.clear()
    if rank == 1:
        os.environ["TORCH_BACKENDS_SELECT_TIMEOUT"] = "2"
        tbr.refresh()
        torch.compile(torch.nn.Linear(8, 3), backend="pick")(torch.randn(4, 8))
found["alone"] = sorted(set(members.RAN))
with open(f"rank{rank}.json", "w") as out:
    json.dump(found, out)
dist.barrier()
dist.destroy_process_group()
"""


def test_every_rank_runs_rank_zeros_choice_and_none_waits_for_ever(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    # by_rank_a is slow on rank 0 and by_rank_b on rank 1: deciding alone, the ranks would
    # differ. Rank 0 decides; rank 1 times nothing and runs its choice, as soon as it hears
    # it: the name it hears it by holds no address (a function in options) and no device
    # index (a graph that makes a tensor on its own rank's device).
    chains = (
        '[backends.pick]\nchain = ["a", "b"]\nselect = "fastest"\n'
        '[backends.solo]\nchain = ["a", "b"]\nselect = "fastest"\n'
    )
    write(
        "backends.toml",
        chains + f'[backends.a]\ntarget = "{members.__name__}:by_rank_a"\n'
        f'[backends.b]\ntarget = "{members.__name__}:by_rank_b"\n'
        f'[backends.c]\ntarget = "{members.__name__}:fast"\n',
    )
    write("override.toml", '[backends.solo]\nchain = ["c", "a"]\nselect = "fastest"\n')
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")},
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TBR_SLOW_ON": "0",
        "TORCH_BACKENDS_SELECT_TIMEOUT": "120",
    }
    ranks = run_ranks(RANKS, cwd=tmp_path, env=env, args=(members.__name__,))
    said = "".join(r.stdout + r.stderr for r in ranks)
    assert [r.returncode for r in ranks] == [0, 0], said[-6000:]
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # On rank 0, a is slow: it chose b. Rank 1 runs b too, though a is faster there.
    assert zero["ran"] == one["ran"] == ["by_rank_b"]
    assert sorted(zero["compiled"]) == ["by_rank_a", "by_rank_b"]
    assert one["compiled"] == ["by_rank_b"]  # only rank 0's choice: nothing else compiled
    assert zero["options"] == one["options"] == ["by_rank_b"]
    assert zero["index"] == one["index"] == ["by_rank_b"]
    # Rank 1's chain lists no b: it runs a member of its own, and says both.
    assert (zero["solo"], one["solo"]) == (["by_rank_b"], ["fast"])
    assert "rank 1 cannot run rank 0's choice 'b' (its chain does not list it): it runs 'c'" in said
    # A graph holding a collective: each rank runs its chain's first that verifies, together.
    assert zero["reduced"] == one["reduced"] == ["by_rank_a"]
    # What rank 0 never compiles: rank 1 waits its time limit, warns, and takes the first.
    assert one["alone"] == ["by_rank_a"]
    assert said.count("heard no choice from rank 0") == 1, said[-3000:]


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


# ------------------------------------------------------------------ what an attack met


def test_a_member_that_loses_gradients_is_never_run_for_training(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    # The fastest member, right in values, whose outputs reach no parameter: refused at
    # every verify level (a plain chain's "none" too), so that every parameter trains.
    for chain, extra in (["detached", "slow"], ""), (["detached", "slow"], 'select = "first"\n'):
        _registry, name = fastest(write, members, chain)
        if extra:  # the same chain, plain and unverified
            manifest = tmp_path / "backends.toml"
            manifest.write_text(manifest.read_text().replace('select = "fastest"\n', ""))
            tbr.install(Registry(cwd=tmp_path, environ={}))
        net = model()
        torch.compile(net, backend=name)(torch.randn(5, 8)).sum().backward()
        assert all(p.grad is not None for p in net.parameters()), extra
        members.RAN.clear()
        with torch.no_grad():  # for inference, its gradients are nothing to lose
            torch._dynamo.reset()
            torch.compile(model(), backend=name)(torch.randn(5, 8))
        assert "detached" in ran(members)
        torch._dynamo.reset()


def test_a_member_that_raises_while_timed_is_skipped_and_the_graph_compiles(
    write: WriteFn, members: ModuleType, logged: list[str]
) -> None:
    for after in (2, 3, 4, 5):
        torch._dynamo.reset()
        logged.clear()
        _registry, name = fastest(write, members, [f"flaky_{after}", "slow"])
        net, x = model(), torch.randn(5, 8)
        with torch.no_grad():
            assert torch.allclose(torch.compile(net, backend=name)(x), net(x))
        assert any(f"device lost at call {after}" in r and "skipping" in r for r in logged)
        assert any("; chose 'slow_" in r for r in logged), after


def test_a_gpt2_training_step_gets_every_gradient_through_a_fastest_chain(
    write: WriteFn, tmp_path: Path
) -> None:
    # What a new user met: OpenVINO (no backward) chosen for GPT-2's training step.
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("openvino")
    write("backends.toml", '[backends.gpt]\nchain = ["eager", "openvino"]\nselect = "fastest"\n')
    tbr.install(Registry(cwd=tmp_path, environ={}))
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    gpt = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 64, (2, 8))
    loss = torch.compile(gpt, backend="gpt")(input_ids=ids, labels=ids).loss
    loss.backward()
    assert [n for n, p in gpt.named_parameters() if p.grad is None] == []


def test_inductor_is_not_refused_for_a_cache_it_lays_out_otherwise(
    write: WriteFn, tmp_path: Path, logged: list[str]
) -> None:
    # GPT-2's key/value cache: inductor gives the concatenation transposed, with the same
    # values; PyTorch judges that right, and so does a chain that verifies.
    write("backends.toml", '[backends.kv]\nchain = ["inductor", "eager"]\nverify = "forward"\n')
    tbr.install(Registry(cwd=tmp_path, environ={}))
    linear = torch.nn.Linear(128, 128)

    def attend(x: Any, cache: Any) -> Any:
        return torch.cat([cache, linear(x).view(2, 8, 4, 32).transpose(1, 2)], -2)

    x, cache = torch.randn(2, 8, 128), torch.zeros(2, 4, 0, 32)
    with torch.no_grad():
        out = torch.compile(attend, backend="kv")(x, cache)
        assert torch.allclose(out, attend(x, cache), atol=1e-5)
    assert not any("skipping 'inductor'" in r for r in logged), logged
    assert any("compiled with 'inductor', forward verified against eager" in r for r in logged)


def test_a_choice_too_close_to_call_keeps_the_first_and_says_so() -> None:
    from torch_backend_registry._timing import choose

    # By medians the second is 1.3x faster; their samples overlap: noise, not a speed-up.
    first = [1.0, 1.4, 0.6, 1.3, 0.7, 1.2, 0.8, 1.0, 1.1]
    second = [0.77, 1.2, 0.5, 1.1, 0.55, 0.9, 0.6, 0.8, 0.7]
    member, speedup, how = choose(["a", "b"], {"a": first, "b": second}, 1.1)
    assert (member, speedup) == ("a", 1.0)
    assert how.startswith("too close to call: 'b' is 1.")
    # A steady member 1.9x faster is chosen, though a noisy one is faster by its median.
    steady = [s / 1.9 for s in [1.0, 1.0, 1.01, 0.99, 1.0, 1.0, 1.02, 0.98, 1.0]]
    member, _speedup, how = choose(
        ["a", "noisy", "steady"], {"a": [1.0] * 9, "noisy": second, "steady": steady}, 1.1
    )
    assert (member, how) == ("steady", "the fastest, 1.90x over 'a'")
    # 1.2x faster by medians, each timing within 8% of its own: min-speedup (1.1) is met,
    # and the spreads do not meet: chosen.
    wobbly = [1.0, 0.92, 1.08, 0.96, 1.04, 0.94, 1.06, 0.98, 1.02]
    member, _speedup, how = choose(["a", "b"], {"a": wobbly, "b": [s / 1.2 for s in wobbly]}, 1.1)
    assert (member, how) == ("b", "the fastest, 1.20x over 'a'")
    # Apart beyond their spread, the faster is chosen.
    member, speedup, how = choose(["a", "b"], {"a": first, "b": [s / 3 for s in first]}, 1.1)
    assert member == "b"
    assert how == "the fastest, 3.00x over 'a'"


def test_explain_says_each_choices_graph_mode_shapes_and_each_members_time(
    write: WriteFn, members: ModuleType, tmp_path: Path
) -> None:
    _registry, name = fastest(write, members, ["slow", "detached", "fast"])
    net = model()
    with torch.no_grad():
        torch.compile(net, backend=name)(torch.randn(5, 8))
    torch.compile(net, backend=name)(torch.randn(5, 8)).sum().backward()
    explained = torch_backends("explain", name, cwd=tmp_path).stdout
    assert "(inference, static shapes): " in explained
    assert "(training, static shapes): fast_" in explained  # detached is no choice there
    assert "ms ±" in explained
    # A member refused for training is said, with why, where it was not timed.
    assert "not timed (verifying it failed: the gradient of output 0 does not reach" in explained
    [inference, training] = sorted(
        json.loads(torch_backends("explain", name, "--json", cwd=tmp_path).stdout)["choices"],
        key=lambda c: c["grad"],
    )
    assert (inference["grad"], training["grad"], training["dynamic"]) == (False, True, False)
    assert set(inference["seconds"]) == {
        f"slow_{name[5:]}",
        f"detached_{name[5:]}",
        f"fast_{name[5:]}",
    }
    assert set(training["skipped"]) == {f"detached_{name[5:]}"}


def test_each_graph_of_a_model_has_its_own_member_on_the_chain(
    write: WriteFn, members: ModuleType
) -> None:
    registry, name = fastest(write, members, ["slow", "fast"])

    def f(x: Any) -> Any:
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return torch.tanh(y) + 1

    with torch.no_grad():
        torch.compile(f, backend=name)(torch.randn(5, 8))
    chain: Any = registry.lookup_backend(name)  # a chain: its own attributes
    graphs = chain.graphs
    assert [member.split("_")[0] for _graph, member in graphs] == ["fast", "fast"]
    assert all(graph.startswith("graph of ") for graph, _member in graphs)


SIBLINGS = """
import time
import speeds_UID

def slow(gm, example_inputs, options=None):
    COMPILED.append("slow")
    def run(*args):
        time.sleep(speeds_UID.SLOW)
        return gm(*args)
    return run

def fast(gm, example_inputs, options=None):
    COMPILED.append("fast")
    return gm.forward

COMPILED = []
"""

CHECKOUT = """
import dataclasses, enum, functools, json, threading, sys
import torch
import torch_backend_registry as tbr

class Mode(enum.Enum):
    FAST = 1

@dataclasses.dataclass
class Settings:
    level: int

def post_pass(graph):
    return graph

tbr.install()
members = __import__(f"members_{sys.argv[1]}")
options = {
    "post_pass": post_pass,
    "partial": functools.partial(max, key=abs),
    "settings": Settings(2),
    "mode": Mode.FAST,
    "scale": torch.ones(3),
    "device": torch.device("cpu", 0),
    "lambda": lambda x: x + 1,
    "format": torch.channels_last,
    "bytes": b"\\x00",
    "complex": 1j,
}
if sys.argv[2:] == ["lock"]:
    options["lock"] = threading.Lock()  # nothing any other process writes alike
    options["sparse"] = torch.eye(2).to_sparse_csr()  # nor this, which never fails the key
with torch.no_grad():
    torch.compile(torch.nn.Linear(8, 4), backend="pick", options=options)(torch.randn(5, 8))
print(json.dumps(sorted(members.COMPILED)))
"""


def test_a_choice_is_found_by_another_process_in_another_checkout(tmp_path: Path) -> None:
    # The key holds no path, no address: options holding functions, a partial, a dataclass,
    # an enum, a tensor and a device are written by what identifies them. A checkout of
    # the same project at another path finds the choice the first made.
    uid = uuid.uuid4().hex[:8]
    first = tmp_path / "checkout"
    first.mkdir()
    (first / f"members_{uid}.py").write_text(SIBLINGS.replace("UID", uid))
    (first / f"speeds_{uid}.py").write_text("SLOW = 0.004\n")
    (first / "backends.toml").write_text(
        '[backends.pick]\nchain = ["slow", "fast"]\nselect = "fastest"\n'
        f'[backends.slow]\ntarget = "members_{uid}:slow"\n'
        f'[backends.fast]\ntarget = "members_{uid}:fast"\n'
    )
    decided = run_forked(CHECKOUT, cwd=first, args=(uid,))
    assert json.loads(decided.stdout) == ["fast", "slow"], decided.stderr
    second = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(first, second)
    found = run_forked(CHECKOUT, cwd=second, args=(uid,))
    assert json.loads(found.stdout) == ["fast"], found.stderr
    # What no other process can write alike: decided again, and said why.
    unknown = run_forked(CHECKOUT, cwd=second, args=(uid, "lock"))
    assert json.loads(unknown.stdout) == ["fast", "slow"]
    said = unknown.stderr
    assert "its choice is not remembered: torch.compile was given a _thread:lock, a tensor" in said
    # A module the member imports, edited: its code changed, and the choice with it.
    (second / f"speeds_{uid}.py").write_text("SLOW = 0.005\n")
    edited = run_forked(CHECKOUT, cwd=second, args=(uid,))
    assert json.loads(edited.stdout) == ["fast", "slow"], edited.stderr


def test_a_select_time_limit_past_what_the_store_counts_waits_its_longest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torch_backend_registry._select import _limit

    # 1e14 s overflows a timedelta: it was taken for a time-out, and a rank waited not at all.
    assert _limit("1e14").days == 366
    assert _limit("2.5").total_seconds() == 2.5
    with caplog.at_level(logging.WARNING, logger="torch_backend_registry"):
        for wrong in ("soon", "-1", "nan", "inf", "0", "soon"):
            assert _limit(wrong).total_seconds() == 600
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "'soon' is not a positive number" in m]) == 1  # once
    assert all("the default 600 s" in m for m in said)


def test_a_step_that_writes_an_activation_in_place_is_timed_and_trains(
    write: WriteFn, tmp_path: Path
) -> None:
    # The second graph after a break writes into an activation that requires grad: called
    # again and again on one copy of its inputs, every member raises (a backward through
    # the last call's graph). That is the timing's fault, not theirs: the first is kept.
    write("backends.toml", '[backends.relu]\nchain = ["eager", "aot_eager"]\nselect = "fastest"\n')
    tbr.install(Registry(cwd=tmp_path, environ={}))

    class Model(torch.nn.Module):  # type: ignore[name-defined,misc]  # torch is Any here
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            y = self.a(x)
            torch._dynamo.graph_break()
            return self.b(torch.nn.functional.relu(y, inplace=True))

    torch.manual_seed(0)
    model = Model()
    torch.compile(model, backend="relu")(torch.randn(8, 16)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
