"""What doctor found: a verdict a backend, its reason in one line, what a bench recommends."""

from __future__ import annotations

import dataclasses
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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

#: A spread (the middle half of the timed rounds over their median) past which a speed is
#: not ranked: the machine was busy, and another run may order the backends otherwise.
WIDE = 0.5


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


def level_name(level: int) -> str:
    """The name of a level (1-based), or "start" before the first."""
    return LEVELS[level - 1] if 1 <= level <= len(LEVELS) else "start"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What probing one backend found: ``status`` one of :data:`STATUSES`, ``level`` the last
    of :data:`LEVELS` reached (1-based), ``member`` the member a chain used, ``via`` the
    backend that reached this one where it was probed only as what another runs. With
    ``bench``: ``per_call_seconds`` against ``eager_seconds``, the one eager baseline of the
    run; ``spread`` the wider of the two; ``speedup`` left out where that spread is past
    :data:`WIDE`."""

    name: str
    status: str
    level: int
    reason: str = ""
    seconds: float = 0.0
    member: str | None = None
    via: str | None = None
    compile_seconds: float | None = None
    per_call_seconds: float | None = None
    eager_seconds: float | None = None
    speedup: float | None = None
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
        """The verdict ``as_json`` gave (a kept ``--json`` record); a :class:`TypeError` for
        anything else."""
        if data.get("status") not in STATUSES:
            raise TypeError(f"no such status: {data.get('status')!r}")
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def sort_key(verdict: Verdict) -> tuple[int, bool, float, str]:
    """Best first: by status, then the speed-ups that rank, fastest first, then by name (a
    speed-up left out ranks nothing)."""
    speedup = verdict.speedup
    return (STATUSES.index(verdict.status), speedup is None, -(speedup or 0.0), verdict.name)


def recommend(verdicts: Sequence[Verdict], device: str, builtin: bool) -> dict[str, Any]:
    """The backend to use on ``device``: the fastest that passed and was timed, as
    ``{"device", "name", "speedup"}``; or ``name`` ``None`` and ``why`` not."""
    timed = [v for v in verdicts if v.ok and v.per_call_seconds is not None]
    ranked = [v for v in timed if v.speedup is not None]
    best = max(ranked, key=lambda v: v.speedup or 0.0, default=None)
    why = ""
    if not timed:
        why = "no backend passed and was timed"
    elif any(v.eager_seconds is None for v in timed):  # its probe crashed, say
        why = "eager itself could not be timed"
    elif len(ranked) < len(timed) or best is None:
        wide = ", ".join(v.name for v in timed if v.speedup is None)
        why = (
            f"the timings of {wide} spread too wide to rank: the machine was busy; run again"
            " with nothing else running"
        )
    elif (best.speedup or 0.0) <= 1 + (best.spread or 0.0) / 2:
        # Not faster than eager by more than the timings' own noise.
        why = "no backend is faster than eager on this model"
        if builtin:
            why += (
                ", which is too small for compiling to pay off; pass --model MOD:FACTORY"
                " to time yours"
            )
    if why:
        return {"device": device, "name": None, "speedup": None, "why": why}
    assert best is not None
    return {"device": device, "name": best.name, "speedup": best.speedup, "why": ""}


def recommended_line(recommendation: Mapping[str, Any]) -> str:
    """``recommended for DEVICE: NAME (N.NNx eager)``, or ``...: none (WHY)``."""
    device, name = recommendation["device"], recommendation["name"]
    if name is None:
        return f"recommended for {device}: none ({recommendation['why']})"
    return f"recommended for {device}: {name} ({recommendation['speedup']:.2f}x eager)"
