"""The bridge to torch.compile: install() puts a registry's backends into PyTorch's registry.

Besides ``torch._dynamo``'s public functions, it uses the registry module's dict of loaded
backends (``_COMPILER_FNS``, or ``_BACKENDS`` in torch 2.0 and 2.1), for what no public
function does: a plugin that registers its own name when it is imported (torch-tensorrt,
ipex, torch_npu) where a stand-in of this library holds that name. PyTorch's
``register_backend`` would raise ``duplicate name``; while stand-ins are installed, it keeps
such a registration aside instead, as PyTorch's registry's definition of that name
(``DISPLACED``), below the registry's by precedence: ``torch.compile`` and
``lookup_backend`` still run one backend.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any

from ._definition import BackendDefinition
from ._errors import BackendRegistryError, warn
from ._forksafe import ForkSafeLock
from ._registry import Registry
from ._sources.pytorch import (
    DISPLACED,
    REGISTRY_MODULE,
    STAND_IN,
    dynamo_imported,
    loaded_backends,
    own,
    tags_of,
    torch_available,
)

# torch's registry is process-wide, so what this bridge put there is too. Lock
# order: this lock, then a registry's (never the other way round).
_INSTALLED: dict[str, _LazyBackend] = {}
#: What PyTorch listed under a name (an entry point) before a stand-in's registration
#: replaced it: put back when the stand-in goes.
_LISTED: dict[str, Any] = {}
_INSTALL_LOCK = ForkSafeLock()
#: The registry install() last put into PyTorch's registry in this process.
_installed: Registry | None = None


def installed() -> Registry | None:
    """The registry whose backends torch.compile runs in this process (the one install()
    was last given), or ``None`` where nothing was installed."""
    return _installed


class _LazyBackend:
    """Stands in PyTorch's registry for a backend; imports its target on the first call. It
    asks the registry on every call (a dict hit once loaded), so ``refresh()`` and later
    registrations take effect without installing again; a name the registry refuses
    (disabled, say) is refused by torch.compile too."""

    def __init__(self, registry: Registry, name: str) -> None:
        self.registry = registry
        self.__name__ = self.__qualname__ = name
        setattr(self, STAND_IN, True)

    def __repr__(self) -> str:
        return f"<torch-backend-registry backend {self.__name__!r}>"

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from ._chain import member_compiler
        from ._loader import cannot_compile

        name = self.__name__
        fn = self.registry.lookup_backend(name)
        # Said plainly, not as the TypeError calling it would raise.
        if (why := cannot_compile(fn, kwargs)) is not None:
            raise TypeError(f"backend {name!r} {why}")
        definition = self.registry.backend_info(name).definition
        return member_compiler(name, definition, fn, kwargs)(gm, example_inputs)


def _dynamo() -> Any:
    if not torch_available():
        raise BackendRegistryError(
            "install() needs PyTorch: pip install torch (torch.compile is what it extends)"
        )
    import torch._dynamo  # every release that has it (2.0 on) has what install() uses

    return torch._dynamo


def install(registry: Registry, *, early: bool = False) -> None:
    """What :func:`torch_backend_registry.install` does once its checks pass; later refreshes
    and registrations follow. ``early`` (autoload, while ``torch._dynamo`` is still being
    imported and the modules that import it are not whole): PyTorch's own backends are left
    for PyTorch to import when it needs them. They cannot collide with a stand-in, which
    never takes one of their names."""
    if not early:
        # PyTorch registers its own backends and reads its entry points now, so that a
        # later import of its backends cannot collide with ours.
        _dynamo().list_backends(exclude_tags=())
    global _installed
    _let_plugins_register()
    _installed = registry
    registry.on_change(_install_names)
    _install_names(registry)
    _apply_default(registry, early=early)


def _install_names(registry: Registry) -> None:
    names = stand_in_names(registry)
    dynamo = _dynamo()
    with _INSTALL_LOCK:
        _remove_stale(registry, set(names))
        for name in names:
            if (proxy := _INSTALLED.get(name)) is not None:
                proxy.registry = registry
                continue
            proxy = _LazyBackend(registry, name)
            tags: tuple[str, ...] = ()  # refused by the registry (disabled): by torch.compile too
            with contextlib.suppress(BackendRegistryError):
                tags = registry.backend_info(name).tags
            listed = getattr(sys.modules[REGISTRY_MODULE], "_BACKENDS", None)
            if isinstance(listed, dict) and listed.get(name) is not None:
                # An entry point PyTorch lists, which registering overwrites with None.
                _LISTED[name] = listed[name]
            try:
                dynamo.register_backend(proxy, name=name, tags=tags)
            except AssertionError:
                # PyTorch raises AssertionError("duplicate name") for a name it holds: a
                # plugin's own registration, or an entry point compiled with before install().
                if not _hold(name, proxy, tags):
                    warn(
                        f"backend {name!r} is not installed into torch.compile: PyTorch's own"
                        " backend of that name is there already"
                    )
                    continue
            _INSTALLED[name] = proxy


def _remove_stale(registry: Registry, names: set[str]) -> None:
    """Take out of PyTorch's registry the stand-ins of ``registry`` for names it no longer
    knows at all (after a refresh or an unregister_backend), so that the two registries
    agree: what a stand-in kept aside is put back, else the name is gone. A name it still
    knows (an entry point's, say) keeps its stand-in, which resolves it as the registry does."""
    module: Any = sys.modules[REGISTRY_MODULE]
    loaded = loaded_backends(module)
    index = registry.index(with_torch=False)
    for name, proxy in list(_INSTALLED.items()):
        known = name in names or name in index.by_key or name in index.excluded
        if known or proxy.registry is not registry:
            continue
        del _INSTALLED[name]
        if loaded is None or loaded.get(name) is not proxy:
            continue
        displaced = DISPLACED.pop(name, None)
        _put(name, displaced, tuple(getattr(displaced, "_tags", ())))
        if displaced is not None:
            continue
        listed = getattr(module, "_BACKENDS", None)  # the names PyTorch lists
        if listed is not loaded and isinstance(listed, dict) and listed.get(name, 0) is None:
            # An entry point's goes back (PyTorch loads it again when asked); a name the
            # stand-in's registration made goes.
            _set(listed, name, _LISTED.pop(name, None))


def _hold(name: str, proxy: _LazyBackend, tags: tuple[str, ...]) -> bool:
    """Put ``proxy`` under ``name`` in place of what a plugin registered there, kept aside (see
    the module's docstring); ``False`` where PyTorch's own backend holds the name."""
    held = (loaded_backends(sys.modules[REGISTRY_MODULE]) or {}).get(name)
    if held is None or own(held):
        return False
    DISPLACED[name] = held
    with contextlib.suppress(AttributeError, TypeError):  # its own, kept with it: torch
        held._tags = tags_of(name, held)  # 2.14 keeps them by name, where the proxy goes now
    proxy._tags = tuple(tags)  # type: ignore[attr-defined]  # what PyTorch's listing reads
    _put(name, proxy, tags)
    return True


def _put(name: str, fn: Any, tags: tuple[str, ...]) -> None:
    """Put ``fn`` under ``name`` in PyTorch's dict of loaded backends (``None``: take the name
    out), its tags too where PyTorch keeps them by name (torch 2.14's ``_BACKEND_TAGS``)."""
    module: Any = sys.modules[REGISTRY_MODULE]
    _set(loaded_backends(module), name, fn)
    _set(getattr(module, "_BACKEND_TAGS", None), name, None if fn is None else tags)


def _set(table: Any, name: str, value: Any) -> None:
    """``table[name] = value`` in one of PyTorch's dicts (``None``: the name taken out)."""
    if isinstance(table, dict) and value is None:
        table.pop(name, None)
    elif isinstance(table, dict):
        table[name] = value


def _let_plugins_register() -> None:
    """Make PyTorch's ``register_backend`` keep aside a registration of a name a stand-in
    holds, rather than raise (see the module's docstring). Once a process: every
    ``register_backend`` PyTorch exports is replaced by one that does so."""
    dynamo = _dynamo()
    module: Any = sys.modules[REGISTRY_MODULE]
    original = module.register_backend
    if getattr(original, STAND_IN, False):
        return

    @functools.wraps(original)
    def register_backend(compiler_fn: Any = None, name: str | None = None, tags: Any = ()) -> Any:
        if compiler_fn is None:
            return functools.partial(register_backend, name=name, tags=tags)
        key = name or getattr(compiler_fn, "__name__", None)
        held = (loaded_backends(module) or {}).get(key) if isinstance(key, str) else None
        if getattr(held, STAND_IN, False) is True and not getattr(compiler_fn, STAND_IN, False):
            compiler_fn._tags = tuple(tags)
            DISPLACED[key] = compiler_fn  # type: ignore[index]
            return compiler_fn
        return original(compiler_fn, name=name, tags=tags)

    setattr(register_backend, STAND_IN, True)
    for holder in (module, dynamo):
        if getattr(holder, "register_backend", None) is original:
            holder.register_backend = register_backend
    for tag in ("debug", "experimental"):  # as PyTorch spells them: partials of the one above
        setattr(module, f"register_{tag}_backend", functools.partial(register_backend, tags=(tag,)))


def stand_in_names(registry: Registry) -> list[str]:
    """The names torch.compile needs a stand-in for, so that it runs what the registry does.
    PyTorch reads the entry points itself (the same ones, in the same order): an entry point's
    own name needs none, unless a higher definition hides it (disabled, broken), the policy
    left it out, or two distributions declare it."""
    index = registry.index(with_torch=False)
    names = [key for key, found in index.by_key.items() if _needs_stand_in(found)]
    # PyTorch would load a plugin the policy left out, or run one that registered itself
    # when imported (read where its registry is loaded): a stand-in refuses it there too.
    excluded = registry.index().excluded if dynamo_imported() else index.excluded
    names.extend(name for name in excluded if name not in index.by_key)
    # Where distributions disagree, PyTorch takes os.listdir's order: a stand-in
    # makes torch.compile run the one this registry resolves to.
    return [*names, *index.conflicts]


def _needs_stand_in(candidates: list[BackendDefinition]) -> bool:
    top = candidates[0]
    if top.usable:  # the index holds no backend of PyTorch's, which needs none either
        return top.source.kind != "entry-point"
    # A declared name left out for a manifest error: its stand-in raises that error, at its
    # file and line, where PyTorch would say only "Invalid backend".
    broken = top.enabled and top.source.kind in ("env", "project")
    return broken or any(lower.source.kind == "entry-point" for lower in candidates[1:])


def _apply_default(registry: Registry, *, early: bool = False) -> None:
    """Make a manifest's ``default`` what torch.compile uses when given no backend."""
    index = registry.index(with_torch=False)
    if (default := index.default) is None:
        return
    where = f"{default.path}:{default.line}"
    try:
        # Early (autoload), PyTorch's own backends are not registered yet: one of their names
        # is taken as they will be, as the registry knows them without reading PyTorch's.
        if not (early and index.could_be_pytorch(default.name)):
            registry.backend_info(default.name)
    except BackendRegistryError as exc:
        warn(f"{where}: {default.key}: not applied: {exc}")
        return
    import torch.compiler

    if (setter := getattr(torch.compiler, "set_default_backend", None)) is None:
        warn(
            f"{where}: default backend {default.name!r} not applied: this PyTorch has no"
            " torch.compiler.set_default_backend (added in a later release)"
        )
        return
    setter(default.name)
