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

from .conftest import WriteFn

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

def wrong(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return type(out)(o + 1 for o in out) if isinstance(out, (list, tuple)) else out + 1
    return run

def inference_only(gm, example_inputs):
    def run(*args):
        with torch.no_grad():
            return gm(*args)
    return run

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
    assert f"backend 'portable{uid}': compiled with 'fine{uid}'" in logged


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
    assert (error.line, error.key) == (1, f"backends.gpu_only{uid}.by-device")


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
        .message.startswith("by-device 'auto' names 'nowhere', which is no usable backend")
    )


# ------------------------------------------------------------------ chains that verify


def test_a_chain_that_verifies_skips_what_fails_differs_or_has_no_backward(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = installed(
        write,
        f"""
        [backends.careful_UID]
        chain = ["launch_UID", "wrong_UID", "inference_UID", "fine_UID"]
        verify = "backward"
        [backends.launch_UID]
        target = "{members}:fails_at_first_call"
        [backends.wrong_UID]
        target = "{members}:wrong"
        [backends.inference_UID]
        target = "{members}:inference_only"
        [backends.fine_UID]
        target = "{members}:fine"
        """,
    )
    x = torch.randn(5, 4)
    out = torch.compile(model(), backend=f"careful{uid}")(x)
    assert torch.allclose(out, model()(x))
    skipped = [r for r in logged if "skipping" in r]
    assert skipped[0].endswith("running it raised RuntimeError: kernel launch failed")
    assert "output 0 differs from eager beyond rtol=0.01, atol=0.01" in skipped[1]
    assert "its backward raised RuntimeError" in skipped[2]
    assert logged[-1] == (
        f"backend 'careful{uid}': compiled with 'fine{uid}', backward verified against eager"
    )


def test_verifying_at_the_forward_level_keeps_an_inference_backend(
    write: WriteFn, members: str, logged: list[str]
) -> None:
    _registry, uid = installed(
        write,
        f"""
        [backends.serving_UID]
        chain = ["inference_UID", "fine_UID"]
        verify = "forward"
        [backends.inference_UID]
        target = "{members}:inference_only"
        [backends.fine_UID]
        target = "{members}:fine"
        """,
    )
    torch.compile(model(), backend=f"serving{uid}")(torch.randn(5, 4))
    assert logged[-1] == (
        f"backend 'serving{uid}': compiled with 'inference{uid}', forward verified against eager"
    )


def test_verifying_changes_no_state_of_the_model(write: WriteFn, members: str) -> None:
    _registry, uid = installed(
        write,
        f"""
        [backends.careful_UID]
        chain = ["fine_UID"]
        verify = "backward"
        [backends.fine_UID]
        target = "{members}:fine"
        """,
    )
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
