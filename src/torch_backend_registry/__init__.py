"""A declarative registry of torch.compile backends.

Backends are declared in TOML manifests, merged with entry points and
``register_backend`` calls by a documented precedence, and imported only when
first looked up. Importing this package imports nothing: each name below is
imported on its first use (PyTorch loads this package at ``import torch``, for
``TORCH_BACKENDS_AUTOLOAD``, and that must cost nothing when it is off).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._api import (
        Registry,
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
    from ._doctor.verdicts import Verdict
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

#: The modules the public names are defined in (as imported above), cheapest first: a name
#: costs the import of its own module and of those before it, no more.
_HOMES = ("_errors", "_definition", "_api", "_doctor.verdicts")

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
    if name == "__version__":  # importlib.metadata costs milliseconds: only when asked
        from importlib.metadata import version

        return version("torch-backend-registry")
    if name in __all__:
        from importlib import import_module

        for home in _HOMES:
            module = import_module(f"{__name__}.{home}")
            if hasattr(module, name):
                value = globals()[name] = getattr(module, name)  # a plain attribute from now on
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
