"""Fallback chains: a backend that compiles with the first member that works."""

from __future__ import annotations

import logging

from ._errors import BackendChainError, BackendRegistryError
from ._finding import missing_requirements

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._definition import BackendDefinition, BackendInfo
    from ._verdict import Verdict

logger = logging.getLogger("torch_backend_registry")


class ChainBackend:
    """Calls each member of a chain in order until one compiles.

    A member is skipped when its ``requires`` cannot be found, when it cannot be
    looked up or loaded, when compiling raises, or (with ``known_failure``)
    when doctor found it failing here; each skip is logged with its reason. If
    every member is skipped, :class:`BackendChainError` names them all.
    The registry hands over how to look a member up and what it knows of it.
    """

    def __init__(
        self,
        definition: BackendDefinition,
        *,
        lookup: Callable[[str], Callable[..., Any]],
        info: Callable[[str], BackendInfo],
        known_failure: Callable[[str], Verdict | None] | None = None,
    ) -> None:
        self.definition = definition
        self._lookup = lookup
        self._info = info
        self._known_failure = known_failure
        #: The member the last successful compile used.
        self.used: str | None = None
        self.__name__ = definition.name
        self.__qualname__ = definition.name

    def __repr__(self) -> str:
        return f"<fallback chain {self.definition.name!r}: {' -> '.join(self.members)}>"

    @property
    def members(self) -> tuple[str, ...]:
        return self.definition.chain or ()

    def _skip(self, member: str) -> tuple[str, int] | None:
        """Why ``member`` is skipped before compiling, and how loudly; ``None`` to try it."""
        if self._known_failure is not None:
            verdict = self._known_failure(member)
            if verdict is not None:
                return f"doctor found {verdict.status} here ({verdict.reason})", logging.INFO
        try:
            missing = missing_requirements(self._info(member).definition)
        except BackendRegistryError as exc:
            return str(exc), logging.WARNING
        if missing:
            return f"requires {', '.join(map(repr, missing))}, which cannot be found", logging.INFO
        return None

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        name = self.definition.name
        failures: list[tuple[str, str]] = []
        for member in self.members:
            skipped = self._skip(member)
            if skipped is None:
                try:
                    compiler = self._lookup(member)
                except BackendRegistryError as exc:
                    skipped = str(exc), logging.WARNING
            if skipped is None:
                try:
                    compiled = compiler(gm, example_inputs, **kwargs)
                except Exception as exc:
                    skipped = f"compiling raised {type(exc).__name__}: {exc}", logging.WARNING
                else:
                    logger.info("backend %r: compiled with %r", name, member)
                    self.used = member
                    return compiled
            reason, level = skipped
            failures.append((member, reason))
            logger.log(level, "backend %r: skipping %r: %s", name, member, reason)
        raise BackendChainError(name, failures)
