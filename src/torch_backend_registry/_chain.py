"""Backends made of other backends: fallback chains, and tables by device type."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ._definition import ATOL, RTOL, BackendDefinition, BackendInfo
from ._environment import COMPILE_CACHE_VAR
from ._errors import (
    BackendChainError,
    BackendRegistryError,
    ManifestError,
    RefusedArguments,
    UnknownBackendError,
    warn,
)
from ._isolate import Guards, Inputs, own_copy
from ._key import words
from ._loader import call_options
from ._members import typo_of
from ._runs import leaves
from ._sources import Context
from ._sources.files import read_bytes
from ._sources.finding import missing_requirements
from ._sources.pytorch import inductor
from ._verify import Reference, compiling

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._definition import Severity

logger = logging.getLogger("torch_backend_registry")


@dataclasses.dataclass(eq=False, repr=False)  # a backend, not a value: by identity
class _Composite:
    """A backend that compiles with other backends, which the registry hands over how to look
    up (``lookup``), what it knows of (``info``), and what it reads with (``context``: its
    environment, and the cache a chain's choices are remembered in)."""

    definition: BackendDefinition
    _: dataclasses.KW_ONLY
    #: How a member is looked up, and what the registry knows of one.
    lookup: Callable[[str], Callable[..., Any]]
    info: Callable[[str], BackendInfo]
    context: Context
    #: The member the last compile used.
    used: str | None = dataclasses.field(default=None, init=False)
    #: Each graph this backend compiled in this process, in order: the graph in words,
    #: and the member it runs with.
    graphs: list[tuple[str, str]] = dataclasses.field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.__name__ = self.__qualname__ = self.definition.name


class ChainBackend(_Composite):
    """Compiles with the first member of a chain that works (``select = "fastest"``: see
    ``_select.FastestChain``).

    A member is skipped when its ``requires`` cannot be found, when it cannot be
    looked up or loaded, when compiling raises, or when it computes other than eager
    (``verify``), or, where gradients are on, loses them; each skip is logged with its
    reason. If every member is skipped, :class:`BackendChainError` names them all.
    """

    def __repr__(self) -> str:
        return f"<fallback chain {self.__name__!r}: {' -> '.join(self.members)}>"

    @property
    def members(self) -> tuple[str, ...]:
        """The backends it tries, in order (callers read it, as ``used``)."""
        return self.definition.members

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        run = Run(self, gm, example_inputs, kwargs)
        for member, compiled in run.candidates():
            return run.use(member, compiled)
        raise run.failed()


class Run:
    """One compile of a chain: its members tried in turn on the graph, each skip logged."""

    def __init__(
        self, chain: ChainBackend, gm: Any, example_inputs: Any, kwargs: Mapping[str, Any]
    ) -> None:
        import torch

        if not _COMPILE_CACHE:
            load_compile_cache(chain)
        self.chain, self.gm, self.example_inputs, self.kwargs = chain, gm, example_inputs, kwargs
        self.name = chain.__name__
        verify = chain.definition.verify
        #: How far each member is held to eager: the chain's ``verify``; where gradients are on
        #: and it verifies nothing, the reach of the gradients alone (``"none"``): a member that
        #: loses them is never used. And how it is compiled (``_verify.compiling``).
        self.level = verify[0] if verify else "none" if torch.is_grad_enabled() else None
        self.tolerances = verify[1:] if verify else (RTOL, ATOL)
        #: ``(member, reason)`` of each member skipped, in order.
        self.failures: list[tuple[str, str]] = []
        #: The graph run eagerly, taken before any member runs (one may rewrite it in place).
        self.reference: Reference | None = None
        #: How far each member that passed was verified, and whether that is all asked.
        self.verified: dict[str, tuple[str, bool]] = {}
        self.inputs = Inputs(example_inputs)
        self.device = device_type(gm, example_inputs)
        #: The graph in a few words, for the log.
        self.words = words(gm, example_inputs)
        #: Who hears the member the graph runs with (``""``: none): rank 0's other ranks, if any.
        self.tell: Callable[[str], object] = lambda member: None
        #: Whether a member wrote into the graph's inputs beyond putting back: no later one is
        #: tried on the changed values.
        self.last = False
        # A backward compiled at its first run, while torch.compile still compiles the
        # forward, would take that compile for its own: where a member's backward runs now
        # (to verify it, or to time a training step), it is compiled with the forward.
        # What is timed is verified: a training step times the backward too.
        if chain.definition.select == "fastest" and torch.is_grad_enabled():
            self.level = "backward"

    def say(self, message: str, severity: Severity | None = None) -> None:
        """Log ``message`` of this compile, after the chain's name and the graph in words:
        with no ``severity``, as information; else at its level, after its name."""
        level = logging.INFO if severity is None else LOG_LEVELS[severity]
        prefix = "" if severity is None else f"{severity}: "
        logger.log(level, "backend %r: %s: %s%s", self.name, self.words, prefix, message)

    def skip(self, member: str, reason: str, severity: Severity) -> None:
        self.failures.append((member, reason))
        # A compiler's own message may run to pages: the log line keeps its head and end.
        said = reason if len(reason) <= 600 else f"{reason[:400]} ... {reason[-150:]}"
        self.say(f"skipping {member!r}: {said}", severity)

    def candidates(self, members: Sequence[str] | None = None) -> Iterator[tuple[str, Any]]:
        """Each of ``members`` (default: the chain's) that compiles and verifies, compiled."""
        for member in self.chain.members if members is None else members:
            if self.last:
                return
            if (compiled := self._compiled(member)) is not None:
                yield member, compiled

    def _compiled(self, member: str) -> Any:
        try:
            definition = self.chain.info(member).definition
            missing = missing_requirements(definition)
            compiler = None if missing else self.chain.lookup(member)
        except BackendRegistryError as exc:
            return self.skip(member, *unusable(exc))
        if compiler is None:
            needs = ", ".join(map(repr, missing))
            return self.skip(member, f"requires {needs}, which cannot be found", "note")
        # What torch.compile(backend=member, ...) would hand it; a member that takes no
        # such argument is the caller's mistake, said at once, not a member to skip.
        compile_fn = member_compiler(self.name, definition, compiler, self.kwargs)
        if self.reference is None and self.level is not None:
            self.reference = Reference(self.gm, self.example_inputs, self.level, *self.tolerances)
        import torch._dynamo.exc as dynamo

        guards = Guards()
        failure: tuple[str, Severity] | None = None
        try:
            # Each member its own copy: one that rewrites what it is given and then
            # fails leaves the next, and dynamo, the graph and inputs as they came.
            with compiling(self.level):
                compiled = compile_fn(own_copy(self.gm), list(self.example_inputs))
        # Let through, not a member failing: the signals dynamo itself lets through a
        # compiler call to act on, a restart of its analysis (``TensorifyScalarRestartAnalysis``
        # under ``dynamic=True``) and a frame to skip; and a caller's arguments a member refuses.
        except (dynamo.RestartAnalysis, dynamo.SkipFrame, RefusedArguments):
            raise
        except Exception as exc:
            # A table's member not installed here is the note it is wherever it is named.
            severity = unusable(exc)[1] if isinstance(exc, UnknownBackendError) else "warning"
            failure = (f"compiling raised {type(exc).__name__}: {exc}", severity)
        finally:  # compiled or not: what it guarded of its own would fail the whole frame
            guards.take_back(self.name, member)
        self._inputs_kept(member, failure)
        if failure is not None:
            return self.skip(member, *failure)
        if not callable(compiled):  # dynamo could not run it: "did not return callable"
            said = f"compiling gave {type(compiled).__name__}, not a function to run the graph"
            return self.skip(member, said, "warning")
        if self.reference is not None:
            if (why := self.reference.check(compiled)) is not None:
                return self.skip(member, f"verifying it failed: {why}", "warning")
            said = f", {self.reference.said}" if self.reference.said else ""
            self.verified[member] = (said, self.reference.complete)
        return compiled

    def _inputs_kept(self, member: str, failure: tuple[str, Severity] | None) -> None:
        """Where compiling ``member`` ran the graph on its inputs and wrote into them (as
        tracing and calibrating compilers do), put them back as they came; where that cannot
        be done (the eager run did not show the graph writing them), no later member is
        tried on the changed values, and a member that failed so ends the chain."""
        clean = {} if self.reference is None else self.reference.clean
        written = self.inputs.written(clean)
        if not written:
            return
        numbers = ("inputs " if len(written) > 1 else "input ") + ", ".join(map(str, written))
        if self.inputs.put_back(written, clean):
            self.say(
                f"compiling {member!r} ran the graph and wrote into {numbers}: put back as it came"
            )
            return
        self.last = True
        said = (
            f"compiling it ran the graph and wrote into {numbers}, which cannot be put"
            " back, so no later member is tried on the changed values"
        )
        if failure is None:
            self.say(f"{member!r}: {said}", "warning")
            return
        self.skip(member, f"{failure[0]}; {said}", failure[1])
        raise self.failed()

    def use(self, member: str, compiled: Any, how: str = "") -> Any:
        """``compiled``, ``member``'s, as what the graph runs with (``how`` it was chosen)."""
        # The other ranks hear it first: they wait on it, whatever happens here after.
        self.tell(member)
        verified, complete = self.verified.get(member, ("", True))
        # Less than asked is worth a warning.
        self.say(f"compiled with {member!r}{how}{verified}", None if complete else "warning")
        self.chain.used = member
        self.chain.graphs.append((self.words, member))
        return compiled

    def failed(self) -> BackendChainError:
        return BackendChainError(self.name, self.failures)


class DeviceBackend(_Composite):
    """Compiles with the backend its ``by-device`` table names for the device type of the
    graph (as ``torch.device(...).type`` names it), ``other`` for any not listed; where the
    entry is a table, with its ``mode`` and ``options`` in place of torch.compile's."""

    def __repr__(self) -> str:
        table = ", ".join(f"{device} -> {name}" for device, name in self.table.items())
        return f"<by-device backend {self.__name__!r}: {table}>"

    @property
    def table(self) -> dict[str, str]:
        """The backend of each device type (callers read it, as ``used``)."""
        return dict(self.definition.by_device or ())

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        device = device_type(gm, example_inputs)
        table = self.table
        entry = device if device in table else "other"
        member = table.get(entry)
        if member is None:
            raise ManifestError.of(
                self.definition.located(
                    f"backend {self.__name__!r} names no backend for device {device!r}"
                    f" (by-device has {', '.join(table)}); add it, or 'other' for every device"
                    " not listed",
                    "by-device",
                )
            )
        settings = self.definition.device_settings.get(entry)
        said = "" if settings is None else f", with {dict(settings)} in place of {kwargs}"
        logger.info(
            "backend %r: device %s: compiling with %r%s", self.__name__, device, member, said
        )
        self.used = member
        self.graphs.append((words(gm, example_inputs), member))
        compiler = self.lookup(member)
        definition = self.info(member).definition
        given = kwargs if settings is None else settings
        return member_compiler(self.__name__, definition, compiler, given)(gm, example_inputs)


#: The compile cache this process loaded (``""``: none), once, before its first chain compile.
_COMPILE_CACHE: list[str] = []


def load_compile_cache(chain: _Composite) -> None:
    """Load PyTorch's compile caches (what ``torch-backends tune --compile-cache`` saved) from
    the file ``TORCH_BACKENDS_COMPILE_CACHE`` names, else the chain's manifest's
    ``compile-cache``: once a process. A file that does not load (saved by another PyTorch,
    refused by the trust rule: its compiled code would run here) is a warning."""
    path = chain.context.environ.get(COMPILE_CACHE_VAR) or chain.definition.compile_cache
    _COMPILE_CACHE.append(path or "")
    if not path:
        return
    try:
        import torch.compiler

        # None, having logged why, where PyTorch cannot read them (another release's).
        info = torch.compiler.load_cache_artifacts(read_bytes(path, 2**40, "compile cache"))
        if info is None:
            raise ValueError("PyTorch could not read them (saved by another release?)")
        logger.info("loaded PyTorch's compile caches from %s (%s)", path, info)
    except Exception as exc:
        warn(f"{path}: PyTorch's compile caches not loaded: {exc}")


#: The logging level of each severity, so that the log says what ``check`` says.
LOG_LEVELS: dict[Severity, int] = {
    "note": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def unusable(exc: BackendRegistryError) -> tuple[str, Severity]:
    """Why a member that cannot be looked up is skipped, and how loudly, in ``check``'s
    words: a name that exists nowhere here (a plugin not installed) or is disabled is a
    note; one that is a likely typo, or a broken definition, is an error."""
    if isinstance(exc, UnknownBackendError):
        if exc.left_out:  # disabled, or left out by the plugin policy: it says so
            return exc.note, "note"
        if typo_of(exc.name, exc.suggestions) is not None:
            return exc.brief, "error"
        return "not installed here", "note"
    return str(exc), "error" if isinstance(exc, ManifestError) else "warning"


def member_compiler(
    owner: str,
    definition: BackendDefinition,
    compiler: Callable[..., Any],
    kwargs: Mapping[str, Any],
) -> Callable[[Any, Any], Any]:
    """How ``torch.compile(backend=member, **kwargs)`` would compile with a member: inductor
    through the wrapper that applies ``mode`` and ``options`` to its configuration, any other
    backend with them as keyword arguments. Raises :class:`RefusedArguments`, before anything
    compiles, where the member cannot take them."""
    # PyTorch's own inductor, by its name or declared as a target, with the manifest's
    # options (compile_fx's keyword arguments: config_patches, ...) bound or not.
    own = inductor()
    bound: functools.partial[Any] | None = None
    if isinstance(compiler, functools.partial) and compiler.func is own and not compiler.args:
        bound = compiler
    if own is not None and (compiler is own or bound is not None):
        import torch

        try:
            wrapper: Any = torch._TorchCompileInductorWrapper(
                kwargs.get("mode"), kwargs.get("options"), None
            )
        except RuntimeError as exc:  # "Unexpected optimization option ..."
            raise RefusedArguments(f"backend {owner!r}: {exc}") from exc
        if bound is None:
            return wrapper  # type: ignore[no-any-return]
        # What torch.compile gave (its mode's and options' settings) over the manifest's.
        patches = {**(bound.keywords.get("config_patches") or {}), **wrapper.config}
        return functools.partial(bound, config_patches=patches)
    try:
        options = call_options(compiler, definition.name, kwargs)
    except TypeError as exc:
        given = ", ".join(f"{key}=..." for key in kwargs)
        if owner == definition.name:  # a plain backend: no member to speak of
            said = f"backend {owner!r} cannot take what torch.compile was given ({given}): {exc}"
        else:
            said = (
                f"backend {owner!r}: its member {definition.name!r} cannot take what"
                f" torch.compile was given ({given}), as torch.compile(backend="
                f"{definition.name!r}) could not: {exc}"
            )
        raise RefusedArguments(said) from None
    # A table of options torch.compile gave goes over the manifest's key by key, as
    # inductor's settings do above: openvino's model_caching stays with options={"device": ..}.
    declared = compiler.keywords.get("options") if isinstance(compiler, functools.partial) else None
    if isinstance(declared, Mapping) and isinstance(options.get("options"), Mapping):
        options["options"] = {**declared, **options["options"]}
    return functools.partial(compiler, **options) if options else compiler


def device_type(gm: Any, example_inputs: Any) -> str:
    """The device a graph runs on: its tensor inputs' (where they are on several, the first
    that is not the CPU); for a graph with none, its own parameters' and buffers'; for a
    graph with none of those either, that of the tensors it makes; else the CPU. A tensor
    the graph makes on the side (``device="meta"``) never outvotes its inputs."""
    inputs = [x.device.type for x in example_inputs if hasattr(x, "device") and hasattr(x, "dtype")]
    held = [*gm.parameters(), *gm.buffers()] if hasattr(gm, "parameters") else []
    for found in (inputs, [t.device.type for t in held], list(_made_devices(gm))):
        if found:
            return next((t for t in found if t != "cpu"), "cpu")
    return "cpu"


def _made_devices(gm: Any) -> Iterator[str]:
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        # dynamo records each value a node gives (a fake tensor) in its meta.
        meta = getattr(node, "meta", {})
        for value in leaves(meta.get("example_value", meta.get("val"))):
            if (device := getattr(value, "device", None)) is not None and hasattr(value, "dtype"):
                yield device.type
        if (device := getattr(node, "kwargs", {}).get("device")) is not None:
            import torch

            with contextlib.suppress(RuntimeError, TypeError, ValueError):
                yield torch.device(device).type
