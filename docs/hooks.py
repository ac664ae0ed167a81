"""MkDocs hooks: the reference pages filled in from what the code holds, so they cannot drift.

A page asks for a generated part with a marker on a line of its own:

- ``<!-- generate: manifest -->``: every manifest key, from ``schemas/backends.schema.json``;
- ``<!-- generate: cli -->``: every command and option, from the argparse parser that
  ``torch-backends`` itself parses with (``build_parser()``);
- ``<!-- generate: layers -->``: the package's layers, from the import-linter contract in
  ``pyproject.toml``, each module with the first line of its docstring.

A marker this file does not know fails the build. The functions below import nothing of
MkDocs, so that the test suite can call them where MkDocs is not installed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "backends.schema.json"
PACKAGE = ROOT / "src" / "torch_backend_registry"

MARKER = re.compile(r"^<!-- generate: ([a-z-]+) -->$", re.MULTILINE)

# What a pattern of the schema asks for, in words; a pattern not listed is shown as it is.
_PATTERNS = {
    "^[A-Za-z_][A-Za-z0-9_-]*$": "a name: letters, digits, `_` and `-`, not starting with a digit",
    "^[A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*:"
    "[A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*$": "`module.path:attribute.path`",
    "^[A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*$": "a dotted module name",
    "^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$": "a distribution name, as pip installs it",
    "^[^\\x00]+$": "a folder path",
    "^[a-z][a-z0-9_]*$": "a device type as `torch.device(...).type` names it, or `other`",
}


# ------------------------------------------------------------------ the manifest keys


def manifest_reference(schema: dict[str, Any] | None = None) -> str:
    """Every key of a manifest, as Markdown: the top level, a backend's table, ``[plugins]``."""
    if schema is None:
        schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    definitions = schema["$defs"]
    top = {k: v for k, v in schema["properties"].items() if k not in ("backends", "plugins")}
    backends = schema["properties"]["backends"]
    entry = definitions["BackendEntry"]
    names = next(iter(backends["patternProperties"]))
    parts = [
        "## Top level",
        "",
        _first_line(schema["description"]),
        "",
        _key_table(top, "", schema.get("required", ())),
        "",
        "## `[backends.NAME]`",
        "",
        f"{_first_line(backends['description'])} `NAME` is {_pattern(names)}.",
        "",
        _key_table(entry["properties"], "backends-", entry.get("required", ())),
        "",
        _exclusive(entry),
        "",
        "## A `by-device` entry's table",
        "",
        _first_line(definitions["DeviceEntry"]["description"]),
        "",
        _key_table(definitions["DeviceEntry"]["properties"], "by-device-", ("backend",)),
        "",
        "## `[plugins]`",
        "",
        _first_line(definitions["Plugins"]["description"]),
        "",
        _key_table(definitions["Plugins"]["properties"], "plugins-", ()),
        "",
        "Unknown keys are errors everywhere, with the closest known key suggested.",
    ]
    return "\n".join(parts)


def _first_line(text: str) -> str:
    return text.replace("``", "`")


def _key_table(properties: dict[str, Any], anchor: str, required: Any) -> str:
    rows = ["| key | value | default | what it does |", "| --- | --- | --- | --- |"]
    for key, spec in properties.items():
        default = f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        if key in required:
            default = "required"
        description = _first_line(spec.get("description", ""))
        rows.append(
            f'| <span id="{anchor}{key}"></span>`{key}` | {_value(spec)} | {default}'
            f" | {description} |"
        )
    return "\n".join(rows)


def _value(spec: dict[str, Any]) -> str:
    """What a key takes, in words."""
    kind = str(spec.get("type"))
    if "enum" in spec:
        return "one of " + ", ".join(f'`"{value}"`' for value in spec["enum"])
    if "$ref" in spec:
        return "a table (below)"
    if kind == "string":
        return f"string: {_pattern(spec['pattern'])}" if "pattern" in spec else "string"
    if kind == "array":
        items = spec.get("items", {})
        what = _pattern(items["pattern"]) if "pattern" in items else "string"
        least = spec.get("minItems")
        return "array of " + (f"at least {least}, each " if least else "") + what
    if kind == "object":
        if "patternProperties" in spec:
            ((key, value),) = spec["patternProperties"].items()
            if "oneOf" in value:  # a by-device entry: a name, or a table of it and settings
                kinds = [
                    _pattern(v["pattern"]) if "pattern" in v else "a table (below)"
                    for v in value["oneOf"]
                ]
                return f"table: {_pattern(key)} to {' or '.join(kinds)}"
            return f"table: {_pattern(key)} to {_pattern(value['pattern'])}"
        return "table of any TOML values"
    if kind in ("integer", "number"):
        bounds = []
        if "minimum" in spec:
            bounds.append(f">= {spec['minimum']}")
        if "maximum" in spec:
            bounds.append(f"<= {spec['maximum']}")
        return kind + (f" ({', '.join(bounds)})" if bounds else "")
    if kind == "boolean":
        return "`true` or `false`"
    return kind


def _pattern(pattern: str) -> str:
    return _PATTERNS.get(pattern, f"matching `{pattern}`")


def _exclusive(entry: dict[str, Any]) -> str:
    """The schema's rules on which keys a backend's table needs, and which exclude another."""
    needs = []
    for option in entry["anyOf"]:
        if option.get("properties"):  # {"enabled": {"const": false}}
            ((key, value),) = option["properties"].items()
            needs.append(f"`{key} = {json.dumps(value['const'])}`")
        else:
            needs.extend(f"`{key}`" for key in option["required"])
    pairs = [" and ".join(f"`{k}`" for k in rule["required"]) for rule in entry["not"]["anyOf"]]
    return (
        f"A backend's table needs one of {', '.join(needs[:-1])} or {needs[-1]}."
        f" These go not together: {'; '.join(pairs)}."
    )


# ---------------------------------------------------------------- the command line


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every command of ``torch-backends`` with its usage and options, as Markdown."""
    if parser is None:
        from torch_backend_registry._cli.arguments import build_parser

        parser = build_parser()
    with _columns(100):
        parts = [
            "```text",
            _usage(parser),
            "```",
            "",
            parser.description or "",
            "",
            _option_table(parser),
            "",
            "```text",
            (parser.epilog or "").strip(),
            "```",
        ]
        for name, command in _commands(parser).items():
            parts += [
                "",
                f"## `{parser.prog} {name}`",
                "",
                f"{_sentence(command.description or '')}",
                "",
                "```text",
                _usage(command),
                "```",
                "",
                _option_table(command),
            ]
    return "\n".join(parts)


def _usage(parser: argparse.ArgumentParser) -> str:
    """argparse's usage without its ``usage: `` prefix, the lines below it moved back alike."""
    prefix = "usage: "
    first, *rest = parser.format_usage().strip().splitlines()
    return "\n".join([first.removeprefix(prefix), *(line[len(prefix) :] for line in rest)])


@contextlib.contextmanager
def _columns(width: int) -> Any:
    """argparse wraps usage to the terminal's width: the same width on every machine."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _option_table(parser: argparse.ArgumentParser) -> str:
    rows = ["| argument | what it does |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        rows.append(f"| {_spelling(action)} | {_help(action)} |")
    return "\n".join(rows) if len(rows) > 2 else "No options but `--help` and `--debug`."


def _spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        metavar = action.metavar or action.dest
        repeat = " ..." if action.nargs in ("*", "+") else ""
        return f"`{metavar}{repeat}`"
    takes = action.nargs != 0
    if action.choices is not None:
        value = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        value = str(action.metavar or action.dest.upper())
    return ", ".join(
        f"`{option} {value}`" if takes else f"`{option}`" for option in action.option_strings
    )


def _help(action: argparse.Action) -> str:
    text = (action.help or "").replace("%(default)s", str(action.default))
    if action.help == argparse.SUPPRESS:
        return ""
    text = _sentence(text) if text else ""
    if action.nargs == "*" and action.option_strings == []:
        text += " Any number, or none."
    if action.option_strings and isinstance(action, argparse._AppendAction):
        text += " May be given more than once."
    return text.replace("|", "\\|")


# ------------------------------------------------------------------------ the layers


def layers_reference(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The layers of the package, top first, as import-linter checks them: a table of each
    layer's modules, each with the first line of its docstring (its one job)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = next(c for c in contracts if c["type"] == "layers")
    rows = ["| layer | module | its job |", "| --- | --- | --- |"]
    for number, layer in enumerate(layered["layers"], start=1):
        for index, name in enumerate(part.strip() for part in layer.split(":")):
            shown = str(number) if index == 0 else ""
            rows.append(f"| {shown} | `{_module_path(name)}` | {_job(name)} |")
    return "\n".join(rows)


def _module_path(name: str) -> str:
    return f"{name}/" if (PACKAGE / name).is_dir() else f"{name}.py"


def _job(name: str) -> str:
    """The first line of a module's docstring, read without importing it."""
    path = PACKAGE / name / "__init__.py" if (PACKAGE / name).is_dir() else PACKAGE / f"{name}.py"
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.split("\n\n")[0].replace("\n", " ").replace("``", "`").replace("|", "\\|")


# ------------------------------------------------------------------ the MkDocs hooks

GENERATORS: dict[str, Callable[[], str]] = {
    "manifest": manifest_reference,
    "cli": cli_reference,
    "layers": layers_reference,
}


def fill(markdown: str) -> str:
    """``markdown`` with each marker replaced by what it asks for; unknown markers raise."""

    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            known = ", ".join(sorted(GENERATORS))
            raise ValueError(f"unknown marker <!-- generate: {name} --> (known: {known})")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)


# Sphinx roles in docstrings (":class:`X`"), which Markdown shows as they are.
_ROLE = re.compile(r":(?:class|func|data|meth|attr|exc|mod):(?=<code>)")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return fill(markdown)


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub("", html)
