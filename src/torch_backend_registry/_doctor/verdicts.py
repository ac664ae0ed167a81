"""Doctor's verdicts: what probing a backend found; a report, never remembered."""

from __future__ import annotations

import dataclasses
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

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

#: The levels a probe goes through, in the order they are reached.
LEVELS = ("requirements", "import", "forward", "backward", "bench")


def level_name(level: int) -> str:
    """The name of a level (1-based), or "start" before the first."""
    return LEVELS[level - 1] if 1 <= level <= len(LEVELS) else "start"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What probing one backend found: ``status`` one of :data:`STATUSES`, ``level`` the last
    of :data:`LEVELS` reached (1-based), ``member`` the member a chain used; the
    ``*_seconds``, ``speedup`` and ``spread`` come with ``bench``."""

    name: str
    status: str
    level: int
    reason: str = ""
    seconds: float = 0.0
    member: str | None = None
    compile_seconds: float | None = None
    per_call_seconds: float | None = None
    eager_seconds: float | None = None
    speedup: float | None = None
    #: With ``bench``: how far the middle half of the timed rounds spread, as a share of
    #: their median (the larger of eager's and the backend's). Past 0.5, speeds do not rank.
    spread: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def level_name(self) -> str:
        return level_name(self.level)

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "level_name": self.level_name}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        """The verdict ``as_json`` gave; a :class:`TypeError` for anything else."""
        facts = {k: v for k, v in data.items() if k in _KINDS}
        for fact, value in facts.items():  # what is left out takes its default
            # True is an int to Python, and no fact is a bool.
            if isinstance(value, bool) or not isinstance(value, _KINDS[fact]):
                raise TypeError(f"a verdict's {fact} cannot be {value!r}")
        if facts.get("status") not in STATUSES:
            raise TypeError(f"no such status: {facts.get('status')!r}")
        return cls(**facts)


#: The kinds of value each fact of a verdict may hold.
_KINDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "status": (str,),
    "level": (int,),
    "reason": (str,),
    "seconds": (int, float),
    "member": (str, type(None)),
    **dict.fromkeys(
        ("compile_seconds", "per_call_seconds", "eager_seconds", "speedup", "spread"),
        (int, float, type(None)),
    ),
}
