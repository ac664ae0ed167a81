"""The values: a backend's definition and source, a problem, what resolving a name found."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType

from ._keys import table_prefix, toml_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, Literal, TypeAlias

    #: Where a definition comes from; SOURCE_KINDS orders them by precedence.
    SourceKind: TypeAlias = Literal["runtime", "env", "project", "entry-point", "torch"]
    Severity: TypeAlias = Literal["error", "warning", "note"]

#: How close compiled results must be to eager ones (``torch.testing.assert_close``), in
#: doctor's probes and in chains that verify: what bfloat16 arithmetic reaches (8 bits of
#: mantissa), which CPU plugins such as OpenVINO may use for float32 models. A wrong kernel
#: misses it by far more.
RTOL, ATOL = 1e-2, 1e-2
#: How many times faster than a chain's first verified member another must be to be chosen
#: by ``select = "fastest"``: timings closer than that keep the chain's order.
MIN_SPEEDUP = 1.1

#: The source kinds, highest precedence first: the single source of truth for precedence.
SOURCE_KINDS: tuple[SourceKind, ...] = ("runtime", "env", "project", "entry-point", "torch")

EMPTY: Mapping[str, Any] = MappingProxyType({})


def canonical(value: object) -> str:
    """One text for a plain value, equal exactly when the values are (``nan`` too): what an
    identity, a lock and a cache key compare. Each table, array, set and date is an object
    keyed by its kind, so no value writes the text of a value of another kind."""
    return json.dumps(_typed(value), separators=(",", ":"))


def _typed(value: object) -> object:
    if value is None or isinstance(value, (str, int, float)):  # bool is an int, JSON tells them
        return value
    if isinstance(value, (dict, MappingProxyType)):
        return {"t": sorted([str(k), _typed(v)] for k, v in value.items())}
    if isinstance(value, (list, tuple)):
        return {"a": [_typed(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"s": sorted(map(canonical, value))}
    return {type(value).__name__: str(value)}  # dates and times: their ISO form, by kind


def shown_path(path: str, folder: str | None) -> str:
    """``path`` relative to ``folder`` when it lies below it, else as it is."""
    import os

    if folder is None:
        return path
    try:
        relative = os.path.relpath(path, folder)
    except ValueError:  # pragma: no cover - another drive on Windows
        return path
    return path if relative.startswith("..") else relative


def location(path: str | None, line: int | None, key: str | None) -> str:
    """The ``PATH:LINE: KEY: `` prefix of a message, leaving out what is unknown."""
    where = "" if path is None else f"{path}: " if line is None else f"{path}:{line}: "
    return where + (f"{key}: " if key else "")


def target_of(fn: object) -> str | None:
    """``module:qualname`` of a function, or ``None`` where that names nothing importable."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}:{qualname}"
    return None


@dataclass(frozen=True, slots=True)
class Source:
    """Where a definition came from: a manifest's table (``path``, the ``line`` of its
    header), an entry point (``distribution``, ``version``) or a ``register_backend`` call
    (``module``); what does not apply is ``None``."""

    kind: SourceKind
    path: str | None = None
    line: int | None = None
    distribution: str | None = None
    version: str | None = None
    module: str | None = None

    def describe(self, relative_to: str | None = None) -> str:
        """``PATH:LINE`` (relative to ``relative_to`` below it), a distribution, or a module."""
        if self.path is not None:
            path = shown_path(self.path, relative_to)
            return path if self.line is None else f"{path}:{self.line}"
        if self.distribution is not None:
            version = f" {self.version}" if self.version else ""
            return f"distribution {self.distribution!r}{version}"
        if self.module is not None:
            return f"register_backend in module {self.module!r}"
        return "PyTorch" if self.kind == "torch" else self.kind

    def short(self, relative_to: str | None = None) -> str:
        """The location for a table column: ``PATH:LINE``, ``DIST VERSION``, a module, or ""."""
        if self.path is not None:
            return self.describe(relative_to)
        if self.distribution is not None:
            return f"{self.distribution} {self.version or ''}".rstrip()
        return self.module or ""


@dataclass(frozen=True, slots=True)
class Problem:
    """What reading, merging or checking found, with where: a value, printed or warned.

    An ``error`` leaves out what it names and makes ``check`` fail; a ``warning`` is about
    something used, but likely not as meant; a ``note`` is no fault (a chain member not
    installed here, which the chain skips).
    """

    message: str
    path: str | None = None
    line: int | None = None
    key: str | None = None
    severity: Severity = "error"
    #: How many more problems of its file this one stands for, past the most reported.
    also: int = 0
    #: What an error leaves out is its whole file (one that cannot be parsed), not the
    #: backend whose table it is located in.
    whole_file: bool = False

    def __str__(self) -> str:
        return location(self.path, self.line, self.key) + self.message

    def shown(self, relative_to: str | None) -> str:
        """The line ``check`` prints: ``PATH:LINE: SEVERITY: KEY: message``, as compilers
        print theirs, with the path relative to ``relative_to`` where it lies below it."""
        path = None if self.path is None else shown_path(self.path, relative_to)
        where = location(path, self.line, None)
        return f"{where}{self.severity}: " + location(None, None, self.key) + self.message


@dataclass(frozen=True, slots=True)
class BackendDefinition:
    """One definition of a backend name, as its source declared it; importing nothing."""

    name: str
    source: Source
    target: str | None = None
    chain: tuple[str, ...] | None = None
    #: Instead of a target or chain: ``(device type, backend name)`` pairs, ``other`` last.
    by_device: tuple[tuple[str, str], ...] | None = None
    #: Of a ``by-device`` table: torch.compile's settings (``mode``, ``options``) that a
    #: device's entry gives its graphs, by device type.
    device_settings: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: EMPTY, compare=False
    )
    tags: tuple[str, ...] = ()
    description: str | None = None
    aliases: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    #: Compared by their canonical text (``_compared``), in which ``nan`` equals itself.
    options: Mapping[str, Any] = field(default_factory=lambda: EMPTY, compare=False)
    enabled: bool = True
    #: The manifest's ``python-path`` folders, absolute.
    python_path: tuple[str, ...] = ()
    #: Where a lookup finds modules after every other place: ``python_path``, then the
    #: manifest's own folder.
    search_path: tuple[str, ...] = ()
    #: The manifest's ``python-path`` entries as written (the same in every checkout).
    written_path: tuple[str, ...] = ()
    #: The manifest's ``compile-cache``, absolute: what a chain of it loads before compiling.
    compile_cache: str | None = field(default=None, compare=False)
    #: The callable itself, where the source holds one (runtime, PyTorch).
    compiler_fn: Callable[..., Any] | None = None
    #: Why this definition cannot be used as declared, or ``None``.
    problem: Problem | None = None
    #: For a chain: ``("forward" | "backward", rtol, atol)`` to check each member's compiled
    #: graph against the graph run eagerly, or ``None``.
    verify: tuple[str, float, float] | None = None
    #: For a chain: ``"first"``, the first member that works; ``"fastest"``, for each graph
    #: the fastest member that verifies, unless it is less than ``min_speedup`` times
    #: faster than the first member that verifies.
    select: str = "first"
    min_speedup: float = MIN_SPEEDUP
    #: The installed distribution a manifest picked to provide this name's entry point.
    distribution: str | None = None
    #: Where each key of a manifest's table is written: its line, by the key as TOML writes
    #: it relative to the table (``target``, ``options.fp16``); circumstance, not value.
    lines: Mapping[str, int] = field(default_factory=lambda: EMPTY, compare=False, repr=False)
    _compared: str = field(init=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        written = [self.options, self.device_settings]
        object.__setattr__(self, "_compared", canonical(written) if any(written) else "")

    def line_of(self, *parts: str) -> int | None:
        """The line ``parts`` (a key of this backend's table, and one inside it) are written
        on: the key's own, else the nearest written key above it, else the table header's."""
        for depth in range(len(parts), 0, -1):
            if (line := self.lines.get(toml_key(parts[:depth]))) is not None:
                return line
        return self.source.line

    def located(self, message: str, *parts: str, severity: Severity = "error") -> Problem:
        """A problem of this backend, at the line and key of ``parts`` (none: its table), the
        key as its file writes it (``backends.fast.target``, or under ``tool.torch-backends``
        in pyproject.toml)."""
        path = self.source.path
        key = toml_key((*table_prefix(path), "backends", self.name, *parts))
        return Problem(message, path=path, line=self.line_of(*parts), key=key, severity=severity)

    @property
    def usable(self) -> bool:
        """Whether this definition can be looked up (enabled and without a problem)."""
        return self.enabled and self.problem is None

    @property
    def members(self) -> tuple[str, ...]:
        """The backends this one runs: a chain's members, or a ``by-device`` table's."""
        if self.by_device is not None:
            return tuple(dict.fromkeys(name for _device, name in self.by_device))
        return self.chain or ()


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What ``backend_info(name)`` found: the definition ``name`` resolves to (its attributes
    read through: ``info.target``), what it shadows, and the alias asked for."""

    definition: BackendDefinition
    #: The definitions of the same name from lower sources, highest first.
    shadowed: tuple[BackendDefinition, ...] = ()
    alias: str | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.definition, name)


@dataclass(frozen=True, slots=True)
class DefaultDeclaration:
    """A manifest's ``default = "NAME"``, with where it is written."""

    name: str
    path: str
    line: int | None
    #: The key as written in the file (``tool.torch-backends.default`` in pyproject.toml).
    key: str


def distribution_key(name: str) -> str:
    """A distribution's name normalised as packaging compares them (PEP 503)."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class PluginRule:
    """An ``allow`` or ``deny`` list of distributions (normalised: :func:`distribution_key`),
    with where: a manifest's line and key, or (``path`` ``None``) the environment variable."""

    kind: Literal["allow", "deny"]
    names: frozenset[str]
    key: str
    path: str | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        # Normalised as made, whoever makes it (frozen: set through object's own setter).
        object.__setattr__(self, "names", frozenset(map(distribution_key, self.names)))

    @property
    def where(self) -> str:
        """Where the list is, for a sentence: ``PATH:LINE (KEY)``, or the variable."""
        if self.path is None:
            return self.key
        return f"{location(self.path, self.line, None).rstrip(': ')} ({self.key})"


@dataclass(slots=True)
class Discovery:
    """What reading some input found: definitions and plugin rules in precedence order,
    problems, a default. One file, one source and the fold of all sources are each one."""

    definitions: list[BackendDefinition] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    default: DefaultDeclaration | None = None
    #: Plugin allow and deny lists, highest precedence first.
    rules: list[PluginRule] = field(default_factory=list)

    def add(self, other: Discovery) -> None:
        """Fold in ``other``, which ranks below everything already here."""
        self.definitions.extend(other.definitions)
        self.problems.extend(other.problems)
        self.rules.extend(other.rules)
        self.default = self.default or other.default  # the first by precedence
