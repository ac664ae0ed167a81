"""One reading of a registry's sources: taken on first need, then answered from until refresh().

A snapshot fixes the working directory and the environment when it is made, reads each
source at most once (PyTorch's only when asked, as it imports torch), and holds what was
derived from that reading. PyTorch's registry is a dict that plugins may add to at any
time: :meth:`Snapshot.torch_changed` compares its names with what was read.
"""

from __future__ import annotations

import contextlib
import gc
import os

from ._errors import BackendRegistryError, UnknownBackendError, warn_problem
from ._forksafe import ForkSafeLock
from ._sources import READERS, Context, pytorch
from ._sources.cache import Cache, cache_folder
from ._sources.entry_points import read_entry_points
from ._sources.finding import missing_requirements

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Any

    from ._definition import BackendDefinition, Discovery, SourceKind
    from ._merge import Index


class Snapshot:
    """What one registry read, and what it derived from that; see the module's docstring."""

    def __init__(self, kinds: tuple[SourceKind, ...], context: Context) -> None:
        self.kinds = kinds
        self.context = context._replace(entry_point_names=self.entry_point_names)
        self.lock = ForkSafeLock()
        self._found: dict[SourceKind, Discovery] = {}
        self._indexes: dict[bool, Index] = {}
        self._entry_point_names: frozenset[str] | None = None
        # Why each definition cannot be used here (None: it can); filled on demand.
        self._available: dict[BackendDefinition, str | None] = {}
        #: The callables looked up, by name (the hot path) and by definition (a name
        #: and its aliases give one object).
        self.loaded: dict[str, Callable[..., Any]] = {}
        self.by_definition: dict[BackendDefinition, Callable[..., Any]] = {}
        #: What was said as a warning, so that each problem is said once a reading.
        self._warned: set[str] = set()

    @classmethod
    def taken(
        cls,
        kinds: tuple[SourceKind, ...],
        *,
        cwd: str | None,
        environ: Mapping[str, str] | None,
        files: Sequence[str] | None,
        runtime: Sequence[BackendDefinition],
        fresh: bool,
    ) -> Snapshot:
        """A snapshot of the working directory and the environment as they are now."""
        try:
            here: str | None = os.path.abspath(cwd or os.getcwd())
        except OSError:  # the working directory was removed under the process
            here = None
        environ = dict(os.environ if environ is None else environ)
        cache = Cache(cache_folder(environ))
        return cls(kinds, Context(here, environ, runtime, cache, files, fresh))

    def derive(
        self, *, runtime: Sequence[BackendDefinition] | None = None, torch: bool = True
    ) -> Snapshot:
        """The same reading with other runtime registrations (``torch=False``: PyTorch's
        registry read again too). Nothing else is read again."""
        context = self.context if runtime is None else self.context._replace(runtime=runtime)
        derived = Snapshot(self.kinds, context)
        read_again = ("runtime",) if torch else ("runtime", "torch")
        derived._found = {k: v for k, v in self._found.items() if k not in read_again}
        derived._warned = self._warned
        # A definition read alike gives the callable it gave: a registration of another name
        # must not make torch.compile's cached backends look new.
        derived.by_definition = self.by_definition
        return derived

    def found(self, kind: SourceKind) -> Discovery:
        found = self._found.get(kind)
        if found is None:
            # Read with no lock held (reading PyTorch's imports torch: seconds, which must
            # not stall another thread's lookup); two threads reading at once keep the first.
            # Collection stays on while torch is imported: it makes cycles of its own.
            with contextlib.nullcontext() if kind == "torch" else _no_cycle_collection():
                read = READERS[kind](self.context)
            with self.lock:
                found = self._found.setdefault(kind, read)
        return found

    def entry_point_names(self) -> frozenset[str]:
        if self._entry_point_names is None:
            found = (
                self.found("entry-point") if "entry-point" in self.kinds else read_entry_points()
            )
            self._entry_point_names = frozenset(d.name for d in found.definitions)
        return self._entry_point_names

    def index(self, with_torch: bool = True) -> Index:
        """The merge of every source read (PyTorch's too with ``with_torch``)."""
        with_torch = with_torch and "torch" in self.kinds
        index = self._indexes.get(with_torch)
        if index is not None:
            return index
        if with_torch and not pytorch.registry_readable():
            # Asked from inside PyTorch's own import of its registry (autoload installs
            # there): what it holds then is not kept as if whole, and not read at all.
            return self.index(with_torch=False)
        from ._merge import merge

        discoveries = [self.found(k) for k in self.kinds if with_torch or k != "torch"]
        own = self.pytorch_names()  # after reading PyTorch's registry, where that is asked
        with self.lock:
            index = self._indexes.get(with_torch)
            if index is None:  # else another thread merged while this one waited
                index = self._indexes[with_torch] = merge(
                    discoveries,
                    own,
                    # Without torch installed there is no registry of PyTorch's to read.
                    torch_read=with_torch and pytorch.torch_available(),
                    plugins_read="entry-point" in self.kinds,
                )
                for problem in index.problems:
                    if str(problem) not in self._warned:  # both merges find them: once
                        self._warned.add(str(problem))
                        warn_problem(problem, index.pytorch)
        return index

    def pytorch_names(self) -> frozenset[str]:
        """The names of PyTorch's own backends: those known without importing torch, and
        those in its registry now, where that is loaded."""
        live = self._registered() or {}
        own = {name for name, fn in live.items() if pytorch.own(fn)}
        return pytorch.pytorch_names(self.context.cache) | own

    def _registered(self) -> dict[str, Any] | None:
        # Entry points are read only where PyTorch's registry can hold something to compare.
        return pytorch.registered(self.entry_point_names()) if pytorch.dynamo_imported() else None

    def pytorch_callables(self) -> list[Callable[..., Any]]:
        """The callables of PyTorch's own backends, where torch.compile's registry is loaded."""
        if "torch" not in self.kinds or not pytorch.dynamo_imported():
            return []
        return [d.compiler_fn for d in self.found("torch").definitions if d.compiler_fn]

    def torch_changed(self) -> bool:
        """Whether PyTorch's registry now holds other names than this snapshot read."""
        found = self._found.get("torch")
        if found is None:
            return False
        live = self._registered()
        return live is not None and live.keys() != {d.name for d in found.definitions}

    def why_unavailable(
        self, definition: BackendDefinition, visiting: frozenset[str] = frozenset()
    ) -> str | None:
        """See the registry's; ``visiting``: the chains it is asked for inside."""
        if definition in self._available:
            return self._available[definition]
        reason: str | None = None
        missing = missing_requirements(definition)
        if missing:
            reason = "missing " + ", ".join(missing)
        elif definition.source.kind == "torch":
            reason = pytorch.missing_device(definition.name)
        elif definition.members:
            reason = self._why_chain(definition, visiting | {definition.name})
        self._available[definition] = reason  # the same answer whichever thread found it
        return reason

    def _why_chain(self, definition: BackendDefinition, visiting: frozenset[str]) -> str | None:
        """A chain can be used where one member can; a table by device where the backend it
        gives the CPU can (every machine has one; what it gives an accelerator is known only
        when a graph is on it)."""
        problem = self.index().chain_problems().get(definition.name)
        if problem is not None:
            return problem.message
        if definition.by_device is not None:
            table = dict(definition.by_device)
            member = table.get("cpu", table.get("other"))
            if member is None:
                return f"it gives the CPU no backend (by-device has {', '.join(table)})"
            why = self._why_member(definition, member, visiting)
            return None if why is None else f"for the CPU, {why}"
        reasons = []
        for member in definition.members:
            why = self._why_member(definition, member, visiting)
            if why is None:
                return None
            reasons.append(why)
        return "no member can be used (" + "; ".join(reasons) + ")"

    def _why_member(
        self, definition: BackendDefinition, member: str, visiting: frozenset[str]
    ) -> str | None:
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
        if resolved.name in visiting:
            return f"{member}: it refers back to {definition.name!r}"
        why = self.why_unavailable(resolved, visiting)
        return None if why is None else f"{member}: {why}"


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """No cyclic garbage collection while manifests are read: thousands of definitions are
    a million new tuples, none in a cycle, which the collector would walk again and again
    (a tenth of a first listing of 10,000 backends). Collection resumes after, unless it
    was off before."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
