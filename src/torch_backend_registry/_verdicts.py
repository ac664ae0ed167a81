"""Doctor's verdicts, remembered in the cache by everything a verdict depends on.

A verdict is about a *subject*: the identity of what a name runs (its chain's
members' included), the file and modification time of every target module it
may import, and the machine (Python, platform, PyTorch). It was found by a
*probe*: the model, the device, the level asked for and the time limit. A run
of ``doctor`` reuses a verdict of the same subject and probe; a listing shows
the newest verdict of the subject on the built-in model and the CPU; a chain
with ``skip-known-failures`` skips a member with such a verdict of failure.
"""

from __future__ import annotations

import os
import sys
import time

from ._definition import canonical
from ._files import untrusted_folder
from ._finding import code_stamp, find, installed_stamp, missing_requirements
from ._verdict import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ._cache import Cache
    from ._definition import BackendDefinition

#: The most subjects remembered; the oldest are forgotten first.
LIMIT = 10_000
#: The probe a listing's verdict and a chain's skip were found with: the built-in
#: model on the CPU (any level, any time limit).
BUILT_IN = {"model": None, "device": "cpu"}
#: Statuses that say a backend fails here, whatever the time limit.
FAILURES = frozenset({"import-error", "compile-error", "wrong-result", "backward-error", "crashed"})


def subject(
    identity: Mapping[str, Any],
    definitions: Iterable[BackendDefinition],
    torch_version: str | None,
    stamps: dict[Any, Any] | None = None,
) -> str:
    """The key of what a verdict judges: ``identity``; for the backend and what its chain
    reaches, the code their targets name, which of their requirements are missing and
    which python-path folders the trust rule refuses; and this machine and environment
    (what is installed in it, PyTorch's version).

    ``stamps`` remembers what was looked at across the calls of one listing.
    """
    memo: dict[Any, Any] = {} if stamps is None else stamps
    judged = []
    for definition in definitions:
        folders = definition.search_path
        module = None  # the stamp is the module's: many backends share one
        if definition.target is not None and definition.compiler_fn is None:
            module = definition.target.partition(":")[0]
        code, needs = ("code", module, folders), ("requires", definition.requires, folders)
        # Each part kept as its canonical text: a listing writes it once, not once a row.
        if code not in memo:
            memo[code] = canonical(None if module is None else code_stamp(module, folders))
        if needs not in memo:
            trust = [(p, untrusted_folder(p)) for p in folders]
            memo[needs] = canonical([missing_requirements(definition), trust])
        judged.append([memo[code], memo[needs]])
    if "installed" not in memo:
        memo["installed"] = canonical([installed_stamp(), sys.version, *this_machine()])
    return canonical([identity, judged, memo["installed"], torch_version])


def this_machine() -> list[str]:
    """What tells this machine from another that shares its home folder (nodes of a
    cluster over NFS, one with a GPU and one without): its platform, processor, host."""
    uname = getattr(os, "uname", None)
    if uname is None:  # pragma: no cover - Windows
        return [
            sys.platform,
            os.environ.get("PROCESSOR_ARCHITECTURE", ""),
            os.environ.get("COMPUTERNAME", ""),
        ]
    found = uname()
    return [sys.platform, found.machine, found.nodename]


class Verdicts:
    """The remembered verdicts, read once from the cache.

    Each is kept under a digest of its subject, with its probe and, as the probe found
    them, the files of the code it ran (a project's own: an edit of any of them, the
    target's imports included, makes it stale) and the modules it found missing
    (installing one does too).
    """

    KIND = "verdicts"
    KEY = 2

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._table: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._table is None:
            table = self.cache.get(self.KIND, self.KEY)
            self._table = table if isinstance(table, dict) else {}
        return self._table

    def __len__(self) -> int:
        return len(self._load())

    def _entries(self, subject: str) -> list[dict[str, Any]]:
        probes = self._load().get(_digest(subject))
        found = probes.values() if isinstance(probes, dict) else ()
        return [entry for entry in found if _current(entry)]

    def get(self, subject: str, probe: Mapping[str, Any]) -> Verdict | None:
        """The verdict of ``subject`` found by exactly ``probe``, where still current."""
        wanted = canonical(probe)
        for entry in self._entries(subject):
            if canonical(entry.get("probe")) == wanted:
                return _verdict(entry)
        return None

    def latest(self, subject: str) -> Verdict | None:
        """The newest current verdict of ``subject`` on the built-in model and the CPU."""
        found = []
        for entry in self._entries(subject):
            when, probe = entry.get("when"), entry.get("probe")
            if not isinstance(probe, dict) or not isinstance(when, float):
                continue
            if all(probe.get(k) == v for k, v in BUILT_IN.items()):
                found.append((when, entry))
        found.sort(key=lambda pair: pair[0], reverse=True)
        # Only the newest that reads back as a verdict is built.
        return next(filter(None, (_verdict(entry) for _when, entry in found)), None)

    def put(self, subject: str, probe: Mapping[str, Any], verdict: Verdict) -> None:
        """Remember ``verdict`` of ``subject`` found by ``probe``."""
        self.remember([(subject, probe, verdict, None, [])])

    def remember(
        self, found: Iterable[tuple[str, Mapping[str, Any], Verdict, Any, list[str]]]
    ) -> None:
        """Remember verdicts, each with its subject, its probe, the code it ran and the
        modules it missed, in one write. The table is read again and written under the
        cache's lock: two runs ending together both keep what they found."""
        with self.cache.locked(self.KIND):
            self._table = None
            self._remember(self._load(), found)

    def _remember(
        self,
        table: dict[str, Any],
        found: Iterable[tuple[str, Mapping[str, Any], Verdict, Any, list[str]]],
    ) -> None:
        for subject, probe, verdict, code, missing in found:
            key = _digest(subject)
            probes = table.get(key)
            if not isinstance(probes, dict):
                probes = table[key] = {}
            # What is None takes its default when read back: a listing reads every entry.
            facts = {fact: value for fact, value in verdict.facts().items() if value is not None}
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


def _current(entry: object) -> bool:
    """Whether what a verdict was found on is as it was: the code it ran, the modules it
    missed (still missing)."""
    if not isinstance(entry, dict):
        return False
    code, missing = entry.get("code"), entry.get("missing") or []
    for stamp in code if isinstance(code, list) else ():
        try:
            path, size, mtime = stamp
            info = os.stat(path)
        except (OSError, TypeError, ValueError):
            return False
        if (info.st_size, info.st_mtime_ns) != (size, mtime):
            return False
    return all(isinstance(m, str) and find(m) is None for m in missing)


def _newest(probes: object) -> float:
    if not isinstance(probes, dict):
        return 0.0
    times = [p.get("when") for p in probes.values() if isinstance(p, dict)]
    return max((t for t in times if isinstance(t, (int, float))), default=0.0)


def _verdict(found: object) -> Verdict | None:
    if not isinstance(found, dict) or not isinstance(found.get("verdict"), dict):
        return None
    try:
        return Verdict.from_json(found["verdict"], cached=True)
    except TypeError:
        return None
