"""The registry: runtime registrations, listeners, and the snapshot of its sources it asks."""

from __future__ import annotations

import contextlib
import functools
import os

from ._definition import SOURCE_KINDS, BackendDefinition, BackendInfo, Source, target_of
from ._errors import BackendRegistryError, DuplicateBackendError, UnknownBackendError
from ._forksafe import ForkSafeLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any, TypeVar, overload

    from ._definition import Problem, SourceKind
    from ._merge import Index
    from ._snapshot import Snapshot
    from ._sources import Context

    CompilerFn = Callable[..., Any]
    F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_EXCLUDE_TAGS = ("debug", "experimental")


class Registry:
    """A backend registry with its own working directory, environment and sources.

    ``cwd`` is where the project manifest is looked for (default: the current
    directory at discovery time; it must exist), ``environ`` supplies
    ``TORCH_BACKENDS_PATH`` and the other ``TORCH_BACKENDS_*`` settings
    (default: ``os.environ`` as it is at discovery time), ``sources`` picks
    source kinds out of ``("runtime", "env", "project", "entry-point",
    "torch")`` (precedence stays the documented one whatever the order given),
    and ``files`` names manifests to read as the env source instead of
    ``TORCH_BACKENDS_PATH`` (what ``torch-backends check FILE...`` does).
    """

    def __init__(
        self,
        *,
        cwd: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        sources: Iterable[str] | None = None,
        files: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        kinds = SOURCE_KINDS if sources is None else tuple(sources)
        if unknown := [kind for kind in kinds if kind not in SOURCE_KINDS]:
            raise ValueError(
                f"unknown source kind {unknown[0]!r}; expected some of {', '.join(SOURCE_KINDS)}"
            )
        #: The source kinds this registry reads, highest precedence first.
        self.sources: tuple[SourceKind, ...] = tuple(k for k in SOURCE_KINDS if k in kinds)
        self._cwd = None if cwd is None else os.fspath(cwd)
        if self._cwd is not None and not os.path.isdir(self._cwd):
            raise NotADirectoryError(
                f"Registry(cwd={self._cwd!r}): no such folder; the project manifest is"
                " looked for there and in its parents"
            )
        self._environ = None if environ is None else dict(environ)
        self._files = None if files is None else tuple(os.fspath(f) for f in files)
        self._lock = ForkSafeLock()
        self._runtime: dict[str, BackendDefinition] = {}
        # Everything read and derived, replaced whole by refresh() and registrations:
        # a lookup running meanwhile sees the old state or the new one, never a mix.
        self._snapshot: Snapshot | None = None
        # After refresh(), entry points are read for real, never from the disk cache.
        self._fresh = False
        self._listeners: list[Callable[[Registry], None]] = []

    def __repr__(self) -> str:
        return f"Registry(cwd={self._cwd!r}, sources={self.sources!r})"

    @property
    def context(self) -> Context:
        """What this registry reads with, fixed until refresh(): its ``cwd`` (``None``: the
        folder was removed), ``environ``, ``files``, and the ``cache`` it remembers in."""
        return self._current().context

    def on_change(self, listener: Callable[[Registry], None]) -> None:
        """Call ``listener(self)`` after every refresh() and registration (once per listener)."""
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def _current(self, live: bool = False) -> Snapshot:
        """The snapshot, taken on first need; ``live``: PyTorch's registry read again where
        it changed."""
        snapshot = self._snapshot
        if snapshot is None:  # taken once under the lock; read without it ever after
            with self._lock:
                snapshot = self._snapshot
                if snapshot is None:
                    snapshot = self._snapshot = self._taken()
        if live and snapshot.torch_changed():
            with self._lock:
                if self._snapshot is snapshot:
                    self._snapshot = snapshot.derive(torch=False)
            return self._current()
        return snapshot

    def _taken(self) -> Snapshot:
        """A snapshot of the working directory and the environment as they are now."""
        from ._snapshot import Snapshot
        from ._sources import Context
        from ._sources.cache import Cache, cache_folder

        here: str | None = None
        with contextlib.suppress(OSError):  # the working directory was removed under the process
            here = os.path.abspath(self._cwd or os.getcwd())
        environ = dict(os.environ if self._environ is None else self._environ)
        runtime = tuple(self._runtime.values())
        cache = Cache(cache_folder(environ))
        context = Context(here, environ, runtime, cache, self._files, self._fresh)
        return Snapshot(self.sources, context, self.lookup_backend, self.backend_info)

    def _changed(self, registered: bool) -> None:
        """Forget what the runtime registrations decided (or everything); tell the listeners."""
        with self._lock:
            if registered and (snapshot := self._snapshot) is not None:
                self._snapshot = snapshot.derive(runtime=tuple(self._runtime.values()))
            else:
                self._snapshot = None
            listeners = list(self._listeners)
        for listener in listeners:  # outside the lock: the torch bridge takes its own first
            listener(self)

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
        the function. A runtime registration outranks every manifest; a name of
        PyTorch's own backends is refused, as PyTorch's registry refuses it.
        """
        if compiler_fn is None:
            return functools.partial(self.register_backend, name=name, tags=tags)
        if not callable(compiler_fn):
            raise TypeError(f"compiler_fn must be callable, got {type(compiler_fn).__name__}")
        name = name or compiler_fn.__name__
        tags = tuple(tags)
        # PyTorch's names are refused whether or not torch.compile's registry is loaded.
        pytorch = self._current().pytorch_names()
        with self._lock:
            if name in self._runtime:
                raise DuplicateBackendError(name, self._runtime[name].source)
            if name in pytorch:
                raise DuplicateBackendError(name, Source("torch"))
            # Tagged as PyTorch tags it (a builtin keeps them in the definition only).
            with contextlib.suppress(AttributeError, TypeError):
                compiler_fn._tags = tags  # type: ignore[attr-defined]
            source = Source("runtime", module=getattr(compiler_fn, "__module__", None))
            self._runtime[name] = BackendDefinition(
                name, source, tags=tags, compiler_fn=compiler_fn, target=target_of(compiler_fn)
            )
        self._changed(registered=True)
        return compiler_fn

    def unregister_backend(self, name: str) -> None:
        """Forget a runtime registration (for tests and reloading code); others stay."""
        with self._lock:
            if self._runtime.pop(name, None) is None:
                raise UnknownBackendError(name, note="not registered at runtime")
        self._changed(registered=True)

    def refresh(self) -> None:
        """Forget discovered definitions and loaded callables; re-read on next need, for real
        (entry points too, not from the disk cache). Runtime registrations are kept."""
        self._fresh = True
        self._changed(registered=False)

    def lookup_backend(self, name_or_fn: str | CompilerFn) -> CompilerFn:
        """Return the callable for a backend name, importing it on first use.

        A callable passes through unchanged. Raises
        :class:`UnknownBackendError`, :class:`ManifestError` (the definition is
        broken) or :class:`BackendLoadError` (its import failed; not cached).
        """
        try:
            return self._snapshot.loaded[name_or_fn]  # type: ignore[index, union-attr]
        except (KeyError, TypeError, AttributeError):
            pass
        if isinstance(name_or_fn, str):
            return self._current(live=True).load(name_or_fn)
        if callable(name_or_fn):
            return name_or_fn
        raise TypeError(
            f"expected a backend name or a callable, got {type(name_or_fn).__name__} {name_or_fn!r}"
        )

    def list_backends(self, exclude_tags: Sequence[str] | None = DEFAULT_EXCLUDE_TAGS) -> list[str]:
        """Sorted backend names, leaving out those with a tag in ``exclude_tags``.

        Aliases are not listed (they resolve to their backend). Imports no backend code.
        """
        return [d.name for d in self.definitions(exclude_tags)]

    def definitions(
        self,
        exclude_tags: Sequence[str] | None = DEFAULT_EXCLUDE_TAGS,
        *,
        with_torch: bool = True,
        broken: bool = False,
    ) -> list[BackendDefinition]:
        """The winning definition of every listed backend, sorted by name.

        ``with_torch=False`` leaves PyTorch's own backends out (and torch unimported);
        ``broken=True`` adds the backends that cannot be used as declared, each with
        its ``problem``.
        """
        exclude = set(exclude_tags or ())
        winners = self.index(with_torch=with_torch).winners(broken=broken)
        return sorted((d for d in winners if exclude.isdisjoint(d.tags)), key=lambda d: d.name)

    def backend_info(self, name: str) -> BackendInfo:
        """What ``name`` resolves to: its definition, the lower definitions of that name
        it shadows, and the alias asked for. Imports nothing."""
        return self._current(live=True).info(name)

    def why_unavailable(self, definition: BackendDefinition | BackendInfo) -> str | None:
        """Why ``definition`` cannot be used here, or ``None`` when it can, without importing.

        Its ``requires`` are looked for (no code runs); a chain can be used when one
        of its members can, and the reason names each member's.
        """
        if isinstance(definition, BackendInfo):
            definition = definition.definition
        return self._current().why_unavailable(definition)

    def is_registered_backend(self, compiler_fn: CompilerFn) -> bool:
        """Whether ``compiler_fn`` is (or wraps) a backend of this registry, as PyTorch's check."""
        known = self._current(live=True).callables()
        if any(fn is compiler_fn for fn in known):
            return True
        if isinstance(compiler_name := getattr(compiler_fn, "compiler_name", None), str):
            with contextlib.suppress(BackendRegistryError):
                self.backend_info(compiler_name)
                return True
        inner = getattr(compiler_fn, "compiler_fn", None)
        return inner is not None and any(fn is inner for fn in known)

    def index(self, *, with_torch: bool = True) -> Index:
        """The merge of what this registry read: every name with its candidates."""
        return self._current(live=with_torch).index(with_torch)

    def problems(self, *, with_torch: bool = True) -> list[Problem]:
        """Every problem of the discovered manifests: bad entries, chains, the default (a
        ``"note"`` is no fault: a chain member not installed here, which the chain skips)."""
        index = self.index(with_torch=with_torch)
        # Both tables hold chains only, by name; a chain's own problem before its members'.
        chains = {**index.unknown_members(), **index.chain_problems}
        problems = [*index.problems, index.default_problem()]
        problems += [chains.get(d.name) for d in index.winners()]
        # What merging found a definition cannot be (a pick of no installed distribution):
        # the lookup raises it; check says it.
        listed = set(problems)
        problems += [d.problem for d in index.winners(broken=True) if d.problem not in listed]
        return [problem for problem in problems if problem is not None]

    def facts(self, *, with_torch: bool = True) -> dict[str, Any]:
        """Every usable name's facts and every alias: what the fingerprint and a lock hold."""
        from ._identity import registry_facts
        from ._sources.pytorch import torch_version

        return registry_facts(self.index(with_torch=with_torch), torch_version())
