"""What probing one backend found (``doctor``'s verdict), as a value."""

from __future__ import annotations

from ._definition import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
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

#: How close compiled results must be to eager ones (``torch.testing.assert_close``), in
#: doctor's probes and in chains that verify: what bfloat16 arithmetic reaches (8 bits of
#: mantissa), which CPU plugins such as OpenVINO may use for float32 models. A wrong kernel
#: misses it by far more.
RTOL, ATOL = 1e-2, 1e-2

#: The levels a probe goes through, in the order they are reached.
LEVELS = ("requirements", "import", "forward", "backward", "bench")


def level_name(level: int) -> str:
    """The name of a level (1-based), or "start" before the first."""
    return LEVELS[level - 1] if 1 <= level <= len(LEVELS) else "start"


class Verdict(Frozen):
    """What probing one backend found.

    ``status`` is one of :data:`STATUSES`; ``level`` the last level reached
    (1 requirements, 2 import, 3 forward, 4 backward, 5 bench); ``member`` the
    member a chain used; the ``*_seconds``, ``speedup`` and ``spread`` come with ``bench``;
    ``cached`` tells a remembered verdict (and takes no part in comparing two).
    """

    __slots__ = (  # noqa: RUF023 - the order of the fields, of repr() and of the JSON
        "name",
        "status",
        "level",
        "reason",
        "seconds",
        "member",
        "compile_seconds",
        "per_call_seconds",
        "eager_seconds",
        "speedup",
        "spread",
        "_cached",
    )

    name: str
    status: str
    level: int
    reason: str
    seconds: float
    member: str | None
    compile_seconds: float | None
    per_call_seconds: float | None
    eager_seconds: float | None
    speedup: float | None
    #: With ``bench``: how far the slowest round was from the fastest, as a share of the
    #: median (the larger of eager's and the backend's). Past 0.5, speeds do not rank.
    spread: float | None
    _cached: bool

    def __init__(
        self,
        name: str,
        status: str,
        level: int,
        reason: str = "",
        seconds: float = 0.0,
        member: str | None = None,
        compile_seconds: float | None = None,
        per_call_seconds: float | None = None,
        eager_seconds: float | None = None,
        speedup: float | None = None,
        spread: float | None = None,
        cached: bool = False,
    ) -> None:
        super().__init__(
            name=name,
            status=status,
            level=level,
            reason=reason,
            seconds=seconds,
            member=member,
            compile_seconds=compile_seconds,
            per_call_seconds=per_call_seconds,
            eager_seconds=eager_seconds,
            speedup=speedup,
            spread=spread,
            _cached=cached,
        )

    #: What is remembered of a verdict, and read back: every field but ``cached``.
    FACTS = __slots__[:-1]

    @property
    def cached(self) -> bool:
        return self._cached

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def level_name(self) -> str:
        return level_name(self.level)

    def facts(self) -> dict[str, Any]:
        """Every field but ``cached``: what is remembered of a verdict."""
        return {fact: getattr(self, fact) for fact in self.FACTS}

    def as_json(self) -> dict[str, Any]:
        return {**self.facts(), "cached": self.cached, "level_name": self.level_name}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, cached: bool = False) -> Verdict:
        """The verdict ``as_json`` (or ``facts``) gave; a :class:`TypeError` for anything
        else (a remembered verdict of another shape is not one)."""
        facts = {k: v for k, v in data.items() if k in cls.FACTS}
        for fact, value in facts.items():  # what is left out takes its default
            kinds = _KINDS[fact]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise TypeError(f"a verdict's {fact} cannot be {value!r}")
        if facts.get("status") not in STATUSES:
            raise TypeError(f"no such status: {facts.get('status')!r}")
        return cls(**facts, cached=cached)


_NUMBER = (int, float)
_MAYBE = (int, float, type(None))
#: The kinds of value each fact may hold.
_KINDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "status": (str,),
    "level": (int,),
    "reason": (str,),
    "seconds": _NUMBER,
    "member": (str, type(None)),
    "compile_seconds": _MAYBE,
    "per_call_seconds": _MAYBE,
    "eager_seconds": _MAYBE,
    "speedup": _MAYBE,
    "spread": _MAYBE,
}
