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
from ._definition import BackendDefinition, BackendInfo, Problem, Source
from ._errors import (
    BackendChainError,
    BackendLoadError,
    BackendRegistryError,
    DuplicateBackendError,
    InconsistentRegistryError,
    LockDriftError,
    LockFileError,
    ManifestError,
    ManifestWarning,
    UnknownBackendError,
)
from ._registry import Registry
from ._verdict import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "BackendChainError",
    "BackendDefinition",
    "BackendInfo",
    "BackendLoadError",
    "BackendRegistryError",
    "DuplicateBackendError",
    "InconsistentRegistryError",
    "LockDriftError",
    "LockFileError",
    "ManifestError",
    "ManifestWarning",
    "Problem",
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
    # importlib.metadata costs milliseconds: pay for it only when asked.
    if name == "__version__":
        from importlib.metadata import version

        return version("torch-backend-registry")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
