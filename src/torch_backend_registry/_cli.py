"""The ``torch-backends`` command: list, explain, check, schema, init."""

from __future__ import annotations

import argparse
import os
import sys

from ._errors import BackendRegistryError, ManifestError
from ._registry import DEFAULT_EXCLUDE_TAGS, Registry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ._definition import BackendDefinition, Source

PROG = "torch-backends"
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

STARTER = """\
# Backends for torch.compile(model, backend="NAME"), read by torch-backend-registry.
# Check this file with `torch-backends check`; see every backend with `torch-backends list`.
# For validation in your editor (Taplo, Even Better TOML):
#   torch-backends schema > backends.schema.json
# and then add this line at the very top:  #:schema ./backends.schema.json

schema-version = 1

# The backend torch.compile uses when given none, once install() has run.
# default = "my_backend"

# Folders, relative to this file, put on sys.path only while importing the targets below.
# python-path = ["src"]

[backends.my_backend]
# Required (or `chain`): the compiler function, "module.path:attribute". It is
# imported on first use only; it takes (graph_module, example_inputs).
target = "my_package.compilers:my_compiler"
# Optional: labels; list_backends() hides "debug" and "experimental" by default.
tags = ["experimental"]
# Optional: one line shown by `torch-backends list`.
description = "My compiler"
# Optional: more names for the same backend.
# aliases = ["mine"]
# Optional: modules that must be importable (looked for, never imported).
# requires = ["tensorrt"]
# Optional: keyword arguments passed to the target on every call.
# options = { fp16 = true }
# Optional: false hides this name, also from entry points and PyTorch.
# enabled = true

# A fallback chain: the first member whose requirements are met and that
# compiles without raising is used.
# [backends.portable]
# chain = ["tensorrt", "inductor", "eager"]
"""


class _VersionAction(argparse.Action):
    # importlib.metadata is only worth importing when the version is asked for.
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from importlib.metadata import version

        print(f"{PROG} {version('torch-backend-registry')}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Declare, list and check torch.compile backends.",
        epilog=f"Extra manifests: set TORCH_BACKENDS_PATH to files or folders ({os.pathsep!r}"
        " separated). Run 'torch-backends COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks of errors (for bug reports)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    lister = commands.add_parser("list", help="list backends (NAME, TAGS, SOURCE, TARGET)")
    lister.add_argument("--all", action="store_true", help="include debug and experimental")
    lister.add_argument(
        "--tag", action="append", default=[], metavar="T", help="only backends tagged T"
    )
    lister.add_argument(
        "--exclude-tag", action="append", default=[], metavar="T", help="leave out tag T"
    )
    lister.add_argument(
        "--available", action="store_true", help="only backends whose requirements are met"
    )
    lister.add_argument("--json", action="store_true", help="print a JSON array")
    lister.add_argument(
        "--no-torch", action="store_true", help="leave out PyTorch's own backends (fast)"
    )

    explain = commands.add_parser("explain", help="where a backend is defined and what it shadows")
    explain.add_argument("name", metavar="NAME")
    explain.add_argument("--no-torch", action="store_true", help="leave out PyTorch's backends")

    check = commands.add_parser("check", help="validate manifests (the discovered or the given)")
    check.add_argument("files", nargs="*", metavar="FILE")
    check.add_argument(
        "--import",
        dest="import_targets",
        action="store_true",
        help="also import every target and check that it is callable",
    )

    commands.add_parser("schema", help="print the JSON Schema of a manifest")
    commands.add_parser("init", help="write a starter backends.toml here (never overwrites)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        code, error = _run(args)
    for warning in caught:
        message = str(warning.message)
        # The error below says the same thing; one line is enough.
        if error is None or not message.startswith(error):
            print(f"{PROG}: warning: {_printable(message)}", file=sys.stderr)
    if error is not None:
        _error(error)
    return code


def _run(args: argparse.Namespace) -> tuple[int, str | None]:
    handler = {
        "list": _list,
        "explain": _explain,
        "check": _check,
        "schema": _schema,
        "init": _init,
    }[args.command]
    try:
        return handler(args), None
    except BackendRegistryError as exc:
        if args.debug:
            raise
        return EXIT_PROBLEMS, str(exc)
    except BrokenPipeError:
        # `torch-backends list | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK, None
    except KeyboardInterrupt:
        return 130, None
    except Exception as exc:
        if args.debug:
            raise
        return EXIT_PROBLEMS, f"{type(exc).__name__}: {exc} (run with --debug for a traceback)"


def _error(message: str) -> None:
    print(f"{PROG}: error: {_printable(message)}", file=sys.stderr)


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on escaped: one line, no control sequences.

    A manifest may hold any character in a description or a file name; printed raw,
    an escape sequence or a bidi override would be obeyed by the terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _registry(no_torch: bool = False) -> Registry:
    from ._sources import SOURCE_KINDS

    kinds = [kind for kind in SOURCE_KINDS if not (no_torch and kind == "torch")]
    return Registry(sources=kinds)


# ---------------------------------------------------------------------------- list


def _availability(registry: Registry, definition: BackendDefinition) -> str | None:
    """Why ``definition`` cannot be used here, or ``None`` when it can, as far as can be
    told without importing: its ``requires``, and for a chain, a member that can be used.
    """
    return _why_unavailable(registry, definition, frozenset())


def _why_unavailable(
    registry: Registry, definition: BackendDefinition, seen: frozenset[str]
) -> str | None:
    from ._loader import missing_requirements

    missing = missing_requirements(definition)
    if missing:
        return "missing " + ", ".join(missing)
    if definition.chain is None:
        return None
    seen = seen | {definition.name}
    for member in definition.chain:
        if member in seen:
            continue
        try:
            info = registry.backend_info(member)
        except BackendRegistryError:
            continue
        if _why_unavailable(registry, info, seen) is None:
            return None
    return "no member of the chain can be used"


def _list(args: argparse.Namespace) -> int:
    registry = _registry(args.no_torch)
    if args.all or args.tag:
        exclude: list[str] = list(args.exclude_tag)
    else:
        exclude = [*DEFAULT_EXCLUDE_TAGS, *args.exclude_tag]
    rows = registry.definitions(exclude)
    if args.tag:
        wanted = set(args.tag)
        rows = [d for d in rows if wanted.issubset(d.tags)]
    available = {d.name: _availability(registry, d) is None for d in rows}
    if args.available:
        rows = [d for d in rows if available[d.name]]
    if args.json:
        import json

        json.dump([_as_json(d, available[d.name]) for d in rows], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    table = [("NAME", "TAGS", "SOURCE", "TARGET")]
    for d in rows:
        table.append((d.name, ",".join(d.tags), _short_source(d.source), _what(d)))
    _print_table(table)
    return EXIT_OK


def _as_json(d: BackendDefinition, available: bool) -> dict[str, Any]:
    s = d.source
    return {
        "name": d.name,
        "target": d.target,
        "chain": list(d.chain) if d.chain is not None else None,
        "tags": list(d.tags),
        "description": d.description,
        "aliases": list(d.aliases),
        "source": {
            "kind": s.kind,
            "path": s.path,
            "line": s.line,
            "distribution": s.distribution,
            "version": s.version,
        },
        "available": available,
    }


def _relative(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive on Windows
        return path
    return path if relative.startswith("..") else relative


def _short_source(source: Source) -> str:
    if source.path is not None:
        where = _relative(source.path)
        where = where if source.line is None else f"{where}:{source.line}"
        return f"{source.kind} {where}"
    if source.distribution is not None:
        return f"{source.kind} {source.distribution} {source.version or ''}".rstrip()
    if source.module is not None:
        return f"{source.kind} {source.module}"
    return source.kind


def _what(d: BackendDefinition) -> str:
    if d.chain is not None:
        return "chain: " + " -> ".join(d.chain)
    return d.target or ""


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    rows = [tuple(_printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    limit = None
    if sys.stdout.isatty():
        import shutil

        limit = shutil.get_terminal_size().columns
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        line = "  ".join([*cells, row[-1]]).rstrip()
        if limit is not None and len(line) > limit:
            line = line[: max(limit - 1, 0)] + "…"
        print(line)


# ------------------------------------------------------------------------- explain


def _explain(args: argparse.Namespace) -> int:
    registry = _registry(args.no_torch)
    info = registry.backend_info(args.name)
    out: list[str] = []
    heading = info.name if info.name == args.name else f"{args.name} (alias of {info.name})"
    heading = _printable(heading)
    out.append(heading)
    out.extend(_describe(registry, info))
    if info.shadowed:
        out.append("shadows (lower precedence, not used):")
        for lower in info.shadowed:
            out.append(f"  {lower.name}")
            out.extend("  " + line for line in _describe(registry, lower))
    else:
        out.append("shadows nothing")
    print("\n".join(out))
    return EXIT_OK


def _describe(registry: Registry, d: BackendDefinition) -> list[str]:
    from ._loader import missing_requirements

    missing = missing_requirements(d)
    source = d.source
    where = source.describe()
    if source.path is not None:
        where = _relative(source.path) + ("" if source.line is None else f":{source.line}")
    fields: list[tuple[str, str]] = [("source", f"{source.kind}: {where}")]
    if not d.enabled:
        fields.append(("enabled", "false (hides this name)"))
    if d._error is not None:
        fields.append(("error", d._error.message))
    if d.target is not None:
        fields.append(("target", d.target))
    if d.chain is not None:
        fields.append(("chain", " -> ".join(d.chain)))
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
    if d.enabled and d._error is None:
        why = _availability(registry, d)
        fields.append(("available", "yes" if why is None else f"no: {why}"))
    return [f"  {key + ':':<13}{_printable(value)}" for key, value in fields]


# --------------------------------------------------------------------------- check


def _display(problem: BackendRegistryError) -> str:
    """A problem as ``PATH:LINE: ...`` with PATH relative to here when below it."""
    if isinstance(problem, ManifestError) and problem.path is not None:
        shown = _relative(problem.path)
        problem = ManifestError(problem.message, path=shown, line=problem.line, key=problem.key)
    return _printable(str(problem))


def _check(args: argparse.Namespace) -> int:
    import warnings

    from ._errors import ManifestWarning

    # Every problem is printed below as a line of its own; no need to warn too.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ManifestWarning)
        return _check_quietly(args)


def _check_quietly(args: argparse.Namespace) -> int:
    from ._sources import ENV_VAR

    if args.files:
        missing = [f for f in args.files if not os.path.exists(f)]
        for path in missing:
            print(_printable(f"{path}: no such file"))
        # The given files, read as the environment source reads its entries.
        registry = Registry(sources=("env",))
        registry._env_files = tuple(f for f in args.files if f not in missing)
        problems: list[BackendRegistryError] = list(registry.problems(with_torch=False))
        count = len(missing) + len(problems)
    else:
        registry = Registry(sources=("env", "project"))
        problems = list(registry.problems(with_torch=False))
        count = len(problems)
        if not registry.definitions(()) and not problems:
            from ._sources import project_manifest

            if project_manifest(os.getcwd()) is None and not os.environ.get(ENV_VAR):
                _error(
                    "no manifest found: no backends.toml here or above, no"
                    f" [tool.torch-backends] in pyproject.toml, and {ENV_VAR} is unset;"
                    " create one with 'torch-backends init'"
                )
                return EXIT_PROBLEMS
    for problem in problems:
        print(_display(problem))
    backends = registry.definitions(())
    if args.import_targets:
        for d in backends:
            if d.target is None:
                continue
            try:
                registry.lookup_backend(d.name)
            except BackendRegistryError as exc:
                count += 1
                print(_display(exc))
    checked = f"{len(backends)} backend(s)" + (" imported" if args.import_targets else "")
    if count:
        print(f"{count} problem(s); {checked} usable", file=sys.stderr)
        return EXIT_PROBLEMS
    print(f"no problems; {checked}", file=sys.stderr)
    return EXIT_OK


# ------------------------------------------------------------------- schema, init


def schema_text() -> str:
    """The JSON Schema as written to ``schemas/backends.schema.json``."""
    import json

    from ._manifest import json_schema

    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def _schema(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text())
    return EXIT_OK


def _init(args: argparse.Namespace) -> int:
    path = os.path.join(os.getcwd(), "backends.toml")
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(STARTER)
    except FileExistsError:
        raise ManifestError(
            "already exists; not overwritten (edit it, or remove it first)", path="backends.toml"
        ) from None
    print(f"wrote {_relative(path)}; check it with 'torch-backends check'")
    return EXIT_OK
