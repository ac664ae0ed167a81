"""How doctor probes: one value for every backend of a run, each default written once here."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from .._errors import BackendRegistryError

#: How far a backend must get to be ``ok``: forward (inference backends) or backward.
GOALS = ("forward", "backward")


class ModelError(BackendRegistryError, ValueError):
    """The model given to doctor cannot be found or built (a usage error, not a verdict)."""


class Options(NamedTuple):
    #: Seconds a backend may take before it is killed.
    timeout: float = 300.0
    #: Also time compiling and calls against eager.
    bench: bool = False
    #: ``module:factory`` of the model to probe with; ``None``: a small built-in one.
    model: str | None = None
    device: str = "cpu"
    #: The level a backend must reach to be ``ok``: one of :data:`GOALS`.
    level: str = "backward"
    #: Probes run at once; ``None``: half the cores (one when timing).
    jobs: int | None = None
    #: Probe again even where a verdict is remembered.
    fresh: bool = False

    def checked(self) -> Options:
        """These options, or :class:`ValueError` naming the one that cannot be used."""
        number = isinstance(self.timeout, (int, float)) and not isinstance(self.timeout, bool)
        if not (number and 0 < self.timeout < float("inf")):
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs must be 1 or more, got {self.jobs!r}")
        if self.level not in GOALS:
            raise ValueError(f"level must be one of {', '.join(GOALS)}, got {self.level!r}")
        return self._replace(timeout=float(self.timeout))

    def facts(self, model_file: object, path: list[str]) -> dict[str, Any]:
        """What a verdict found with these options depends on, besides the backend."""
        visible = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
        accelerator = self.device != "cpu"
        return {
            "model": self.model,
            "model-file": model_file,
            "device": self.device,
            # Which accelerator: nodes sharing a home folder may hold different ones.
            "device-name": device_name(self.device) if accelerator else None,
            "visible": {v: os.environ.get(v) for v in visible} if accelerator else None,
            "level": self.level,
            "timeout": self.timeout,
            "path": path,
        }


#: The time limit a probe gets unless told otherwise (``--timeout``, ``doctor(timeout=)``).
DEFAULT_TIMEOUT: float = Options._field_defaults["timeout"]


def device_name(device: str) -> str | None:
    """The accelerator ``device`` names here (``NVIDIA A100-SXM4-80GB``), or ``None``."""
    try:
        import torch

        module = getattr(torch, torch.device(device).type)
        name = module.get_device_name(torch.device(device)) if module.is_available() else None
    except Exception:  # no such module, or it cannot tell
        return None
    return name if isinstance(name, str) else None
