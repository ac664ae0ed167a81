"""Hugging Face accelerate: a ``TorchDynamoPlugin`` that compiles with any backend the registry
resolves.

accelerate takes a backend only from its own ``DynamoBackend`` enum (``'IND_FWD' is not a
valid DynamoBackend``). :func:`dynamo_plugin` gives its ``TorchDynamoPlugin`` with the enum at
``INDUCTOR`` (so that accelerate compiles at all), and the registry's name where accelerate
hands the plugin's settings to ``torch.compile``; accelerate's own ``mode``, ``fullgraph``,
``dynamic``, ``options`` and ``use_regional_compilation`` are kept as given::

    from accelerate import Accelerator
    from torch_backend_registry.integrations.accelerate import dynamo_plugin

    accelerator = Accelerator(dynamo_plugin=dynamo_plugin("portable", mode="max-autotune"))
"""

from __future__ import annotations

import dataclasses
from typing import Any

from accelerate.utils import TorchDynamoPlugin

from .. import _api

__all__ = ["RegistryDynamoPlugin", "dynamo_plugin"]


@dataclasses.dataclass
class RegistryDynamoPlugin(TorchDynamoPlugin):  # type: ignore[misc]
    """accelerate's ``TorchDynamoPlugin``, compiling with the registry's backend
    ``registry_backend`` (any name the registry resolves)."""

    registry_backend: str = ""

    def __post_init__(self) -> None:
        if self.registry_backend:
            # accelerate checks its enum and compiles only where it is not NO: INDUCTOR says
            # "compile"; which backend is the registry's, below.
            self.backend = "inductor"
        super().__post_init__()

    def to_dict(self) -> dict[str, Any]:
        # What accelerate records and hands torch.compile: the registry's name as the backend.
        settings: dict[str, Any] = super().to_dict()
        name = settings.pop("registry_backend", "")
        if name:
            settings["backend"] = name
        return settings

    def to_kwargs(self) -> dict[str, Any]:
        # What accelerate hands torch.compile, in whatever process compiles: one the plugin
        # was pickled to (a spawned worker) has not installed the registry's backends.
        if self.registry_backend:
            _ready(self.registry_backend)
        kwargs: dict[str, Any] = super().to_kwargs()
        return kwargs


def _ready(name: str) -> None:
    """Make ``name`` a torch.compile name here, as the registry resolves it; an unknown or
    left-out name raises :class:`~torch_backend_registry.UnknownBackendError` before
    anything compiles. Where nothing was installed (a process the plugin was sent to),
    the default registry is: PyTorch alone would load a plugin's entry point of that name,
    one the manifest shadows or denies among them."""
    from .._torch import installed

    registry = installed() or _api.default_registry
    registry.backend_info(name)
    if installed() is None:
        _api.install(registry)


def dynamo_plugin(backend: str, *, registry: Any = None, **kwargs: Any) -> RegistryDynamoPlugin:
    """A ``TorchDynamoPlugin`` that compiles with ``backend`` (see the module's docstring).

    An unknown name raises :class:`~torch_backend_registry.UnknownBackendError` here; the
    registry's backends are installed into torch.compile (``install()``) so that
    accelerate's ``torch.compile(model, backend=name)`` finds it.
    """
    target = registry or _api.default_registry
    target.backend_info(backend)
    _api.install(target)
    return RegistryDynamoPlugin(registry_backend=backend, **kwargs)
