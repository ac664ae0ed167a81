"""The registry: merges the sources by precedence, resolves names, loads on first use."""

from __future__ import annotations

import os

# The C lock itself: `threading` would add milliseconds to `import torch_backend_registry`.
from _thread import RLock

from ._definition import BackendDefinition, Source, target_of
from ._errors import (
    BackendRegistryError,
    DuplicateBackendError,
    ManifestError,
    UnknownBackendError,
    warn,
)
from ._sources import ENV_VAR, SOURCE_KINDS, SOURCES, Context

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any, TypeVar, overload

    from ._sources import Found

    CompilerFn = Callable[..., Any]
    F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_EXCLUDE_TAGS = ("debug", "experimental")


class _Index:
    """The merge of some sources: every name and alias to its definitions, highest first."""

    __slots__ = ("by_key", "default", "problems", "warnings")

    def __init__(self) -> None:
        self.by_key: dict[str, list[BackendDefinition]] = {}
        self.default: tuple[str, str, int | None] | None = None
        self.problems: list[ManifestError] = []
        self.warnings: list[ManifestError] = []


class Registry:
    """A backend registry with its own working directory, environment and sources.

    ``cwd`` is where the project manifest is looked for (default: the current
    directory at discovery time), ``environ`` supplies ``TORCH_BACKENDS_PATH``
    (default: ``os.environ``), ``sources`` picks source kinds out of
    ``("runtime", "env", "project", "entry-point", "torch")``; precedence stays
    the documented one whatever the order given.
    """

    def __init__(
        self,
        *,
        cwd: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        sources: Iterable[str] | None = None,
    ) -> None:
        kinds = SOURCE_KINDS if sources is None else tuple(sources)
        unknown = [kind for kind in kinds if kind not in SOURCE_KINDS]
        if unknown:
            raise ValueError(
                f"unknown source kind {unknown[0]!r}; expected some of {', '.join(SOURCE_KINDS)}"
            )
        self._kinds = tuple(kind for kind in SOURCE_KINDS if kind in kinds)
        self._cwd = None if cwd is None else os.fspath(cwd)
        self._environ = environ
        # Files given one by one (`torch-backends check FILE...`): a name may hold
        # os.pathsep, so they cannot go through TORCH_BACKENDS_PATH.
        self._env_files: tuple[str, ...] | None = None
        self._lock = RLock()
        self._runtime: dict[str, BackendDefinition] = {}
        # Named caches, all cleared by refresh(): what each source found, the
        # merges built from them, and the loaded callables by name (the hot path)
        # and by definition (so that a name and its aliases give one object).
        self._found: dict[str, Found] = {}
        self._indexes: dict[bool, _Index] = {}
        self._loaded: dict[str, CompilerFn] = {}
        self._by_definition: dict[BackendDefinition, CompilerFn] = {}
        # Bumped (under the lock) whenever the caches are cleared, so a load that
        # began before never stores a callable into the state that follows.
        self._generation = 0
        self._installed = False

    def __repr__(self) -> str:
        return f"Registry(cwd={self._cwd!r}, sources={self._kinds!r})"

    @property
    def sources(self) -> tuple[str, ...]:
        """The source kinds this registry reads, highest precedence first."""
        return self._kinds

    # ------------------------------------------------------------------ discovery

    def _source(self, kind: str) -> Found:
        found = self._found.get(kind)
        if found is None:
            try:
                cwd: str | None = os.path.abspath(self._cwd or os.getcwd())
            except OSError:  # the working directory was removed under the process
                cwd = None
            if self._env_files is not None:
                entries: Sequence[str] = self._env_files
            else:
                environ = self._environ if self._environ is not None else os.environ
                entries = environ.get(ENV_VAR, "").split(os.pathsep)
            ctx = Context(cwd, entries, self._runtime)
            reader = dict(SOURCES)[kind]
            found = reader(ctx)
            if kind != "runtime":
                self._found[kind] = found
            _warn(found)
        return found

    def _index(self, with_torch: bool = True) -> _Index:
        with_torch = with_torch and "torch" in self._kinds
        index = self._indexes.get(with_torch)
        if index is not None:
            return index
        with self._lock:
            index = self._indexes.get(with_torch)
            if index is not None:  # another thread merged while this one waited
                return index
            index = _Index()
            by_key = index.by_key
            for kind in self._kinds:
                if kind == "torch" and not with_torch:
                    continue
                found = self._source(kind)
                index.problems.extend(found.problems)
                index.warnings.extend(found.warnings)
                if index.default is None and found.default is not None:
                    index.default = found.default
                for definition in found.definitions:
                    name = definition.name
                    if name in by_key:
                        by_key[name].append(definition)
                    else:
                        by_key[name] = [definition]
                    if definition.enabled:
                        for alias in definition.aliases:
                            by_key.setdefault(alias, []).append(definition)
            self._indexes[with_torch] = index
            return index

    def _candidates(self, name: str) -> list[BackendDefinition] | None:
        found = self._index(with_torch=False).by_key.get(name)
        if found is None and "torch" in self._kinds:
            found = self._index().by_key.get(name)
        return found

    def _winner(self, name: str, candidates: list[BackendDefinition] | None) -> BackendDefinition:
        if not candidates:
            raise self._unknown(name)
        winner = candidates[0]
        if winner._error is not None:
            raise winner._error
        if not winner.enabled:
            raise self._unknown(name, note=f"disabled by {winner.source.describe()}")
        return winner

    def _unknown(self, name: str, note: str = "") -> UnknownBackendError:
        import difflib

        index = self._index()
        if not note and index.problems:
            # The name may live in a manifest that could not be read.
            note = f"{len(index.problems)} manifest problem(s) found; run 'torch-backends check'"
        usable = [key for key, defs in index.by_key.items() if defs[0].usable]
        suggestions = difflib.get_close_matches(name, usable, n=3, cutoff=0.6)
        return UnknownBackendError(name, suggestions, note=note)

    # ------------------------------------------------------------------ public API

    if TYPE_CHECKING:

        @overload
        def register_backend(
            self, compiler_fn: F, name: str | None = None, tags: Sequence[str] = ()
        ) -> F: ...
        @overload
        def register_backend(
            self, compiler_fn: None = None, name: str | None = None, tags: Sequence[str] = ()
        ) -> Callable[[F], F]: ...

    def register_backend(
        self,
        compiler_fn: CompilerFn | None = None,
        name: str | None = None,
        tags: Sequence[str] = (),
    ) -> Any:
        """Register ``compiler_fn`` under ``name`` (default: its ``__name__``).

        Usable bare (``@register_backend``) or called
        (``@register_backend(name="x", tags=("debug",))``), as PyTorch's; returns
        the function. A runtime registration outranks every manifest.
        """
        if compiler_fn is None:

            def decorator(fn: F) -> F:
                return self.register_backend(fn, name=name, tags=tags)

            return decorator
        if not callable(compiler_fn):
            raise TypeError(f"compiler_fn must be callable, got {type(compiler_fn).__name__}")
        name = name or compiler_fn.__name__
        with self._lock:
            if name in self._runtime:
                raise DuplicateBackendError(name, self._runtime[name].source)
            source = Source("runtime", module=getattr(compiler_fn, "__module__", None))
            self._runtime[name] = BackendDefinition(
                name, source, tags=tuple(tags), obj=compiler_fn, target=target_of(compiler_fn)
            )
            # As PyTorch does; a builtin or slotted callable keeps its tags in the definition.
            # (try/except rather than contextlib.suppress: contextlib costs import time.)
            try:  # noqa: SIM105
                compiler_fn._tags = tuple(tags)  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            self._indexes.clear()
            self._loaded.pop(name, None)
            self._generation += 1
            if self._installed:
                from ._torch import install_names

                install_names(self, [name])
        return compiler_fn

    def lookup_backend(self, name_or_fn: str | CompilerFn) -> CompilerFn:
        """Return the callable for a backend name, importing it on first use.

        A callable passes through unchanged. Raises
        :class:`UnknownBackendError`, :class:`ManifestError` (the definition is
        broken) or :class:`BackendLoadError` (its import failed; not cached).
        """
        try:
            return self._loaded[name_or_fn]  # type: ignore[index]
        except (KeyError, TypeError):
            pass
        if isinstance(name_or_fn, str):
            return self._load(name_or_fn)
        if callable(name_or_fn):
            return name_or_fn
        raise TypeError(
            f"expected a backend name or a callable, got {type(name_or_fn).__name__} {name_or_fn!r}"
        )

    def _load(self, name: str) -> CompilerFn:
        # No registry lock is held while importing: a slow or hanging import must
        # not stall lookups of other names, listing, or refresh(). Python's own
        # per-module import lock makes threads that import one target wait for
        # each other, so it runs once; the first callable stored is what all get.
        generation = self._generation
        definition = self._winner(name, self._candidates(name))
        if definition._obj is not None:
            fn = definition._obj
        elif definition.chain is not None:
            from ._chain import ChainBackend
            from ._loader import check_requirements

            self._check_cycle(definition)
            check_requirements(definition)
            fn = ChainBackend(self, definition)
        else:
            from ._loader import load_target

            fn = load_target(definition)
        with self._lock:
            if generation != self._generation:
                return fn  # found before a refresh(): right for this call, not to keep
            # One callable a definition, whichever of its names was asked for first.
            fn = self._loaded[name] = self._by_definition.setdefault(definition, fn)
            return fn

    def list_backends(self, exclude_tags: Sequence[str] | None = DEFAULT_EXCLUDE_TAGS) -> list[str]:
        """Sorted backend names, leaving out those with a tag in ``exclude_tags``.

        Aliases are not listed (they resolve to their backend). Imports no backend code.
        """
        return [d.name for d in self.definitions(exclude_tags)]

    def definitions(
        self, exclude_tags: Sequence[str] | None = DEFAULT_EXCLUDE_TAGS
    ) -> list[BackendDefinition]:
        """The winning definition of every listed backend, sorted by name."""
        exclude = set(exclude_tags or ())
        result = []
        for key, candidates in self._index().by_key.items():
            winner = candidates[0]
            if winner.name != key or not winner.usable:
                continue
            if exclude and exclude.intersection(winner.tags):
                continue
            result.append(winner)
        result.sort(key=lambda d: d.name)
        return result

    def backend_info(self, name: str) -> BackendDefinition:
        """The resolved definition of ``name`` (or of the backend it is an alias of).

        Its ``shadowed`` holds the lower definitions of the same name. Imports nothing.
        """
        candidates = self._index().by_key.get(name)
        winner = self._winner(name, candidates)
        assert candidates is not None
        return winner._replace_shadowed(tuple(candidates[1:]))

    def is_registered_backend(self, compiler_fn: CompilerFn) -> bool:
        """Whether ``compiler_fn`` is (or wraps) a backend of this registry, as PyTorch's check."""
        with self._lock:  # other threads may be adding to both
            known = [d._obj for d in self._runtime.values()]
            known.extend(self._loaded.values())
        if any(fn is compiler_fn for fn in known):
            return True
        compiler_name = getattr(compiler_fn, "compiler_name", None)
        if isinstance(compiler_name, str):
            candidates = self._candidates(compiler_name)
            if candidates and candidates[0].usable:
                return True
        inner = getattr(compiler_fn, "compiler_fn", None)
        return inner is not None and any(fn is inner for fn in known)

    def refresh(self) -> None:
        """Forget discovered definitions and loaded callables; re-read on next need.

        Runtime registrations are kept. After :meth:`install`, PyTorch's registry
        needs the names now: the manifests are re-read at once and backends new
        to them are installed too.
        """
        with self._lock:
            self._found.clear()
            self._indexes.clear()
            self._loaded.clear()
            self._by_definition.clear()
            self._generation += 1
        if self._installed:
            self.install()

    def install(self) -> None:
        """Make every backend usable as ``torch.compile(backend="name")``, importing no target.

        Also applies a manifest's ``default``. Idempotent.
        """
        from ._torch import install

        install(self)

    def default_backend(self) -> tuple[str, str, int | None] | None:
        """The first manifest ``default`` by precedence, as ``(name, path, line)``."""
        return self._index(with_torch=False).default

    def problems(self, *, with_torch: bool = True) -> list[BackendRegistryError]:
        """Every problem of the discovered manifests, and chains that loop."""
        index = self._index(with_torch)
        problems: list[BackendRegistryError] = [*index.problems, *index.warnings]
        if index.default is not None:
            name, path, line = index.default
            try:
                self._winner(name, index.by_key.get(name))
            except UnknownBackendError as exc:
                problems.append(
                    ManifestError(str(exc), path=path, line=line, key=_key_in(path, "default"))
                )
            except BackendRegistryError:
                pass  # the backend's own problem is reported already
        for key, candidates in index.by_key.items():
            winner = candidates[0]
            if winner.name == key and winner.usable and winner.chain is not None:
                try:
                    self._check_cycle(winner, with_torch)
                except ManifestError as exc:
                    problems.append(exc)
        return problems

    def _check_cycle(self, definition: BackendDefinition, with_torch: bool = True) -> None:
        index = self._index(with_torch)
        path = [definition.name]

        def visit(current: BackendDefinition) -> None:
            for member in current.chain or ():
                candidates = index.by_key.get(member)
                if not candidates or not candidates[0].usable:
                    continue
                nxt = candidates[0]
                if nxt is definition:
                    trail = " -> ".join([*path, member])
                    source = definition.source
                    raise ManifestError(
                        f"chain {definition.name!r} names itself ({trail}); remove the loop",
                        path=source.path,
                        line=source.line,
                        key=_key_in(source.path, f"backends.{definition.name}.chain"),
                    )
                if nxt.chain is not None and nxt.name not in path:
                    path.append(nxt.name)
                    visit(nxt)
                    path.pop()

        visit(definition)


def _key_in(path: str | None, key: str) -> str:
    """A manifest key as written in its file: under ``tool.torch-backends`` in pyproject.toml."""
    if path is not None and os.path.basename(path) == "pyproject.toml":
        return f"tool.torch-backends.{key}"
    return key


def _warn(found: Found) -> None:
    if not (found.problems or found.warnings):
        return
    for skipped in found.warnings:
        warn(str(skipped))
    for problem in found.problems:
        warn(f"{problem} (left out)")
