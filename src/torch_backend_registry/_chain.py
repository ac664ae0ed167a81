"""Fallback chains: a backend that compiles with the first member that works."""

from __future__ import annotations

import logging

from ._errors import BackendChainError, BackendRegistryError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._definition import BackendDefinition
    from ._registry import Registry

logger = logging.getLogger("torch_backend_registry")


class ChainBackend:
    """Calls each member of ``chain`` in order until one compiles.

    A member is skipped when its ``requires`` cannot be found, when it cannot be
    looked up or loaded, or when compiling raises; each skip is logged with its
    reason. If every member is skipped, :class:`BackendChainError` names them all.
    """

    def __init__(self, registry: Registry, definition: BackendDefinition) -> None:
        self.registry = registry
        self.definition = definition
        #: The member the last successful compile used.
        self.used: str | None = None
        self.__name__ = definition.name
        self.__qualname__ = definition.name

    def __repr__(self) -> str:
        return f"<fallback chain {self.definition.name!r}: {' -> '.join(self.members)}>"

    @property
    def members(self) -> tuple[str, ...]:
        return self.definition.chain or ()

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from ._loader import missing_requirements

        name = self.definition.name
        failures: list[tuple[str, str]] = []
        for member in self.members:
            if self.definition.skip_known_failures:
                from ._doctor import known_failure

                verdict = known_failure(self.registry, member)
                if verdict is not None:
                    reason = f"doctor found {verdict.status} here ({verdict.reason})"
                    failures.append((member, reason))
                    logger.info("backend %r: skipping %r: %s", name, member, reason)
                    continue
            try:
                info = self.registry.backend_info(member)
                missing = missing_requirements(info)
                if missing:
                    reason = f"requires {', '.join(map(repr, missing))}, which cannot be found"
                    failures.append((member, reason))
                    logger.info("backend %r: skipping %r: %s", name, member, reason)
                    continue
                compiler = self.registry.lookup_backend(member)
            except BackendRegistryError as exc:
                failures.append((member, str(exc)))
                logger.warning("backend %r: skipping %r: %s", name, member, exc)
                continue
            try:
                compiled = compiler(gm, example_inputs, **kwargs)
            except Exception as exc:
                reason = f"compiling raised {type(exc).__name__}: {exc}"
                failures.append((member, reason))
                logger.warning("backend %r: skipping %r: %s", name, member, reason)
                continue
            logger.info("backend %r: compiled with %r", name, member)
            self.used = member
            return compiled
        raise BackendChainError(name, failures)
