"""What doctor found: a verdict a backend, its reason in one line."""

from __future__ import annotations

import dataclasses
from typing import Any

#: Every status a verdict can have, best first (the order tables are sorted in).
STATUSES = (
    "ok",
    "unavailable",
    "import-error",
    "compile-error",
    "wrong-result",
    "backward-error",
    "crashed",
    "timeout",
)
#: Statuses that say a backend fails here, whatever the time limit.
FAILURES = frozenset({"import-error", "compile-error", "wrong-result", "backward-error", "crashed"})

#: The levels a probe goes through, in the order they are reached, by number: 0 before the
#: first.
LEVELS = ("start", "requirements", "import", "forward", "backward")


def one_line(exc: BaseException) -> str:
    """The exception in one line, with the causes it wraps (torch's BackendCompilerFailed
    holds its own) where they say more."""
    said, seen = "", set()
    current: BaseException | None = exc
    while isinstance(current, BaseException) and id(current) not in seen:
        seen.add(id(current))
        text = (str(current).strip().splitlines() or [""])[0]
        own = f"{type(current).__name__}: {text}".rstrip(": ")
        # A cause its wrapper already quotes says nothing new.
        if not (text and text in said) and own not in said:
            said = f"{said.rstrip(':')}: {own}" if said else own
        current = current.__cause__ or getattr(current, "inner_exception", None)
    # Bounded; the innermost cause, which says most, comes last: keep the end.
    return said if len(said) <= 300 else f"{said[:99]}…{said[-200:]}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What probing one backend found: ``status`` one of :data:`STATUSES`, ``level`` the last
    of :data:`LEVELS` reached (by its number), ``via`` the backend that reached this one where it
    was probed only as what another runs. Of a chain, how it ran: ``member``, the member it
    compiled with, and its ``select`` and ``verify``."""

    name: str
    status: str
    level: int
    reason: str = ""
    seconds: float = 0.0
    member: str | None = None
    via: str | None = None
    select: str | None = None
    verify: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def level_name(self) -> str:
        return LEVELS[self.level]

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "level_name": self.level_name}
