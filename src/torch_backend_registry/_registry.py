"""The registry: caches what the sources found, resolves names by the merge, loads on first use."""

from __future__ import annotations

import os

from ._definition import SOURCE_KINDS, BackendDefinition, Source, target_of
from ._errors import (
    BackendRegistryError,
    DuplicateBackendError,
    ManifestError,
    UnknownBackendError,
    warn,
)
from ._locks import ForkSafeLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any, TypeVar, overload

    from ._definition import DefaultDeclaration, Discovery, SourceKind
    from ._doctor import Verdict
    from ._merge import Index

    CompilerFn = Callable[..., Any]
    F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_EXCLUDE_TAGS = ("debug", "experimental")


class Registry:
    """A backend registry with its own working directory, environment and sources.

    ``cwd`` is where the project manifest is looked for (default: the current
    directory at discovery time; it must exist), ``environ`` supplies
    ``TORCH_BACKENDS_PATH`` (default: ``os.environ``), ``sources`` picks source
    kinds out of ``("runtime", "env", "project", "entry-point", "torch")``
    (precedence stays the documented one whatever the order given), and
    ``files`` names manifests to read as the env source instead of
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
        unknown = [kind for kind in kinds if kind not in SOURCE_KINDS]
        if unknown:
            raise ValueError(
                f"unknown source kind {unknown[0]!r}; expected some of {', '.join(SOURCE_KINDS)}"
            )
        self._kinds: tuple[SourceKind, ...] = tuple(k for k in SOURCE_KINDS if k in kinds)
        self._cwd = None if cwd is None else os.fspath(cwd)
        if self._cwd is not None and not os.path.isdir(self._cwd):
            raise NotADirectoryError(
                f"Registry(cwd={self._cwd!r}): no such folder; the project manifest is"
                " looked for there and in its parents"
            )
        self._environ = environ
        self._files = None if files is None else tuple(os.fspath(f) for f in files)
        self._lock = ForkSafeLock()
        self._runtime: dict[str, BackendDefinition] = {}
        # Named caches, all cleared by refresh(): what each source found, the
        # merges built from them, availability answers, and the loaded callables
        # by name (the hot path) and by definition (a name and its aliases give one object).
        self._found: dict[SourceKind, Discovery] = {}
        self._indexes: dict[bool, Index] = {}
        self._available: dict[BackendDefinition, str | None] = {}
        self._loaded: dict[str, CompilerFn] = {}
        self._by_definition: dict[BackendDefinition, CompilerFn] = {}
        # Bumped (under the lock) whenever the caches are cleared, so a load that
        # began before never stores a callable into the state that follows.
        self._generation = 0
        self._installed = False
        self._verified = False
        # What the merges warned of since discovery, so that each is said once.
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"Registry(cwd={self._cwd!r}, sources={self._kinds!r})"

    @property
    def sources(self) -> tuple[SourceKind, ...]:
        """The source kinds this registry reads, highest precedence first."""
        return self._kinds

    # ------------------------------------------------------------------ discovery

    def _discover(self, kind: SourceKind) -> Discovery:
        found = self._found.get(kind)
        if found is not None:
            return found
        from ._sources import ENV_VAR, READERS, Context

        try:
            cwd: str | None = os.path.abspath(self._cwd or os.getcwd())
        except OSError:  # the working directory was removed under the process
            cwd = None
        environ = self._environ if self._environ is not None else os.environ
        entries = environ.get(ENV_VAR, "").split(os.pathsep)
        found = READERS[kind](Context(cwd, entries, self._runtime, self._files, environ))
        if kind != "runtime":
            self._found[kind] = found
        _warn(found)
        return found

    def _index(self, with_torch: bool = True) -> Index:
        with_torch = with_torch and "torch" in self._kinds
        index = self._indexes.get(with_torch)
        if index is not None:
            return index
        from ._merge import merge

        with self._lock:
            index = self._indexes.get(with_torch)
            if index is None:  # else another thread merged while this one waited
                kinds = [k for k in self._kinds if with_torch or k != "torch"]
                index = self._indexes[with_torch] = merge([self._discover(k) for k in kinds])
                for said in (*index.refused, *index.conflicts.values()):
                    if str(said) not in self._warned:  # both merges find them: say it once
                        self._warned.add(str(said))
                        warn(str(said))
            return index

    def _resolving_index(self, name: str) -> Index:
        """The index to resolve ``name`` in.

        PyTorch's backends are the lowest source, and reading them imports torch:
        they are read on a miss, or once torch.compile's registry is loaded
        anyway (then their names also refuse other definitions, as PyTorch's
        registry does). A name PyTorch's registry gained since is found at once.
        """
        index = self._index(with_torch=False)
        if "torch" not in self._kinds:
            return index
        from ._torch import dynamo_imported

        if name in index.by_key and not dynamo_imported():
            return index
        index = self._index()
        if name not in index.by_key and self._pytorch_changed():
            index = self._index()
        return index

    def _pytorch_changed(self) -> bool:
        """Whether PyTorch's registry changed since it was read; if so, forget that reading."""
        from ._torch import torch_names_changed

        found = self._found.get("torch")
        if found is None or not torch_names_changed(d.name for d in found.definitions):
            return False
        with self._lock:
            self._found.pop("torch", None)
            self._forget_merges()
        return True

    def _resolve(self, name: str) -> BackendDefinition:
        return self._resolving_index(name).resolve(name)

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
            pytorch = self._pytorch_definition(name)
            if pytorch is not None:  # as PyTorch's own registry refuses it
                raise DuplicateBackendError(name, pytorch.source)
            source = Source("runtime", module=getattr(compiler_fn, "__module__", None))
            self._runtime[name] = BackendDefinition(
                name,
                source,
                tags=tuple(tags),
                compiler_fn=compiler_fn,
                target=target_of(compiler_fn),
            )
            # As PyTorch does; a builtin or slotted callable keeps its tags in the definition.
            # (try/except rather than contextlib.suppress: contextlib costs import time.)
            try:  # noqa: SIM105
                compiler_fn._tags = tuple(tags)  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            self._forget_merges()
            installed = self._installed
        # Outside the registry lock: the torch bridge takes its own lock, then ours.
        if installed:
            from ._torch import install_names

            install_names(self, [name])
        return compiler_fn

    def _pytorch_definition(self, name: str) -> BackendDefinition | None:
        """PyTorch's own backend of that name, when torch.compile's registry is loaded."""
        from ._torch import dynamo_imported

        if "torch" not in self._kinds or not dynamo_imported():
            return None
        self._pytorch_changed()
        for definition in self._discover("torch").definitions:
            if definition.name == name:
                return definition
        return None

    def unregister_backend(self, name: str) -> None:
        """Forget a runtime registration (for tests and reloading code); others stay."""
        with self._lock:
            if self._runtime.pop(name, None) is None:
                raise UnknownBackendError(name, note="not registered at runtime")
            self._forget_merges()

    def _forget_merges(self) -> None:
        self._indexes.clear()
        self._available.clear()
        self._loaded.clear()
        self._by_definition.clear()
        self._generation += 1

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
        if not self._verified and os.environ.get("TORCH_BACKENDS_VERIFY", "0") not in ("", "0"):
            self._verify_if_distributed()
        generation = self._generation
        index = self._resolving_index(name)
        definition = index.resolve(name)
        fn: CompilerFn
        if definition.compiler_fn is not None:
            fn = definition.compiler_fn
        elif definition.chain is not None:
            from ._chain import ChainBackend
            from ._loader import check_requirements

            problem = self._chain_problem(definition)
            if problem is not None:
                raise problem
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

    def _verify_if_distributed(self) -> None:
        """TORCH_BACKENDS_VERIFY: the cluster check, once, at the first lookup of a rank."""
        from ._cluster import distributed_ready

        if distributed_ready():
            self.verify_consistent()

    def _chain_problem(
        self, definition: BackendDefinition, *, unknown_members: bool = False
    ) -> ManifestError | None:
        """Why a chain cannot be used (it loops, nests too deeply), or names no backend.

        PyTorch's backends are read only where a member is not found without them.
        """

        def problem(index: Index) -> ManifestError | None:
            found = index.chain_problems().get(definition.name)
            if found is None and unknown_members:
                found = index.unknown_members().get(definition.name)
            return found

        found = problem(self._index(with_torch=False))
        if found is not None and "torch" in self._kinds:
            found = problem(self._index())
        return found

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
        if with_torch and "torch" in self._kinds:
            self._pytorch_changed()
        result = [
            d
            for d in self._index(with_torch).winners(broken=broken)
            if not (exclude and exclude.intersection(d.tags))
        ]
        result.sort(key=lambda d: d.name)
        return result

    def backend_info(self, name: str) -> BackendDefinition:
        """The resolved definition of ``name`` (or of the backend it is an alias of).

        Its ``shadowed`` holds the lower definitions of the same name. Imports nothing.
        """
        index = self._index()
        if name not in index.by_key and "torch" in self._kinds and self._pytorch_changed():
            index = self._index()
        winner = index.resolve(name)
        return winner.with_shadowed(index.shadowed(winner))

    def why_unavailable(self, definition: BackendDefinition) -> str | None:
        """Why ``definition`` cannot be used here, or ``None`` when it can, without importing.

        Its ``requires`` are looked for (no code runs); a chain can be used when one
        of its members can, and the reason names each member's.
        """
        if definition in self._available:
            return self._available[definition]
        from ._loader import missing_requirements

        reason: str | None = None
        missing = missing_requirements(definition)
        if missing:
            reason = "missing " + ", ".join(missing)
        elif definition.source.kind == "torch":
            from ._torch import missing_device

            reason = missing_device(definition.name)
        elif definition.chain is not None:
            reason = self._why_chain_unavailable(definition)
        self._available[definition] = reason
        return reason

    def _why_chain_unavailable(self, definition: BackendDefinition) -> str | None:
        problem = self._chain_problem(definition)
        if problem is not None:
            return problem.message
        self._available[definition] = "its members refer back to it"  # a guard while walking
        index = self._index()
        reasons = []
        for member in dict.fromkeys(definition.chain or ()):
            try:
                info = index.resolve(member)
            except BackendRegistryError as exc:
                reasons.append(f"{member}: {_first_clause(exc)}")
                continue
            why = self.why_unavailable(info)
            if why is None:
                return None
            reasons.append(f"{member}: {why}")
        return "no member can be used (" + "; ".join(reasons) + ")"

    def is_registered_backend(self, compiler_fn: CompilerFn) -> bool:
        """Whether ``compiler_fn`` is (or wraps) a backend of this registry, as PyTorch's check."""
        with self._lock:  # other threads may be adding to both
            known = [d.compiler_fn for d in self._runtime.values()]
            known.extend(self._loaded.values())
        if "torch" in self._kinds:
            from ._torch import pytorch_callables

            known.extend(pytorch_callables())
        if any(fn is compiler_fn for fn in known):
            return True
        compiler_name = getattr(compiler_fn, "compiler_name", None)
        if isinstance(compiler_name, str):
            try:
                self._resolve(compiler_name)
            except BackendRegistryError:
                pass
            else:
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
            self._warned.clear()
            self._forget_merges()
            installed = self._installed
        if installed:
            self.install()

    def resolved(self) -> dict[str, BackendDefinition]:
        """Every usable name and alias, with the definition it resolves to."""
        index = self._index()
        found = {key: index.get(key) for key in index.by_key}
        return {key: d for key, d in found.items() if d is not None}

    def fingerprint(self) -> str:
        """A short stable hash of what every name resolves to: the same inputs give the
        same hash in any process on any machine (no paths, no line numbers in it)."""
        from ._fingerprint import fingerprint

        return fingerprint(self)

    def verify_consistent(self, group: Any = None, timeout: float = 60.0) -> str:
        """Check, over torch.distributed, that every rank resolves names alike.

        Every rank calls it once the process group is initialised. Returns the
        fingerprint when all agree; otherwise every rank raises the same
        :class:`InconsistentRegistryError` naming the differing ranks, hosts,
        names and fields. A rank that never calls makes the others raise after
        ``timeout`` seconds, naming it.
        """
        from ._cluster import verify_consistent

        self._verified = True
        return verify_consistent(self, group, timeout)

    def install(self, *, locked: bool | str | os.PathLike[str] | None = None) -> None:
        """Make every backend usable as ``torch.compile(backend="name")``, importing no target.

        Also applies a manifest's ``default``. Idempotent. With ``locked`` (``True``
        for the ``backends.lock`` beside the project manifest, or a lock's path),
        or ``TORCH_BACKENDS_LOCKED`` in the environment, a registry that drifted
        from its lock raises :class:`LockDriftError` and installs nothing.
        """
        from ._fingerprint import check_locked, lock_from_environment, lock_path
        from ._torch import apply_default, install_names, prepare

        lock: str | None
        if locked is None:
            lock = lock_from_environment(self, self._environ or os.environ)
        elif locked is False:
            lock = None
        else:
            lock = lock_path(self) if locked is True else os.fspath(locked)
        if lock is not None:
            check_locked(self, lock)
        prepare()
        with self._lock:
            self._installed = True
        index = self._index(with_torch=False)
        names = [key for key, found in index.by_key.items() if _installs(found)]
        # PyTorch would load a plugin the policy left out: a stand-in refuses it there too.
        names.extend(name for name in index.excluded if name not in index.by_key)
        # Where distributions disagree, PyTorch takes os.listdir's order: a stand-in
        # makes torch.compile run the one this registry resolves to.
        names.extend(index.conflicts)
        install_names(self, names)
        apply_default(self, self.default_backend())

    def doctor(
        self,
        names: Sequence[str] | None = None,
        *,
        bench: bool = False,
        timeout: float = 300.0,
        model: str | None = None,
        device: str = "cpu",
        jobs: int | None = None,
        fresh: bool = False,
        on_progress: Callable[[str, int, float], None] | None = None,
    ) -> list[Verdict]:
        """Probe each backend (default: every listed one) in its own subprocess.

        Each goes as far as it can: requirements found, target imported,
        ``torch.compile`` forward matching eager, backward gradients matching,
        and with ``bench`` its compile time and speed against eager. One
        :class:`Verdict` a backend, best first. Verdicts are remembered per
        definition and environment; ``fresh`` probes again anyway.
        """
        from ._doctor import Probe, run

        probe = Probe(
            timeout=timeout, bench=bench, model=model, device=device, jobs=jobs, fresh=fresh
        )
        return run(self, names, probe, on_progress)

    def probe_config(self) -> dict[str, Any]:
        """What a subprocess needs to build this same registry: folder, environment, sources."""
        from ._sources import ENV_VAR

        env = dict(os.environ)
        if self._environ is not None:
            env.pop(ENV_VAR, None)
            if ENV_VAR in self._environ:
                env[ENV_VAR] = self._environ[ENV_VAR]
        return {
            "cwd": self._cwd or os.getcwd(),
            "env": env,
            "sources": list(self._kinds),
            "files": None if self._files is None else list(self._files),
        }

    def default_backend(self) -> DefaultDeclaration | None:
        """The first manifest ``default`` by precedence."""
        return self._index(with_torch=False).default

    def problems(self, *, with_torch: bool = True) -> list[BackendRegistryError]:
        """Every problem of the discovered manifests: bad entries, chains, the default."""
        index = self._index(with_torch)
        problems: list[BackendRegistryError] = [*index.problems, *index.warnings]
        default = index.default_problem()
        if default is not None and with_torch and "torch" in self._kinds:
            default = self._index().default_problem()
        if default is not None:
            problems.append(default)
        for definition in index.winners():
            if definition.chain is not None:
                problem = self._chain_problem(definition, unknown_members=True)
                if problem is not None:
                    problems.append(problem)
        return problems


def _installs(candidates: list[BackendDefinition]) -> bool:
    """Whether torch.compile needs a stand-in for the name these candidates define.

    PyTorch reads the entry points itself (the same ones, in the same order): an
    entry point's own name needs none, unless a higher definition hides it
    (disabled, broken), which torch.compile must then refuse too.
    """
    top = candidates[0]
    if top.usable:
        return top.source.kind not in ("entry-point", "torch")
    return any(lower.source.kind == "entry-point" for lower in candidates[1:])


def _first_clause(exc: BaseException) -> str:
    return str(exc).split(". ", 1)[0]


def _warn(found: Discovery) -> None:
    for skipped in found.warnings:
        warn(str(skipped))
    for problem in found.problems:
        warn(f"{problem} (left out)")
