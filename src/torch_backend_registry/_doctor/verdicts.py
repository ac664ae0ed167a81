"""Doctor's verdicts: what probing a backend found, remembered by everything it depends on.

A verdict is about a *subject* (:func:`subject`), found by a *probe* (the model, the
device, the level and the time limit). A run of doctor reuses a verdict of the same
subject and probe; a listing, and a chain that skips known failures, read the newest
verdict of the subject on the built-in model and the CPU.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, NamedTuple

from .._definition import canonical
from .._errors import BackendRegistryError
from .._identity import identity, reach
from .._sources.files import untrusted_folder
from .._sources.finding import code_stamp, find, installed_stamp, missing_requirements, stamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .._definition import BackendDefinition
    from .._merge import Index
    from .._registry import Registry
    from .._sources.cache import Cache

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


class Verdict(NamedTuple):
    """What probing one backend found: ``status`` one of :data:`STATUSES`, ``level`` the last
    of :data:`LEVELS` reached (1-based), ``member`` the member a chain used; the
    ``*_seconds``, ``speedup`` and ``spread`` come with ``bench``; ``cached`` tells a
    remembered verdict (and takes no part in comparing two)."""

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
    cached: bool = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self[:-1] == other[:-1]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:-1])

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def level_name(self) -> str:
        return level_name(self.level)

    def facts(self) -> dict[str, Any]:
        return {fact: getattr(self, fact) for fact in _KINDS}

    def as_json(self) -> dict[str, Any]:
        return {**self.facts(), "cached": self.cached, "level_name": self.level_name}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, cached: bool = False) -> Verdict:
        """The verdict ``as_json`` (or ``facts``) gave; a :class:`TypeError` for anything
        else (a remembered verdict of another shape is not one)."""
        facts = {k: v for k, v in data.items() if k in _KINDS}
        for fact, value in facts.items():  # what is left out takes its default
            # True is an int to Python, and no fact is a bool.
            if isinstance(value, bool) or not isinstance(value, _KINDS[fact]):
                raise TypeError(f"a verdict's {fact} cannot be {value!r}")
        if facts.get("status") not in STATUSES:
            raise TypeError(f"no such status: {facts.get('status')!r}")
        return cls(**facts, cached=cached)


#: The kinds of value each fact of a verdict (every field but ``cached``) may hold.
_KINDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "status": (str,),
    "level": (int,),
    "reason": (str,),
    "seconds": (int, float),
    "member": (str, type(None)),
    **dict.fromkeys(Verdict._fields[6:-1], (int, float, type(None))),
}

#: The most subjects remembered; the oldest are forgotten first.
LIMIT = 10_000
#: The probe of a listing's verdict and a chain's skip (any level, any time limit).
BUILT_IN = {"model": None, "device": "cpu"}


def subject(
    registry: Registry,
    name: str,
    stamps: dict[Any, Any] | None = None,
    memory: Verdicts | None = None,
) -> str:
    """What a verdict about ``name`` judges: the identity of what it runs, and for it and
    what its chain reaches, the code their targets name, their missing requirements and
    refused python-path folders; this machine and what is installed in it. ``stamps``
    remembers what was looked at across the calls of one listing."""
    index = registry.index_for(name)
    memo = {} if stamps is None else stamps
    memory = Verdicts(registry.context.cache) if memory is None else memory
    return _subject(index, index.resolve(name), memo, memory)


def _subject(
    index: Index,
    definition: BackendDefinition,
    memo: dict[Any, Any],
    memory: Verdicts,
    within: frozenset[str] = frozenset(),
) -> str:
    from .._sources.pytorch import torch_version

    facts = identity(index, definition, torch_version())
    if definition.skip_known_failures:
        # Which members are known to fail belongs to what such a chain runs.
        failing = []
        for name in definition.members:
            member = index.get(name)
            if member is None or member.name in within:  # a cycle: the chain is broken
                continue
            inner = _subject(index, member, memo, memory, within | {definition.name})
            verdict = memory.latest(inner)
            if verdict is not None and verdict.status in FAILURES:
                failing.append(name)
        facts["known_failures"] = failing
    judged = []
    members = [d for d in reach(index, definition).values() if d is not None]
    for judging in [definition, *members]:
        folders = judging.search_path
        module = None  # the stamp is the module's: many backends share one
        if judging.target is not None and judging.compiler_fn is None:
            module = judging.target.partition(":")[0]
        code, needs = ("code", module, folders), ("requires", judging.requires, folders)
        # Each part kept as its canonical text: a listing writes it once, not once a row.
        if code not in memo:
            memo[code] = canonical(None if module is None else code_stamp(module, folders))
        if needs not in memo:
            trust = [(p, untrusted_folder(p)) for p in folders]
            memo[needs] = canonical([missing_requirements(judging), trust])
        judged.append([memo[code], memo[needs]])
    if "installed" not in memo:
        memo["installed"] = canonical([installed_stamp(), sys.version, *this_machine()])
    return canonical([facts, judged, memo["installed"], torch_version()])


def known_failure(registry: Registry, name: str) -> str | None:
    """Why ``name`` is known to fail here, by the newest verdict remembered of what it runs;
    ``None`` where none says so, or ``name`` resolves to nothing (the chain says why)."""
    memory = Verdicts(registry.context.cache)
    try:
        verdict = memory.latest(subject(registry, name, memory=memory))
    except BackendRegistryError:
        return None
    if verdict is None or verdict.status not in FAILURES:
        return None
    return f"doctor found {verdict.status} here ({verdict.reason})"


def this_machine() -> list[str]:
    """What tells this machine from another that shares its home folder (nodes of a
    cluster over NFS, one with a GPU and one without)."""
    if not hasattr(os, "uname"):  # pragma: no cover - Windows
        machine, host = (os.environ.get(v, "") for v in ("PROCESSOR_ARCHITECTURE", "COMPUTERNAME"))
        return [sys.platform, machine, host]
    return [sys.platform, os.uname().machine, os.uname().nodename]


class Verdicts:
    """The remembered verdicts, read once from the cache. Each is kept under a digest of its
    subject, with its probe, the files of the code it ran (a project's own: an edit of any
    makes it stale) and the modules it found missing (installing one does too)."""

    KIND = "verdicts"
    KEY = 2

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    @functools.cached_property
    def _table(self) -> dict[str, Any]:
        table = self.cache.get(self.KIND, self.KEY)
        return table if isinstance(table, dict) else {}

    def __len__(self) -> int:
        return len(self._table)

    def _probes(self, subject: str) -> dict[str, Any]:
        probes = self._table.get(_digest(subject))
        return probes if isinstance(probes, dict) else {}

    def get(self, subject: str, probe: Mapping[str, Any]) -> Verdict | None:
        return _read(self._probes(subject).get(canonical(probe)))

    def latest(self, subject: str) -> Verdict | None:
        """The newest current verdict of ``subject`` on the built-in model and the CPU."""
        found = []
        for entry in self._probes(subject).values():
            probe = entry.get("probe") if isinstance(entry, dict) else None
            if isinstance(probe, dict) and all(probe.get(k) == v for k, v in BUILT_IN.items()):
                found.append(entry)
        # Only the newest that reads back as a verdict is built.
        return next(filter(None, map(_read, sorted(found, key=_when, reverse=True))), None)

    def remember(
        self, found: Iterable[tuple[str, Mapping[str, Any], Verdict, Any, list[str]]]
    ) -> None:
        """Remember verdicts in one write, read again under the cache's lock: two runs ending
        together both keep what they found."""
        with self.cache.locked(self.KIND):
            vars(self).pop("_table", None)  # read again, under the lock
            table = self._table
            for subject, probe, verdict, code, missing in found:
                probes = self._probes(subject)
                table[_digest(subject)] = probes
                # What is None takes its default when read back: a listing reads every entry.
                facts = {
                    fact: value for fact, value in verdict.facts().items() if value is not None
                }
                probes[canonical(probe)] = {
                    "verdict": facts,
                    "when": time.time(),
                    "probe": dict(probe),
                    "code": code,
                    "missing": missing,
                }
            if len(table) > LIMIT:
                for old in sorted(table, key=lambda s: _newest(table[s]))[: len(table) - LIMIT]:
                    del table[old]
            self.cache.put(self.KIND, self.KEY, table)


def _digest(subject: str) -> str:
    import hashlib

    return hashlib.sha256(subject.encode("utf-8", "surrogatepass")).hexdigest()


def _when(entry: Any) -> float:
    when = entry.get("when") if isinstance(entry, dict) else None
    return when if isinstance(when, float) else 0.0


def _newest(probes: Any) -> float:
    return max(map(_when, probes.values()), default=0.0) if isinstance(probes, dict) else 0.0


def _read(entry: Any) -> Verdict | None:
    """The verdict ``entry`` holds, where still current; ``None`` for one of another shape."""
    try:
        if any(stamp(str(stamped[0])) != stamped for stamped in entry.get("code") or ()):
            return None
        if any(find(module) is not None for module in entry.get("missing") or ()):
            return None
        return Verdict.from_json(entry["verdict"], cached=True)
    except (TypeError, KeyError, IndexError, AttributeError):
        return None
