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

#: Each public name, by the module that defines it: imported on its first use.
_MODULES = {
    "_api": "backend_info doctor fingerprint install is_registered_backend list_backends"
    " lookup_backend refresh register_backend register_debug_backend"
    " register_experimental_backend verify_consistent",
    "_definition": "BackendDefinition BackendInfo Problem Source",
    "_doctor.verdicts": "Verdict",
    "_errors": "BackendChainError BackendLoadError BackendRegistryError DuplicateBackendError"
    " InconsistentRegistryError LockDriftError LockFileError ManifestError ManifestWarning"
    " UnknownBackendError",
    "_registry": "Registry",
}
_HOMES = {name: home for home, names in _MODULES.items() for name in names.split()}

__all__ = sorted([*_HOMES, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":  # importlib.metadata costs milliseconds: only when asked
        from importlib.metadata import version

        return version("torch-backend-registry")
    if (home := _HOMES.get(name)) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = globals()[name] = getattr(import_module(f"{__name__}.{home}"), name)  # once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
