"""A declarative registry of torch.compile backends.

Backends are declared in TOML manifests, merged with entry points and
``register_backend`` calls by a documented precedence, and imported only when
first looked up. Importing this package imports nothing: each name below is
imported on its first use (PyTorch loads this package at ``import torch``, for
``TORCH_BACKENDS_AUTOLOAD``, and that must cost nothing when it is off).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # what the names are, for type checkers (imported lazily below)
    from typing import Any

    from ._api import backend_info as backend_info
    from ._api import doctor as doctor
    from ._api import fingerprint as fingerprint
    from ._api import install as install
    from ._api import is_registered_backend as is_registered_backend
    from ._api import list_backends as list_backends
    from ._api import lookup_backend as lookup_backend
    from ._api import refresh as refresh
    from ._api import register_backend as register_backend
    from ._api import register_debug_backend as register_debug_backend
    from ._api import register_experimental_backend as register_experimental_backend
    from ._api import verify_consistent as verify_consistent
    from ._definition import BackendDefinition as BackendDefinition
    from ._definition import BackendInfo as BackendInfo
    from ._definition import Problem as Problem
    from ._definition import Source as Source
    from ._doctor.verdicts import Verdict as Verdict
    from ._errors import BackendChainError as BackendChainError
    from ._errors import BackendLoadError as BackendLoadError
    from ._errors import BackendRegistryError as BackendRegistryError
    from ._errors import DuplicateBackendError as DuplicateBackendError
    from ._errors import InconsistentRegistryError as InconsistentRegistryError
    from ._errors import LockDriftError as LockDriftError
    from ._errors import LockFileError as LockFileError
    from ._errors import ManifestError as ManifestError
    from ._errors import ManifestWarning as ManifestWarning
    from ._errors import UnknownBackendError as UnknownBackendError
    from ._registry import Registry as Registry

#: Each public name, and the module that defines it: imported on its first use.
_HOMES = {
    "backend_info": "_api",
    "doctor": "_api",
    "fingerprint": "_api",
    "install": "_api",
    "is_registered_backend": "_api",
    "list_backends": "_api",
    "lookup_backend": "_api",
    "refresh": "_api",
    "register_backend": "_api",
    "register_debug_backend": "_api",
    "register_experimental_backend": "_api",
    "verify_consistent": "_api",
    "BackendDefinition": "_definition",
    "BackendInfo": "_definition",
    "Problem": "_definition",
    "Source": "_definition",
    "Verdict": "_doctor.verdicts",
    "BackendChainError": "_errors",
    "BackendLoadError": "_errors",
    "BackendRegistryError": "_errors",
    "DuplicateBackendError": "_errors",
    "InconsistentRegistryError": "_errors",
    "LockDriftError": "_errors",
    "LockFileError": "_errors",
    "ManifestError": "_errors",
    "ManifestWarning": "_errors",
    "UnknownBackendError": "_errors",
    "Registry": "_registry",
}

__all__ = sorted([*_HOMES, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":  # importlib.metadata costs milliseconds: only when asked
        from importlib.metadata import version

        return version("torch-backend-registry")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = globals()[name] = getattr(import_module(f"{__name__}.{home}"), name)  # once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
