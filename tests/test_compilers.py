"""Chains and tables with the compilers people use, through torch.compile after install():
PyTorch's inductor, aot_eager (AOTAutograd, where dynamo's graphs are strict) and eager,
and real plugins (openvino; iree-turbine where installed), for a forward pass and a
training step, on a model with buffers and one with dropout.

Marked ``compilers`` (besides ``torch``): ``pytest -m "not compilers"`` skips them.
"""

from __future__ import annotations

import importlib.util
import logging
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import Registry

from .conftest import WriteFn, run_forked, torch_backends

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.compilers]
Module: Any = torch.nn.Module  # a class to subclass, which mypy sees as Any

ROOT = Path(__file__).resolve().parent.parent

#: Members that fail in each way a member can, written as plugins and projects write them.
FAILING = """
import operator
import torch

def fails_at_compile(gm, example_inputs, **options):  # takes what torch.compile gives
    raise RuntimeError("no kernel for this graph")

def rewrites_then_fails(gm, example_inputs):
    # An FX pass applied in place, as FX passes are, that then gives up: the next member
    # must get the graph as it came, with what dynamo put on its nodes.
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (operator.add, torch.add):
            node.target = operator.sub
    gm.recompile()
    raise RuntimeError("gave up after rewriting")

def fails_at_first_call(gm, example_inputs):
    def run(*args):
        raise RuntimeError("kernel launch failed")
    return run

def off_by_one(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        if isinstance(out, (list, tuple)):
            return type(out)(o + 1 if o.is_floating_point() else o + 3 for o in out)
        return out + 1
    return run

def forgets_to_return(gm, example_inputs):
    gm.recompile()  # and no return: None for the function to run

def inference_only(gm, example_inputs):
    def run(*args):
        with torch.no_grad():
            return gm(*args)
    return run
"""

PLUGINS = [
    "openvino",
    pytest.param(
        "iree_boo",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("iree") is None, reason="iree-turbine is not installed"
        ),
    ),
]
REAL = ["inductor", "aot_eager", "eager", *PLUGINS]


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def failing(make_module: Callable[..., str], module_name: str) -> str:
    return make_module(module_name, FAILING)


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
    uid = f"_{uuid.uuid4().hex[:8]}"
    path = write("backends.toml", textwrap.dedent(body).replace("_UID", uid))
    registry = Registry(cwd=path.parent, environ={})
    tbr.install(registry)
    return registry, uid


def used(registry: Registry, name: str) -> Any:
    """The member a chain or table compiled with last."""
    return getattr(registry.lookup_backend(name), "used", None)


def plugin_here(name: str) -> None:
    if name == "openvino":
        pytest.importorskip("openvino")


def chain_before(real: str, failing: str, verify: str, *, differs: bool = True) -> str:
    """A chain of every kind of failing member, then ``real``; with ``verify``, the members
    only verification can catch too (they compile, then fail at their first call, or give
    other values: ``differs``, which a graph that draws random numbers cannot show)."""
    members = ["gone_UID", "fails_compile_UID", "rewrites_UID"]
    if verify != "none":
        members += ["fails_call_UID", "wrong_UID"] if differs else ["fails_call_UID"]
    listed = ", ".join(f'"{m}"' for m in [*members, real])
    said = "" if verify == "none" else f'verify = "{verify}"\n'
    return f"""
        [backends.chain_UID]
        chain = [{listed}]
        {said}
        [backends.gone_UID]
        target = "tbr_not_installed_anywhere:compile"
        [backends.fails_compile_UID]
        target = "{failing}:fails_at_compile"
        [backends.rewrites_UID]
        target = "{failing}:rewrites_then_fails"
        [backends.fails_call_UID]
        target = "{failing}:fails_at_first_call"
        [backends.wrong_UID]
        target = "{failing}:off_by_one"
    """


def with_buffers() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


def with_dropout() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))


def close(a: Any, b: Any) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-2, atol=1e-2))


@pytest.mark.parametrize("verify", ["none", "forward", "backward"])
@pytest.mark.parametrize("real", REAL)
def test_a_chain_falls_back_past_every_kind_of_failure_to_a_real_compiler(
    write: WriteFn, failing: str, logged: list[str], real: str, verify: str
) -> None:
    plugin_here(real)
    registry, uid = installed(write, chain_before(real, failing, verify))
    x = torch.randn(6, 4)
    twin, model = with_buffers().eval(), with_buffers().eval()
    compiled = torch.compile(model, backend=f"chain{uid}")

    # A forward pass for inference: every failure before the real compiler is skipped.
    with torch.no_grad():
        out = compiled(x)
        expected = twin(x)
    assert close(out, expected)
    assert used(registry, f"chain{uid}") == real
    skipped = [r for r in logged if ": skipping " in r]
    assert len(skipped) == (3 if verify == "none" else 5), skipped

    # A training step: gradients and BatchNorm's statistics as eager's.
    torch._dynamo.reset()
    logged.clear()
    model, twin = with_buffers(), with_buffers()
    compiled = torch.compile(model, backend=f"chain{uid}")
    if real in ("openvino",):
        # Inference only: its outputs require no grad. At every level, verify = "none" too,
        # that is seen before its backward is ever needed, and no member is left.
        with pytest.raises(Exception, match="no member of fallback chain") as caught:
            compiled(x)
        assert "no output requires grad, where eager's do" in str(caught.value)
        return
    compiled(x).sum().backward()
    twin(x).sum().backward()
    assert used(registry, f"chain{uid}") == real
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert mine.grad is not None
        assert close(mine.grad, theirs.grad)
    assert close(model[1].running_mean, twin[1].running_mean)
    assert close(model[1].running_var, twin[1].running_var)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("real", ["inductor", "aot_eager", "eager", "openvino"])
def test_a_model_with_dropout_is_verified_as_far_as_its_random_numbers_allow_and_trains(
    write: WriteFn, failing: str, logged: list[str], real: str, training: bool
) -> None:
    plugin_here(real)
    if real == "openvino" and training:
        pytest.skip("openvino compiles for inference only (test above)")
    # Its values cannot be compared with eager's (they are random): only a member that gives
    # other values would pass, and none is in the chain.
    registry, uid = installed(write, chain_before(real, failing, "backward", differs=False))
    model, twin = with_dropout(), with_dropout()
    x = torch.randn(6, 4)
    compiled = torch.compile(model, backend=f"chain{uid}")
    torch.manual_seed(3)
    if training:
        out = compiled(x)
        out.sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    else:
        with torch.no_grad():
            out = compiled(x)
    assert used(registry, f"chain{uid}") == real
    assert out.shape == (6, 3)
    # Eager and AOTAutograd draw random numbers as eager does: compared by value, and the
    # same values as an uncompiled twin. Inductor draws its own: only shapes and types can
    # agree, and the log says which. (OpenVINO may run dropout through PyTorch, or not.)
    same = "with the same random numbers as eager"
    own = "verified in shapes and types only"
    said = {"eager": [same], "aot_eager": [same], "inductor": [own]}.get(real, [same, own])
    assert any(any(s in r for s in said) for r in logged), logged
    if real in ("eager", "aot_eager"):
        torch.manual_seed(3)
        assert torch.equal(out.detach(), twin(x).detach())


CAUGHT_BY_VERIFY = """
import torch

def _each(out, change):
    return type(out)(change(o) for o in out) if isinstance(out, (list, tuple)) else change(out)

def one_output_more(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return (*out, out[0]) if isinstance(out, (list, tuple)) else (out, out)
    return run

def a_row_short(gm, example_inputs):
    return lambda *args: _each(gm(*args), lambda o: o[1:])

def counts_as_floats(gm, example_inputs):
    return lambda *args: _each(gm(*args), lambda o: o.double())

class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("no backward kernel for this device")

def backward_fails(gm, example_inputs):
    return lambda *args: _each(gm(*args), _NoBackward.apply)
"""


def test_verify_says_how_each_member_differs_and_the_chain_trains_with_the_next(
    write: WriteFn, make_module: Callable[..., str], module_name: str, logged: list[str]
) -> None:
    module = make_module(module_name, CAUGHT_BY_VERIFY)
    members = ["one_output_more", "a_row_short", "counts_as_floats", "backward_fails"]
    tables = "".join(f'[backends.{m}_UID]\ntarget = "{module}:{m}"\n' for m in members)
    listed = ", ".join([*(f'"{m}_UID"' for m in members), '"aot_eager"'])
    registry, uid = installed(
        write, f'[backends.chain_UID]\nchain = [{listed}]\nverify = "backward"\n{tables}'
    )
    model, twin = with_buffers(), with_buffers()
    x = torch.randn(6, 4)
    torch.compile(model, backend=f"chain{uid}")(x).sum().backward()
    twin(x).sum().backward()
    assert used(registry, f"chain{uid}") == "aot_eager"
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert mine.grad is not None
        assert close(mine.grad, theirs.grad)
    said = {m: next(r for r in logged if f"skipping '{m}{uid}'" in r) for m in members}
    assert "2 outputs where eager gives 1" in said["one_output_more"]
    assert "output 0 differs from eager beyond rtol=" in said["a_row_short"]
    assert "torch.Size([5, 3]) != torch.Size([6, 3])" in said["a_row_short"]
    assert "'dtype' do not match: torch.float64 != torch.float32" in said["counts_as_floats"]
    assert "its backward raised RuntimeError: no backward kernel" in said["backward_fails"]


def test_without_verify_a_member_that_fails_later_is_not_caught(
    write: WriteFn, failing: str
) -> None:
    # What a chain cannot help with, unless it verifies: for inference, a member that
    # compiles, then fails at its first call, or gives wrong values. (In training, each
    # member runs once, to see that its gradients reach what eager's do: the first is
    # caught there, as the last line shows.)
    _registry, uid = installed(
        write,
        f"""
        [backends.late_UID]
        chain = ["fails_call_UID", "eager"]
        [backends.wrong_chain_UID]
        chain = ["wrong_UID", "eager"]
        [backends.fails_call_UID]
        target = "{failing}:fails_at_first_call"
        [backends.wrong_UID]
        target = "{failing}:off_by_one"
        """,
    )
    x = torch.randn(6, 4)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="kernel launch failed"):
            torch.compile(with_buffers(), backend=f"late{uid}")(x)
        torch._dynamo.reset()
        out = torch.compile(with_buffers(), backend=f"wrong_chain{uid}")(x)
        assert not close(out, with_buffers()(x))
    torch._dynamo.reset()
    trained = torch.compile(with_buffers(), backend=f"late{uid}")(x)
    assert close(trained, with_buffers()(x))


def test_a_member_that_gives_nothing_to_run_is_skipped_by_name(
    write: WriteFn, failing: str, logged: list[str]
) -> None:
    registry, uid = installed(
        write,
        f"""
        [backends.chain_UID]
        chain = ["forgets_UID", "aot_eager"]
        [backends.forgets_UID]
        target = "{failing}:forgets_to_return"
        """,
    )
    model, x = with_buffers(), torch.randn(6, 4)
    assert close(torch.compile(model, backend=f"chain{uid}")(x), with_buffers()(x))
    assert used(registry, f"chain{uid}") == "aot_eager"
    assert any(
        f"skipping 'forgets{uid}': compiling gave NoneType, not a function" in r for r in logged
    ), logged


# ------------------------------------------------------------------ what torch.compile passes


def _recording_inductor(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the configuration inductor compiles with (torch.compile's wrapper passes it)."""
    import torch._inductor.compile_fx as compile_fx_module

    seen: list[dict[str, Any]] = []
    real = compile_fx_module.compile_fx

    def compile_fx(*args: Any, config_patches: Any = None, **kwargs: Any) -> Any:
        seen.append(dict(config_patches or {}))
        return real(*args, config_patches=config_patches, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", compile_fx)
    return seen


def test_inductor_as_a_member_gets_mode_and_options_as_torch_compile_gives_them(
    write: WriteFn, failing: str, logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _recording_inductor(monkeypatch)
    registry, uid = installed(
        write,
        f"""
        [backends.chain_UID]
        chain = ["fails_compile_UID", "inductor", "eager"]
        [backends.table_UID]
        by-device = {{ cpu = "inductor", other = "eager" }}
        [backends.fails_compile_UID]
        target = "{failing}:fails_at_compile"
        """,
    )
    x = torch.randn(6, 4)
    mode = "max-autotune-no-cudagraphs"
    torch.compile(with_buffers(), backend="inductor", mode=mode)(x)
    direct = seen[0]  # the outermost call: what torch.compile's wrapper asked for
    assert direct.get("max_autotune") is True
    for backend in (f"chain{uid}", f"table{uid}"):
        torch._dynamo.reset()
        seen.clear()
        out = torch.compile(with_buffers(), backend=backend, mode=mode)(x)
        assert close(out, with_buffers()(x))
        assert used(registry, backend) == "inductor"  # not a silent eager
        assert seen[0] == direct
    torch._dynamo.reset()
    seen.clear()
    options = {"epilogue_fusion": False}
    torch.compile(with_buffers(), backend=f"chain{uid}", options=options)(x)
    assert seen[0].get("epilogue_fusion") is False
    # An option inductor does not know is inductor's own error, at once: no fall to eager.
    torch._dynamo.reset()
    logged.clear()
    with pytest.raises(Exception, match="Unexpected optimization option epilogue_fusin"):
        torch.compile(with_buffers(), backend=f"chain{uid}", options={"epilogue_fusin": 1})(x)
    assert not any("compiled with 'eager'" in r for r in logged)


def test_inductor_declared_with_manifest_options_gets_mode_and_options_too(
    write: WriteFn, logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _recording_inductor(monkeypatch)
    registry, uid = installed(
        write,
        """
        [backends.tuned_UID]
        target = "torch._dynamo.backends.inductor:inductor"
        options = { config_patches = { epilogue_fusion = false } }
        [backends.chain_UID]
        chain = ["tuned_UID", "eager"]
        """,
    )
    x = torch.randn(6, 4)
    given: list[dict[str, Any]] = [
        {"mode": "max-autotune-no-cudagraphs"},
        {"options": {"max_autotune": True}},
    ]
    for backend in (f"tuned{uid}", f"chain{uid}"):
        for kwargs in given:
            torch._dynamo.reset()
            seen.clear()
            out = torch.compile(with_buffers(), backend=backend, **kwargs)(x)
            assert close(out, with_buffers()(x))
            # torch.compile's settings and the manifest's, both.
            assert seen[0].get("max_autotune") is True, (backend, kwargs, seen[0])
            assert seen[0].get("epilogue_fusion") is False
    assert used(registry, f"chain{uid}") == f"tuned{uid}"  # not a silent eager
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unexpected optimization option epilogue_fusin"):
        torch.compile(with_buffers(), backend=f"chain{uid}", options={"epilogue_fusin": 1})(x)
    assert not any("compiled with 'eager'" in r for r in logged), logged


def test_a_member_that_cannot_take_what_torch_compile_gives_is_an_error_at_once(
    write: WriteFn, logged: list[str]
) -> None:
    pytest.importorskip("openvino")
    _registry, uid = installed(write, '[backends.chain_UID]\nchain = ["openvino", "eager"]\n')
    with pytest.raises(Exception, match="its member 'openvino' cannot take") as caught:
        torch.compile(with_buffers(), backend=f"chain{uid}", mode="max-autotune")(torch.randn(6, 4))
    assert "option 'mode' is not a parameter of openvino" in str(caught.value)
    assert not any("compiled with 'eager'" in r for r in logged)


def test_a_misspelt_option_of_pytorchs_inductor_is_found_before_any_compile(
    write: WriteFn,
) -> None:
    # inductor takes **kwargs and hands them to compile_fx: a typo there would only fail
    # the compile, and a chain would then quietly run its next member.
    body = (
        "[backends.tuned_UID]\n"
        'target = "torch._dynamo.backends.inductor:inductor"\n'
        "options = { config_patchs = { max_autotune = true } }\n"
        '[backends.chain_UID]\nchain = ["tuned_UID", "eager"]\n'
    )
    registry, uid = installed(write, body)
    with pytest.raises(tbr.ManifestError) as caught:
        registry.lookup_backend(f"tuned{uid}")
    assert (caught.value.line, caught.value.key) == (
        3,
        f"backends.tuned{uid}.options.config_patchs",
    )
    assert caught.value.message.endswith("did you mean 'config_patches'?")
    done = torch_backends(
        "check", "--import", "--no-torch", cwd=Path(registry.context.cwd or "."), check=1
    )
    assert f"backends.tuned{uid}.options.config_patchs: option 'config_patchs'" in done.stdout


def test_options_torch_compile_gives_go_over_a_declared_options_table_key_by_key(
    write: WriteFn, tmp_path: Path
) -> None:
    # openvino takes its options as one table: the manifest's model caching must stay when
    # torch.compile gives another option, as the manifest's inductor settings do.
    pytest.importorskip("openvino")
    cache = tmp_path / "ovcache"
    _registry, uid = installed(
        write,
        "[backends.cached_UID]\n"
        'target = "openvino.frontend.pytorch.torchdynamo.backend:openvino"\n'
        f'options = {{ options = {{ model_caching = true, cache_dir = "{cache}" }} }}\n',
    )
    model = torch.nn.Linear(4, 2).eval()
    with torch.no_grad():
        out = torch.compile(model, backend=f"cached{uid}", options={"device": "CPU"})(
            torch.randn(3, 4)
        )
    assert out.shape == (3, 2)
    assert cache.is_dir()
    assert any(cache.iterdir())


# ------------------------------------------------------------------ verification


EXACT = """
import torch

def shifted_argmax(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return type(out)(o + 3 if not o.is_floating_point() else o for o in out)
    return run

def off_by_one(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return type(out)(o + 1.0 if o.is_floating_point() else o for o in out)
    return run

def zeros(gm, example_inputs):
    def run(*args):
        return type(out := gm(*args))(o * 0 for o in out)
    return run

class _Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 2

def doubled_gradients(gm, example_inputs):
    def run(*args):
        return type(out := gm(*args))(_Doubled.apply(o) for o in out)
    return run
"""


def test_verification_holds_integers_exactly_and_sees_lost_gradients(
    write: WriteFn, make_module: Callable[..., str], module_name: str, failing: str
) -> None:
    exact = make_module(module_name + "_exact", EXACT)
    registry, uid = installed(
        write,
        f"""
        [backends.exact_UID]
        chain = ["argmax_UID", "aot_eager"]
        verify = "forward"
        [backends.training_UID]
        chain = ["no_grad_UID", "aot_eager"]
        verify = "forward"
        [backends.argmax_UID]
        target = "{exact}:shifted_argmax"
        [backends.no_grad_UID]
        target = "{failing}:inference_only"
        """,
    )

    def top(x: Any) -> Any:
        return (x * 100).long().argmax(dim=1), x.sum()

    x = torch.randn(4, 600)
    got = torch.compile(top, backend=f"exact{uid}")(x)
    assert torch.equal(got[0], top(x)[0])  # 503 for 500 is wrong, whatever the tolerance
    assert used(registry, f"exact{uid}") == "aot_eager"
    # Training at the forward level: an inference-only member would lose the gradients.
    model = with_buffers()
    torch.compile(model, backend=f"training{uid}")(torch.randn(6, 4)).sum().backward()
    assert used(registry, f"training{uid}") == "aot_eager"
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():  # for inference, nothing is lost: the first member serves
        torch._dynamo.reset()
        torch.compile(with_buffers(), backend=f"training{uid}")(torch.randn(6, 4))
    assert used(registry, f"training{uid}") == f"no_grad{uid}"


@pytest.mark.parametrize("real", ["aot_eager", "openvino"])
def test_values_far_below_the_tolerance_are_still_verified(
    write: WriteFn, make_module: Callable[..., str], module_name: str, real: str
) -> None:
    # Probabilities over 1,000 classes, gradients of a loss weighted 1e-3: every value is
    # below the 0.01 tolerance, so a member that zeroes them or doubles them is still wrong,
    # while a member that computes them in bfloat16 (openvino here) is right.
    plugin_here(real)
    exact = make_module(module_name + "_small", EXACT)
    registry, uid = installed(
        write,
        f"""
        [backends.probabilities_UID]
        chain = ["zeros_UID", "{real}"]
        verify = "forward"
        [backends.gradients_UID]
        chain = ["doubled_UID", "aot_eager"]
        verify = "backward"
        [backends.zeros_UID]
        target = "{exact}:zeros"
        [backends.doubled_UID]
        target = "{exact}:doubled_gradients"
        """,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 1000), torch.nn.Softmax(-1))
    x = torch.randn(4, 16)
    with torch.no_grad():
        got = torch.compile(model, backend=f"probabilities{uid}")(x)
    assert used(registry, f"probabilities{uid}") == real
    assert torch.allclose(got.sum(-1), torch.ones(4), atol=1e-2)

    def loss(m: Any, x: Any) -> Any:
        return (torch.log_softmax(m(x), -1) * 1e-3).sum()

    small = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    loss(small, x).backward()
    expected = [p.grad.clone() for p in small.parameters()]
    small.zero_grad()
    loss(torch.compile(small, backend=f"gradients{uid}"), x).backward()
    assert used(registry, f"gradients{uid}") == "aot_eager"
    grads = zip(small.parameters(), expected, strict=True)
    assert all(torch.allclose(p.grad, e, rtol=1e-4, atol=0) for p, e in grads)


def test_under_dynamic_shapes_members_are_verified_and_restarts_pass_through(
    write: WriteFn, make_module: Callable[..., str], module_name: str, logged: list[str]
) -> None:
    exact = make_module(module_name + "_dyn", EXACT)
    registry, uid = installed(
        write,
        f"""
        [backends.checked_UID]
        chain = ["off_UID", "aot_eager", "eager"]
        verify = "forward"
        [backends.off_UID]
        target = "{exact}:off_by_one"
        """,
    )

    def scaled(x: Any, p: float) -> Any:
        # A float argument used in an op makes AOTAutograd restart dynamo's analysis under
        # dynamic=True; a size-dependent op gives the graph symbolic inputs.
        return torch.nn.functional.leaky_relu(x, p) * x.shape[0], torch.add(x, x, alpha=p)

    x = torch.randn(3, 4)
    out = torch.compile(scaled, backend=f"checked{uid}", dynamic=True)(x, 0.2)
    expected = scaled(x, 0.2)
    assert all(close(a, b) for a, b in zip(out, expected, strict=True))
    assert used(registry, f"checked{uid}") == "aot_eager"
    assert any("skipping 'off" in r and "differs from eager" in r for r in logged), logged
    assert not any("Restart" in r for r in logged)
    assert not any("not verified" in r for r in logged)


def test_a_table_picks_by_the_device_a_graph_makes_its_tensors_on(
    write: WriteFn, failing: str
) -> None:
    registry, uid = installed(
        write,
        f"""
        [backends.auto_UID]
        by-device = {{ meta = "eager", cpu = "fails_compile_UID" }}
        [backends.fails_compile_UID]
        target = "{failing}:fails_at_compile"
        """,
    )

    def made() -> Any:  # no inputs at all: the graph makes its own tensors
        return torch.ones(3, device="meta") * 2

    assert torch.compile(made, backend=f"auto{uid}")().device.type == "meta"
    assert used(registry, f"auto{uid}") == "eager"
    # With a tensor input on the CPU, a tensor made on the side does not decide.
    registry, uid = installed(write, '[backends.cpu_only_UID]\nby-device = { cpu = "eager" }\n')

    def aside(x: Any) -> Any:
        return x + 1, torch.zeros(4, device="meta") * 2

    torch.compile(aside, backend=f"cpu_only{uid}")(torch.randn(4))
    assert used(registry, f"cpu_only{uid}") == "eager"


# ------------------------------------------------------------------ plugins that register


TENSORRT = """
import torch

CALLS = []

@torch._dynamo.register_backend(name="tensorrt")
def tensorrt_backend(gm, example_inputs, **kwargs):
    CALLS.append("plugin's own")
    return gm.forward

def compile(gm, inputs, ir):
    CALLS.append("compile")
    return gm.forward
"""


@pytest.mark.parametrize("when", ["after install()", "before install()"])
def test_a_plugin_that_registers_its_own_name_on_import_beside_this_repository(
    tmp_path: Path, when: str
) -> None:
    # A real distribution, as pip leaves it, whose import registers 'tensorrt' with
    # PyTorch (as torch-tensorrt does); this repository's manifest declares 'tensorrt' too.
    site = tmp_path / "site"
    (site / "torch_tensorrt").mkdir(parents=True)
    (site / "torch_tensorrt" / "__init__.py").write_text(TENSORRT)
    info = site / "torch_tensorrt-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-tensorrt\nVersion: 9.9\n")
    early = "import torch_tensorrt\n" if when == "before install()" else ""
    late = "" if early else "import torch_tensorrt\n"
    code = f"""
import sys, warnings, torch
sys.path.insert(0, {str(site)!r})
import torch_backend_registry as tbr
warnings.simplefilter("error", tbr.ManifestWarning)
{early}tbr.install()
{late}model = torch.nn.Linear(3, 3)
out = torch.compile(model, backend="tensorrt")(torch.ones(2, 3))
import torch_tensorrt
info = tbr.backend_info("tensorrt")
print(info.source.kind, [(d.source.kind, d.target) for d in info.shadowed])
print(torch_tensorrt.CALLS)
print(tbr.lookup_backend("tensorrt").__name__, "tensorrt" in torch._dynamo.list_backends(()))
"""
    done = run_forked(code, ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "project [('torch', 'torch_tensorrt:tensorrt_backend')]",  # both known, by precedence
        "['compile']",  # torch.compile ran the manifest's backend, which lookup returns
        "tensorrt_compile True",
    ]


def test_a_stale_or_renamed_entry_point_is_never_loaded_by_a_listing(tmp_path: Path) -> None:
    # Two plugins in one process, as PyTorch read them once: one uninstalled since, one whose
    # new version renames its entry point.
    site = tmp_path / "site"
    for case in ("uninstalled", "upgraded"):
        info = site / f"{case}_plugin-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {case}-plugin\nVersion: 1.0\n"
        )
        (info / "entry_points.txt").write_text(
            f"[torch_dynamo_backends]\nold_{case} = tbr_{case}_plugin:compile\n"
        )
        (site / f"tbr_{case}_plugin.py").write_text(
            "import sys\nprint('plugin code ran', file=sys.stderr)\n"
            "def compile(gm, inputs):\n    return gm.forward\n"
        )

    code = """
import shutil, sys, pathlib
sys.path.insert(0, sys.argv[1])
import torch, torch_backend_registry as tbr
torch._dynamo.list_backends()  # PyTorch reads the entry points, once a process
assert {"old_uninstalled", "old_upgraded"} <= set(tbr.list_backends())
site = pathlib.Path(sys.argv[1])
shutil.rmtree(site / "uninstalled_plugin-1.0.dist-info")
(site / "tbr_uninstalled_plugin.py").unlink()
(site / "upgraded_plugin-1.0.dist-info" / "entry_points.txt").write_text(
    "[torch_dynamo_backends]\\nnew_upgraded = tbr_upgraded_plugin:compile\\n"
)
import importlib; importlib.invalidate_caches()
tbr.refresh()
names = tbr.list_backends(exclude_tags=())
print("inductor" in names, "new_upgraded" in names)
print([n for n in names if n.startswith("old_")], [m for m in sys.modules if m.startswith("tbr_")])
print(callable(tbr.lookup_backend("inductor")))
"""
    done = run_forked(code, tmp_path, args=(str(site),))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True True", "[] []", "True"]
    assert "plugin code ran" not in done.stderr


# ------------------------------------------------------------------ check --import


def test_check_import_imports_what_chains_and_tables_run(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    # A plugin that is installed but cannot be imported (built for another PyTorch).
    info = make_dist("broken-plugin", "1.0", {"broken_plugin": "tbr_broken_plugin_mod:compile"})
    (info.parent / "tbr_broken_plugin_mod.py").write_text(
        "raise ImportError('libbroken.so: undefined symbol: _ZN3c1017RegisterOperators')\n"
    )
    write(
        "backends.toml",
        """
        [backends.table]
        by-device = { cpu = "broken_plugin", other = "eager" }
        [backends.only]
        chain = ["broken_plugin"]
        [backends.mixed]
        chain = ["broken_plugin", "eager"]
        [backends.factory]
        target = "json:JSONEncoder"
        """,
    )
    done = torch_backends("check", "--import", cwd=tmp_path, check=None)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(": ", 3)[:3] for line in lines] == [
        ["backends.toml:2", "error", "backends.table.by-device"],
        ["backends.toml:4", "error", "backends.only.chain"],
        ["backends.toml:6", "warning", "backends.mixed.chain"],
        ["backends.toml:8", "error", "backends.factory.target"],
    ]
    assert "built for another PyTorch than the one installed here" in lines[0]
    assert lines[2].endswith("'mixed' uses the next member")
    assert "it looks like a factory that returns the compiler" in lines[3]
    assert done.stderr.splitlines()[-1] == (
        "3 problem(s); 1 of 4 backend(s) imported and usable, 1 warning(s); read backends.toml"
    )


# ------------------------------------------------------------------ what an attack found

MEDDLERS = """
import warnings
import torch
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

def strip_meta(gm, example_inputs):
    for node in gm.graph.nodes:  # an FX pass that rebuilds node metadata, then fails
        node.meta = {}
    raise RuntimeError("failed after its first pass")

def reverse_inputs(gm, example_inputs):
    example_inputs.reverse()  # what openvino does with model caching on
    raise RuntimeError("failed after reordering example_inputs")

def fold_constant(gm, example_inputs):
    gm.register_buffer("_folded_constant0", torch.ones(1))
    raise RuntimeError("failed after folding a constant")

def rewrite_branches(gm, example_inputs):
    # As inductor's pre-grad passes do: the graphs of torch.cond's branches, in place.
    for sub in gm.modules():
        if sub is not gm and isinstance(sub, torch.fx.GraphModule):
            for node in sub.graph.nodes:
                if node.target in (torch.sin, torch.ops.aten.sin.default):
                    node.target = torch.cos
            sub.recompile()
    raise RuntimeError("failed after its passes")

def traces_then_fails(gm, example_inputs):
    # As tracing compilers do (torch.jit.trace: tvm's, ipex's): the graph runs once on the
    # inputs dynamo gives, the real tensors, with whatever it writes into them.
    with warnings.catch_warnings():  # what tracing says of the graph is not this test's
        warnings.simplefilter("ignore")
        torch.jit.trace(gm, example_inputs, check_trace=False)
    raise RuntimeError("failed after tracing")

def traces_then_runs(gm, example_inputs):
    # A tracing compiler that works: the graph ran once on the real tensors while compiling.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(gm, example_inputs, check_trace=False)
    return gm.forward

def retraces_then_fails(gm, example_inputs):
    # As OpenVINO's compiler does: the graph traced again in dynamo's own fake mode, from
    # real tensors, which guards sizes of that trace's own; then it gives up.
    from torch._dynamo.backends.common import fake_tensor_unsupported
    from torch.fx.experimental.proxy_tensor import make_fx

    @fake_tensor_unsupported
    def trace(gm, example_inputs):
        return make_fx(gm, tracing_mode="fake", _allow_non_fake_inputs=True)(*example_inputs)

    trace(gm, example_inputs)
    raise RuntimeError("failed after tracing again")

def _ones_for_tangents(gm, example_inputs):
    for node in list(gm.graph.nodes):  # a lowering bug: every incoming gradient is 1
        if node.op == "placeholder" and node.name.startswith("tangents"):
            with gm.graph.inserting_after(node):
                ones = gm.graph.call_function(torch.ops.aten.ones_like.default, (node,))
            node.replace_all_uses_with(ones, delete_user_cb=lambda user: user is not ones)
    gm.recompile()
    return make_boxed_func(gm.forward)

ignores_incoming_gradient = aot_autograd(
    fw_compiler=lambda gm, inputs: make_boxed_func(gm.forward), bw_compiler=_ones_for_tangents
)
"""


@pytest.fixture
def meddlers(make_module: Callable[..., str], module_name: str) -> str:
    return make_module(module_name + "_meddlers", MEDDLERS)


def test_what_a_failing_member_changed_never_reaches_the_next_one_nor_dynamo(
    write: WriteFn, meddlers: str
) -> None:
    registry, uid = installed(
        write,
        "".join(
            f'[backends.{f}_UID]\ntarget = "{meddlers}:{f}"\n'
            f'[backends.after_{f}_UID]\nchain = ["{f}_UID", "aot_eager"]\n'
            for f in ("strip_meta", "reverse_inputs", "fold_constant", "rewrite_branches")
        ),
    )
    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    for meddler in ("strip_meta", "reverse_inputs", "fold_constant"):
        torch._dynamo.reset()
        out = torch.compile(model, backend=f"after_{meddler}{uid}")(x)
        assert close(out, model(x)), meddler
        assert used(registry, f"after_{meddler}{uid}") == "aot_eager"

    def branches(t: Any) -> Any:
        return torch.cond(t.sum() > 0, lambda u: torch.sin(u), lambda u: u * 2, (t,))

    torch._dynamo.reset()
    ones = torch.ones(3)
    assert close(
        torch.compile(branches, backend=f"after_rewrite_branches{uid}")(ones), branches(ones)
    )


def test_verification_keeps_the_layout_of_what_requires_grad(write: WriteFn) -> None:
    registry, uid = installed(
        write,
        '[backends.fwd_UID]\nchain = ["inductor", "eager"]\nverify = "forward"\n'
        '[backends.bwd_UID]\nchain = ["aot_eager", "eager"]\nverify = "backward"\n',
    )

    class Halves(Module):  # type: ignore[misc]  # the graph after the break gets strided views
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 8)

        def forward(self, x: Any) -> Any:
            a, b = self.lin(x).chunk(2, dim=-1)
            torch._dynamo.graph_break()
            return (a * b.sigmoid()).sum()

    def aliased(base: Any, view: Any) -> Any:  # one input a view of another, written
        view.mul_(2)
        return base * 3

    for backend, member in ((f"fwd{uid}", "inductor"), (f"bwd{uid}", "aot_eager")):
        torch._dynamo.reset()
        model = Halves()
        torch.compile(model, backend=backend)(torch.randn(3, 4)).backward()
        assert used(registry, backend) == member
        torch._dynamo.reset()
        leaf = torch.arange(4.0, requires_grad=True)
        base = leaf * 1
        torch.compile(aliased, backend=backend)(base, base[:2]).sum().backward()
        assert used(registry, backend) == member
        assert leaf.grad is not None
        assert leaf.grad.tolist() == [6.0, 6.0, 3.0, 3.0]


def test_a_backward_that_mishandles_its_incoming_gradient_is_seen(
    write: WriteFn, meddlers: str
) -> None:
    registry, uid = installed(
        write,
        f'[backends.safe_UID]\nchain = ["buggy_UID", "aot_eager"]\nverify = "backward"\n'
        f'[backends.buggy_UID]\ntarget = "{meddlers}:ignores_incoming_gradient"\n',
    )
    model, twin = with_buffers(), with_buffers()
    x = torch.randn(6, 4)
    (torch.compile(model, backend=f"safe{uid}")(x) * torch.arange(3.0)).sum().backward()
    (twin(x) * torch.arange(3.0)).sum().backward()
    assert used(registry, f"safe{uid}") == "aot_eager"
    assert close(model[0].weight.grad, twin[0].weight.grad)


def test_random_draws_written_into_an_input_are_no_difference(
    write: WriteFn, logged: list[str]
) -> None:
    _registry, uid = installed(
        write, '[backends.fast_UID]\nchain = ["inductor", "eager"]\nverify = "forward"\n'
    )

    class Noisy(Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("eps", torch.zeros(4))

        def forward(self, x: Any) -> Any:
            self.eps.copy_(torch.randn(4) * 0.1)  # noise resampled each step, into a buffer
            if x.sum() > 0:  # a graph break
                x = x * 2
            return self.lin(x) + self.eps

    torch.manual_seed(0)
    torch.compile(Noisy(), backend=f"fast{uid}")(torch.ones(2, 4))
    compiled = [r for r in logged if "compiled with" in r]
    assert len(compiled) == 2  # a graph each side of the break, both with inductor
    assert all("compiled with 'inductor'" in r for r in compiled), compiled


def test_a_nested_members_refusal_of_what_torch_compile_gives_is_never_skipped(
    write: WriteFn, logged: list[str]
) -> None:
    _registry, uid = installed(
        write,
        '[backends.inner_UID]\nchain = ["inductor"]\n'
        '[backends.outer_UID]\nchain = ["inner_UID", "eager"]\n'
        '[backends.table_UID]\nby-device = { cpu = "inductor" }\n'
        '[backends.outer_table_UID]\nchain = ["table_UID", "eager"]\n'
        '[backends.named_UID]\ntarget = "torch._dynamo.backends.inductor:inductor"\n'
        '[backends.outer_named_UID]\nchain = ["named_UID", "eager"]\n',
    )
    x = torch.randn(6, 4)
    for outer in (f"outer{uid}", f"outer_table{uid}", f"outer_named{uid}"):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="Unexpected optimization option bogus"):
            torch.compile(with_buffers(), backend=outer, options={"bogus": 1})(x)
    # PyTorch's inductor declared as a target is given mode= as inductor is.
    torch._dynamo.reset()
    out = torch.compile(
        with_buffers(), backend=f"outer_named{uid}", mode="max-autotune-no-cudagraphs"
    )(x)
    assert close(out, with_buffers()(x))
    assert not any("compiled with 'eager'" in r for r in logged)


def test_what_a_member_wrote_into_the_inputs_while_compiling_is_put_back(
    write: WriteFn, meddlers: str, logged: list[str]
) -> None:
    # A tracing compiler runs the graph on the real inputs while it compiles: in a training
    # step, BatchNorm's running statistics would count the step twice (the tracer's run,
    # then the member's that runs it). The chain puts them back as they came, from what the
    # eager reference kept of what the graph writes, and goes on, whether the tracer failed
    # after tracing or passed and another member came after it.
    _registry, uid = installed(
        write,
        f'[backends.tracer_UID]\ntarget = "{meddlers}:traces_then_fails"\n'
        f'[backends.passing_UID]\ntarget = "{meddlers}:traces_then_runs"\n'
        '[backends.plain_UID]\nchain = ["tracer_UID", "eager"]\n'
        '[backends.checked_UID]\nchain = ["tracer_UID", "aot_eager", "eager"]\n'
        'verify = "forward"\n'
        '[backends.fastest_UID]\nchain = ["passing_UID", "aot_eager", "eager"]\n'
        'select = "fastest"\n',
    )
    x = torch.randn(6, 4)
    for backend, tracer in (("plain", "tracer"), ("checked", "tracer"), ("fastest", "passing")):
        torch._dynamo.reset()
        logged.clear()
        model, twin = with_buffers(), with_buffers()
        out = torch.compile(model, backend=f"{backend}{uid}")(x)
        assert close(out, twin(x))
        # Counted once, as eager counts it.
        assert torch.allclose(model[1].running_mean, twin[1].running_mean), backend
        assert torch.allclose(model[1].running_var, twin[1].running_var), backend
        assert int(model[1].num_batches_tracked) == 1, backend
        assert any(
            f"compiling '{tracer}{uid}' ran the graph and wrote into input" in r
            and r.endswith("put back as it came")
            for r in logged
        ), backend

    def step(p: Any, g: Any) -> None:  # an optimizer's update: a parameter written
        with torch.no_grad():
            p.sub_(g)

    # For inference, a chain that verifies nothing keeps no reference to put inputs back
    # from: a member that failed after writing ends the chain, saying so.
    torch._dynamo.reset()
    weight = torch.nn.Parameter(torch.zeros(3))
    with torch.no_grad(), pytest.raises(Exception, match="wrote into input 0") as raised:
        torch.compile(step, backend=f"plain{uid}")(weight, torch.ones(3))
    assert f"'tracer{uid}': compiling raised RuntimeError: failed after tracing" in str(
        raised.value
    )
    assert torch.equal(weight, -torch.ones(3))  # once: the tracer's write, no second one


@pytest.mark.parametrize("select", ["", 'select = "fastest"'])
def test_guards_a_members_compile_puts_on_sizes_of_its_own_are_taken_back(
    write: WriteFn, logged: list[str], select: str
) -> None:
    # OpenVINO traces a convolution again with dynamo's own fake mode, guarding sizes of its
    # own that no input of the frame has: alone, torch.compile fails after it returned.
    pytest.importorskip("openvino")
    registry, uid = installed(write, f'[backends.chain_UID]\nchain = ["openvino"]\n{select}\n')
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()
    ).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        with pytest.raises(Exception, match="sources must not be empty"):
            torch.compile(model, backend="openvino")(x)
        torch._dynamo.reset()
        out = torch.compile(model, backend=f"chain{uid}")(x)
        assert close(out, model(x))
        assert close(torch.compile(model, backend=f"chain{uid}")(x * 2), model(x * 2))
    assert used(registry, f"chain{uid}") == "openvino"
    assert any("compiling 'openvino' guarded sizes of its own" in r for r in logged)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_what_a_member_that_then_failed_guarded_of_its_own_never_fails_the_frame(
    write: WriteFn, meddlers: str, logged: list[str], training: bool
) -> None:
    registry, uid = installed(
        write,
        f'[backends.retraces_UID]\ntarget = "{meddlers}:retraces_then_fails"\n'
        '[backends.chain_UID]\nchain = ["retraces_UID", "aot_eager"]\n',
    )
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()
    ).train(training)
    x = torch.randn(2, 3, 8, 8)
    with torch.set_grad_enabled(training):
        out = torch.compile(model, backend=f"chain{uid}")(x)
    if training:
        out.sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    else:
        assert close(out, model(x))
        assert any(f"compiling 'retraces{uid}' guarded sizes of its own" in r for r in logged)
    assert used(registry, f"chain{uid}") == "aot_eager"
