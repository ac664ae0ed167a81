"""PyTorch's own registry, read as a source: its backends, its names, its version.

torch is imported here only when PyTorch's backends are asked for; whether it
is installed, its version and the names of its own backends are known without
importing it.
"""

from __future__ import annotations

import sys

from ._definition import BackendDefinition, Source, target_of
from ._errors import warn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Any

#: What PyTorch's own backends need and are, which their functions do not say:
#: name -> (modules they import when called, device kind, description).
_KNOWN: dict[str, tuple[tuple[str, ...], str | None, str]] = {
    "inductor": ((), None, "PyTorch's default compiler, TorchInductor"),
    "cudagraphs": ((), "cuda", "records the graph as a CUDA graph and replays it"),
    "tvm": (("tvm",), None, "Apache TVM"),
    "openxla": (("torch_xla",), None, "PyTorch/XLA through AOTAutograd"),
    "openxla_eval": (("torch_xla",), None, "PyTorch/XLA, inference only"),
    "onnxrt": (("onnxruntime",), None, "ONNX Runtime"),
    "eager": ((), None, "runs the captured graph as it is (for debugging)"),
    "aot_eager": ((), None, "AOTAutograd tracing, then eager (for debugging)"),
    "aot_eager_default_partitioner": ((), None, "aot_eager with the default partitioner"),
    "aot_eager_decomp_partition": ((), None, "aot_eager with decompositions and partitioning"),
    "aot_ts": ((), None, "AOTAutograd with TorchScript (for debugging)"),
    "ts": ((), None, "TorchScript (for debugging)"),
}

#: The names PyTorch's own backends take (torch 2.13), known without importing torch:
#: PyTorch's registry refuses a second definition of them, so this one does too.
#: Once ``torch._dynamo`` is loaded, the names it holds are read instead.
PYTORCH_NAMES = frozenset(
    """
    aot_eager aot_eager_decomp_partition aot_eager_decomp_partition_crossref
    aot_eager_decomp_partition_with_mode aot_eager_default_partitioner aot_ts cudagraphs
    dynamo_accuracy_minifier_backend dynamo_minifier_backend eager eager_debug eager_noexcept
    inductor invoke_subgraph non_leaf_compile_error_TESTING_ONLY openxla openxla_eval
    pre_dispatch_eager relu_accuracy_error_TESTING_ONLY relu_compile_error_TESTING_ONLY
    relu_runtime_error_TESTING_ONLY ts tvm
    """.split()  # noqa: SIM905 - names to read, not a list to edit
)

#: The attribute that marks what this library put into PyTorch's registry (the
#: torch bridge's stand-ins): another source's backend, not PyTorch's own.
STAND_IN = "__torch_backend_registry__"


def torch_available() -> bool:
    """Whether torch can be found, without importing it."""
    if sys.modules.get("torch") is not None:
        return True
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def torch_version() -> str | None:
    """The installed PyTorch's version, read from its metadata (no import of torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def dynamo_imported() -> bool:
    """Whether torch.compile's registry is in this process already (no import)."""
    return "torch._dynamo" in sys.modules


def registered(entry_points: Collection[str]) -> dict[str, Any] | None:
    """What PyTorch's registry holds now, by name, less ``entry_points`` (not loaded) and
    this library's stand-ins; ``None`` while ``torch._dynamo`` is not imported. Dict reads."""
    dynamo: Any = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return None
    try:
        names = dynamo.list_backends(exclude_tags=())
        found = {name: dynamo.lookup_backend(name) for name in names if name not in entry_points}
    except Exception:
        return None
    return {name: fn for name, fn in found.items() if getattr(fn, STAND_IN, False) is not True}


def own(fn: object) -> bool:
    """Whether a callable in PyTorch's registry is one of PyTorch's own backends (defined in
    torch), which no other source may redefine, rather than a plugin's registered there."""
    module = getattr(fn, "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def torch_definitions(entry_points: Collection[str]) -> list[BackendDefinition]:
    """What PyTorch's registry holds: its own backends, and what plugins registered there
    with ``torch._dynamo.register_backend`` (not its entry points, not this library's
    stand-ins). Imports ``torch._dynamo``; a broken torch leaves them out with a warning."""
    if not torch_available():
        return []
    try:
        import torch._dynamo as dynamo

        dynamo.list_backends(exclude_tags=())  # PyTorch reads its own backends now
        found = registered(entry_points) or {}
    except Exception as exc:  # a broken torch must not break manifest backends
        warn(f"PyTorch's backends are left out: torch._dynamo failed: {type(exc).__name__}: {exc}")
        return []
    definitions = []
    for name, fn in sorted(found.items()):
        requires, _device, description = _KNOWN.get(name, ((), None, None))
        definitions.append(
            BackendDefinition(
                name,
                Source("torch", module=getattr(fn, "__module__", None)),
                target=_target(fn),
                tags=tuple(getattr(fn, "_tags", ())),
                description=description,
                requires=requires,
                compiler_fn=fn,
            )
        )
    return definitions


def _target(fn: object) -> str | None:
    """Where ``fn`` can be imported from; for a wrapper object, what it wraps."""
    target = target_of(fn)
    if target is not None:
        return target
    inner = getattr(fn, "func", None) or getattr(fn, "kwargs", {}).get("fw_compiler")
    return target_of(inner) if inner is not None else None


def missing_device(name: str) -> str | None:
    """The device kind one of PyTorch's own backends needs and this machine lacks."""
    device = _KNOWN.get(name, ((), None, ""))[1]
    if device is None:
        return None
    import torch

    module = getattr(torch, device, None)
    available = getattr(module, "is_available", None)
    if callable(available) and available():
        return None
    return (
        f"needs a {device.upper() if len(device) <= 4 else device} device; none is available here"
    )
