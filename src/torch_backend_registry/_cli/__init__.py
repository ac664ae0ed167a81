"""The ``torch-backends`` command: parses arguments, asks the registry, prints its answers."""

from __future__ import annotations

import contextlib
import os
import sys

from .._api import Registry
from .._errors import BackendRegistryError, UnknownBackendError
from .._registry import DEFAULT_EXCLUDE_TAGS
from .arguments import PROG

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace as Arguments
    from collections.abc import Iterator, Sequence
    from typing import Any

    from .._definition import (
        BackendDefinition,
        DefaultDeclaration,
        Problem,
        Severity,
        SourceKind,
    )
    from .._doctor.verdicts import Verdict

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A command cannot do what was asked (a file exists, say): one line, exit 1."""


class UsageError(CommandError):
    """What was asked means nothing (options that contradict each other): exit 2."""


STARTER = """\
# Backends for torch.compile(model, backend="NAME"), read by torch-backend-registry.
# Check this file, and import what it names, with `torch-backends check --import`;
# see every backend with `torch-backends list`.
# For validation in your editor (Taplo, Even Better TOML):
#   torch-backends schema > backends.schema.json
# and then add this line at the very top:  #:schema ./backends.schema.json

schema-version = 1

# The backend torch.compile uses when given none, once install() has run.
# default = "my_backend"

# Folders, relative to this file, searched (after every installed module) while
# importing the targets below.
# python-path = ["src"]

[backends.my_backend]
# Required (or `chain`): the compiler function, "module.path:attribute". It is
# imported on first use only; it takes (graph_module, example_inputs).
target = "my_package.compilers:my_compiler"
# Optional: one line, shown by `torch-backends explain my_backend` (and by `list`
# on a terminal wide enough).
description = "My compiler"
# Optional: labels; `list` and list_backends() hide "debug" and "experimental".
# tags = ["experimental"]
# Optional: more names for the same backend.
# aliases = ["mine"]
# Optional: modules that must be importable (looked for, never imported).
# requires = ["tensorrt"]
# Optional: keyword arguments passed to the target on every call.
# options = { fp16 = true }
# Optional: false hides this name, also from plugins' entry points (PyTorch's own
# names cannot be hidden).
# enabled = true

# A fallback chain: the first member whose requirements are met and that
# compiles without raising is used. With verify = "forward" (or "backward"), a
# member whose compiled graph gives other values than the graph run eagerly (or
# other gradients) is skipped too.
# [backends.portable]
# chain = ["tensorrt", "inductor", "eager"]
# verify = "forward"

# A backend chosen by the device of the graph's inputs ("other": any other device).
# [backends.auto]
# by-device = { cuda = "inductor", cpu = "portable", other = "eager" }
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit code."""
    _printable_streams()
    args = parse(argv)
    import warnings

    from .._errors import ManifestWarning

    show = warnings.showwarning
    caught: list[str] = []

    def said(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, ManifestWarning):
            caught.append(str(message))
        else:  # what an imported backend warns of keeps Python's form, as it happens
            show(message, category, *args, **kw)

    with warnings.catch_warnings():
        # This library's own warnings are the command's to say, each once; others keep
        # Python's filters.
        warnings.simplefilter("default", ManifestWarning)
        warnings.showwarning = said
        code, error = _run(args)
    for message in caught:
        # The error below says the same thing; one line is enough.
        if error is None or not message.startswith(error):
            print(f"{PROG}: warning: {printable(message)}", file=sys.stderr)
    if error is not None:
        _error(error)
    return code


def parse(argv: Sequence[str] | None) -> Arguments:
    """The arguments as argparse parses them; exits as argparse does on help or a mistake."""
    from .arguments import build_parser, complete

    parser = build_parser(complete_names=_complete_names)
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions
        complete(parser)  # answers and exits, where argcomplete is installed
    return parser.parse_args(sys.argv[1:] if argv is None else argv)


def _complete_names(prefix: str, **kwargs: Any) -> list[str]:
    """Backend names and aliases for completion: the manifests and plugins, not PyTorch's."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        registry = _registry(no_torch=True)
        names = {d.name for d in registry.definitions(())}
        names.update(alias for d in registry.definitions(()) for alias in d.aliases)
    return sorted(n for n in names if n.startswith(prefix))


def _printable_streams() -> None:
    # A description may hold characters the terminal's encoding lacks (a C locale,
    # PYTHONIOENCODING=ascii): print them escaped rather than fail.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _run(args: Arguments) -> tuple[int, str | None]:
    debug = getattr(args, "debug", False)
    try:
        return _HANDLERS[args.command](args), None
    except UnknownBackendError as exc:
        if debug:
            raise
        from .._sources.pytorch import PYTORCH_NAMES

        if getattr(args, "no_torch", False) and exc.name in PYTORCH_NAMES:
            return EXIT_PROBLEMS, (
                f"unknown backend {exc.name!r} with --no-torch: it is one of PyTorch's own"
                " backends, which --no-torch leaves out; run it without --no-torch"
            )
        return EXIT_PROBLEMS, f"{exc.brief} '{PROG} list --all' shows every name."
    except UsageError as exc:
        return EXIT_USAGE, str(exc)
    except (BackendRegistryError, CommandError) as exc:
        if debug:
            raise
        return EXIT_PROBLEMS, str(exc)
    except BrokenPipeError:
        # `torch-backends list | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK, None
    except KeyboardInterrupt:
        return 130, None
    except Exception as exc:
        if debug:
            raise
        return EXIT_PROBLEMS, f"{type(exc).__name__}: {exc} (run with --debug for a traceback)"


def _error(message: str) -> None:
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)


def printable(text: str) -> str:
    """``text`` with what a terminal would act on escaped: one line, no control sequences.

    A manifest may hold any character in a description or a file name; printed raw,
    an escape sequence or a bidi override would be obeyed by the terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _here() -> str | None:
    """The working directory, or ``None`` where it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _registry(no_torch: bool = False) -> Registry:
    from .._definition import SOURCE_KINDS

    return Registry(sources=[k for k in SOURCE_KINDS if not (no_torch and k == "torch")])


# ---------------------------------------------------------------------------- list


def _list(args: Arguments) -> int:
    registry = _registry(args.no_torch)
    if args.all or args.tag:
        exclude: list[str] = list(args.exclude_tag)
    else:
        exclude = [*DEFAULT_EXCLUDE_TAGS, *args.exclude_tag]
    both = sorted(set(args.tag) & set(args.exclude_tag))
    if both:
        raise UsageError(f"--tag and --exclude-tag both name {', '.join(map(repr, both))}")
    with _Waiting("loading PyTorch's backends (--no-torch skips them)", not args.no_torch):
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
        _print_json(objects)
        return EXIT_OK
    here = _here()
    doctored = any(v is not None for v in verdicts.values())
    header = ("NAME", "TAGS", "SOURCE", "TARGET") + (("DOCTOR",) if doctored else ())
    table = [(*header, "DESCRIPTION")]
    for d in rows:
        source = f"{d.source.kind} {d.source.short(here)}".rstrip()
        verdict = verdicts[d.name]
        said = (_verdict_cell(verdict),) if doctored else ()
        table.append((d.name, ",".join(d.tags), source, _what(d), *said, d.description or ""))
    _print_rows(table, optional_last=True, shrinkable=(3, len(header)))
    if default is not None and _terminal_width() is not None:
        where = _shown_path(default.path) + (f":{default.line}" if default.line else "")
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


def _print_json(value: object) -> None:
    import json

    # ASCII: a description's control or bidi characters reach no terminal raw.
    json.dump(value, sys.stdout, indent=2, default=_json_default)
    sys.stdout.write("\n")


def _json_default(value: object) -> object:
    """TOML's dates and times, and mappings, as JSON can hold them."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "items"):
        return dict(value.items())
    raise TypeError(f"{type(value).__name__} is not JSON")


class _Waiting:
    """A line on a terminal's stderr while something slow runs, erased when it is done."""

    def __init__(self, message: str, slow: bool) -> None:
        self.shown = slow and sys.stderr.isatty()
        self.message = message

    def __enter__(self) -> None:
        if self.shown:
            sys.stderr.write(f"{PROG}: {self.message}...")
            sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


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


def _terminal_width(stream: Any = None) -> int | None:
    if not (stream or sys.stdout).isatty():
        return None
    import shutil

    return shutil.get_terminal_size().columns


def _print_rows(
    rows: Sequence[tuple[str, ...]],
    *,
    optional_last: bool = False,
    shrinkable: Sequence[int] = (),
) -> None:
    """Aligned columns, the last one as it is. On a terminal, the ``shrinkable`` columns are
    cut (down to :data:`NARROWEST` each) to fit its width, and then each line; the last
    column, if ``optional_last``, only where it still fits. Piped, nothing is cut, and an
    optional last column is left out (the columns scripts know)."""
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    limit = _terminal_width()
    if optional_last and limit is None:
        rows = [row[:-1] for row in rows]
    elif limit is not None:
        fitted = _fitted(rows, limit, shrinkable)
        if fitted is None and optional_last:
            rows = [row[:-1] for row in rows]
            shrinkable = [i for i in shrinkable if i < len(rows[0])]
            fitted = _fitted(rows, limit, shrinkable)
        rows = fitted or rows
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        line = "  ".join([*cells, row[-1]]).rstrip()
        if limit is not None and len(line) > limit:
            line = line[: max(limit - 1, 0)] + "…"
        print(line)


#: The narrowest a column is cut to, to fit a terminal.
NARROWEST = 20


def _fitted(
    rows: Sequence[tuple[str, ...]], limit: int, shrinkable: Sequence[int]
) -> list[tuple[str, ...]] | None:
    """``rows`` with the ``shrinkable`` columns cut so that every line fits ``limit``;
    ``None`` where even cut to :data:`NARROWEST` they do not."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    over = sum(widths) + 2 * (len(widths) - 1) - limit
    for column in shrinkable:
        if over <= 0:
            break
        by = min(over, widths[column] - NARROWEST)
        if by > 0:
            widths[column] -= by
            over -= by
    if over > 0:
        return None

    def cut(cell: str, width: int) -> str:
        return cell if len(cell) <= width else cell[: width - 1] + "…"

    return [tuple(cut(cell, widths[i]) for i, cell in enumerate(row)) for row in rows]


# ------------------------------------------------------------------------- explain


def _explain(args: Arguments) -> int:
    registry = _registry(args.no_torch)
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
        _print_json(
            {
                **_as_json(info.definition, available, verdict, default=default),
                "alias": info.alias,
                "policy": policy,
                "autoload": _autoload_on(),
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
        where = _shown_path(default.path) + (f":{default.line}" if default.line else "")
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
        out.append(f"  {'disabled:':<13}by {top.source.describe(_here())} (enabled = false)")
        lower = candidates[1:]
    else:
        lower = candidates
    for definition, why in excluded:
        out.append(f"  {'left out:':<13}{why}")
        lower = [d for d in lower if d is not definition]
    for hidden in lower:
        out.append(f"  {'hides:':<13}{hidden.source.kind}: {hidden.source.describe(_here())}")
    print("\n".join(printable(line) for line in out))
    return True


def _autoload_on() -> bool:
    from .._autoload import enabled

    return enabled()


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
    where = d.source.describe(_here())
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


# --------------------------------------------------------------------------- check

#: The sources whose manifests `check` validates; the others only resolve chain members.
_CHECKED: tuple[SourceKind, ...] = ("env", "project")


def _check(args: Arguments) -> int:
    import warnings

    from .._errors import ManifestWarning

    # Every problem is printed below as a line of its own; no need to warn too.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ManifestWarning)
        if args.locked and args.files:
            raise CommandError(
                "--locked compares the backends found here (the project's manifest,"
                " TORCH_BACKENDS_PATH, plugins) with backends.lock: give it no files"
            )
        registry = _check_registry(args.files, args.no_torch)
        if registry is None:
            if args.json:  # a script reading the output gets an answer it can parse
                problem = {"severity": "error", "message": _NO_MANIFEST, "path": None}
                _print_json({"problems": [problem], "backends": 0, "errors": 1})
            return EXIT_PROBLEMS
        with _Waiting("loading PyTorch's backends (--no-torch skips them)", not args.no_torch):
            problems = registry.problems(with_torch=not args.no_torch)
        problems += _replaced_tables(registry)
        matched = None
        if args.locked:
            matched = _drift(_registry(args.no_torch), problems, with_torch=not args.no_torch)
        return _report(
            registry, problems, args.import_targets, not args.no_torch, matched, args.json
        )


def _drift(registry: Registry, problems: list[Problem], *, with_torch: bool) -> str | None:
    """Add each difference from backends.lock to ``problems``, as a problem of the lock
    file; where there is none, say which lock matched."""
    from .._definition import Problem
    from .._errors import LockFileError
    from .._lock import changes, digest, lock_path, read_lock

    path = lock_path(registry)
    try:
        locked = read_lock(path)
    except LockFileError as exc:
        problems.append(Problem(exc.message, path=exc.path, line=exc.line))
        return None
    drift = [
        Problem(f"{change}; run 'torch-backends lock' to accept it", path=path)
        for _key, change in changes(locked, registry.facts(), with_torch=with_torch)
    ]
    problems.extend(drift)
    return None if drift else f"{_shown_path(path)} matched (fingerprint {digest(locked)[:16]})"


def _check_registry(files: Sequence[str], no_torch: bool) -> Registry | None:
    """The registry `check` reads: the given files, or the discovered manifests.

    Entry points and PyTorch's backends are read too: chains name them, and
    PyTorch's names cannot be redefined.
    """
    others: tuple[SourceKind, ...] = ("entry-point",) if no_torch else ("entry-point", "torch")
    if files:
        return Registry(files=files, sources=("env", *others))
    if _no_manifest():
        _error(_NO_MANIFEST + _near_table_here())
        return None
    return Registry(sources=("env", "project", *others))


_NO_MANIFEST = (
    "no manifest found: no backends.toml here or above, no [tool.torch-backends] in"
    " pyproject.toml, and TORCH_BACKENDS_PATH is unset; create one with 'torch-backends init'"
)


def _near_table_here() -> str:
    """Where a pyproject.toml here or above holds what looks like a misspelt table, say so."""
    from .._sources import PROJECT_FILES, near_table

    folder = _here()
    while folder:
        candidate = os.path.join(folder, PROJECT_FILES[1])
        if os.path.isfile(candidate):
            near = near_table(candidate)
            if near is not None:
                return (
                    f" ({_shown_path(candidate)} has {near}: did you mean [tool.torch-backends]?)"
                )
        parent = os.path.dirname(folder)
        folder = None if parent == folder else parent
    return ""


def _no_manifest() -> bool:
    """Whether no manifest is found from here: no project's, none named by the environment."""
    from .._sources import ENV_VAR, project_manifest

    here = _here()
    return (here is None or project_manifest(here) is None) and not os.environ.get(ENV_VAR)


def _report(
    registry: Registry,
    problems: list[Problem],
    import_targets: bool,
    with_torch: bool,
    matched: str | None,
    as_json: bool = False,
) -> int:
    """Print each problem, each note (a chain member not installed here) and, with
    ``--import``, each backend that cannot be used here (a missing requirement, a table
    whose CPU backend is missing), by file and line; then a summary. Only problems fail."""
    index = registry.index(with_torch=with_torch)
    checked = [
        d
        for d in registry.definitions((), with_torch=False, broken=True)
        if d.source.kind in _CHECKED
    ]
    problems = [*problems, *_missing_folders(checked)]
    # A chain none of whose members exists anywhere can never be used.
    dead = {d.name for d in checked if d.members and index.all_members_missing(d)}
    looping = index.chain_problems()  # reported already, among the problems
    usable = [d for d in checked if d.usable and d.name not in dead and d.name not in looping]
    # A note is worth printing and no fault: a chain member not installed here.
    notes = [p for p in problems if p.severity == "note"]
    problems = [p for p in problems if p.severity != "note"]
    unavailable: list[Problem] = []
    if import_targets:
        imports = _Imports(registry, {d.name for d in checked})
        for d in list(usable):
            why = registry.why_unavailable(d)
            if why is not None:
                usable.remove(d)
                said = f"unavailable here ({why}); not imported"
                unavailable.append(d.located(said, severity="note"))
                continue
            found = imports.check(d)
            problems.extend(found)
            if imports.failure(d.name) is not None:
                usable.remove(d)
    here = _here()
    shown = sorted([*problems, *notes, *unavailable], key=lambda p: (p.path or "", p.line or 0))
    errors = [p for p in problems if p.severity == "error"]
    # One line may stand for more problems of its file than are worth printing.
    counted = sum(1 + p.also for p in errors)
    if as_json:
        _print_json(
            {
                "problems": [
                    {
                        "path": p.path,
                        "line": p.line,
                        "key": p.key,
                        "severity": p.severity,
                        "message": p.message,
                    }
                    for p in shown
                ],
                "backends": len(checked),
                "usable": len(usable),
                "unavailable": len(unavailable),
                "errors": counted,
                "warnings": len(problems) - len(errors),
                "notes": len(notes),
                "imported": import_targets,
                "lock": matched,
                "autoload": _autoload_on(),
            }
        )
        return EXIT_PROBLEMS if errors else EXIT_OK
    for line in shown:
        print(printable(line.shown(here)))
    what = "imported and usable" if import_targets else "usable"
    summary = f"{len(usable)} of {len(checked)} backend(s) {what}"
    if unavailable:
        summary += f", {len(unavailable)} unavailable here"
    warnings = len(problems) - len(errors)
    if warnings:
        summary += f", {warnings} warning(s)"
    if notes:
        summary += f", {len(notes)} note(s)"
    if matched:
        summary += f"; {matched}"
    if _autoload_on():  # why these are torch.compile names in processes nobody changed
        from .._autoload import state

        summary += f"; autoload {state()}"
    if errors:
        print(f"{counted} problem(s); {summary}", file=sys.stderr)
        return EXIT_PROBLEMS
    print(f"no problems; {summary}", file=sys.stderr)
    return EXIT_OK


def _replaced_tables(registry: Registry) -> list[Problem]:
    from .._sources import project_manifest, replaced_table

    here = registry.context.cwd
    manifest = project_manifest(here) if here is not None else None
    found = replaced_table(manifest) if manifest is not None else None
    return [] if found is None else [found]


def _missing_folders(checked: Sequence[BackendDefinition]) -> list[Problem]:
    """A python-path folder that does not exist serves nothing: likely a typo (once a file)."""
    from .._definition import Problem
    from .._keys import table_prefix, toml_key

    said: dict[tuple[str, str], Problem] = {}
    for d in checked:
        path = d.source.path
        for written, folder in zip(d.written_path, d.python_path, strict=False):
            if path is not None and (path, folder) not in said and not os.path.isdir(folder):
                said[(path, folder)] = Problem(
                    f"python-path folder {written!r} does not exist ({folder}); a target in"
                    " it would not be found",
                    path=path,
                    line=d.line_of("python-path"),
                    key=toml_key((*table_prefix(path), "python-path")),
                    severity="warning",
                )
    return list(said.values())


class _Imports:
    """What ``check --import`` imports, each backend once: a target itself; a chain's members
    (usable where one is); a table's (usable where the one it gives the CPU is)."""

    def __init__(self, registry: Registry, declared: set[str]) -> None:
        self.registry = registry
        self.index = registry.index()
        #: The backends the checked manifests declare: each is reported at its own table.
        self.declared = declared
        #: Why each backend looked at cannot be used here (``None``: it can), and whether
        #: that is a failure (it was imported and broke) or unavailability (not imported).
        self.found: dict[str, tuple[str, bool] | None] = {}

    def failure(self, name: str) -> str | None:
        said = self.found.get(name)
        return None if said is None else said[0]

    def check(self, d: BackendDefinition) -> list[Problem]:
        """Import what ``d`` may run; the problems found, where they are written."""
        if not d.members:
            problem = self._load(d)
            self.found[d.name] = None if problem is None else (problem.message, True)
            return [] if problem is None else [problem]
        self._judge(d.name)
        problems = []
        what = "chain" if d.by_device is None else "by-device"
        fatal = self.failure(d.name) is not None
        for member in d.members:
            said = self.found.get(member)
            resolved = self.index.get(member)
            if said is None or not said[1] or (resolved and resolved.name in self.declared):
                continue  # it loads; or is unavailable here (noted); or has its own report
            severity: Severity = "error" if fatal else "warning"
            message = f"{what} member {member!r}: {said[0]}"
            if not fatal:
                message += f"; {d.name!r} " + (
                    "uses the next member" if d.by_device is None else "fails on that device"
                )
            problems.append(d.located(message, what, severity=severity))
        return problems

    def _judge(self, name: str) -> tuple[str, bool] | None:
        if name in self.found:
            return self.found[name]
        self.found[name] = None  # a loop is reported already: do not walk it again
        definition = self.index.get(name)
        if definition is None:
            return None  # unknown here (noted), or one of PyTorch's not read (--no-torch)
        why = self.registry.why_unavailable(definition)
        result: tuple[str, bool] | None
        if why is not None:
            result = (f"unavailable here ({why})", False)
        elif definition.members:
            result = self._judge_members(definition)
        else:
            problem = self._load(definition)
            result = None if problem is None else (problem.message, True)
        self.found[name] = result
        return result

    def _judge_members(self, definition: BackendDefinition) -> tuple[str, bool] | None:
        judged = {m: self._judge(m) for m in definition.members}
        if definition.by_device is not None:
            table = dict(definition.by_device)
            cpu = table.get("cpu", table.get("other"))
            said = judged.get(cpu) if cpu is not None else ("it gives the CPU no backend", True)
            return None if said is None else (f"for the CPU, {cpu}: {said[0]}", said[1])
        if any(said is None for said in judged.values()):
            return None
        reasons = "; ".join(f"{m}: {said[0]}" for m, said in judged.items() if said)
        return f"no member can be used ({reasons})", any(s[1] for s in judged.values() if s)

    def _load(self, d: BackendDefinition) -> Problem | None:
        from .._loader import cannot_compile

        try:
            # What a backend prints as it is imported must not mix with this report.
            with contextlib.redirect_stdout(sys.stderr):
                fn = self.registry.lookup_backend(d.name)
        except BackendRegistryError as exc:
            return _load_problem(d, exc)
        why = cannot_compile(fn)
        if why is None:
            return None
        message = f"backend {d.name!r} (target {d.target!r}) {why}"
        return Problem(message) if d.source.path is None else d.located(message, "target")


def _load_problem(d: BackendDefinition, exc: BackendRegistryError) -> Problem:
    """A failed import as a problem at the backend's ``target``, like the manifest's own."""
    from .._errors import BackendLoadError, ManifestError

    if isinstance(exc, ManifestError):  # where it is written: an option's own line
        return exc.problem
    if isinstance(exc, BackendLoadError):
        what = f" (target {exc.target!r})" if exc.target else ""
        message = f"cannot load backend {d.name!r}{what}: {exc.reason}"
    else:
        message = str(exc)
    if d.source.path is None:
        from .._definition import Problem

        return Problem(message)
    return d.located(message, "target")


# -------------------------------------------------------------------------- doctor


def _doctor(args: Arguments) -> int:
    from .._doctor.options import ModelError, Options
    from .._doctor.parent import run, start
    from .._sources.pytorch import dynamo_imported, torch_available

    if not torch_available():
        raise CommandError("doctor needs PyTorch to compile with: pip install torch")
    registry = _registry()
    options = Options(**{f: getattr(args, f) for f in Options._fields}).checked()
    try:
        # The probes' server imports PyTorch meanwhile, as this process does to list every
        # backend or resolve a name no manifest declares.
        server = start(registry, options)
    except ModelError as exc:
        _error(str(exc))
        return EXIT_USAGE
    with server:
        with _Waiting("importing PyTorch", not dynamo_imported()):
            names = args.names or registry.list_backends(() if args.all else DEFAULT_EXCLUDE_TAGS)
            for name in names:
                registry.backend_info(name)  # an unknown name fails here, as explain says it
        progress = _Progress(sys.stderr.isatty(), len(names))
        try:
            with _terminated_as_exit():
                verdicts = run(registry, names, options, progress.update, server)
        except ModelError as exc:
            progress.done()
            _error(str(exc))
            return EXIT_USAGE
    progress.done()
    if args.json:
        import json

        json.dump([v.as_json() for v in verdicts], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_verdicts(verdicts, args.bench, sys.stdout.isatty())
    named = set(args.names)
    failed = [v for v in verdicts if not v.ok and _fails(registry, v, named)]
    return EXIT_PROBLEMS if failed else EXIT_OK


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, ``kill``) as an exit, so that doctor kills its probes,
    which run in process groups of their own, instead of leaving them running."""
    import signal

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: the caller handles signals
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fails(registry: Registry, verdict: Verdict, named: set[str]) -> bool:
    """Whether a verdict fails the run: any failure; ``unavailable`` only for a name asked
    for or a backend a manifest declares (PyTorch's GPU backends are not there on a CPU)."""
    if verdict.status != "unavailable" or verdict.name in named:
        return True
    return registry.backend_info(verdict.name).source.kind in ("env", "project")


class _Progress:
    """One line on a terminal's stderr: how many are done, and each probe running (its level
    and time), cut to the terminal's width."""

    def __init__(self, shown: bool, total: int) -> None:
        import threading

        self.shown = shown
        self.total = total
        self.lock = threading.Lock()
        self.running: dict[str, tuple[int, float]] = {}
        self.finished = 0

    def update(self, name: str, level: int, seconds: float, done: bool) -> None:
        if not self.shown:
            return
        from .._doctor.verdicts import level_name

        with self.lock:
            if done:
                self.running.pop(name, None)
                self.finished += 1
            else:
                self.running[name] = (level, seconds)
            what = ", ".join(
                f"{n} {level_name(lv)} {s:.0f}s" for n, (lv, s) in self.running.items()
            )
            line = f"{PROG}: {self.finished}/{self.total} done; probing {what}"
            width = _terminal_width(sys.stderr) or 80
            sys.stderr.write("\r\033[K" + printable(line)[: width - 1])
            sys.stderr.flush()

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _print_verdicts(verdicts: Sequence[Verdict], bench: bool, terminal: bool) -> None:
    """A table sorted by result and speed; with ``bench``, a bar for each speed-up, the
    spread of the timed rounds, and a rank where the speeds can be told apart."""
    header = ["NAME", "STATUS", "LEVEL", "SECONDS"]
    if bench:
        header += ["COMPILE", "PER CALL", "SPEED-UP", "SPREAD", "RANK"]
    header.append("REASON")
    table = [tuple(header)]
    fastest = max((v.speedup or 0.0 for v in verdicts), default=0.0)
    ranks = _ranks(verdicts) if bench else {}
    for v in verdicts:
        status = v.status + (" (cached)" if v.cached else "")
        name = v.name + (f" -> {v.member}" if v.member else "")
        row = [name, status, v.level_name, f"{v.seconds:.1f}"]
        if bench:
            row += [
                _duration(v.compile_seconds),
                _duration(v.per_call_seconds),
                _speedup(v.speedup, fastest, terminal),
                "" if v.spread is None else f"±{v.spread * 50:.0f}%",
                ranks.get(v.name, ""),
            ]
        row.append(v.reason)
        table.append(tuple(row))
    _print_rows(table)
    wide = [v.name for v in verdicts if v.spread is not None and v.spread > WIDE]
    if wide:
        print(
            f"(the timed rounds of {', '.join(wide)} spread too wide to rank: the machine"
            " was busy; run again with nothing else running)"
        )


#: A spread (the middle half of the timed rounds over their median) past which a speed
#: is not ranked.
WIDE = 0.5


def _ranks(verdicts: Sequence[Verdict]) -> dict[str, str]:
    """Each timed backend's rank by speed-up, fastest first. Backends whose speeds lie
    within each other's spread share a rank; one spread too wide is not ranked."""
    timed = sorted(
        (v for v in verdicts if v.speedup and v.spread is not None and v.spread <= WIDE),
        key=lambda v: -(v.speedup or 0.0),
    )
    ranks: dict[str, str] = {}
    rank, floor = 0, float("inf")
    for number, v in enumerate(timed, start=1):
        speedup, half = v.speedup or 0.0, (v.spread or 0.0) / 2
        if speedup * (1 + half) < floor:  # clearly slower than the fastest of the rank above
            rank, floor = number, speedup * (1 - half)
        ranks[v.name] = str(rank)
    return ranks


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def _speedup(speedup: float | None, fastest: float, terminal: bool) -> str:
    if speedup is None:
        return ""
    text = f"{speedup:.2f}x"
    if terminal and fastest > 0:
        text = f"{text:>6} " + "█" * max(1, round(20 * speedup / fastest))
    return text


# ---------------------------------------------------------------------------- lock


def _lock(args: Arguments) -> int:
    from .._lock import digest, summary, write_lock

    if _no_manifest():  # a lock of PyTorch's backends alone pins nobody's
        raise CommandError(_NO_MANIFEST)
    registry = _registry()
    with _Waiting("loading PyTorch's backends", True):
        errors = [p for p in registry.problems() if p.severity == "error"]
        if errors:  # a lock of what is broken pins it broken
            raise CommandError(
                f"not written: the manifests have {len(errors)} error(s), the first"
                f" {errors[0].shown(_here())}; fix them ('torch-backends check' shows them)"
            )
        try:
            path = write_lock(registry, args.output)
        except OSError as exc:
            raise CommandError(f"cannot write {args.output or 'the lock'}: {exc.strerror}") from exc
        facts = registry.facts()
    shown = _shown_path(path)
    print(f"wrote {shown}: {summary(facts)}; fingerprint {digest(facts)[:16]}; commit it")
    return EXIT_OK


def _shown_path(path: str) -> str:
    from .._definition import shown_path

    here = _here()
    return path if here is None else shown_path(path, here)


# ------------------------------------------------------------------- schema, init


def schema_text() -> str:
    """The JSON Schema as written to ``schemas/backends.schema.json``."""
    import json

    from .._sources.schema import json_schema

    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def _schema(args: Arguments) -> int:
    sys.stdout.write(schema_text())
    return EXIT_OK


def pyproject_starter() -> str:
    """The starter as a ``[tool.torch-backends]`` table, for ``init --pyproject``."""
    body = STARTER.split("schema-version = 1\n", 1)[1]
    body = body.replace("[backends.", "[tool.torch-backends.backends.")
    return (
        '# Backends for torch.compile(model, backend="NAME"), read by torch-backend-registry.\n'
        "# Check them, and import what they name, with `torch-backends check --import`;\n"
        "# see them with `torch-backends list`.\n"
        "[tool.torch-backends]\nschema-version = 1\n" + body
    )


def _init(args: Arguments) -> int:
    here = os.getcwd()
    from .._sources import PROJECT_FILES

    backends, pyproject = (os.path.join(here, name) for name in PROJECT_FILES)
    if os.path.lexists(backends):
        raise CommandError(
            f"{PROJECT_FILES[0]}: already exists; not overwritten (edit it, or remove it first)"
        )
    declares = os.path.isfile(pyproject) and _declares_table(pyproject)
    if declares:
        # A backends.toml would take precedence and silently replace that table.
        raise CommandError(
            f"{PROJECT_FILES[1]}: already has a [tool.torch-backends] table: edit it there"
            " (a backends.toml here would replace it)"
        )
    if args.pyproject:
        return _init_pyproject(pyproject)
    with open(backends, "x", encoding="utf-8") as handle:
        handle.write(STARTER)
    print(f"wrote {PROJECT_FILES[0]}; check it with 'torch-backends check --import'")
    if os.path.isfile(pyproject):
        print("(to keep the backends in pyproject.toml instead: remove it, then run"
              " 'torch-backends init --pyproject')")  # fmt: skip
    return EXIT_OK


def _declares_table(pyproject: str) -> bool:
    from .._sources import project_manifest

    return project_manifest(os.path.dirname(pyproject)) == pyproject


def _init_pyproject(pyproject: str) -> int:
    """Append the starter table to pyproject.toml, if the result is still valid TOML."""
    from .._sources.files import NO_SUCH_FILE, parse_toml, read_text

    if not os.path.isfile(pyproject):
        raise CommandError(
            f"pyproject.toml: {NO_SUCH_FILE}; run 'torch-backends init' for a backends.toml instead"
        )
    text = read_text(pyproject)
    separator = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    addition = separator + pyproject_starter()
    parse_toml(pyproject, text + addition)  # refuses before writing if it would not parse
    with open(pyproject, "a", encoding="utf-8") as handle:
        handle.write(addition)
    print(
        "added [tool.torch-backends] to pyproject.toml;"
        " check it with 'torch-backends check --import'"
    )
    return EXIT_OK


#: What each command runs; the grammar (``_arguments``) names the command.
_HANDLERS = {
    "list": _list,
    "explain": _explain,
    "check": _check,
    "doctor": _doctor,
    "lock": _lock,
    "schema": _schema,
    "init": _init,
}
