"""``list`` and ``explain``: the backends found, and where a name is defined and what it shadows."""

from __future__ import annotations

import sys

from .._errors import BackendRegistryError, UnknownBackendError
from .._registry import DEFAULT_EXCLUDE_TAGS
from .common import (
    EXIT_OK,
    PROG,
    CommandError,
    UsageError,
    Waiting,
    autoload_on,
    print_json,
    print_rows,
    printable,
    registry_for,
    relative,
    terminal_width,
    working_folder,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace as Arguments
    from collections.abc import Sequence
    from typing import Any

    from .._api import Registry
    from .._definition import BackendDefinition, DefaultDeclaration
    from .._doctor.verdicts import Verdict


def run_list(args: Arguments) -> int:
    registry = registry_for(args.no_torch)
    if args.all or args.tag:
        exclude: list[str] = list(args.exclude_tag)
    else:
        exclude = [*DEFAULT_EXCLUDE_TAGS, *args.exclude_tag]
    both = sorted(set(args.tag) & set(args.exclude_tag))
    if both:
        raise UsageError(f"--tag and --exclude-tag both name {', '.join(map(repr, both))}")
    with Waiting("loading PyTorch's backends (--no-torch skips them)", not args.no_torch):
        every = registry.definitions(())
    known = sorted({tag for d in every for tag in d.tags})
    left_out = set(exclude)
    rows = [d for d in every if not left_out.intersection(d.tags)]
    unknown = sorted(set(args.exclude_tag) - set(known))
    if unknown:  # nothing to leave out: likely a typo, and the listing is still right
        print(f"{PROG}: warning: {_no_such_tag(unknown, known)}", file=sys.stderr)
    if args.tag:
        wanted = set(args.tag)
        if not wanted <= set(known):
            raise CommandError(_no_such_tag(sorted(wanted - set(known)), known))
        rows = [d for d in rows if wanted.issubset(d.tags)]
    available = {d.name: registry.why_unavailable(d) is None for d in rows}
    if args.available:
        rows = [d for d in rows if available[d.name]]
    remembered = _Remembered(registry)
    verdicts = {d.name: remembered(d.name) for d in rows}
    default = registry.default_backend()
    if args.json:
        objects = [_as_json(d, available[d.name], verdicts[d.name], default=default) for d in rows]
        print_json(objects)
        return EXIT_OK
    here = working_folder()
    doctored = any(v is not None for v in verdicts.values())
    header = ("NAME", "TAGS", "SOURCE", "TARGET") + (("DOCTOR",) if doctored else ())
    table = [(*header, "DESCRIPTION")]
    for d in rows:
        source = f"{d.source.kind} {d.source.short(here)}".rstrip()
        verdict = verdicts[d.name]
        said = (_verdict_cell(verdict),) if doctored else ()
        table.append((d.name, ",".join(d.tags), source, _what(d), *said, d.description or ""))
    print_rows(table, optional_last=True, shrinkable=(3, len(header)))
    if default is not None and terminal_width() is not None:
        where = relative(default.path) + (f":{default.line}" if default.line else "")
        print(f"default: {default.name} (what torch.compile uses when given none; {where})")
    return EXIT_OK


def _verdict_cell(verdict: Verdict | None) -> str:
    """The DOCTOR cell: the last verdict here and the level it was judged at."""
    if verdict is None:
        return "-"
    return f"{verdict.status} ({verdict.level_name})"


def _no_such_tag(missing: Sequence[str], known: Sequence[str]) -> str:
    import difflib

    quoted = ", ".join(map(repr, missing))
    there = ", ".join(known) or "none"
    said = f"no backend is tagged {quoted} (the tags here: {there})"
    close = [c for m in missing for c in difflib.get_close_matches(m, known, n=1, cutoff=0.6)]
    return said + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")


def _as_json(
    d: BackendDefinition,
    available: bool,
    verdict: Verdict | None = None,
    *,
    default: DefaultDeclaration | None = None,
) -> dict[str, Any]:
    """A backend as ``list --json`` and ``explain --json`` give it."""
    s = d.source
    verify = (
        None if d.verify is None else dict(zip(("level", "rtol", "atol"), d.verify, strict=True))
    )
    return {
        "name": d.name,
        "target": d.target,
        "chain": list(d.chain) if d.chain is not None else None,
        "by_device": dict(d.by_device) if d.by_device is not None else None,
        "tags": list(d.tags),
        "description": d.description,
        "aliases": list(d.aliases),
        "requires": list(d.requires),
        "options": dict(d.options),
        "verify": verify,
        "skip_known_failures": d.skip_known_failures,
        "default": default is not None and default.name == d.name,
        "source": {
            "kind": s.kind,
            "path": s.path,
            "line": s.line,
            "distribution": s.distribution,
            "version": s.version,
        },
        "available": available,
        "doctor": verdict.as_json() if verdict is not None else None,
    }


def _what(d: BackendDefinition) -> str:
    if d.chain is not None:
        return "chain: " + " -> ".join(d.chain)
    if d.by_device is not None:
        return "by-device: " + ", ".join(f"{device} -> {name}" for device, name in d.by_device)
    return d.target or ""


def run_explain(args: Arguments) -> int:
    registry = registry_for(args.no_torch)
    try:
        info = registry.backend_info(args.name)
    except UnknownBackendError:
        # What declares it, printed; the error says why it is no backend here.
        _explain_unusable(registry, args.name)
        raise
    name = info.definition.name
    verdict = _Remembered(registry)(name)
    default = registry.default_backend()
    # Entry points are admitted without PyTorch read: explaining needs no torch import.
    policy = registry.index(with_torch=False).admitted.get(name)
    if args.json:
        available = registry.why_unavailable(info.definition) is None
        print_json(
            {
                **_as_json(info.definition, available, verdict, default=default),
                "alias": info.alias,
                "policy": policy,
                "autoload": autoload_on(),
                "shadowed": [
                    _as_json(lower, registry.why_unavailable(lower) is None)
                    for lower in info.shadowed
                ],
            }
        )
        return EXIT_OK
    out: list[str] = []
    if info.alias is None:
        out.append(name)
    else:
        out.append(f"{info.alias} (alias of {name}: resolves to whatever {name} does)")
    out.extend(_describe(registry, info.definition, verdict))
    if default is not None and default.name in (name, info.alias):
        where = relative(default.path) + (f":{default.line}" if default.line else "")
        out.append(f"  {'default:':<13}yes: torch.compile uses it when given none ({where})")
    if policy is not None:
        out.append(f"  {'policy:':<13}{policy}")
    out.append(f"  {'autoload:':<13}{_autoload_state(info.definition)}")
    if info.shadowed:
        out.append("shadows (lower precedence, not used):")
        for lower in info.shadowed:
            out.append(f"  {lower.name}")
            out.extend("  " + line for line in _describe(registry, lower, None))
    else:
        out.append("shadows nothing")
    print("\n".join(printable(line) for line in out))
    return EXIT_OK


def _explain_unusable(registry: Registry, name: str) -> bool:
    """Explain a name that is no backend here but is declared: disabled, or left out by the
    plugin policy. ``False`` where nothing declares it."""
    index = registry.index(with_torch=False)
    candidates = index.by_key.get(name, [])
    excluded = index.excluded.get(name, [])
    if not candidates and not excluded:
        return False
    out = [f"{name} (no backend here)"]
    if candidates and not candidates[0].enabled:
        top = candidates[0]
        out.append(
            f"  {'disabled:':<13}by {top.source.describe(working_folder())} (enabled = false)"
        )
        lower = candidates[1:]
    else:
        lower = candidates
    for definition, why in excluded:
        out.append(f"  {'left out:':<13}{why}")
        lower = [d for d in lower if d is not definition]
    for hidden in lower:
        out.append(
            f"  {'hides:':<13}{hidden.source.kind}: {hidden.source.describe(working_folder())}"
        )
    print("\n".join(printable(line) for line in out))
    return True


def _autoload_state(d: BackendDefinition) -> str:
    """Whether ``d`` is a torch.compile name in a process of this environment that did not
    call install(): PyTorch's own and its entry points always are; the others with autoload."""
    if d.source.kind in ("torch", "entry-point") and d.distribution is None:
        return "not needed: PyTorch finds this backend itself"
    from .._autoload import state

    return state()


def _describe(registry: Registry, d: BackendDefinition, verdict: Verdict | None) -> list[str]:
    from .._sources.finding import missing_requirements

    missing = missing_requirements(d)
    where = d.source.describe(working_folder())
    fields: list[tuple[str, str]] = [("source", f"{d.source.kind}: {where}")]
    if not d.enabled:
        fields.append(("enabled", "false (hides this name)"))
    if d.problem is not None:
        fields.append(("error", d.problem.message))
    if d.target is not None:
        fields.append(("target", d.target))
    if d.chain is not None:
        fields.append(("chain", " -> ".join(d.chain)))
    if d.by_device is not None:
        by_device = ", ".join(f"{device} -> {name}" for device, name in d.by_device)
        fields.append(("by-device", by_device))
    if d.verify is not None:
        level, rtol, atol = d.verify
        fields.append(("verify", f"{level} (rtol {rtol:g}, atol {atol:g})"))
    if d.skip_known_failures:
        fields.append(("skips", "members doctor found failing here (skip-known-failures)"))
    if d.tags:
        fields.append(("tags", ", ".join(d.tags)))
    if d.aliases:
        fields.append(("aliases", ", ".join(d.aliases)))
    if d.description:
        fields.append(("description", d.description))
    if d.options:
        fields.append(("options", ", ".join(f"{k} = {v!r}" for k, v in d.options.items())))
    if d.requires:
        status = ", ".join(f"{r} ({'missing' if r in missing else 'found'})" for r in d.requires)
        fields.append(("requires", status))
    if d.usable:
        why = registry.why_unavailable(d)
        fields.append(("available", "yes" if why is None else f"no: {why}"))
    if verdict is not None:
        said = verdict.status + (f": {verdict.reason}" if verdict.reason else "")
        fields.append(("doctor", f"{said} (last probe here, {verdict.level_name} level)"))
    return [f"  {key + ':':<13}{value}" for key, value in fields]


class _Remembered:
    """The last doctor verdict here of what a name runs: the memory read once, and each
    target's file looked at once, however many rows ask."""

    def __init__(self, registry: Registry) -> None:
        from .._doctor.verdicts import Verdicts

        self.registry = registry
        self.memory = Verdicts(registry.context.cache)
        self.stamps: dict[Any, Any] = {}

    def __call__(self, name: str) -> Verdict | None:
        from .._doctor.verdicts import subject

        if not self.memory:
            return None  # nothing remembered: nothing to work out
        try:
            return self.memory.latest(subject(self.registry, name, self.stamps))
        except BackendRegistryError:
            return None
