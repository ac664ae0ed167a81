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
    fingerprint,
    install,
    is_registered_backend,
    list_backends,
    lookup_backend,
    refresh,
    register_backend,
    register_debug_backend,
    register_experimental_backend,
    verify_consistent,
)
from ._definition import BackendDefinition, Source
from ._errors import (
    BackendChainError,
    BackendLoadError,
    BackendRegistryError,
    DuplicateBackendError,
    InconsistentRegistryError,
    LockDriftError,
    ManifestError,
    ManifestWarning,
    UnknownBackendError,
)
from ._registry import Registry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._doctor import Verdict

__all__ = [
    "BackendChainError",
    "BackendDefinition",
    "BackendLoadError",
    "BackendRegistryError",
    "DuplicateBackendError",
    "InconsistentRegistryError",
    "LockDriftError",
    "ManifestError",
    "ManifestWarning",
    "Registry",
    "Source",
    "UnknownBackendError",
    "Verdict",
    "__version__",
    "backend_info",
    "doctor",
    "fingerprint",
    "install",
    "is_registered_backend",
    "list_backends",
    "lookup_backend",
    "refresh",
    "register_backend",
    "register_debug_backend",
    "register_experimental_backend",
    "verify_consistent",
]


def __getattr__(name: str) -> Any:
    # importlib.metadata, and doctor's subprocess and threading, cost milliseconds:
    # pay for them only when asked.
    if name == "__version__":
        from importlib.metadata import version

        return version("torch-backend-registry")
    if name == "Verdict":
        from ._doctor import Verdict

        return Verdict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
