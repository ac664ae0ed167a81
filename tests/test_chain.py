"""Backends made of other backends, compiled for real on the CPU: tables by device, chains
that verify each member on the graph, and options checked against the compiler."""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import ManifestError, Registry

from .conftest import WriteFn, torch_backends

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

MakeModule = Callable[..., str]

MEMBERS = """
import torch

CALLS = []

def fine(gm, example_inputs, *, level=1):
    CALLS.append(("fine", level))
    return gm.forward

def fails_at_first_call(gm, example_inputs):
    def run(*args):
        raise RuntimeError("kernel launch failed")
    return run

def column_major(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return type(out)(o.t().contiguous().t() for o in out)
    return run

def with_gaps(gm, example_inputs):
    # The right values, every other element of a buffer twice their size: not dense.
    def run(*args):
        out = gm(*args)
        def spaced(o):
            buffer = o.new_zeros(o.shape[0], o.shape[1] * 2)
            buffer[:, ::2] = o
            return buffer[:, ::2]
        return type(out)(spaced(o) for o in out)
    return run

def wrong(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return type(out)(o + 1 for o in out) if isinstance(out, (list, tuple)) else out + 1
    return run

def draws_ahead(gm, example_inputs):
    # Right, but not with eager's random numbers: it draws one of its own first.
    def run(*args):
        torch.rand(1)
        return gm(*args)
    return run

def inference_only(gm, example_inputs):
    def run(*args):
        with torch.no_grad():
            return gm(*args)
    return run

def rewrites_in_place(gm, example_inputs):
    # An FX pass with a bug, applied to the graph in place as FX passes are: * becomes +.
    import operator
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (operator.mul, torch.mul):
            node.target = operator.add
    gm.recompile()
    raise RuntimeError("gave up after rewriting")

def tensor_for_int(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return (out[0], torch.full((2,), 99.0))
    return run

import functools

def _logged(fn):
    @functools.wraps(fn)
    def wrapper(gm, example_inputs, debug=False, **kw):
        CALLS.append(("wrapper", debug))
        return fn(gm, example_inputs)
    return wrapper

@_logged
def wrapped(gm, example_inputs):
    return gm.forward

def takes_a_dict(gm, example_inputs, options=None):
    CALLS.append(("dict", options))
    return gm.forward

def takes_anything(gm, example_inputs, **options):
    CALLS.append(("anything", options))
    return gm.forward
"""


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def members(make_module: MakeModule, module_name: str) -> str:
    return make_module(module_name, MEMBERS)


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


def installed(write: WriteFn, body: str) -> tuple[Registry, str]:
    """A project manifest whose names carry a fresh suffix (PyTorch's registry is
    process-wide), installed; the registry and the suffix."""
    uid = uuid.uuid4().hex[:8]
    path = write("backends.toml", body.replace("_UID", f"_{uid}"))
    registry = Registry(cwd=path.parent, environ={})
    tbr.install(registry)
    return registry, f"_{uid}"


def verifying(
    write: WriteFn, members: str, name: str, level: str, **targets: str
) -> tuple[Registry, str]:
    """A chain ``name`` that verifies at ``level``; its members, in order, run the
    functions of the ``members`` module (``member=function``); installed as
    :func:`installed` does."""
    chain = ", ".join(f'"{member}_UID"' for member in targets)
    body = f'[backends.{name}_UID]\nchain = [{chain}]\nverify = "{level}"\n' + "".join(
        f'[backends.{member}_UID]\ntarget = "{members}:{function}"\n'
        for member, function in targets.items()
    )
    return installed(write, body)


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Tanh())


# ------------------------------------------------------------------ by device


def test_a_table_by_device_compiles_with_the_cpus_backend(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = installed(
        write,
        f"""
        [backends.auto_UID]
        by-device = {{ cuda = "inductor", cpu = "portable_UID", other = "eager" }}
        [backends.portable_UID]
        chain = ["missing_here_UID", "fine_UID"]
        [backends.fine_UID]
        target = "{members}:fine"
        """,
    )
    x = torch.randn(5, 4)
    out = torch.compile(model(), backend=f"auto{uid}")(x)
    assert torch.allclose(out, model()(x))
    assert f"backend 'auto{uid}': device cpu: compiling with 'portable{uid}'" in logged
    assert any(
        r.startswith(f"backend 'portable{uid}': graph of 4 operations on (3, 4), (3,), (5, 4)")
        and r.endswith(f"(training, static shapes): compiled with 'fine{uid}'")
        for r in logged
    )


def test_a_composite_backend_says_what_it_runs(write: WriteFn, members: str) -> None:
    # What lookup_backend gives a caller: a chain's members in order, a table's devices.
    registry, uid = installed(
        write,
        f"""
        [backends.auto_UID]
        by-device = {{ cpu = "portable_UID", other = "eager" }}
        [backends.portable_UID]
        chain = ["missing_here_UID", "fine_UID"]
        [backends.fine_UID]
        target = "{members}:fine"
        """,
    )
    chain: Any = registry.lookup_backend(f"portable{uid}")
    table: Any = registry.lookup_backend(f"auto{uid}")
    assert chain.members == (f"missing_here{uid}", f"fine{uid}")
    assert table.table == {"cpu": f"portable{uid}", "other": "eager"}
    assert (chain.used, table.used) == (None, None)


def test_no_backend_for_the_device_names_the_device_and_the_line(
    write: WriteFn, members: str
) -> None:
    _registry, uid = installed(
        write,
        f"""
        [backends.gpu_only_UID]
        by-device = {{ cuda = "fine_UID" }}
        [backends.fine_UID]
        target = "{members}:fine"
        """,
    )
    with pytest.raises(Exception, match="no backend for device 'cpu'") as caught:
        torch.compile(model(), backend=f"gpu_only{uid}")(torch.randn(5, 4))
    error: BaseException | None = caught.value
    while error is not None and not isinstance(error, ManifestError):
        # torch.compile wraps what a backend raises
        error = getattr(error, "inner_exception", None) or error.__cause__
    assert isinstance(error, ManifestError)
    # The line of the by-device key it names, below the table's header.
    assert (error.line, error.key) == (2, f"backends.gpu_only{uid}.by-device")


def test_a_table_by_device_is_checked_as_a_chain_is(tmp_path: Path, write: WriteFn) -> None:
    write(
        "backends.toml",
        '[backends.auto]\nby-device = { cpu = "nowhere", cuda = "loop" }\n'
        '[backends.loop]\nchain = ["auto"]\n'
        '[backends.pytorchs]\nby-device = { cpu = "eager", other = "inductor" }\n',
    )
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    said = {p.key: p.message for p in registry.problems(with_torch=False)}
    assert said["backends.auto.by-device"].startswith("by-device 'auto' names itself")
    assert said["backends.loop.chain"].startswith("chain 'loop' names itself")
    assert "backends.pytorchs.by-device" not in said  # PyTorch's names, not read here
    assert (
        registry.index(with_torch=False)
        .unknown_members()["auto"]
        .message.startswith(
            "by-device 'auto' names 'nowhere', which is not installed here; on cpu it fails"
        )
    )


def test_a_table_that_gives_the_cpu_nothing_is_a_note_said_once(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.gpu_only]\nby-device = { cuda = "inductor" }\n')
    note = (
        "backends.toml:2: note: backends.gpu_only.by-device: by-device 'gpu_only' gives the"
        " CPU no backend (it has cuda), so a graph on the CPU fails; add 'cpu' or 'other'"
        " unless that is meant\n"
    )
    # Unavailable here, by the registry's rule for a table (as list --available says),
    # importing or not: the note says why, once.
    plain = torch_backends("check", "--no-torch", cwd=tmp_path)
    assert (plain.stdout, plain.stderr) == (
        note,
        "no problems; 0 of 1 backend(s) usable, 1 unavailable here, 1 note(s);"
        " read backends.toml\n",
    )
    imported = torch_backends("check", "--import", "--no-torch", cwd=tmp_path)
    assert (imported.stdout, imported.stderr) == (
        note,
        "no problems; 0 of 1 backend(s) imported and usable, 1 unavailable here, 1 note(s);"
        " read backends.toml\n",
    )


TABLES = """
[backends.trt]
target = "tbr_not_installed:compile"
requires = ["tbr_not_installed"]
[backends.auto]
by-device = { cpu = "trt", other = "eager" }
[backends.typo]
by-device = { cdua = "eager", other = "eager" }
[backends.loop]
by-device = { cpu = "loop2" }
[backends.loop2]
chain = ["loop"]
[backends.loose]
chain = ["eager"]
rtol = 0.1
"""


def test_a_device_type_typo_is_told_what_was_meant_others_included(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "backends.toml",
        '[backends.plural]\nby-device = { cpu = "eager", others = "eager" }\n'
        '[backends.npu_only]\nby-device = { npu = "eager", other = "eager" }\n',
    )
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.warns(tbr.ManifestWarning):
        said = {p.key: p.message for p in registry.problems(with_torch=False)}
    assert said == {
        "backends.plural.by-device.others": "device type 'others' is not one PyTorch names, so"
        " no graph will be on it; did you mean 'other'? (an extension's own device type is"
        " fine as written)"
    }


def test_check_judges_a_table_by_the_backend_it_gives_the_cpu(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", TABLES)
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.warns(tbr.ManifestWarning) as warned:
        registry.list_backends()
    assert sum("device type 'cdua'" in str(w.message) for w in warned) == 1
    # A table has no fallback: on a CPU, its CPU's backend is what runs.
    assert registry.why_unavailable(registry.backend_info("auto")) == (
        "for the CPU, trt: missing tbr_not_installed"
    )
    assert registry.why_unavailable(registry.backend_info("typo")) is None
    said = {p.key: p for p in registry.problems(with_torch=False)}
    typo = said["backends.typo.by-device.cdua"]
    assert (typo.severity, typo.line) == ("warning", 7)
    assert "did you mean 'cuda'?" in typo.message
    # A rule of the whole table is reported at the key it rules out.
    assert (said["backends.loose.rtol"].line, said["backends.loose.rtol"].message) == (
        14,
        "'rtol' goes with 'verify = \"forward\"' or \"backward\"",
    )
    done = torch_backends("check", "--import", "--no-torch", cwd=tmp_path, check=None)
    # A loop is a problem once, never also a backend "unavailable here", nor a usable one;
    # each at the line of the key it names (the loops' by-device and chain keys).
    assert [line.split(": ", 2)[:2] for line in done.stdout.splitlines()] == [
        ["backends.toml:1", "note"], ["backends.toml:4", "note"],
        ["backends.toml:7", "warning"], ["backends.toml:9", "error"],
        ["backends.toml:11", "error"], ["backends.toml:14", "error"],
    ]  # fmt: skip
    # A device type PyTorch does not name is a warning: printed, and no failure.
    assert done.stderr == (
        "3 problem(s); 1 of 6 backend(s) imported and usable, 2 unavailable here, 1 warning(s);"
        " read backends.toml\n"
    )


# ------------------------------------------------------------------ chains that verify


def test_a_skipped_member_is_said_at_compile_time_in_the_words_check_uses(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    # A typo is an error to check and in the log; a plugin not installed here a note in both.
    registry, uid = installed(
        write,
        '[backends.c_UID]\nchain = ["fien_UID", "tbr_not_here", "fine_UID"]\n'
        f'[backends.fine_UID]\ntarget = "{members}:fine"\n',
    )
    said = torch_backends("check", "--no-torch", cwd=Path(registry.context.cwd or ""), check=1)
    assert f"error: backends.c{uid}.chain: chain 'c{uid}' names 'fien{uid}'" in said.stdout
    assert "it skips 'tbr_not_here' when it runs" in said.stdout
    torch.compile(model(), backend=f"c{uid}")(torch.randn(5, 4))
    # Each said of the graph it was for: a model of several graphs tells them apart.
    graph = "graph of 4 operations on (3, 4), (3,), (5, 4), ... (training, static shapes)"
    assert [r.split(": skipping")[0] for r in logged if ": skipping" in r] == [
        f"backend 'c{uid}': {graph}: error",
        f"backend 'c{uid}': {graph}: note",
    ]
    assert "note: skipping 'tbr_not_here': not installed here" in logged[1]


def test_a_chain_that_verifies_skips_what_fails_differs_or_has_no_backward(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = verifying(
        write,
        members,
        "careful",
        "backward",
        launch="fails_at_first_call",
        wrong="wrong",
        inference="inference_only",
        fine="fine",
    )
    x = torch.randn(5, 4)
    out = torch.compile(model(), backend=f"careful{uid}")(x)
    assert torch.allclose(out, model()(x))
    skipped = [r for r in logged if "skipping" in r]
    assert skipped[0].endswith("running it raised RuntimeError: kernel launch failed")
    assert "output 0 differs from eager beyond rtol=0.01, atol=0.01" in skipped[1]
    assert "no output requires grad, where eager's do: it gives no backward pass" in skipped[2]
    assert logged[-1].endswith(
        f"(training, static shapes): compiled with 'fine{uid}', backward verified against eager"
    )


def test_verifying_at_the_forward_level_keeps_an_inference_backend(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = verifying(
        write, members, "serving", "forward", inference="inference_only", fine="fine"
    )
    with torch.no_grad():  # serving: no gradients, so none is missing
        torch.compile(model(), backend=f"serving{uid}")(torch.randn(5, 4))
    assert logged[-1] == (
        f"backend 'serving{uid}': graph of 4 operations on (3, 4), (3,), (5, 4), ... (inference,"
        f" static shapes): compiled with 'inference{uid}', forward verified against eager"
    )


def test_verifying_changes_no_state_of_the_model(write: WriteFn, members: str) -> None:
    _registry, uid = verifying(write, members, "careful", "backward", fine="fine")
    x = torch.randn(8, 4)
    torch.manual_seed(1)
    eager = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Dropout(0.5)
    )
    compiled = copy.deepcopy(eager)
    torch.manual_seed(7)
    expected = eager(x)
    torch.manual_seed(7)
    out = torch.compile(compiled, backend=f"careful{uid}")(x)
    # Dropout drew what eager drew: verifying consumed no random numbers.
    assert torch.equal(out, expected)
    # BatchNorm's statistics and its batch counter moved once, as eagerly.
    for name, value in eager.state_dict().items():
        assert torch.equal(compiled.state_dict()[name], value), name
    assert compiled[1].num_batches_tracked.item() == 1
    assert all(p.grad is None for p in compiled.parameters())


def careful(write: WriteFn, members: str, level: str = "forward") -> str:
    """A verifying chain of a member that adds 1 to every output, then a right one."""
    _registry, uid = verifying(write, members, "careful", level, wrong="wrong", fine="fine")
    return f"careful{uid}"


def test_the_next_member_gets_the_graph_as_it_came_and_is_held_to_it(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = verifying(
        write, members, "passes", "forward", rewrites="rewrites_in_place", fine="fine"
    )
    out = torch.compile(lambda x: x * 3, backend=f"passes{uid}")(torch.ones(2))
    assert out.tolist() == [3.0, 3.0]
    assert f": compiled with 'fine{uid}'" in logged[-1]


def test_a_graph_that_writes_a_parameter_is_verified_and_writes_it_once(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    average = torch.nn.Module()  # state kept in a frozen parameter
    average.avg = torch.nn.Parameter(torch.zeros(4), requires_grad=False)

    def step(x: Any) -> Any:
        average.avg.mul_(0.5).add_(x.mean(0), alpha=0.5)
        return x - average.avg

    out = torch.compile(step, backend=careful(write, members))(torch.ones(3, 4))
    assert average.avg.tolist() == [0.5] * 4
    assert out.tolist() == [[0.5] * 4] * 3
    assert any("skipping 'wrong_" in r and "differs from eager" in r for r in logged)


def test_a_graph_may_write_an_input_that_requires_grad(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    linear = torch.nn.Linear(4, 4)
    h = linear(torch.randn(3, 4))  # an activation after a graph break: not a leaf
    out = torch.compile(lambda h: torch.relu_(h) * 2, backend=careful(write, members, "backward"))(
        h
    )
    out.sum().backward()
    assert linear.weight.grad is not None
    assert any("skipping 'wrong_" in r and "differs from eager" in r for r in logged)
    assert logged[-1].endswith("backward verified against eager")


def test_what_cannot_be_compared_with_eager_is_a_difference(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    registry, uid = verifying(
        write, members, "mixed", "forward", tensor_for_int="tensor_for_int", fine="fine"
    )

    # A graph that gives an int beside a tensor, called as torch.compile calls a backend.
    gm = torch.fx.symbolic_trace(lambda x, n: (x * 2, n + 1))
    compiled = registry.lookup_backend(f"mixed{uid}")(gm, [torch.ones(2), 3])
    assert compiled(torch.ones(2), 3)[1] == 4
    assert any("output 1 is Tensor, eager gives int" in r for r in logged)


def test_inputs_that_share_memory_still_do_in_the_copies(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = installed(
        write,
        """
        [backends.real_UID]
        chain = ["aot_eager", "eager"]
        verify = "forward"
        """,
    )

    def writes_a_view(x: Any, y: Any) -> Any:
        y.add_(1)
        return x * 2

    base = torch.zeros(2, 3)
    out = torch.compile(writes_a_view, backend=f"real{uid}")(base, base[0])
    assert logged[-1].endswith(": compiled with 'aot_eager', forward verified against eager")
    assert base.tolist() == [[1.0] * 3, [0.0] * 3]  # written once, by the real call
    assert out.tolist() == [[2.0] * 3, [0.0] * 3]


def test_a_log_says_how_far_a_check_went_and_warns_when_less_than_asked(
    write: WriteFn, members: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = careful(write, members, "backward")
    dropout = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with caplog.at_level(logging.INFO, logger="torch_backend_registry"):
        torch.compile(dropout, backend=name)(torch.randn(3, 4))
    [used] = [r for r in caplog.records if "compiled with" in r.getMessage()]
    # Random numbers are drawn each compiler its own way: only shapes and types can agree.
    assert "verified in shapes and types only (the graph draws random numbers)" in used.message
    assert used.levelno == logging.WARNING
    caplog.clear()
    torch._dynamo.reset()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="torch_backend_registry"):
        torch.compile(model().eval(), backend=name)(torch.randn(3, 4))
    [used] = [r for r in caplog.records if "compiled with" in r.getMessage()]
    assert used.message.endswith(
        "forward verified against eager; no backward to verify (gradients are off, or no"
        " output requires them)"
    )
    assert used.levelno == logging.WARNING


def test_an_output_laid_out_otherwise_passes_and_one_with_gaps_does_not(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    # As PyTorch judges its compilers: the same elements in another order of dimensions are
    # right (inductor may give a cache transposed); an output that leaves gaps in its memory
    # where eager's fills it is not.
    _registry, uid = verifying(
        write, members, "laid", "forward", gaps="with_gaps", columns="column_major", real="fine"
    )
    x = torch.randn(2, 4)
    out = torch.compile(torch.nn.Linear(4, 3), backend=f"laid{uid}")(x)
    assert out.stride() == (1, 2)  # column-major, as the member gave it
    assert any(
        f"skipping 'gaps{uid}'" in r
        and "strides (6, 2) where eager's are (3, 1): it overlaps itself or leaves gaps" in r
        for r in logged
    )
    assert any(
        f"compiled with 'columns{uid}', forward verified against eager (output 0 laid out"
        " otherwise: strides (1, 2), eager's (3, 1))" in r
        for r in logged
    )


def test_an_output_that_varies_alone_leaves_the_others_checked(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    # One output drawn at random says nothing of the others: a member that adds 1 to every
    # output is still caught by the one that does not vary, and one whose random numbers are
    # not eager's passes, that output compared in shapes and types.
    _registry, uid = installed(
        write,
        '[backends.mixed_UID]\nchain = ["wrong_UID", "ahead_UID"]\nverify = "forward"\n'
        f'[backends.wrong_UID]\ntarget = "{members}:wrong"\n'
        f'[backends.ahead_UID]\ntarget = "{members}:draws_ahead"\n',
    )

    def f(x: Any) -> Any:
        return x + 1, torch.rand(64, 4)

    torch.compile(f, backend=f"mixed{uid}")(torch.randn(3, 4))
    assert any(f"skipping 'wrong{uid}'" in r and "output 0 differs" in r for r in logged)
    assert logged[-1].endswith(
        f"compiled with 'ahead{uid}', forward verified against eager, but output 1 in shapes and"
        " types only (they differ from one eager run to the next: random numbers, or memory"
        " left unset)"
    )


# ------------------------------------------------------------------ options


def test_an_option_the_compiler_does_not_take_is_refused_at_its_line(
    write: WriteFn, members: str
) -> None:
    registry, uid = installed(
        write,
        f"""
        [backends.typo_UID]
        target = "{members}:fine"
        options = {{ levle = 2 }}
        [backends.anything_UID]
        target = "{members}:takes_anything"
        options = {{ whatever = 1 }}
        """,
    )
    with pytest.raises(ManifestError) as caught:
        registry.lookup_backend(f"typo{uid}")
    assert (caught.value.line, caught.value.key) == (3, f"backends.typo{uid}.options.levle")
    assert caught.value.message == (
        f"option 'levle' is not a parameter of {members}:fine; did you mean 'level'?"
    )
    assert callable(registry.lookup_backend(f"anything{uid}"))  # **options takes any


def test_torch_compiles_options_are_checked_with_the_same_words(
    write: WriteFn, members: str
) -> None:
    _registry, uid = installed(write, f'[backends.fine_UID]\ntarget = "{members}:fine"\n')
    calls = __import__(members).CALLS
    torch.compile(model(), backend=f"fine{uid}", options={"level": 3})(torch.randn(5, 4))
    assert calls[-1] == ("fine", 3)  # torch.compile's options reach the compiler as keywords
    torch._dynamo.reset()
    with pytest.raises(Exception, match="did you mean 'level'") as caught:
        torch.compile(model(), backend=f"fine{uid}", options={"levle": 3})(torch.randn(5, 4))
    assert f"option 'levle' is not a parameter of {members}:fine" in str(caught.value)


def test_every_refused_option_is_named_and_a_wrapper_is_read_as_it_is(
    write: WriteFn, members: str
) -> None:
    registry, uid = installed(
        write,
        f"""
        [backends.typos_UID]
        target = "{members}:fine"
        options = {{ levle = 2, fats = true, "a.b" = 1 }}
        [backends.wrapped_UID]
        target = "{members}:wrapped"
        options = {{ debug = true }}
        [backends.dict_UID]
        target = "{members}:takes_a_dict"
        options = {{ fp16 = true }}
        """,
    )
    with pytest.raises(ManifestError) as caught:
        registry.lookup_backend(f"typos{uid}")
    assert caught.value.key == f"backends.typos{uid}.options.levle"
    assert caught.value.message == (
        f"options 'levle', 'fats' and 'a.b' are not parameters of {members}:fine;"
        " did you mean 'level' for 'levle'? It takes 'level'"
    )
    # functools.wraps points at the wrapped function: the wrapper's own parameters count.
    registry.lookup_backend(f"wrapped{uid}")(torch.fx.symbolic_trace(torch.nn.ReLU()), [])
    assert __import__(members).CALLS[-1] == ("wrapper", True)
    with pytest.raises(ManifestError) as written_for_torch_compile:
        registry.lookup_backend(f"dict{uid}")
    assert written_for_torch_compile.value.message.endswith(
        "it takes its options as one table: options = { options = { fp16 = ... } }"
    )


SILENT = """
import torch

class _Silent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError()  # no message at all

def silent_backward(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        if isinstance(out, (list, tuple)):
            return type(out)(_Silent.apply(o) for o in out)
        return _Silent.apply(out)
    return run
"""


def test_an_error_without_a_message_is_said_not_turned_into_another(
    write: WriteFn, make_module: MakeModule, module_name: str, logged: list[str]
) -> None:
    silent = make_module(module_name, SILENT)
    _registry, uid = installed(
        write,
        '[backends.quiet_UID]\nchain = ["silent_UID", "eager"]\nverify = "backward"\n'
        f'[backends.silent_UID]\ntarget = "{silent}:silent_backward"\n',
    )
    torch.compile(torch.nn.Linear(4, 2), backend=f"quiet{uid}")(torch.randn(3, 4)).sum().backward()
    [skipped] = [r for r in logged if f"skipping 'silent{uid}'" in r]
    assert skipped.endswith("verifying it failed: its backward raised RuntimeError")
