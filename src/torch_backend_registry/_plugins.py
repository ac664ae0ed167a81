"""The plugin policy over entry points: what allow and deny lists leave out, and which
distribution a name two of them declare is taken from.

A distribution counts when the highest allow list (if any) names it and the highest rule
naming it is not a deny; so deny lists combine, and only an explicit allow re-admits. When
several distributions declare one name, the first on ``sys.path`` (then by name) wins
unless a manifest picks one with ``distribution = "..."``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from ._definition import BackendDefinition, Discovery, Problem
from ._definition import distribution_key as _dist_key
from ._errors import did_you_mean
from ._keys import toml_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._definition import PluginRule
    from ._merge import Index


def rules_naming_nothing(found: Discovery) -> list[Problem]:
    """An allow or deny list naming a distribution that declares no backend here (a typo?),
    at the line of its list, with the closest name that does."""
    declaring = sorted({_dist_of(d) for d in found.definitions if d.source.distribution})
    said = []
    for rule in found.rules:
        for name in sorted(rule.names - set(declaring)):
            if _installed(name):  # one whose package registers itself when imported
                continue
            hint = did_you_mean(name, declaring, "check the name")
            if rule.kind == "allow" and declaring and not rule.names & set(declaring):
                hint += (
                    " (as written, it admits no installed plugin: every entry point is left out)"
                )
            where = f"{rule.key}: " if rule.path is None else ""
            said.append(
                Problem(
                    f"{where}the {rule.kind} list names {name!r}, which is no installed"
                    f" distribution declaring a torch_dynamo_backends entry point; {hint}",
                    path=rule.path,
                    line=rule.line,
                    key=rule.key if rule.path is not None else None,
                    severity="warning",
                )
            )
    return said


def excluded(
    definition: BackendDefinition, rules: Sequence[PluginRule], index: Index
) -> str | None:
    """Why the plugin policy leaves this entry point out, or ``None`` (see the module's rules)."""
    name = definition.source.distribution or ""
    key = _dist_of(definition)
    allow = next((rule for rule in rules if rule.kind == "allow"), None)
    if allow is not None and key not in allow.names:
        return f"distribution {name!r} is not allowed by {allow.where}"
    if (deciding := next((rule for rule in rules if key in rule.names), None)) is None:
        return None
    if deciding.kind == "deny":
        return f"distribution {name!r} is denied by {deciding.where}"
    if lower := [rule.where for rule in rules if rule.kind == "deny" and key in rule.names]:
        index.admitted[definition.name] = (
            f"distribution {name!r} is allowed by {deciding.where}, over the deny of"
            f" {', '.join(lower)}"
        )
    return None


def resolve_picks(index: Index, definitions: Sequence[BackendDefinition]) -> None:
    """Give each ``distribution = "..."`` pick its entry point; report unpicked conflicts."""
    names = {d.name for d in definitions if d.distribution or d.source.kind == "entry-point"}
    for key in sorted(names):
        if not (candidates := index.by_key.get(key)) or candidates[0].name != key:
            continue
        top = candidates[0]
        points = [d for d in candidates if d.source.kind == "entry-point" and d.name == key]
        if top.distribution is not None and top.usable:
            candidates[0] = _picked(top, points, index.excluded.get(key, []))
            continue
        if top.source.kind != "entry-point" or len(points) < 2:
            continue  # one entry point of a name is no conflict
        if len({_dist_of(p) for p in points}) > 1:
            declared = " and ".join(_owner(p) for p in points)
            index.conflicts[key] = Problem(
                f"entry point {key!r} is declared by {declared}: {_owner(points[0])} is used, the"
                ' first on sys.path, then by name; say which with `distribution = "..."` in a'
                f" [{toml_key(('backends', key))}] table of a manifest",
                severity="warning",
            )
    index.problems.extend(index.conflicts.values())


def _picked(
    pick: BackendDefinition,
    points: list[BackendDefinition],
    excluded: list[tuple[BackendDefinition, str]],
) -> BackendDefinition:
    wanted = _dist_key(pick.distribution or "")
    if (match := next((p for p in points if _dist_of(p) == wanted), None)) is not None:
        found = match.source
        source = replace(pick.source, distribution=found.distribution, version=found.version)
        return replace(pick, source=source, target=match.target)
    if (left := next((why for p, why in excluded if _dist_of(p) == wanted), None)) is not None:
        why = f"the entry point {pick.name!r} it picks is left out: {left}"
    else:
        declared = ", ".join(_owner(p) for p in points) or "no installed distribution"
        why = (
            f"no installed distribution {pick.distribution!r} declares the entry point"
            f" {pick.name!r} (declared by: {declared})"
        )
        distributions = [p.source.distribution or "" for p in points]
        why += did_you_mean(pick.distribution or "", distributions, before="; ")
    problem = pick.located(why, "distribution")
    return BackendDefinition(
        pick.name, pick.source, distribution=pick.distribution, problem=problem, lines=pick.lines
    )


def _installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    with contextlib.suppress(PackageNotFoundError, ValueError):
        return distribution(name) is not None
    return False


def _dist_of(point: BackendDefinition) -> str:
    return _dist_key(point.source.distribution or "")


def _owner(point: BackendDefinition) -> str:
    version = f" {point.source.version}" if point.source.version else ""
    return f"{point.source.distribution!r}{version}"
