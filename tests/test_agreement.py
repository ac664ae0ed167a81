"""One name, one backend: this registry and PyTorch's, side by side in one process.

After install(), for every name, torch.compile(backend=name) runs what
lookup_backend(name) returns, or both refuse.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import (
    BackendRegistryError,
    DuplicateBackendError,
    ManifestWarning,
    Problem,
    Registry,
    UnknownBackendError,
)

from .conftest import WriteFn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

COUNTING = """
CALLS = []
def count(gm, example_inputs, **options):
    CALLS.append(options.get("tag"))
    return gm.forward
"""


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    yield
    torch._dynamo.reset()


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:8]


def model() -> Any:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())


def test_every_listed_name_compiles_with_what_lookup_returns(
    write: WriteFn,
    make_module: Callable[..., str],
    make_dist: Callable[..., Path],
    module_name: str,
    uid: str,
) -> None:
    counting = make_module(module_name, COUNTING)
    make_dist(f"tbr-agree-{uid}", "1.0", {f"ep_{uid}": f"{counting}:count"})
    path = write(
        "backends.toml",
        f"""
        [backends.mine_{uid}]
        target = "{counting}:count"
        options = {{ tag = "mine" }}
        aliases = ["alias_{uid}"]
        tags = ["debug"]

        [backends.chain_{uid}]
        chain = ["nope_{uid}", "mine_{uid}"]

        [backends.ep_{uid}]          # hides an installed plugin's entry point
        enabled = false

        [backends.inductor]          # PyTorch's own: refused where it is declared
        target = "{counting}:count"

        [backends.aot_eager]         # PyTorch's own: cannot be disabled
        enabled = false
        """,
    )
    registry = Registry(cwd=path.parent, environ={})
    with pytest.warns(ManifestWarning) as caught:
        tbr.install(registry)
    refusals = sorted(str(w.message) for w in caught if "PyTorch's own" in str(w.message))
    assert sorted(r.split(": ", 2)[1] for r in refusals) == [
        "backends.aot_eager",
        "backends.inductor",
    ]
    # PyTorch's backend of that name stays: the warning never says that it is left out.
    assert not [r for r in refusals if "so backend" in r], refusals
    module = __import__(counting)
    x = torch.ones(2, 4)
    for name in [*registry.list_backends(exclude_tags=()), f"alias_{uid}"]:
        ours = registry.lookup_backend(name)
        theirs = torch._dynamo.lookup_backend(name)
        if theirs is ours:
            continue  # PyTorch's own and entry points: the very same object
        # A stand-in: compiling through it must reach exactly our callable.
        module.CALLS.clear()
        torch._dynamo.reset()
        torch.compile(model(), backend=name)(x)
        assert module.CALLS == ["mine"], name
    # A name the registry refuses, torch.compile refuses too: both say why.
    with pytest.raises(UnknownBackendError, match="disabled by"):
        registry.lookup_backend(f"ep_{uid}")
    with pytest.raises(Exception, match="disabled by"):
        torch.compile(model(), backend=f"ep_{uid}")(x)
    # PyTorch's own names kept theirs, in both.
    for name in ("inductor", "aot_eager"):
        assert registry.lookup_backend(name) is torch._dynamo.lookup_backend(name)
    problems = {p.key: p for p in registry.problems() if isinstance(p, Problem)}
    assert problems["backends.inductor"].line == 13
    assert "cannot be disabled" in problems["backends.aot_eager"].message


def test_registering_one_of_pytorchs_names_is_refused_as_pytorch_refuses_it() -> None:
    registry = Registry(environ={}, sources=("runtime", "torch"))
    registry.list_backends()  # torch.compile's registry is loaded
    with pytest.raises(DuplicateBackendError, match=r"'aot_eager_default_partitioner' is already"):
        registry.register_backend(len, name="aot_eager_default_partitioner")
    with pytest.raises(AssertionError, match="duplicate name"):
        torch._dynamo.register_backend(len, name="aot_eager_default_partitioner")


def test_a_backend_pytorch_gains_later_is_found_at_once(uid: str) -> None:
    registry = Registry(environ={}, sources=("runtime", "project", "torch"))
    assert f"late_{uid}" not in registry.list_backends()

    def late(gm: Any, example_inputs: Any) -> Any:
        return gm.forward

    torch._dynamo.register_backend(late, name=f"late_{uid}")  # as `import some_plugin` does
    assert registry.lookup_backend(f"late_{uid}") is late
    info = registry.backend_info(f"late_{uid}")
    assert (info.source.kind, info.source.module) == ("torch", __name__)
    assert f"late_{uid}" in registry.list_backends()


def test_is_registered_backend_answers_as_pytorch_does() -> None:
    registry = Registry(environ={}, sources=("runtime", "torch"))
    registry.list_backends()
    eager = torch._dynamo.lookup_backend("eager")
    wrapper = torch._TorchCompileWrapper("aot_eager", None, None, None)
    inductor = torch._TorchCompileInductorWrapper(None, None, None)
    # PyTorch's _is_registered_backend answers True, True, True, False for these.
    answers = [
        registry.is_registered_backend(candidate)
        for candidate in (eager, wrapper, inductor, lambda gm, inputs: gm)
    ]
    assert answers == [True, True, True, False]


def test_pytorchs_own_backends_say_what_they_need_and_are() -> None:
    registry = Registry(environ={}, sources=("torch",))
    why = {d.name: registry.why_unavailable(d) for d in registry.definitions(exclude_tags=())}
    if not torch.cuda.is_available():
        assert why["cudagraphs"] == "needs a CUDA device; none is available here"
    for name, module in (("tvm", "tvm"), ("openxla", "torch_xla")):
        try:
            __import__(module)
        except ImportError:
            assert why[name] == f"missing {module}"
    assert why["eager"] is None
    for name in ("cudagraphs", "openxla", "aot_ts", "aot_eager_default_partitioner"):
        info = registry.backend_info(name)
        assert info.target or info.description, name


def test_an_alias_follows_its_backend_to_the_override(
    write: WriteFn, make_module: Callable[..., str], module_name: str
) -> None:
    counting = make_module(module_name, COUNTING)
    project = write(
        "proj/backends.toml",
        f'[backends.op_counts]\ntarget = "{counting}:count"\naliases = ["ops"]\n'
        'options = { tag = "project" }\n',
    )
    override = write(
        "cluster/backends.toml",
        f'[backends.op_counts]\ntarget = "{counting}:count"\noptions = {{ tag = "cluster" }}\n',
    )
    registry = Registry(
        cwd=project.parent,
        environ={"TORCH_BACKENDS_PATH": str(override.parent)},
        sources=("env", "project"),
    )
    assert registry.lookup_backend("ops") is registry.lookup_backend("op_counts")
    assert registry.backend_info("ops").options == {"tag": "cluster"}


def test_a_chain_says_which_members_are_unavailable_and_why(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        '[backends.trt]\ntarget = "m:f"\nrequires = ["tbr_no_such_module"]\n'
        '[backends.portable]\nchain = ["trt", "nope", "cudagraphs"]\n',
    )
    registry = Registry(cwd=path.parent, environ={})
    why = registry.why_unavailable(registry.backend_info("portable"))
    if torch.cuda.is_available():
        assert why is None
        return
    assert why == (
        "no member can be used (trt: missing tbr_no_such_module; nope: not installed here;"
        " cudagraphs: needs a CUDA device; none is available here)"
    )


def test_unknown_names_read_as_sentences(write: WriteFn) -> None:
    path = write("backends.toml", '[backends.mine]\ntarget = "m:f"\n')
    registry = Registry(cwd=path.parent, environ={}, sources=("project",))
    with pytest.raises(UnknownBackendError) as caught:
        registry.lookup_backend("mien")
    assert str(caught.value) == (
        "unknown backend 'mien'. Did you mean 'mine'? list_backends(exclude_tags=()) gives"
        " every name."
    )
    assert isinstance(caught.value, LookupError)
    assert isinstance(caught.value, BackendRegistryError)
