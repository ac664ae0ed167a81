"""PyTorch's own registry, read as a source: its backends, its names, its version.

torch is imported here only when PyTorch's backends are asked for; whether it
is installed, its version and the names of its own backends are known without
importing it.
"""

from __future__ import annotations

import contextlib
import functools
import sys

from .._definition import BackendDefinition, Source, target_of
from .._errors import warn

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


@functools.cache  # one process runs one PyTorch
def torch_version() -> str | None:
    """The installed PyTorch's version, as ``torch.__version__`` gives it, without importing
    torch or ``importlib.metadata``: from the ``version.py`` beside its ``__init__``."""
    module = sys.modules.get("torch")
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    import importlib.util
    import os
    import re

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str):
        return None
    try:
        with open(os.path.join(os.path.dirname(origin), "version.py"), encoding="utf-8") as f:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.MULTILINE)
    except OSError:
        found = None
    if found is not None:
        return found.group(1)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:  # a PyTorch laid out otherwise: its metadata says
        return installed("torch")
    except PackageNotFoundError:
        return None


def public_version(version: str | None) -> str | None:
    """A version without its local label (``2.13.0`` of ``2.13.0+cu128``): what decides
    what PyTorch's own backends run. The CPU and the CUDA build of one release run the
    same Python code for every backend name, so a login node and its GPU nodes agree."""
    return None if version is None else version.split("+", 1)[0]


def dynamo_imported() -> bool:
    """Whether torch.compile's registry is in this process, imported whole (no import; a
    module another thread is still importing is not: reading it could wait on that
    thread's import, for ever in the child of a fork)."""
    module = sys.modules.get("torch._dynamo")
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


#: Where PyTorch keeps its registry: ``_COMPILER_FNS``, the backends it has loaded, by name.
REGISTRY_MODULE = "torch._dynamo.backends.registry"

#: Plugins' own registrations (``torch._dynamo.register_backend`` at import) of a name this
#: library's stand-in holds in PyTorch's registry, kept here instead (see ``_torch``): they
#: are still PyTorch's registry's definitions of that name, shadowed by the registry's.
DISPLACED: dict[str, Any] = {}


def loaded_backends() -> dict[str, Any] | None:
    """The backends PyTorch's registry has loaded, by name; ``None`` while torch.compile's
    registry is not imported. A dict read: an entry point PyTorch knows of but has not
    loaded (a plugin since upgraded or removed, say) is neither loaded nor looked at."""
    module: Any = sys.modules.get(REGISTRY_MODULE)
    if module is None or not dynamo_imported():
        return None
    found = getattr(module, "_COMPILER_FNS", None)
    if isinstance(found, dict):
        return dict(found)
    # Another layout: ask by name, each alone, for the names that are not entry points.
    dynamo: Any = sys.modules.get("torch._dynamo")
    loaded: dict[str, Any] = {}
    try:
        names = dynamo.list_backends(exclude_tags=())
    except Exception:
        return loaded
    for name in names:
        point = getattr(module, "_BACKENDS", {}).get(name)
        if point is None:  # registered by code, not an entry point it would load now
            with contextlib.suppress(Exception):
                loaded[name] = dynamo.lookup_backend(name)
    return loaded


def registered(entry_points: Collection[str]) -> dict[str, Any] | None:
    """What PyTorch's registry holds now, by name: what it has loaded, less ``entry_points``
    and this library's stand-ins, with the registrations a stand-in displaced; ``None`` while
    ``torch._dynamo`` is not imported. Dict reads: nothing is loaded."""
    found = loaded_backends()
    if found is None:
        return None
    held = {
        name: fn
        for name, fn in found.items()
        if name not in entry_points and getattr(fn, STAND_IN, False) is not True
    }
    for name, fn in list(DISPLACED.items()):
        held.setdefault(name, fn)
    return held


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
