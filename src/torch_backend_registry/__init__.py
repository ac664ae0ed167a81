"""A declarative registry of torch.compile backends.

Backends are declared in TOML manifests, merged with entry points and
``register_backend`` calls by a documented precedence, and imported only when
first looked up. Importing this package imports neither torch, pydantic nor
importlib.metadata.
"""

from __future__ import annotations

from ._api import (
    backend_info,
    doctor,
    install,
    is_registered_backend,
    list_backends,
    lookup_backend,
    refresh,
    register_backend,
    register_debug_backend,
    register_experimental_backend,
)
from ._definition import BackendDefinition, Source
from ._errors import (
    BackendChainError,
    BackendLoadError,
    BackendRegistryError,
    DuplicateBackendError,
    ManifestError,
    ManifestWarning,
    UnknownBackendError,
)
from ._registry import Registry

__all__ = [
    "BackendChainError",
    "BackendDefinition",
    "BackendLoadError",
    "BackendRegistryError",
    "DuplicateBackendError",
    "ManifestError",
    "ManifestWarning",
    "Registry",
    "Source",
    "UnknownBackendError",
    "__version__",
    "backend_info",
    "doctor",
    "install",
    "is_registered_backend",
    "list_backends",
    "lookup_backend",
    "refresh",
    "register_backend",
    "register_debug_backend",
    "register_experimental_backend",
]


def __getattr__(name: str) -> str:
    # importlib.metadata costs tens of milliseconds: pay it only when asked.
    if name == "__version__":
        from importlib.metadata import version

        return version("torch-backend-registry")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
