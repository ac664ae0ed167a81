"""One reading of a registry's sources, taken on first need, and the names resolved and loaded
from it until refresh().

A snapshot fixes the working directory and the environment when it is made, reads each
source at most once (PyTorch's only when asked, as it imports torch), and holds what was
derived from that reading: the merge, and the callables loaded. PyTorch's registry is a dict
that plugins may add to at any time: :meth:`Snapshot.torch_changed` compares its names with
what was read.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from dataclasses import field

from ._errors import BackendRegistryError, ManifestError, UnknownBackendError, warn_problem
from ._forksafe import ForkSafeLock
from ._sources import READERS, Context, pytorch
from ._sources.entry_points import read_entry_points
from ._sources.finding import missing_requirements

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from ._definition import BackendDefinition, BackendInfo, Discovery, SourceKind
    from ._merge import Index

    CompilerFn = Callable[..., Any]


@dataclasses.dataclass(eq=False)
class Snapshot:
    """What one registry read, and what it derived from that; see the module's docstring.

    ``lookup_backend`` and ``backend_info`` are the registry's own, which a chain compiles
    with: its members are looked up where the registry is then, after registrations and
    refreshes.
    """

    kinds: tuple[SourceKind, ...]
    context: Context
    lookup_backend: Callable[[str], CompilerFn]
    backend_info: Callable[[str], BackendInfo]
    #: What each source kind read (a derived snapshot keeps what it does not read again).
    read: dict[SourceKind, Discovery] = field(default_factory=dict)
    #: What was said as a warning, so that each problem is said once a reading.
    warned: set[str] = field(default_factory=set)
    #: The callables looked up, by definition: a name and its aliases give one object.
    by_definition: dict[BackendDefinition, CompilerFn] = field(default_factory=dict)
    #: The callables looked up, by name (the hot path).
    loaded: dict[str, CompilerFn] = field(default_factory=dict, init=False)
    _lock: ForkSafeLock = field(default_factory=ForkSafeLock, init=False)
    _indexes: dict[bool, Index] = field(default_factory=dict, init=False)
    # Why each definition cannot be used here (None: it can); filled on demand.
    _available: dict[BackendDefinition, str | None] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.context = self.context._replace(entry_point_names=lambda: self.entry_point_names)

    def derive(
        self, *, runtime: Sequence[BackendDefinition] | None = None, torch: bool = True
    ) -> Snapshot:
        """The same reading with other runtime registrations (``torch=False``: PyTorch's
        registry read again too). Nothing else is read again; what was warned of stays said,
        and a definition read alike gives the callable it gave (a registration of another
        name must not make torch.compile's cached backends look new)."""
        context = self.context if runtime is None else self.context._replace(runtime=runtime)
        read_again = ("runtime",) if torch else ("runtime", "torch")
        kept = {kind: found for kind, found in self.read.items() if kind not in read_again}
        return dataclasses.replace(self, context=context, read=kept)

    def _needs_torch(self, name: str, *, shadows: bool = False) -> bool:
        """Whether resolving ``name`` reads PyTorch's registry (importing torch): a name
        another source defines needs nothing of it (the lowest source), unless what it
        ``shadows`` is asked for where torch.compile's registry is loaded."""
        return name not in self.index(False).by_key or (shadows and pytorch.dynamo_imported())

    def info(self, name: str) -> BackendInfo:
        """See the registry's ``backend_info``."""
        return self.index(self._needs_torch(name, shadows=True)).info(name)

    def load(self, name: str) -> CompilerFn:
        """The callable ``name`` resolves to, imported now (see the registry's lookup)."""
        # No lock is held while importing: a slow or hanging import must not stall lookups
        # of other names, listing, or refresh(). Python's own per-module import lock makes
        # threads that import one target wait for each other, so it runs once; the first
        # callable stored is what all get.
        index = self.index(self._needs_torch(name))
        definition = index.resolve(name)
        if definition.compiler_fn is not None:
            fn = definition.compiler_fn
        elif definition.target is not None:
            # Imported where something is loaded: a listing never loads the loader.
            from ._loader import load_target

            fn = load_target(definition)
        else:  # a chain, or a table by device
            fn = self._composite(definition, index)
        with self._lock:
            # One callable a definition, whichever of its names was asked for first.
            fn = self.loaded[name] = self.by_definition.setdefault(definition, fn)
        return fn

    def _composite(self, definition: BackendDefinition, index: Index) -> CompilerFn:
        """What compiles with the members ``definition`` names."""
        from ._chain import ChainBackend, DeviceBackend
        from ._loader import check_requirements
        from ._select import FastestChain

        if (problem := index.chain_problems.get(definition.name)) is not None:
            raise ManifestError.of(problem)
        check_requirements(definition, missing_requirements(definition))
        composite: type[ChainBackend | DeviceBackend] = ChainBackend
        if definition.by_device is not None:
            composite = DeviceBackend
        elif definition.select == "fastest":
            composite = FastestChain
        return composite(
            definition, lookup=self.lookup_backend, info=self.backend_info, context=self.context
        )

    def callables(self) -> list[CompilerFn]:
        """Every callable this reading gives: the runtime registrations', those loaded, and
        PyTorch's own where torch.compile's registry is loaded."""
        with self._lock:  # other threads may be loading
            known = [*(d.compiler_fn for d in self.context.runtime), *self.loaded.values()]
        if "torch" in self.kinds and pytorch.dynamo_imported():
            known += [d.compiler_fn for d in self.found("torch").definitions]
        return [fn for fn in known if fn is not None]

    def found(self, kind: SourceKind) -> Discovery:
        if kind not in self.read:
            # No cyclic garbage collection while manifests are read: thousands of definitions
            # are a million new tuples, none in a cycle, which the collector would walk again
            # and again (a tenth of a first listing of 10,000 backends). It stays on while
            # torch is imported, which makes cycles of its own, and off where it was off.
            paused = kind != "torch" and gc.isenabled()
            if paused:
                gc.disable()
            try:
                # Read with no lock held (reading PyTorch's imports torch: seconds, which must
                # not stall another thread's lookup); two threads reading at once keep the
                # first, in one step: no lock needed.
                self.read.setdefault(kind, READERS[kind](self.context))
            finally:
                if paused:
                    gc.enable()
        return self.read[kind]

    @functools.cached_property
    def entry_point_names(self) -> frozenset[str]:
        """The names installed distributions declare (PyTorch's registry holds them too)."""
        found = self.found("entry-point") if "entry-point" in self.kinds else read_entry_points()
        return frozenset(d.name for d in found.definitions)

    def index(self, with_torch: bool = True) -> Index:
        """The merge of every source read (PyTorch's too with ``with_torch``)."""
        with_torch = with_torch and "torch" in self.kinds
        if (index := self._indexes.get(with_torch)) is not None:
            return index
        if with_torch and not pytorch.registry_readable():
            # Asked from inside PyTorch's own import of its registry (autoload installs
            # there): what it holds then is not kept as if whole, and not read at all.
            return self.index(with_torch=False)
        from ._merge import merge

        discoveries = [self.found(k) for k in self.kinds if with_torch or k != "torch"]
        own = self.pytorch_names()  # after reading PyTorch's registry, where that is asked
        with self._lock:
            # Else another thread merged while this one waited.
            if (index := self._indexes.get(with_torch)) is None:
                index = self._indexes[with_torch] = merge(
                    discoveries,
                    own,
                    # Without torch installed there is no registry of PyTorch's to read.
                    torch_read=with_torch and pytorch.torch_available(),
                    plugins_read="entry-point" in self.kinds,
                )
                for problem in index.problems:
                    if str(problem) not in self.warned:  # both merges find them: once
                        self.warned.add(str(problem))
                        warn_problem(problem, index.pytorch)
        return index

    def pytorch_names(self) -> frozenset[str]:
        """The names of PyTorch's own backends: those known without importing torch, and
        those in its registry now, where that is loaded."""
        own = {name for name, fn in (self._registered() or {}).items() if pytorch.own(fn)}
        return pytorch.pytorch_names(self.context.cache) | own

    def _registered(self) -> dict[str, Any] | None:
        # Entry points are read only where PyTorch's registry can hold something to compare.
        return pytorch.registered(self.entry_point_names) if pytorch.dynamo_imported() else None

    def torch_changed(self) -> bool:
        """Whether PyTorch's registry now holds other names than this snapshot read."""
        if (found := self.read.get("torch")) is None:
            return False
        live = self._registered()
        return live is not None and live.keys() != {d.name for d in found.definitions}

    def why_unavailable(self, definition: BackendDefinition) -> str | None:
        """See the registry's."""
        if definition in self._available:
            return self._available[definition]
        reason: str | None = None
        if missing := missing_requirements(definition):
            reason = "missing " + ", ".join(missing)
        elif definition.source.kind == "torch":
            reason = pytorch.missing_device(definition.name)
        elif definition.members:
            reason = self._why_chain(definition)
        return self._available.setdefault(definition, reason)  # whichever thread found it first

    def _why_chain(self, definition: BackendDefinition) -> str | None:
        """A chain can be used where one member can; a table by device where the backend it
        gives the CPU can (every machine has one; what it gives an accelerator is known only
        when a graph is on it). A chain that names itself, through others or not, has its
        problem, and so does one of the chains of any such loop: asked for its members, no
        chain is asked for again inside."""
        if (problem := self.index().chain_problems.get(definition.name)) is not None:
            return problem.message
        if definition.by_device is not None:
            table = dict(definition.by_device)
            if (member := table.get("cpu", table.get("other"))) is None:
                return f"it gives the CPU no backend (by-device has {', '.join(table)})"
            why = self._why_member(member)
            return None if why is None else f"for the CPU, {why}"
        reasons = []
        for member in definition.members:
            if (why := self._why_member(member)) is None:
                return None
            reasons.append(why)
        return "no member can be used (" + "; ".join(reasons) + ")"

    def _why_member(self, member: str) -> str | None:
        index = self.index()
        try:
            resolved = index.resolve(member)
        except UnknownBackendError:
            if index.could_be_pytorch(member):
                return None  # one of PyTorch's, which was not read: there with torch
            # As check and a compile say it.
            return f"{member}: {index.left_out(member) or 'not installed here'}"
        except BackendRegistryError as exc:  # a table that cannot be used as written
            return f"{member}: {str(exc).split('. ', 1)[0]}"
        why = self.why_unavailable(resolved)
        return None if why is None else f"{member}: {why}"
