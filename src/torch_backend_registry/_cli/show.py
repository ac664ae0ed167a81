"""``list`` and ``explain``: the backends found, and where a name is defined and what it shadows."""

from __future__ import annotations

import sys
from argparse import Namespace as Arguments
from typing import Any

from .._definition import BackendDefinition, DefaultDeclaration
from .._errors import UnknownBackendError, closest
from .._identity import by_device
from .._registry import DEFAULT_EXCLUDE_TAGS, Registry
from .common import (
    EXIT_OK,
    PROG,
    CommandError,
    UsageError,
    print_json,
    print_rows,
    printable,
    registry_for,
    relative,
    status_line,
    working_folder,
)


def run_list(args: Arguments) -> int:
    registry = registry_for(args.no_torch)
    wanted, unwanted = set(args.tag), set(args.exclude_tag)
    if both := sorted(wanted & unwanted):
        raise UsageError(f"--tag and --exclude-tag both name {', '.join(map(repr, both))}")
    with status_line("loading PyTorch's backends (--no-torch skips them)", not args.no_torch):
        every = registry.definitions(())
    known = {tag for d in every for tag in d.tags}
    if unwanted - known:  # nothing to leave out: likely a typo, and the listing is still right
        print(f"{PROG}: warning: {_no_such_tag(unwanted - known, known)}", file=sys.stderr)
    if wanted - known:
        raise CommandError(_no_such_tag(wanted - known, known))
    if not (args.all or wanted):
        unwanted.update(DEFAULT_EXCLUDE_TAGS)
    rows = [d for d in every if wanted <= set(d.tags) and not unwanted.intersection(d.tags)]
    if args.available:
        rows = [d for d in rows if registry.why_unavailable(d) is None]
    default = registry.index(with_torch=False).default
    if args.json:
        print_json([_as_json(registry, d, default) for d in rows])
        return EXIT_OK
    here = working_folder()
    table = [("NAME", "TAGS", "SOURCE", "TARGET", "DESCRIPTION")]
    for d in rows:
        source = f"{d.source.kind} {d.source.short(here)}".rstrip()
        kind, what = _what(d)
        what = what if kind == "target" else f"{kind}: {what}"
        table.append((d.name, ",".join(d.tags), source, what, d.description or ""))
    print_rows(table, optional_last=True, shrinkable=(3, 4))
    if default is not None and sys.stdout.isatty():  # piped: the columns scripts know
        print(f"default: {default.name} (what torch.compile uses when given none; {_at(default)})")
    return EXIT_OK


def _no_such_tag(missing: set[str], known: set[str]) -> str:
    said = f"no backend is tagged {', '.join(map(repr, sorted(missing)))}"
    said += f" (the tags here: {', '.join(sorted(known)) or 'none'})"
    close = [c for m in sorted(missing) for c in closest(m, sorted(known))]
    return said + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")


def _at(default: DefaultDeclaration) -> str:
    return relative(default.path) + (f":{default.line}" if default.line else "")


def _as_json(
    registry: Registry, d: BackendDefinition, default: DefaultDeclaration | None = None
) -> dict[str, Any]:
    """A backend as ``list --json`` and ``explain --json`` give it."""
    return {
        "name": d.name,
        "target": d.target,
        "chain": list(d.chain) if d.chain is not None else None,
        "by_device": by_device(d) if d.by_device is not None else None,
        "tags": list(d.tags),
        "description": d.description,
        "aliases": list(d.aliases),
        "requires": list(d.requires),
        "options": dict(d.options),
        "verify": dict(zip(("level", "rtol", "atol"), d.verify, strict=True)) if d.verify else None,
        "select": {"select": d.select, "min_speedup": d.min_speedup} if d.chain else None,
        "default": default is not None and default.name == d.name,
        "source": {
            key: getattr(d.source, key)
            for key in ("kind", "path", "line", "distribution", "version")
        },
        "available": registry.why_unavailable(d) is None,
    }


def _what(d: BackendDefinition) -> tuple[str, str]:
    """What ``d`` runs, named by its key: a target, a chain or a by-device table."""
    if d.chain is not None:
        return "chain", " -> ".join(d.chain)
    if d.by_device is None:
        return "target", d.target or ""
    said = []
    for device, entry in by_device(d).items():
        if not isinstance(entry, str):  # a backend's name, with the settings it gives the device
            settings = ", ".join(f"{k} {v!r}" for k, v in entry.items() if k != "backend")
            entry = f"{entry['backend']} ({settings or 'no settings'})"
        said.append(f"{device} -> {entry}")
    return "by-device", ", ".join(said)


def run_explain(args: Arguments) -> int:
    from .._autoload import enabled, state

    registry = registry_for(args.no_torch)
    try:
        info = registry.backend_info(args.name)
    except UnknownBackendError:
        # What declares it, printed; the error says why it is no backend here.
        _explain_unusable(registry, args.name)
        raise
    name = info.definition.name
    # Entry points are admitted without PyTorch read: explaining needs no torch import.
    index = registry.index(with_torch=False)
    default, policy = index.default, index.admitted.get(name)
    remembered: list[dict[str, Any]] = []
    shipped: list[dict[str, Any]] = []
    if info.definition.select == "fastest":
        from .._select import remembered as remembered_here
        from .choices import shipped as shipped_here

        remembered = remembered_here(registry.context.cache, info.definition, registry.backend_info)
        shipped = shipped_here(registry, info.definition, args.no_torch)
    if args.json:
        print_json(
            {
                **_as_json(registry, info.definition, default),
                "alias": info.alias,
                "policy": policy,
                "autoload": enabled(),
                "choices": remembered,
                "shipped": shipped,
                "shadowed": [_as_json(registry, lower) for lower in info.shadowed],
            }
        )
        return EXIT_OK
    fields = _fields(registry, info.definition)
    if default is not None and default.name in (name, info.alias):
        fields.append(("default", f"yes: torch.compile uses it when given none ({_at(default)})"))
    if policy is not None:
        fields.append(("policy", policy))
    # PyTorch's own and its entry points are torch.compile names in every process.
    itself = info.source.kind in ("torch", "entry-point") and info.distribution is None
    autoload = "not needed: PyTorch finds this backend itself" if itself else state()
    fields.append(("autoload", autoload))
    if info.definition.select == "fastest":
        fields.append(("choices", f"{len(remembered) or 'none'} remembered here"))
        fields.append(("shipped", f"{len(shipped) or 'none'} in backends.choices"))
    alias = f"{info.alias} (alias of {name}: resolves to whatever {name} does)"
    out = [name if info.alias is None else alias, *_lines(fields)]
    if remembered or shipped:
        from .choices import lines

        out += lines(remembered, shipped)
    if info.shadowed:
        out.append("shadows (lower precedence, not used):")
        for lower in info.shadowed:
            out.append(f"  {lower.name}")
            out.extend("  " + line for line in _lines(_fields(registry, lower)))
    else:
        out.append("shadows nothing")
    print("\n".join(printable(line) for line in out))
    return EXIT_OK


def _explain_unusable(registry: Registry, name: str) -> None:
    """Explain a name that is declared but no backend here: disabled, or left out by policy."""
    index = registry.index(with_torch=False)
    candidates = index.by_key.get(name, [])
    excluded = index.excluded.get(name, [])
    if not candidates and not excluded:
        return
    here = working_folder()
    fields: list[tuple[str, object]] = []
    lower = candidates
    if candidates and not candidates[0].enabled:
        fields.append(("disabled", f"by {candidates[0].source.describe(here)} (enabled = false)"))
        lower = candidates[1:]
    # What the policy leaves out never enters the index: it hides nothing of ``lower``.
    fields += [("left out", why) for _definition, why in excluded]
    fields += [("hides", f"{h.source.kind}: {h.source.describe(here)}") for h in lower]
    print("\n".join(printable(line) for line in [f"{name} (no backend here)", *_lines(fields)]))


def _lines(fields: list[tuple[str, object]]) -> list[str]:
    """``explain``'s layout: a line a field, each value where every other starts."""
    return [f"  {key + ':':<13}{value}" for key, value in fields]


def _fields(registry: Registry, d: BackendDefinition) -> list[tuple[str, object]]:
    from .._sources.finding import missing_requirements

    here = working_folder()
    fields: list[tuple[str, object]] = [("source", f"{d.source.kind}: {d.source.describe(here)}")]
    if not d.enabled:
        fields.append(("enabled", "false (hides this name)"))
    if d.problem is not None:
        fields.append(("error", d.problem.message))
    if d.target is not None or d.members:
        fields.append(_what(d))
    if d.verify is not None:
        level, rtol, atol = d.verify
        fields.append(("verify", f"{level} (rtol {rtol:g}, atol {atol:g})"))
    if d.select == "fastest":
        said = f"fastest (a member at least {d.min_speedup:g}x faster than the first is chosen)"
        fields.append(("select", said))
    written = [
        ("tags", ", ".join(d.tags)),
        ("aliases", ", ".join(d.aliases)),
        ("description", d.description),
        ("options", ", ".join(f"{k} = {v!r}" for k, v in d.options.items())),
    ]
    fields += [(key, value) for key, value in written if value]  # what is not written, unsaid
    if d.requires:
        missing = missing_requirements(d)
        found = (f"{r} ({'missing' if r in missing else 'found'})" for r in d.requires)
        fields.append(("requires", ", ".join(found)))
    if d.usable:
        why = registry.why_unavailable(d)
        fields.append(("available", "yes" if why is None else f"no: {why}"))
    return fields
