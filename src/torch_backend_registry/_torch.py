"""The bridge to torch.compile: install() puts a registry's backends into PyTorch's registry.

Only public or long-stable parts of ``torch._dynamo`` are used:
``list_backends``, ``lookup_backend``, ``register_backend`` and
``torch.compiler.set_default_backend``.
"""

from __future__ import annotations

from ._errors import BackendRegistryError, warn
from ._locks import ForkSafeLock
from ._pytorch import STAND_IN, torch_available

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._definition import BackendDefinition
    from ._registry import Registry

# torch's registry is process-wide, so what this bridge put there is too. Lock
# order: this lock, then a registry's (never the other way round).
_INSTALLED: dict[str, _LazyBackend] = {}
_INSTALL_LOCK = ForkSafeLock()


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
        setattr(self, STAND_IN, True)

    def __repr__(self) -> str:
        return f"<torch-backend-registry backend {self.name!r}>"

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from ._loader import call_options

        fn = self.registry.lookup_backend(self.name)
        return fn(gm, example_inputs, **call_options(fn, self.name, kwargs))


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


def install(registry: Registry) -> None:
    """Make every backend of ``registry`` a ``torch.compile`` name, importing no target;
    apply its manifest ``default``. Idempotent; later refreshes and registrations follow."""
    # PyTorch registers its own backends and reads its entry points now, so that a
    # later import of its backends cannot collide with ours.
    _dynamo().list_backends(exclude_tags=())
    registry.on_change(_follow)
    _install_names(registry)
    _apply_default(registry)


def _follow(registry: Registry) -> None:
    """After a refresh or a registration: new names reach torch.compile at once."""
    _install_names(registry)


def _install_names(registry: Registry) -> None:
    names = stand_in_names(registry)
    dynamo = _dynamo()
    with _INSTALL_LOCK:
        for name in names:
            proxy = _INSTALLED.get(name)
            if proxy is not None:
                proxy.registry = registry
                continue
            proxy = _LazyBackend(registry, name)
            try:
                tags = registry.backend_info(name).tags
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


def stand_in_names(registry: Registry) -> list[str]:
    """The names torch.compile needs a stand-in for, so that it runs what the registry does.

    PyTorch reads the entry points itself (the same ones, in the same order): an
    entry point's own name needs none, unless a higher definition hides it
    (disabled, broken), the policy left it out, or two distributions declare it.
    """
    index = registry.index(with_torch=False)
    names = [key for key, found in index.by_key.items() if _needs_stand_in(found)]
    # PyTorch would load a plugin the policy left out: a stand-in refuses it there too.
    names.extend(name for name in index.excluded if name not in index.by_key)
    # Where distributions disagree, PyTorch takes os.listdir's order: a stand-in
    # makes torch.compile run the one this registry resolves to.
    names.extend(index.conflicts)
    return names


def _needs_stand_in(candidates: list[BackendDefinition]) -> bool:
    top = candidates[0]
    if top.usable:
        return top.source.kind not in ("entry-point", "torch")
    return any(lower.source.kind == "entry-point" for lower in candidates[1:])


def _apply_default(registry: Registry) -> None:
    """Make a manifest's ``default`` what torch.compile uses when given no backend."""
    default = registry.default_backend()
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
