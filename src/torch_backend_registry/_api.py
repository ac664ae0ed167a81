"""The module-level API: the functions of PyTorch's registry, on one default Registry."""

from __future__ import annotations

from ._registry import DEFAULT_EXCLUDE_TAGS, Registry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar, overload

    F = TypeVar("F", bound=Callable[..., Any])

#: The registry the module-level functions act on. Building it reads nothing:
#: discovery waits for the first lookup or listing.
default_registry = Registry()

# Bound once: a hot lookup is then one call and one dict hit.
lookup_backend = default_registry.lookup_backend
is_registered_backend = default_registry.is_registered_backend
backend_info = default_registry.backend_info
refresh = default_registry.refresh
install = default_registry.install
doctor = default_registry.doctor
fingerprint = default_registry.fingerprint
verify_consistent = default_registry.verify_consistent

if TYPE_CHECKING:

    @overload
    def register_backend(
        compiler_fn: F, name: str | None = None, tags: Sequence[str] = ()
    ) -> F: ...
    @overload
    def register_backend(
        compiler_fn: None = None, name: str | None = None, tags: Sequence[str] = ()
    ) -> Callable[[F], F]: ...


def register_backend(
    compiler_fn: Callable[..., Any] | None = None,
    name: str | None = None,
    tags: Sequence[str] = (),
) -> Any:
    """Register a compiler function under ``name``, bare or called, as PyTorch's decorator."""
    return default_registry.register_backend(compiler_fn, name=name, tags=tags)


if TYPE_CHECKING:

    @overload
    def register_debug_backend(compiler_fn: F, name: str | None = None) -> F: ...
    @overload
    def register_debug_backend(
        compiler_fn: None = None, name: str | None = None
    ) -> Callable[[F], F]: ...


def register_debug_backend(
    compiler_fn: Callable[..., Any] | None = None, name: str | None = None
) -> Any:
    """:func:`register_backend` with the tag ``debug``."""
    return default_registry.register_backend(compiler_fn, name=name, tags=("debug",))


if TYPE_CHECKING:

    @overload
    def register_experimental_backend(compiler_fn: F, name: str | None = None) -> F: ...
    @overload
    def register_experimental_backend(
        compiler_fn: None = None, name: str | None = None
    ) -> Callable[[F], F]: ...


def register_experimental_backend(
    compiler_fn: Callable[..., Any] | None = None, name: str | None = None
) -> Any:
    """:func:`register_backend` with the tag ``experimental``."""
    return default_registry.register_backend(compiler_fn, name=name, tags=("experimental",))


def list_backends(exclude_tags: Sequence[str] | None = DEFAULT_EXCLUDE_TAGS) -> list[str]:
    """Sorted backend names without those tagged ``exclude_tags``; imports no backend code."""
    return default_registry.list_backends(exclude_tags)
