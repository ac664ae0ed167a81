"""Immutable values describing a backend and where it was declared."""

from __future__ import annotations

from types import MappingProxyType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ._errors import ManifestError

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class _Frozen:
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


def target_of(fn: object) -> str | None:
    """``module:qualname`` of a function, or ``None`` where that names nothing importable."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}:{qualname}"
    return None


class Source(_Frozen):
    """Where a definition came from.

    ``kind`` is one of ``"runtime"``, ``"env"``, ``"project"``, ``"entry-point"``
    and ``"torch"``; ``path`` and ``line`` locate a manifest entry (the line of
    its table header), ``distribution`` and ``version`` an entry point,
    ``module`` a ``register_backend`` call. What does not apply is ``None``.
    """

    __slots__ = ("kind", "path", "line", "distribution", "version", "module")  # noqa: RUF023

    kind: str
    path: str | None
    line: int | None
    distribution: str | None
    version: str | None
    module: str | None

    def __init__(
        self,
        kind: str,
        *,
        path: str | None = None,
        line: int | None = None,
        distribution: str | None = None,
        version: str | None = None,
        module: str | None = None,
    ) -> None:
        super().__init__(
            kind=kind,
            path=path,
            line=line,
            distribution=distribution,
            version=version,
            module=module,
        )

    def describe(self) -> str:
        """A short human location: ``PATH:LINE``, a distribution, or a module."""
        if self.path is not None:
            return self.path if self.line is None else f"{self.path}:{self.line}"
        if self.distribution is not None:
            version = f" {self.version}" if self.version else ""
            return f"distribution {self.distribution!r}{version}"
        if self.module is not None:
            return f"register_backend in module {self.module!r}"
        return "PyTorch" if self.kind == "torch" else self.kind


class BackendDefinition(_Frozen):
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
        "_python_path",
        "_obj",
        "_error",
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
    _python_path: tuple[str, ...]
    _obj: Callable[..., Any] | None
    _error: ManifestError | None

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
        obj: Callable[..., Any] | None = None,
        error: ManifestError | None = None,
    ) -> None:
        super().__init__(
            name=name,
            source=source,
            target=target,
            chain=chain,
            tags=tags,
            description=description,
            aliases=aliases,
            requires=requires,
            options=MappingProxyType(dict(options)) if options else _EMPTY,
            shadowed=shadowed,
            enabled=enabled,
            _python_path=python_path,
            _obj=obj,
            _error=error,
        )

    def _key(self) -> tuple[Any, ...]:
        key = list(super()._key())
        key[self.__slots__.index("options")] = tuple(sorted(self.options.items(), key=repr))
        return tuple(key)

    @property
    def usable(self) -> bool:
        """Whether this definition can be looked up (enabled and without errors)."""
        return self.enabled and self._error is None

    def _replace_shadowed(self, shadowed: tuple[BackendDefinition, ...]) -> BackendDefinition:
        clone = object.__new__(BackendDefinition)
        for slot in self.__slots__:
            object.__setattr__(clone, slot, getattr(self, slot))
        object.__setattr__(clone, "shadowed", shadowed)
        return clone
