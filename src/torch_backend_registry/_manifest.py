"""The manifest model (schema version 1): reading, validating, locating errors.

pydantic and tomli are imported here only, and this module is imported only
when a manifest is first read, so ``import torch_backend_registry`` stays cheap.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Iterator
from typing import Annotated, Any

import tomli
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from ._definition import BackendDefinition, Source
from ._errors import ManifestError

SCHEMA_VERSION = 1
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*$"
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
TARGET_PATTERN = rf"^{_DOTTED}:{_DOTTED}$"
MODULE_PATTERN = rf"^{_DOTTED}$"

#: The table that holds the manifest inside ``pyproject.toml``.
PYPROJECT_TABLE = ("tool", "torch-backends")

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
ModuleName = Annotated[str, Field(pattern=MODULE_PATTERN)]
Target = Annotated[str, Field(pattern=TARGET_PATTERN)]

# What a user should have written, keyed by the pattern pydantic reports.
_PATTERN_HINTS = {
    NAME_PATTERN: "a name of letters, digits, '_' and '-', starting with a letter or '_'"
    " (e.g. 'my_backend')",
    TARGET_PATTERN: "a target 'module.path:attribute.path' (e.g. 'my_pkg.compilers:compile')",
    MODULE_PATTERN: "a dotted module name (e.g. 'tensorrt' or 'torch_tensorrt.dynamo')",
}
_TYPE_WORDS = {
    "string_type": "a string",
    "bool_type": "true or false",
    "int_type": "an integer",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class BackendEntry(BaseModel):
    """One ``[backends.NAME]`` table."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=_kebab,
        title="Backend",
        # What _target_or_chain checks, said so editors can check it too.
        json_schema_extra={
            "anyOf": [
                {"required": ["target"]},
                {"required": ["chain"]},
                {"required": ["enabled"], "properties": {"enabled": {"const": False}}},
            ],
            "not": {
                "anyOf": [{"required": ["target", "chain"]}, {"required": ["chain", "options"]}]
            },
        },
    )

    target: Target | None = Field(
        default=None,
        description="The compiler function to import on first lookup: 'module.path:attribute'.",
    )
    chain: list[Name] | None = Field(
        default=None,
        min_length=1,
        description="Instead of target: backend names to try in order, first that works wins.",
    )
    tags: list[Name] = Field(default_factory=list, description="Labels, e.g. 'debug'.")
    description: str | None = Field(default=None, description="One line for listings.")
    aliases: list[Name] = Field(
        default_factory=list, description="More names for the same backend."
    )
    requires: list[ModuleName] = Field(
        default_factory=list,
        description="Modules that must be importable (checked, never imported).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments bound to the target at load."
    )
    enabled: bool = Field(
        default=True, description="false hides this name, also from lower sources."
    )

    @model_validator(mode="after")
    def _target_or_chain(self) -> BackendEntry:
        if self.enabled and (self.target is None) == (self.chain is None):
            if self.target is None:
                raise ValueError(
                    "needs 'target' (\"module.path:attribute\") or 'chain' (a list of"
                    " backend names), or 'enabled = false'"
                )
            raise ValueError("give exactly one of 'target' and 'chain', not both")
        if self.chain is not None and self.options:
            # A chain calls its members as they are declared; options here would be lost.
            raise ValueError("'options' go with a 'target'; set them on the chain's members")
        return self


class Manifest(BaseModel):
    """A ``backends.toml`` document (or ``[tool.torch-backends]`` in ``pyproject.toml``)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=_kebab,
        title="torch-backend-registry manifest",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    schema_version: int = Field(
        default=SCHEMA_VERSION,
        ge=1,
        le=SCHEMA_VERSION,
        description=f"The manifest format version; this release reads {SCHEMA_VERSION}.",
    )
    default: Name | None = Field(
        default=None, description="The backend torch.compile uses when given none."
    )
    python_path: list[str] = Field(
        default_factory=list,
        description="Folders, relative to this file, on sys.path while importing its targets.",
    )
    backends: dict[Name, BackendEntry] = Field(
        default_factory=dict,
        description="The backends this file declares, by name.",
        json_schema_extra={"additionalProperties": False},
    )


class _TomlJsonSchema(GenerateJsonSchema):
    """TOML has no null: an optional key is simply left out, so say nothing of null."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        result = super().default_schema(schema)
        if result.get("default", 0) is None:
            del result["default"]
        return result


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a manifest, as committed in ``schemas/backends.schema.json``."""
    return Manifest.model_json_schema(by_alias=True, schema_generator=_TomlJsonSchema)


# --------------------------------------------------------------------------- lines

_BARE = r"[A-Za-z0-9_-]+"
_BASIC = r'"(?:[^"\\]|\\.)*"'
_LITERAL = r"'[^']*'"
_PART = rf"(?:{_BARE}|{_BASIC}|{_LITERAL})"
_DOTTED_KEY = rf"{_PART}(?:\s*\.\s*{_PART})*"
_HEADER_RE = re.compile(rf"\s*\[\[?\s*({_DOTTED_KEY})\s*\]\]?")
_KEY_RE = re.compile(rf"\s*({_DOTTED_KEY})\s*=")
_PART_RE = re.compile(_PART)


def _split_key(dotted: str) -> tuple[str, ...]:
    if '"' not in dotted and "'" not in dotted:
        # Bare keys (nearly all of them) hold no dots or quotes of their own.
        return tuple(part.strip() for part in dotted.split("."))
    parts = []
    for match in _PART_RE.finditer(dotted):
        part = match.group()
        if part[0] == '"' and "\\" in part:
            part = _unescape(part)
        elif part[0] in "\"'":
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def _unescape(quoted: str) -> str:
    # Escapes are rare in keys; the parser itself reads them exactly as TOML does.
    try:
        return next(iter(tomli.loads(f"{quoted} = 0")))
    except (tomli.TOMLDecodeError, StopIteration):
        return quoted[1:-1]


_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(parts: tuple[str, ...]) -> str:
    """A dotted key as TOML writes it: bare parts as they are, the others quoted.

    Quoting also keeps a hostile key (a newline, a terminal escape, a bidi
    override) from breaking the one line an error is printed on.
    """
    return ".".join(part if _BARE_KEY_RE.fullmatch(part) else _quote(part) for part in parts)


def _quote(part: str) -> str:
    out = ['"']
    for char in part:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(f"\\U{ord(char):08X}")
    out.append('"')
    return "".join(out)


def _physical_lines(text: str) -> list[str]:
    # Lines as TOML counts them: str.splitlines() also splits at \f, \x1c, \u2028 and
    # others, which TOML allows inside comments and strings, and would shift every line.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each table header and key path of a TOML text to its first line (1-based).

    TOML parsers do not report positions, so this light scan supplies them; a
    key inside an inline table maps to the line of the table's own key.
    """
    lines: dict[tuple[str, ...], int] = {}
    for number, table, parts in _scan(_physical_lines(text)):
        # `[a.b.c]` also defines `a` and `a.b`, and `b.target = ...` the table `b`,
        # on this line, unless they came before.
        for end in range(1, len(parts) + 1):
            lines.setdefault(table + parts[:end], number)
    return lines


def _scan(lines: list[str]) -> Iterator[tuple[int, tuple[str, ...], tuple[str, ...]]]:
    """Each table header and key line as ``(number, table, parts)``; a header has no table."""
    table: tuple[str, ...] = ()
    in_string: str | None = None
    for number, line in enumerate(lines, start=1):
        if in_string is not None:
            if in_string in line:
                in_string = None
            continue
        if line.lstrip().startswith("["):
            header = _HEADER_RE.match(line)
            if header:
                table = _split_key(header.group(1))
                yield number, (), table
                continue
        key = _KEY_RE.match(line)
        if key:
            yield number, table, _split_key(key.group(1))
            rest = line[key.end() :]
            # Most values hold no triple quotes; only those need the careful scan.
            if '"""' in rest or "'''" in rest:
                in_string = _opens_multiline(rest)


def _opens_multiline(value: str) -> str | None:
    """The quotes of a multi-line string that ``value`` opens and leaves open, if any."""
    i, end = 0, len(value)
    while i < end:
        char = value[i]
        if char == "#":
            return None
        if value.startswith(('"""', "'''"), i):
            quotes = value[i : i + 3]
            close = value.find(quotes, i + 3)
            if close == -1:
                return quotes
            i = close + 3
        elif char == '"':
            i += 1
            while i < end and value[i] != '"':
                i += 2 if value[i] == "\\" else 1
            i += 1
        elif char == "'":
            close = value.find("'", i + 1)
            i = end if close == -1 else close + 1
        else:
            i += 1
    return None


def _line_of(lines: dict[tuple[str, ...], int], path: tuple[str, ...]) -> int | None:
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None


# ------------------------------------------------------------------------ reading


class ManifestResult:
    """What one manifest file yields: definitions, problems and its ``default``."""

    __slots__ = ("default", "default_line", "definitions", "path", "problems", "skipped")

    def __init__(self, path: str) -> None:
        self.path = path
        self.definitions: list[BackendDefinition] = []
        self.problems: list[ManifestError] = []
        self.default: str | None = None
        self.default_line: int | None = None
        #: Why the file was left out on purpose (the trust rule), or ``None``.
        self.skipped: ManifestError | None = None


#: Far above any real manifest (10,000 backends take about 1 MB); a guard against a
#: TORCH_BACKENDS_PATH entry naming the wrong file, read whole into memory otherwise.
MAX_BYTES = 16 * 1024 * 1024

# A FIFO named like a manifest would block open() until a writer comes; with
# O_NONBLOCK it opens at once and fstat tells it is not a regular file.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class _Untrusted(ManifestError):
    """A manifest left out by the trust rule: reported as a warning, not a problem."""


def _untrusted_reason(info: os.stat_result) -> str | None:
    """Why a manifest must not be used, or ``None``: the rule git applies (``safe.directory``)."""
    if not hasattr(os, "getuid"):  # pragma: no cover - no ownership model (Windows)
        return None
    if info.st_mode & stat.S_IWOTH:
        return "it is writable by every user"
    if info.st_uid not in (0, os.getuid()):
        return f"it is owned by another user (uid {info.st_uid})"
    return None


def read_text(path: str) -> str:
    """Read a manifest's text; raise :class:`ManifestError` if it cannot or must not be used.

    The checks are made on the opened file, so the file judged is the file read.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise ManifestError("no such file", path=path) from None
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ManifestError("is a directory, not a manifest; name a .toml file", path=path)
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError("is not a regular file; name a .toml file", path=path)
        reason = _untrusted_reason(info)
        if reason is not None:
            raise _Untrusted(
                f"manifest not used: {reason}; fix its owner or mode (as git's safe.directory)",
                path=path,
            )
        if info.st_size > MAX_BYTES:
            raise _too_large(path)
        with open(fd, "rb", closefd=False) as handle:
            # A buffer of the size fstat gave, plus one byte that tells a file that grew
            # since; such a file is read on, up to the limit.
            data = handle.read(info.st_size + 1)
            if len(data) > info.st_size:
                data += handle.read(MAX_BYTES + 1 - len(data))
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise _too_large(path)
    try:
        # "utf-8-sig": a byte order mark, as some editors write, is not part of the text.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        lines = _physical_lines(data[: exc.start].decode("utf-8-sig", errors="replace"))
        line = data[: exc.start].count(b"\n") + 1
        raise ManifestError(
            f"not valid UTF-8 (byte {data[exc.start]:#04x}); save the file as UTF-8",
            path=path,
            line=line,
            key=_key_at(lines, line),
        ) from exc


def _too_large(path: str) -> ManifestError:
    return ManifestError(
        f"is larger than {MAX_BYTES // 2**20} MiB, too large for a manifest; is it the right file?",
        path=path,
    )


def _key_at(lines: list[str], line: int) -> str | None:
    """The key (or table) written on ``line`` of ``lines``, dotted and quoted as TOML writes it."""
    for number, table, parts in _scan(lines[:line]):
        if number == line:
            return toml_key(table + parts)
    return None


def _toml_error(path: str, text: str, exc: tomli.TOMLDecodeError) -> ManifestError:
    lines = _physical_lines(text)
    # Past the last line is the end of the document: point at the last line.
    line = max(1, min(exc.lineno, len(lines)))
    return ManifestError(f"invalid TOML: {exc.msg}", path=path, line=line, key=_key_at(lines, line))


def _too_deep(path: str, text: str, exc: RecursionError) -> ManifestError:
    # The parser gives no position here; the line with the most openings and dots
    # is where such nesting is written in any file that reaches the limits.
    lines = _physical_lines(text) or [""]
    line = 1 + max(range(len(lines)), key=lambda i: sum(map(lines[i].count, "[{.")))
    key = _key_at(lines, line)
    if key is not None and len(key) > 200:
        key = None  # the key is the problem: a thousand parts help no one read the line
    return ManifestError(f"invalid TOML: {exc}; nest less deeply", path=path, line=line, key=key)


def parse_toml(text: str) -> dict[str, Any]:
    """Parse TOML text."""
    return tomli.loads(text)


def read_manifest(path: str, kind: str) -> ManifestResult | None:
    """Read and validate one manifest file.

    A ``pyproject.toml`` is read from its ``[tool.torch-backends]`` table; if it
    has none, ``None`` is returned. Errors of one backend are recorded on that
    backend and in ``problems``; the file's other backends stay usable.
    """
    result = ManifestResult(path)
    text = ""
    try:
        text = read_text(path)
        data: Any = tomli.loads(text)
    except _Untrusted as exc:
        result.skipped = exc
        return result
    except ManifestError as exc:
        result.problems.append(exc)
        return result
    except tomli.TOMLDecodeError as exc:
        result.problems.append(_toml_error(path, text, exc))
        return result
    except RecursionError as exc:  # tomli's own limits on nesting and key parts
        result.problems.append(_too_deep(path, text, exc))
        return result
    prefix: tuple[str, ...] = ()
    if os.path.basename(path) == "pyproject.toml":
        prefix = PYPROJECT_TABLE
        for part in prefix:
            data = data.get(part) if isinstance(data, dict) else None
        if data is None:
            return None
        if not isinstance(data, dict):
            result.problems.append(
                ManifestError("expected a table", path=path, line=None, key=toml_key(prefix))
            )
            return result
    lines = key_lines(text)
    _validate(result, data, kind, prefix, lines)
    return result


def _validate(
    result: ManifestResult,
    data: dict[str, Any],
    kind: str,
    prefix: tuple[str, ...],
    lines: dict[tuple[str, ...], int],
) -> None:
    path = result.path

    def error(loc: tuple[str | int, ...], message: str) -> ManifestError:
        keys = prefix + tuple(str(part) for part in loc if not isinstance(part, int))
        return ManifestError(
            message,
            path=path,
            line=_line_of(lines, keys) or _line_of(lines, prefix),
            key=toml_key(keys),
        )

    version = data.get("schema-version", SCHEMA_VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        result.problems.append(
            error(
                ("schema-version",),
                f"schema version {version} is newer than this release supports"
                f" ({SCHEMA_VERSION}); upgrade torch-backend-registry or write"
                f" schema-version = {SCHEMA_VERSION}",
            )
        )
        return

    try:
        manifest: Manifest | None = Manifest.model_validate(data)
        broken: dict[str, list[ManifestError]] = {}
    except ValidationError as exc:
        manifest = None
        broken = {}
        for item in exc.errors():
            loc = tuple(item["loc"])
            problem = error(_error_loc(loc), _describe(item, loc))
            if len(loc) >= 2 and loc[0] == "backends" and isinstance(loc[1], str):
                broken.setdefault(loc[1], []).append(problem)
            result.problems.append(problem)

    # On errors, keep what is valid: the document's own keys and each sound backend.
    header = manifest if manifest is not None else _salvage_header(data)
    result.default = header.default
    result.default_line = _line_of(lines, (*prefix, "default"))
    base = os.path.dirname(os.path.abspath(path))
    python_path = tuple(os.path.normpath(os.path.join(base, p)) for p in header.python_path)

    raw_backends = data.get("backends")
    if not isinstance(raw_backends, dict):
        return
    seen: dict[str, str] = {}
    for name, raw in raw_backends.items():
        header_path = (*prefix, "backends", str(name))
        source = Source(kind, path=path, line=_line_of(lines, header_path))
        problems = broken.get(name)
        entry: BackendEntry | None = None
        if problems is None:
            entry = (
                manifest.backends[name]
                if manifest is not None
                else BackendEntry.model_validate(raw)
            )
            for alias in entry.aliases:
                if alias in seen or alias in raw_backends or alias == name:
                    problem = error(
                        ("backends", name, "aliases"),
                        f"alias {alias!r} is already used by backend {seen.get(alias, alias)!r}"
                        " in this file; each name and alias must be unique",
                    )
                    result.problems.append(problem)
                    problems = [problem]
                seen.setdefault(alias, name)
        if problems is not None or entry is None:
            result.definitions.append(
                BackendDefinition(
                    name, source, enabled=True, error=problems[0] if problems else None
                )
            )
            continue
        result.definitions.append(
            BackendDefinition(
                name,
                source,
                target=entry.target,
                chain=tuple(entry.chain) if entry.chain is not None else None,
                tags=tuple(entry.tags),
                description=entry.description,
                aliases=tuple(entry.aliases),
                requires=tuple(entry.requires),
                options=entry.options,
                enabled=entry.enabled,
                python_path=python_path,
            )
        )


def _salvage_header(data: dict[str, Any]) -> Manifest:
    """The document's own keys where they are valid, without its backends."""
    values: dict[str, Any] = {}
    for key in ("schema-version", "default", "python-path"):
        if key in data:
            try:
                Manifest.model_validate({key: data[key]})
            except ValidationError:
                continue
            values[key] = data[key]
    return Manifest.model_validate(values)


def _error_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    # pydantic reports a bad dict key as (..., key, "[key]") and a failed
    # model validator on the model itself; both read better without the marker.
    return tuple(part for part in loc if part != "[key]")


def _fields_of(loc: tuple[str | int, ...]) -> list[str]:
    strings = [part for part in loc if isinstance(part, str)]
    model: type[BaseModel] = (
        BackendEntry if len(strings) >= 3 and strings[0] == "backends" else Manifest
    )
    return [field.alias or name for name, field in model.model_fields.items()]


def _describe(item: Any, loc: tuple[str | int, ...]) -> str:
    kind = item["type"]
    given = item.get("input")
    index = next((part for part in reversed(loc) if isinstance(part, int)), None)
    at = f"item {index}: " if index is not None else ""
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _fields_of(loc)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "expected one of " + ", ".join(known)
        return f"unknown key {key!r}; {hint}"
    if kind == "missing":
        return f"missing required key {str(loc[-1])!r}"
    if kind == "string_pattern_mismatch":
        pattern = item.get("ctx", {}).get("pattern", "")
        what = "key" if "[key]" in loc else "value"
        return f"{at}invalid {what} {given!r}: expected {_PATTERN_HINTS.get(pattern, pattern)}"
    if kind in _TYPE_WORDS:
        return f"{at}expected {_TYPE_WORDS[kind]}, got {_toml_type(given)} {_short(given)}"
    if kind == "value_error":
        return str(item["msg"]).removeprefix("Value error, ")
    if kind in ("less_than_equal", "greater_than_equal") and loc[-1] == "schema-version":
        return f"unsupported schema version {given!r}; this release reads {SCHEMA_VERSION}"
    if kind == "too_short":
        return "must not be empty"
    return f"{at}{item['msg']}"


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
