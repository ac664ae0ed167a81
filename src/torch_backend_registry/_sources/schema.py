"""The manifest schema (version 1) as pydantic models, and the words its errors are told in.

pydantic is imported here only, and this module is imported only when a
manifest is first validated, so ``import torch_backend_registry`` stays cheap.
"""

from __future__ import annotations

import itertools
import re
import reprlib
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from .._errors import did_you_mean
from .._keys import toml_key

SCHEMA_VERSION = 1
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*$"
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
TARGET_PATTERN = rf"^{_DOTTED}:{_DOTTED}$"
MODULE_PATTERN = rf"^{_DOTTED}$"
FOLDER_PATTERN = r"^[^\x00]+$"
#: A distribution's name as packaging allows it (PEP 508), compared normalised (PEP 503).
DISTRIBUTION_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
#: A device type as ``torch.device(...).type`` names it, or ``other``.
DEVICE_PATTERN = r"^[a-z][a-z0-9_]*$"
#: The device types PyTorch names (c10's DeviceType), and the best-known ones extensions add.
DEVICE_TYPES = """
    cpu cuda xpu mps hip meta xla lazy hpu mtia maia ipu ve fpga vulkan metal mkldnn opengl
    opencl ideep privateuseone npu musa
    """.split()  # noqa: SIM905 - names to read, not a list to edit

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
ModuleName = Annotated[str, Field(pattern=MODULE_PATTERN)]
Target = Annotated[str, Field(pattern=TARGET_PATTERN)]
Folder = Annotated[str, Field(pattern=FOLDER_PATTERN, min_length=1)]
Distribution = Annotated[str, Field(pattern=DISTRIBUTION_PATTERN)]
Device = Annotated[str, Field(pattern=DEVICE_PATTERN)]
Tolerance = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Speedup = Annotated[float, Field(ge=1.0, allow_inf_nan=False)]

# What a user should have written, keyed by the pattern pydantic reports.
_PATTERN_HINTS = {
    NAME_PATTERN: "a name of letters, digits, '_' and '-', starting with a letter or '_'"
    " (e.g. 'my_backend')",
    TARGET_PATTERN: "a target 'module.path:attribute.path' (e.g. 'my_pkg.compilers:compile')",
    MODULE_PATTERN: "a dotted module name (e.g. 'tensorrt' or 'torch_tensorrt.dynamo')",
    FOLDER_PATTERN: "a folder path without NUL characters (e.g. 'src')",
    DISTRIBUTION_PATTERN: "a distribution's name, as pip installs it (e.g. 'openvino')",
    DEVICE_PATTERN: "a device type as torch.device(...).type names it (e.g. 'cuda', 'cpu',"
    " 'xpu', 'mps'), or 'other'",
}
_TYPE_WORDS = {
    "string_type": "a string",
    "bool_type": "true or false",
    "int_type": "an integer",
    "float_type": "a number",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
}


#: What every table of a manifest shares: no unknown keys, no coercion, immutable,
#: keys written in kebab-case.
_TABLE = ConfigDict(
    extra="forbid", strict=True, frozen=True, alias_generator=lambda name: name.replace("_", "-")
)
#: The keys that say what a backend runs: exactly one of them, or ``enabled = false``.
_KINDS = ("target", "chain", "by-device", "distribution")
_EXCLUSIVE = [*itertools.combinations(_KINDS, 2), ("chain", "options"), ("by-device", "options")]
#: What BackendEntry._target_or_chain checks, said so that editors can check it too.
_ONE_KIND: dict[str, Any] = {
    "anyOf": [
        *({"required": [kind]} for kind in _KINDS),
        {"required": ["enabled"], "properties": {"enabled": {"const": False}}},
    ],
    "not": {"anyOf": [{"required": list(pair)} for pair in _EXCLUSIVE]},
}


class DeviceEntry(BaseModel):
    """A ``by-device`` entry written as a table: a backend, with torch.compile's settings for
    the graphs on that device in place of those torch.compile was given."""

    model_config = ConfigDict(**_TABLE, title="Device entry")

    backend: Name = Field(description="The backend for graphs on this device.")
    mode: str | None = Field(
        default=None, description="As torch.compile(mode=...), e.g. 'max-autotune'."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="As torch.compile(options={...})."
    )


#: A ``by-device`` entry: a backend's name, or a table (told apart by what is written, so
#: that an error speaks of the form that was meant).
DeviceChoice = Annotated[
    Union[Annotated[Name, Tag("name")], Annotated[DeviceEntry, Tag("table")]],  # noqa: UP007
    Discriminator(lambda value: "table" if isinstance(value, (dict, DeviceEntry)) else "name"),
]
#: The union's tags, which pydantic puts in an error's location.
_TAGS = ("name", "table")


class BackendEntry(BaseModel):
    """One ``[backends.NAME]`` table."""

    model_config = ConfigDict(**_TABLE, title="Backend", json_schema_extra=_ONE_KIND)

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
    distribution: Distribution | None = Field(
        default=None,
        description="Instead of target: take this name's entry point from this installed"
        " distribution (when several declare it).",
    )
    by_device: dict[Device, DeviceChoice] | None = Field(
        default=None,
        min_length=1,
        description="Instead of target or chain: the backend for each device type of the"
        " graph's inputs (as torch.device(...).type names it), 'other' for any not listed;"
        " a table { backend, mode, options } gives that device torch.compile's settings too.",
    )
    verify: Literal["none", "forward", "backward"] | None = Field(
        default=None,
        description="For a chain: run each member's compiled graph once against the graph"
        " run eagerly ('forward'), and its gradients too ('backward'); a member that differs"
        " is skipped. Default 'none', or 'forward' with select = 'fastest'.",
    )
    select: Literal["first", "fastest"] = Field(
        default="first",
        description="For a chain: the first member that works ('first'), or for each graph"
        " the fastest member that verifies, timed, remembered and the same on every rank"
        " ('fastest').",
    )
    min_speedup: Speedup | None = Field(
        default=None,
        description="With select = 'fastest': how many times faster than the chain's first"
        " verified member the fastest must be to be chosen over it (default 1.1).",
    )
    rtol: Tolerance | None = Field(
        default=None, description="With verify: the relative tolerance (default 0.01)."
    )
    atol: Tolerance | None = Field(
        default=None,
        description="With verify: the absolute tolerance (default 0.01), at most rtol of a"
        " value's largest magnitude and at least 1e-5.",
    )

    @model_validator(mode="after")
    def _target_or_chain(self) -> BackendEntry:
        given = [k for k in _KINDS if getattr(self, k.replace("-", "_")) is not None]
        if self.enabled and not given:
            raise ValueError(
                "needs 'target' (\"module.path:attribute\"), 'chain' (a list of backend"
                " names) or 'by-device' (a table of device types), or 'enabled = false'"
            )
        if len(given) > 1:
            raise ValueError(
                "give exactly one of 'target' and 'chain' (or 'by-device'), not"
                f" {' and '.join(given)}"
            )
        if (self.chain is not None or self.by_device is not None) and self.options:
            # It calls its members as they are declared; options here would be lost.
            raise MisplacedKey("options", "'options' go with a 'target'; set them on the members")
        verifying, selecting = self.verify not in (None, "none"), self.select != "first"
        for key, written in (("verify", verifying), ("select", selecting)):
            if written and self.chain is None:
                raise MisplacedKey(key, f"'{key}' goes with a 'chain'")
        if self.select == "fastest" and self.verify == "none":
            said = 'select = "fastest" verifies each member it times: remove verify = "none"'
            raise MisplacedKey("verify", said + ' (it is "forward" then) or set "backward"')
        if self.min_speedup is not None and self.select != "fastest":
            raise MisplacedKey("min-speedup", "'min-speedup' goes with select = \"fastest\"")
        for key in ("rtol", "atol"):  # what verifies: a verify level, or select = "fastest"
            if not (verifying or selecting) and getattr(self, key) is not None:
                raise MisplacedKey(key, f"'{key}' goes with 'verify = \"forward\"' or \"backward\"")
        return self


class Plugins(BaseModel):
    """Which installed distributions' entry points count (``[plugins]``)."""

    model_config = ConfigDict(**_TABLE, title="Plugins")

    allow: list[Distribution] | None = Field(
        default=None, description="Only these distributions' entry points count."
    )
    deny: list[Distribution] = Field(
        default_factory=list, description="These distributions' entry points never count."
    )


class Manifest(BaseModel):
    """A ``backends.toml`` document (or ``[tool.torch-backends]`` in ``pyproject.toml``)."""

    model_config = ConfigDict(
        **_TABLE,
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
    python_path: list[Folder] = Field(
        default_factory=list,
        description="Folders, relative to this file, searched (after every installed module)"
        " while importing its targets.",
    )
    compile_cache: Folder | None = Field(
        default=None,
        description="PyTorch's compile caches that 'torch-backends tune --compile-cache' saved,"
        " relative to this file: loaded once a process, before its first chain compile.",
    )
    plugins: Plugins | None = Field(
        default=None, description="Which installed plugins (entry points) count."
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


class MisplacedKey(ValueError):
    """A key that a table's other keys rule out: the error is at that key's line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def error_loc(item: Any) -> tuple[str | int, ...]:
    """Where a pydantic error is: its location without the ``[key]`` marker of a bad dict
    key, down to the key a table-wide rule found misplaced."""
    loc = tuple(part for part in item["loc"] if part != "[key]")
    if len(loc) > 4 and loc[2] == "by-device" and loc[4] in _TAGS:  # not a key: the form
        loc = loc[:4] + loc[5:]
    error = item.get("ctx", {}).get("error")
    return (*loc, error.key) if isinstance(error, MisplacedKey) else loc


def describe(item: Any, loc: tuple[str | int, ...]) -> str:
    """One pydantic error as a sentence that says what would be right."""
    kind = item["type"]
    given = item.get("input")
    index = next((part for part in reversed(loc) if isinstance(part, int)), None)
    at = f"item {index}: " if index is not None else ""
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _fields(loc)
        if len(loc) == 3 and loc[0] == "backends" and key in _fields(()):
            table = toml_key(("backends", str(loc[1])))
            return (
                f"{key!r} is a key of the whole manifest, not of a backend: move it above the"
                f" first [backends.NAME] table (written below [{table}], it is read as that"
                " backend's)"
            )
        hint = did_you_mean(key, known, "expected one of " + ", ".join(known))
        return f"unknown key {key!r}; {hint}"
    if kind == "string_pattern_mismatch":
        pattern = item.get("ctx", {}).get("pattern", "")
        what = "key" if "[key]" in loc else "value"
        return f"{at}invalid {what} {short(given)}: expected {_PATTERN_HINTS.get(pattern, pattern)}"
    if kind == "missing":
        return f"{at}needs {str(loc[-1])!r}"
    if kind == "string_type" and "by-device" in loc and "name" in loc[3:]:
        return (
            f'expected a backend\'s name or a table {{ backend = "NAME", mode = ...,'
            f" options = {{ ... }} }}, got {_TOML_TYPES.get(type(given), 'a value')} {short(given)}"
        )
    if kind in _TYPE_WORDS:
        toml_type = _TOML_TYPES.get(type(given), type(given).__name__)
        return f"{at}expected {_TYPE_WORDS[kind]}, got {toml_type} {short(given)}"
    if kind == "value_error":
        return str(item["msg"]).removeprefix("Value error, ")
    if kind == "greater_than_equal" and loc[-1] == "schema-version":
        return f"unsupported schema version {short(given)}; this release reads {SCHEMA_VERSION}"
    if kind == "greater_than_equal":
        return f"{at}must be {item['ctx']['ge']:g} or more, not {short(given)}"
    if kind == "finite_number":
        return f"{at}must be a finite number, not {short(given)}"
    if kind in ("too_short", "string_too_short"):
        return f"{at}must not be empty"
    if kind == "literal_error":  # verify and select, whose values are words
        expected = re.findall(r"'(\w+)'", item["ctx"]["expected"])
        listed = " or ".join(map(repr, expected))
        hint = did_you_mean(str(given), expected, f"expected {listed}")
        return f"{at}invalid value {short(given)}; {hint}"
    return f"{at}{item['msg']}"


def _fields(loc: tuple[str | int, ...]) -> list[str]:
    """The keys of the table the key at ``loc`` stands in, as written."""
    strings = [part for part in loc if isinstance(part, str)]
    model: type[BaseModel] = Manifest
    if len(strings) >= 5 and strings[0] == "backends" and strings[2] == "by-device":
        model = DeviceEntry
    elif len(strings) >= 3 and strings[0] == "backends":
        model = BackendEntry
    elif len(strings) >= 2 and strings[0] == "plugins":
        model = Plugins
    return [field.alias or name for name, field in model.model_fields.items()]


#: The parsed value's type, as TOML names it.
_TOML_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "float",
    str: "string",
    list: "array",
    dict: "table",
}


class _TomlRepr(reprlib.Repr):
    """A bounded repr that spells booleans as TOML does: ``true``, ``false``."""

    def repr_bool(self, value: bool, level: int) -> str:
        return "true" if value else "false"


_SHORT = _TomlRepr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel = 3
#: A bounded ``repr``: whatever the value's size or depth, a few dozen characters.
short = _SHORT.repr
