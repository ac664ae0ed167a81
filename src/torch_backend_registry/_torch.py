"""The bridge to PyTorch's registry: PyTorch's own backends as a source, and install().

Only public or long-stable parts of ``torch._dynamo`` are used:
``list_backends``, ``lookup_backend``, ``register_backend`` and
``torch.compiler.set_default_backend``. torch is imported here only, and only
when one of these functions runs.
"""

from __future__ import annotations

import importlib.util

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


class _LazyBackend:
    """Stands in PyTorch's registry for a backend; imports its target on the first call.

    It asks the registry on every call (a dict hit once loaded), so ``refresh()``
    and later registrations take effect without installing again.
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


def torch_definitions() -> list[BackendDefinition]:
    """PyTorch's own backends (not its entry points, not what this bridge installed)."""
    if not torch_available():
        return []
    try:
        import torch._dynamo as dynamo

        names = dynamo.list_backends(exclude_tags=())
    except Exception as exc:  # a broken torch must not break manifest backends
        warn(f"PyTorch's backends are left out: torch._dynamo failed: {type(exc).__name__}: {exc}")
        return []
    from ._sources import read_entry_points

    # Their problems are the entry-point source's to report.
    from_entry_points = {ep.name for ep in read_entry_points([])}
    definitions = []
    source = Source("torch")
    for name in names:
        if name in from_entry_points or name in _INSTALLED:
            continue
        # Entry points are skipped above, so this is a dict hit: nothing imported.
        fn = dynamo.lookup_backend(name)
        if isinstance(fn, _LazyBackend):
            continue
        definitions.append(
            BackendDefinition(
                name,
                source,
                target=target_of(fn),
                tags=tuple(getattr(fn, "_tags", ())),
                compiler_fn=fn,
            )
        )
    return definitions


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
            definition = registry.backend_info(name)
            proxy = _INSTALLED.get(name)
            if proxy is not None:
                proxy.registry = registry
                proxy._tags = definition.tags  # type: ignore[attr-defined]
                continue
            proxy = _LazyBackend(registry, name)
            try:
                dynamo.register_backend(proxy, name=name, tags=definition.tags)
            except AssertionError:
                # PyTorch raises AssertionError("duplicate name") for a name it
                # has already loaded, such as its own "inductor".
                warn(
                    f"{definition.source.describe()}: backend {name!r} is not installed into"
                    " torch.compile: PyTorch already has a backend of that name; rename it"
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
