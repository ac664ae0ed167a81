"""The values of discovery: a backend's definition, its source, a default, what a source found."""

from __future__ import annotations

from types import MappingProxyType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any, Literal, TypeAlias

    from ._errors import ManifestError

    #: Where a definition comes from; SOURCE_KINDS orders them by precedence.
    SourceKind: TypeAlias = Literal["runtime", "env", "project", "entry-point", "torch"]

#: The source kinds, highest precedence first: the single source of truth for precedence.
SOURCE_KINDS: tuple[SourceKind, ...] = ("runtime", "env", "project", "entry-point", "torch")

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Frozen:
    """Slotted, immutable, compared by value: cheaper to import than dataclasses."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, **values: Any) -> None:
        for slot in self.__slots__:
            object.__setattr__(self, slot, values.get(slot))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, slot) for slot in self.__slots__ if not slot.startswith("_"))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self._key())))

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{slot}={getattr(self, slot)!r}"
            for slot in self.__slots__
            if not slot.startswith("_") and getattr(self, slot) not in (None, (), _EMPTY)
        )
        return f"{type(self).__name__}({fields})"


def shown_path(path: str, folder: str) -> str:
    """``path`` relative to ``folder`` when it lies below it, else as it is."""
    import os

    try:
        relative = os.path.relpath(path, folder)
    except ValueError:  # pragma: no cover - another drive on Windows
        return path
    return path if relative.startswith("..") else relative


def target_of(fn: object) -> str | None:
    """``module:qualname`` of a function, or ``None`` where that names nothing importable."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}:{qualname}"
    return None


class Source(Frozen):
    """Where a definition came from.

    ``kind`` is one of ``"runtime"``, ``"env"``, ``"project"``, ``"entry-point"``
    and ``"torch"``; ``path`` and ``line`` locate a manifest entry (the line of
    its table header), ``distribution`` and ``version`` an entry point,
    ``module`` a ``register_backend`` call. What does not apply is ``None``.
    """

    __slots__ = ("kind", "path", "line", "distribution", "version", "module")  # noqa: RUF023

    kind: SourceKind
    path: str | None
    line: int | None
    distribution: str | None
    version: str | None
    module: str | None

    def __init__(
        self,
        kind: SourceKind,
        *,
        path: str | None = None,
        line: int | None = None,
        distribution: str | None = None,
        version: str | None = None,
        module: str | None = None,
    ) -> None:
        # Slot by slot rather than through Frozen's loop: discovery makes one a backend.
        init = object.__setattr__
        init(self, "kind", kind)
        init(self, "path", path)
        init(self, "line", line)
        init(self, "distribution", distribution)
        init(self, "version", version)
        init(self, "module", module)

    def describe(self, relative_to: str | None = None) -> str:
        """A short human location: ``PATH:LINE``, a distribution, or a module.

        With ``relative_to``, a path below that folder is shown relative to it.
        """
        if self.path is not None:
            path = self.path if relative_to is None else shown_path(self.path, relative_to)
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


class BackendDefinition(Frozen):
    """One definition of a backend name, as declared; importing nothing.

    ``shadowed`` holds the definitions of the same name from lower sources,
    highest first (filled in on the winning definition only).
    """

    __slots__ = (  # noqa: RUF023 - the order of repr() and of the spec
        "name",
        "target",
        "chain",
        "tags",
        "description",
        "aliases",
        "requires",
        "options",
        "source",
        "shadowed",
        "enabled",
        "python_path",
        "compiler_fn",
        "problem",
        "skip_known_failures",
        "distribution",
    )

    name: str
    target: str | None
    chain: tuple[str, ...] | None
    tags: tuple[str, ...]
    description: str | None
    aliases: tuple[str, ...]
    requires: tuple[str, ...]
    options: Mapping[str, Any]
    source: Source
    shadowed: tuple[BackendDefinition, ...]
    enabled: bool
    #: The manifest's ``python-path`` folders, absolute.
    python_path: tuple[str, ...]
    #: The callable itself, where the source holds one (runtime, PyTorch).
    compiler_fn: Callable[..., Any] | None
    #: Why this definition cannot be used as declared, or ``None``.
    problem: ManifestError | None
    #: For a chain: skip members that ``doctor`` found failing here.
    skip_known_failures: bool
    #: The installed distribution a manifest picked to provide this name's entry point.
    distribution: str | None

    def __init__(
        self,
        name: str,
        source: Source,
        *,
        target: str | None = None,
        chain: tuple[str, ...] | None = None,
        tags: tuple[str, ...] = (),
        description: str | None = None,
        aliases: tuple[str, ...] = (),
        requires: tuple[str, ...] = (),
        options: Mapping[str, Any] | None = None,
        shadowed: tuple[BackendDefinition, ...] = (),
        enabled: bool = True,
        python_path: tuple[str, ...] = (),
        compiler_fn: Callable[..., Any] | None = None,
        problem: ManifestError | None = None,
        skip_known_failures: bool = False,
        distribution: str | None = None,
    ) -> None:
        init = object.__setattr__  # slot by slot: discovery makes one a backend
        init(self, "name", name)
        init(self, "target", target)
        init(self, "chain", chain)
        init(self, "tags", tags)
        init(self, "description", description)
        init(self, "aliases", aliases)
        init(self, "requires", requires)
        init(self, "options", MappingProxyType(dict(options)) if options else _EMPTY)
        init(self, "source", source)
        init(self, "shadowed", shadowed)
        init(self, "enabled", enabled)
        init(self, "python_path", python_path)
        init(self, "compiler_fn", compiler_fn)
        init(self, "problem", problem)
        init(self, "skip_known_failures", skip_known_failures)
        init(self, "distribution", distribution)

    def _key(self) -> tuple[Any, ...]:
        key = list(super()._key())
        key[self.__slots__.index("options")] = tuple(sorted(self.options.items(), key=repr))
        return tuple(key)

    def __hash__(self) -> int:
        # The identifying fields only: options may be large, and equal definitions
        # agree on these anyway.
        return hash((self.name, self.target, self.chain, self.source))

    @property
    def usable(self) -> bool:
        """Whether this definition can be looked up (enabled and without a problem)."""
        return self.enabled and self.problem is None

    def with_shadowed(self, shadowed: tuple[BackendDefinition, ...]) -> BackendDefinition:
        """A copy of this definition with ``shadowed`` set."""
        clone = object.__new__(BackendDefinition)
        for slot in self.__slots__:
            object.__setattr__(clone, slot, getattr(self, slot))
        object.__setattr__(clone, "shadowed", shadowed)
        return clone


class DefaultDeclaration(Frozen):
    """A manifest's ``default = "NAME"``, with where it is written."""

    __slots__ = ("name", "path", "line", "key")  # noqa: RUF023

    name: str
    path: str
    line: int | None
    #: The key as written in the file (``tool.torch-backends.default`` in pyproject.toml).
    key: str

    def __init__(self, name: str, path: str, line: int | None, key: str) -> None:
        super().__init__(name=name, path=path, line=line, key=key)


def distribution_key(name: str) -> str:
    """A distribution's name normalised as packaging compares them (PEP 503).

    ``re.sub(r"[-_.]+", "-", name).lower()``, written without :mod:`re`: a warm
    listing compares names and imports nothing for it.
    """
    key = name.lower().replace("_", "-").replace(".", "-")
    while "--" in key:  # halves every run of dashes: a few rounds even for a hostile name
        key = key.replace("--", "-")
    return key


class PluginRule(Frozen):
    """An allow or deny list of distributions, with where it was declared."""

    __slots__ = ("names", "where")

    names: frozenset[str]
    where: str

    def __init__(self, names: Iterable[str], where: str) -> None:
        super().__init__(names=frozenset(map(distribution_key, names)), where=where)


class Discovery:
    """What reading some input found: definitions in precedence order, problems, a default.

    One file, one source and the fold of all sources are each a ``Discovery``.
    ``warnings`` hold what was left out on purpose (the trust rule).
    """

    __slots__ = ("allow", "default", "definitions", "deny", "problems", "warnings")

    def __init__(self) -> None:
        self.definitions: list[BackendDefinition] = []
        self.problems: list[ManifestError] = []
        self.warnings: list[ManifestError] = []
        self.default: DefaultDeclaration | None = None
        #: The first plugin allow and deny lists by precedence.
        self.allow: PluginRule | None = None
        self.deny: PluginRule | None = None

    def add(self, other: Discovery) -> None:
        """Fold in ``other``, which ranks below everything already here."""
        self.definitions.extend(other.definitions)
        self.problems.extend(other.problems)
        self.warnings.extend(other.warnings)
        if self.default is None:
            self.default = other.default
        if self.allow is None:
            self.allow = other.allow
        if self.deny is None:
            self.deny = other.deny
