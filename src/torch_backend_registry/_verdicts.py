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

import sys
import time

from ._definition import canonical
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
    import os

    from ._files import untrusted_folder
    from ._finding import code_stamp, installed_stamp, missing_requirements

    memo: dict[Any, Any] = {} if stamps is None else stamps
    judged = []
    for definition in definitions:
        key = (definition.target, definition.requires, definition.python_path)
        if key not in memo:
            code = None
            if definition.target is not None and definition.compiler_fn is None:
                code = code_stamp(definition.target, definition.python_path)
            trust = [(p, untrusted_folder(p)) for p in definition.python_path]
            memo[key] = [code, missing_requirements(definition), trust]
        judged.append(memo[key])
    if "installed" not in memo:
        uname = getattr(os, "uname", None)
        machine = uname().machine if uname is not None else sys.platform
        memo["installed"] = [installed_stamp(), sys.version, sys.platform, machine]
    return canonical([identity, judged, memo["installed"], torch_version])


class Verdicts:
    """The remembered verdicts, read once from the cache."""

    KIND = "verdicts"
    KEY = 1

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

    def get(self, subject: str, probe: Mapping[str, Any]) -> Verdict | None:
        """The verdict of ``subject`` found by exactly ``probe``."""
        probes = self._load().get(subject)
        return _verdict(probes.get(canonical(probe)) if isinstance(probes, dict) else None)

    def latest(self, subject: str) -> Verdict | None:
        """The newest verdict of ``subject`` on the built-in model and the CPU."""
        newest: tuple[float, Verdict] | None = None
        probes = self._load().get(subject)
        for found in probes.values() if isinstance(probes, dict) else ():
            verdict = _verdict(found)
            if verdict is None or not isinstance(found.get("probe"), dict):
                continue
            when = found.get("when")
            if not isinstance(when, (int, float)):
                continue
            on_built_in = all(found["probe"].get(k) == v for k, v in BUILT_IN.items())
            if on_built_in and (newest is None or when > newest[0]):
                newest = (when, verdict)
        return None if newest is None else newest[1]

    def put(self, subject: str, probe: Mapping[str, Any], verdict: Verdict) -> None:
        """Remember ``verdict`` of ``subject`` found by ``probe``."""
        self.remember([(subject, probe, verdict)])

    def remember(self, found: Iterable[tuple[str, Mapping[str, Any], Verdict]]) -> None:
        """Remember verdicts, each with its subject and probe, in one write (the table is
        read again first: another run may have added to it)."""
        self._table = None
        table = self._load()
        for subject, probe, verdict in found:
            probes = table.get(subject)
            if not isinstance(probes, dict):
                probes = table[subject] = {}
            entry = {"verdict": verdict.facts(), "when": time.time(), "probe": dict(probe)}
            probes[canonical(probe)] = entry
        if len(table) > LIMIT:
            for old in sorted(table, key=lambda s: _newest(table[s]))[: len(table) - LIMIT]:
                del table[old]
        self.cache.put(self.KIND, self.KEY, table)


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
