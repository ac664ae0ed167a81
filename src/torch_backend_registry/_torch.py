"""The bridge to PyTorch's registry: PyTorch's own backends as a source, and install().

Only public or long-stable parts of ``torch._dynamo`` are used:
``list_backends``, ``lookup_backend``, ``register_backend`` and
``torch.compiler.set_default_backend``. torch is imported here only, and only
when one of these functions runs.
"""

from __future__ import annotations

import functools
import importlib.util
import sys

from ._definition import BackendDefinition, Source, target_of
from ._errors import BackendRegistryError, warn
from ._locks import ForkSafeLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from ._definition import DefaultDeclaration
    from ._registry import Registry

# torch's registry is process-wide, so what this bridge put there is too. Lock
# order: this lock, then a registry's (never the other way round).
_INSTALLED: dict[str, _LazyBackend] = {}
_INSTALL_LOCK = ForkSafeLock()

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


class _LazyBackend:
    """Stands in PyTorch's registry for a backend; imports its target on the first call.

    It asks the registry on every call (a dict hit once loaded), so ``refresh()``
    and later registrations take effect without installing again; a name the
    registry refuses (disabled, say) is refused by torch.compile too.
    """

    def __init__(self, registry: Registry, name: str) -> None:
        self.registry = registry
        self.name = name
        self.__name__ = name
        self.__qualname__ = name

    def __repr__(self) -> str:
        return f"<torch-backend-registry backend {self.name!r}>"

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        return self.registry.lookup_backend(self.name)(gm, example_inputs, **kwargs)


def torch_available() -> bool:
    """Whether torch can be found, without importing it."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


@functools.cache  # one process runs one installed torch; reading metadata costs ms
def torch_version() -> str | None:
    """The installed PyTorch's version, read from its metadata (no import of torch)."""
    from ._cache import installed_version

    return installed_version("torch")


def dynamo_imported() -> bool:
    """Whether torch.compile's registry is in this process already (no import)."""
    return "torch._dynamo" in sys.modules


def _pytorch_names(dynamo: Any) -> list[str]:
    """The names in PyTorch's registry that are PyTorch's own (or a plugin's, registered late)."""
    from ._sources import read_entry_points

    names = dynamo.list_backends(exclude_tags=())
    # Entry points and what this bridge installed are other sources' to report.
    from_entry_points = {ep.name for ep in read_entry_points([])}
    return [n for n in names if n not in from_entry_points and n not in _INSTALLED]


def torch_definitions() -> list[BackendDefinition]:
    """PyTorch's own backends (not its entry points, not what this bridge installed)."""
    if not torch_available():
        return []
    try:
        import torch._dynamo as dynamo

        names = _pytorch_names(dynamo)
    except Exception as exc:  # a broken torch must not break manifest backends
        warn(f"PyTorch's backends are left out: torch._dynamo failed: {type(exc).__name__}: {exc}")
        return []
    definitions = []
    for name in names:
        # Entry points are left out above, so this is a dict hit: nothing imported.
        fn = dynamo.lookup_backend(name)
        if isinstance(fn, _LazyBackend):
            continue
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


def torch_names_changed(known: Iterable[str]) -> bool:
    """Whether PyTorch's registry now holds names that ``known`` does not (or lacks some).

    PyTorch's registry is an in-memory dict: a plugin may add to it at any time.
    Cheap: the names only, nothing imported.
    """
    if not dynamo_imported():
        return False
    import torch._dynamo as dynamo

    try:
        return set(_pytorch_names(dynamo)) != set(known)
    except Exception:
        return False


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


def pytorch_callables() -> list[Any]:
    """The callables of PyTorch's registry that are loaded, for is_registered_backend()."""
    if not dynamo_imported():
        return []
    import torch._dynamo as dynamo

    loaded = []
    for name in _pytorch_names(dynamo):
        loaded.append(dynamo.lookup_backend(name))
    return loaded


def _dynamo() -> Any:
    if not torch_available():
        raise BackendRegistryError(
            "install() needs PyTorch: pip install torch (torch.compile is what it extends)"
        )
    import torch._dynamo

    for needed in ("register_backend", "list_backends", "lookup_backend"):
        if not hasattr(torch._dynamo, needed):
            raise BackendRegistryError(
                f"this PyTorch ({torch.__version__}) has no torch._dynamo.{needed};"
                " install() needs torch >= 2.0"
            )
    return torch._dynamo


def prepare() -> None:
    """Let PyTorch register its own backends and read its entry points now,
    so that a later import of its backends cannot collide with ours."""
    _dynamo().list_backends(exclude_tags=())


def install_names(registry: Registry, names: Iterable[str]) -> None:
    """Put a :class:`_LazyBackend` for each name into PyTorch's registry."""
    dynamo = _dynamo()
    with _INSTALL_LOCK:
        for name in names:
            proxy = _INSTALLED.get(name)
            if proxy is not None:
                proxy.registry = registry
                continue
            proxy = _LazyBackend(registry, name)
            try:
                definition = registry.backend_info(name)
                tags = definition.tags
            except BackendRegistryError:
                tags = ()  # refused by the registry (disabled): refused by torch.compile too
            try:
                dynamo.register_backend(proxy, name=name, tags=tags)
            except AssertionError:
                # PyTorch raises AssertionError("duplicate name") for a name it has
                # loaded already: an entry point someone compiled with before install().
                warn(
                    f"backend {name!r} is not installed into torch.compile: PyTorch has"
                    " loaded a backend of that name already; call install() first"
                )
                continue
            _INSTALLED[name] = proxy


def apply_default(registry: Registry, default: DefaultDeclaration | None) -> None:
    """Make a manifest's ``default`` what torch.compile uses when given no backend."""
    if default is None:
        return
    name, path, line = default.name, default.path, default.line
    try:
        registry.backend_info(name)
    except BackendRegistryError as exc:
        warn(f"{path}:{line}: {default.key}: not applied: {exc}")
        return
    import torch.compiler

    setter = getattr(torch.compiler, "set_default_backend", None)
    if setter is None:
        warn(
            f"{path}:{line}: default backend {name!r} not applied: this PyTorch has no"
            " torch.compiler.set_default_backend (added in a later release)"
        )
        return
    setter(name)
