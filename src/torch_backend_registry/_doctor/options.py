"""How doctor probes: one value for every backend of a run, each default written once here."""

from __future__ import annotations

from typing import NamedTuple

from .._environment import DOCTOR_TIMEOUT
from .._errors import BackendRegistryError

#: How far a backend must get to be ``ok``: forward (inference backends) or backward.
GOALS = ("forward", "backward")
#: The sources whose manifests are the project's: what doctor probes given no names.
PROJECT = ("env", "project")


class ModelError(BackendRegistryError, ValueError):
    """The model given to doctor cannot be found or built (a usage error, not a verdict)."""


class Options(NamedTuple):
    #: Seconds a backend may take before it is killed.
    timeout: float = DOCTOR_TIMEOUT
    #: ``module:factory`` of the model to probe with; ``None``: a small built-in one.
    model: str | None = None
    device: str = "cpu"
    #: The level a backend must reach to be ``ok``: one of :data:`GOALS`.
    level: str = "backward"
    #: Probes run at once; ``None``: half the cores.
    jobs: int | None = None

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
