"""``select = "fastest"``: each graph runs with the fastest member of a chain that verifies.

For each graph the chain is handed, every available member is compiled and verified, then
timed on one copy of the example inputs: warm-up calls first, then rounds in which the
members take turns, the median of each kept. The choice is remembered in the user's cache
folder by all that decides it (:func:`key`), so a later process compiles only the chosen
member. Where torch.distributed is initialised, rank 0 decides and tells the other ranks
through the default group's store; they time nothing, and none waits on a collective.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import statistics
import sys
import time

from ._chain import ChainBackend, Run, device_type
from ._definition import canonical
from ._environment import SELECT_TIMEOUT, SELECT_TIMEOUT_VAR, SELECT_VAR
from ._identity import own_facts
from ._sources.cache import NO_CACHE
from ._sources.finding import code_stamp
from ._sources.pytorch import torch_version
from ._verify import copies, generators, leaves, restored

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ._definition import BackendDefinition, BackendInfo
    from ._sources.cache import Cache

logger = logging.getLogger("torch_backend_registry")

#: The cache's kind of entry that holds the choices.
KIND = "choices"
#: Calls of each member before it is timed (an AOT member compiles its backward at the first).
WARM_UP = 2
#: The timed rounds; in each, every member takes a turn, the order turning round by one.
ROUNDS = 9
#: How long a member runs untimed at the start of its turn: one runtime's threads wake and
#: its caches fill while another's settle (OpenVINO's first calls after PyTorch's eager ran
#: take up to twice as long, for some 10 ms).
SETTLE_SECONDS = 10e-3
#: The least a timed sample lasts: short calls are timed in batches, so that the clock's
#: resolution and a stray interruption weigh little (with 2 ms, OpenVINO's 1.25x over
#: eager on a small MLP was measured under the 1.1x of min-speedup one run in two).
SAMPLE_SECONDS = 10e-3


class FastestChain(ChainBackend):
    """A chain with ``select = "fastest"``: see the module's docstring."""

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        return fastest(self, gm, example_inputs, kwargs)


def fastest(chain: ChainBackend, gm: Any, example_inputs: Any, kwargs: Mapping[str, Any]) -> Any:
    """What ``chain`` compiles ``gm`` to: its fastest member's compiled graph."""
    run = Run(chain, gm, example_inputs, kwargs)
    environ = os.environ if chain.context is None else chain.context.environ
    cache = NO_CACHE if chain.context is None else chain.context.cache
    decides = key(chain, gm, example_inputs, kwargs)
    store = _store()
    if store is not None and _rank() != 0:
        return _as_rank_zero_chose(run, store, decides, environ)
    fresh = environ.get(SELECT_VAR, "").strip().lower() == "fresh"
    remembered = None if fresh else cache.get(KIND, decides["memory"])
    if isinstance(remembered, dict) and remembered.get("member") in chain.members:
        for member, compiled in run.candidates([remembered["member"]]):
            _publish(store, decides, member)
            return run.use(member, compiled, f", as remembered ({said(remembered)})")
    passed = dict(run.candidates())
    if not passed:
        _publish(store, decides, "")
        raise run.failed()
    if len(passed) == 1 or run.reference is None or run.reference.unverified is not None:
        why = "no other member to time" if len(passed) == 1 else "it cannot be run to time it"
        member = next(iter(passed))
        _publish(store, decides, member)
        return run.use(member, passed[member], f", not timed ({why})")
    times = timed(run, passed)
    member, speedup = choose(list(passed), times, chain.definition.min_speedup)
    choice = {
        "chain": chain.__name__,
        "identity": decides["identity"],
        "member": member,
        "first": next(iter(passed)),
        "speedup": speedup,
        "seconds": times,
        "graph": decides["graph"],
        "when": time.time(),
    }
    logger.info(
        "backend %r: %s: %s; chose %r (%s)",
        chain.__name__,
        decides["graph"],
        ", ".join(f"{m} {_duration(s)}" for m, s in times.items()),
        member,
        said(choice),
    )
    cache.put(KIND, decides["memory"], choice)
    _publish(store, decides, member)
    compiled = passed.pop(member)
    passed.clear()  # the members not chosen, and what they compiled, go now
    return run.use(member, compiled, f", the fastest ({said(choice)})")


def choose(order: list[str], times: Mapping[str, float], min_speedup: float) -> tuple[str, float]:
    """The fastest of ``order`` (the chain's members that verified, in its order), unless it
    is less than ``min_speedup`` times faster than the first, which then stays; and its
    speed-up over the first."""
    first, best = order[0], min(order, key=lambda member: times[member])
    speedup = times[first] / times[best] if times[best] > 0 else 1.0
    return (best, speedup) if speedup >= min_speedup else (first, 1.0)


def timed(run: Run, compiled: Mapping[str, Callable[..., Any]]) -> dict[str, float]:
    """The median seconds of a step with each member's compiled graph: the forward, and
    where the graph is compiled for training and an output requires grad, the backward a
    training step runs with it. The members take turns, on one copy of the inputs; the
    graph's state and every random number generator are as they were afterwards."""
    import torch

    reference = run.reference
    assert reference is not None
    backward = reference.backward_runs
    args, grads = copies(reference.inputs, backward)
    grads += [p for p in getattr(run.gm, "parameters", list)() if p.requires_grad]
    device = device_type(run.gm, run.example_inputs)
    synchronize = getattr(getattr(torch, device, None), "synchronize", None)

    def step(fn: Callable[..., Any]) -> None:
        out = fn(*args)
        if backward:
            outputs = [o for o in leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            if outputs and grads:
                ones = [torch.ones_like(o) for o in outputs]
                torch.autograd.grad(outputs, grads, ones, allow_unused=True)

    def seconds(fn: Callable[..., Any], calls: int) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            step(fn)
        if device != "cpu" and synchronize is not None:
            synchronize()
        return (time.perf_counter() - started) / calls

    samples: dict[str, list[float]] = {member: [] for member in compiled}
    with torch.set_grad_enabled(reference.training), generators(), restored(run.gm):
        calls = {}
        for member, fn in compiled.items():
            for _ in range(WARM_UP):
                step(fn)
            once = seconds(fn, 1)
            calls[member] = max(1, min(1000, int(SAMPLE_SECONDS / max(once, 1e-7))))
        members = list(compiled)
        for round_ in range(ROUNDS):
            turn = members[round_ % len(members) :] + members[: round_ % len(members)]
            for member in turn:
                settled = time.perf_counter() + SETTLE_SECONDS
                while time.perf_counter() < settled:
                    step(compiled[member])
                samples[member].append(seconds(compiled[member], calls[member]))
    return {member: statistics.median(found) for member, found in samples.items()}


def key(
    chain: ChainBackend, gm: Any, example_inputs: Any, kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """What decides a choice: ``memory``, the key it is remembered by (the graph, the chain
    and each member as they are here, what torch.compile was given, PyTorch's version and the
    device's model); ``identity``, the digest of the chain and its members alone (which
    ``explain`` matches); ``rank``, the name rank 0 tells the other ranks its choice by (the
    same on every rank: no path, no device index); ``graph``, the graph in a few words."""
    graph = graph_facts(gm, example_inputs)
    identity = _digest(chain_facts(chain.definition, chain._info))
    asked = canonical(dict(kwargs))
    device = device_type(gm, example_inputs)
    return {
        "memory": [graph, identity, asked, torch_version(), device_model(device)],
        "identity": identity,
        "rank": "torch_backend_registry/select/" + _digest([chain.__name__, graph, asked]),
        "graph": _described(gm, graph),
    }


def chain_facts(chain: BackendDefinition, info: Callable[[str], BackendInfo]) -> list[Any]:
    """The chain's own facts, and each member's (``info`` finds them), with the files of its
    code (a project's own: edited, it is another member), as the fingerprint states them."""
    found: list[Any] = [own_facts(chain, torch_version())]
    for member in chain.members:
        with contextlib.suppress(Exception):  # a member not here: it is skipped, said so
            definition = info(member).definition
            code = None  # a plugin's or PyTorch's: its version says which code it is
            if definition.target is not None and definition.source.kind in ("env", "project"):
                module = definition.target.partition(":")[0]
                code = code_stamp(module, definition.search_path)
            found.append([member, own_facts(definition, torch_version()), code])
    return found


def graph_facts(gm: Any, example_inputs: Any) -> list[Any]:
    """The graph as a choice is keyed by: its code and, for each input, shape, strides,
    dtype, device type and ``requires_grad``, as dynamo recorded them where it did (under
    ``dynamic=True`` the sizes are symbols: one choice for every size), and grad mode."""
    import torch

    placeholders = [
        n for n in getattr(getattr(gm, "graph", None), "nodes", ()) if n.op == "placeholder"
    ]
    recorded = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    values = (
        recorded
        if len(recorded) == len(example_inputs) and all(v is not None for v in recorded)
        else list(example_inputs)
    )
    inputs: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            strides = str(value.stride()) if value.layout == torch.strided else None
            kind = [str(tuple(value.shape)), strides, str(value.dtype), value.device.type]
            inputs.append([*kind, value.requires_grad])
        else:
            inputs.append(type(value).__name__ if isinstance(value, torch.SymInt) else repr(value))
    return [str(getattr(gm, "code", type(gm).__name__)), inputs, torch.is_grad_enabled()]


def device_model(device: str) -> list[Any]:
    """Which model of device ``device`` names here: a CPU's architecture, instruction set and
    cores; an accelerator's own name."""
    import platform

    import torch

    if device == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        return [platform.machine(), platform.processor(), capability, os.cpu_count()]
    module = getattr(torch, device, None)
    with contextlib.suppress(Exception):
        return [device, module.get_device_name()]  # type: ignore[union-attr]
    return [device]


def remembered(
    cache: Cache, chain: BackendDefinition, info: Callable[[str], BackendInfo]
) -> list[dict[str, Any]]:
    """The choices remembered here for ``chain`` as it is now, newest first."""
    identity = _digest(chain_facts(chain, info))
    found = [
        entry
        for entry in cache.entries(KIND)
        if isinstance(entry, dict) and entry.get("identity") == identity
    ]
    return sorted(found, key=lambda entry: -float(entry.get("when", 0)))


# ------------------------------------------------------------------ every rank one choice


def _store() -> Any:
    """The default group's store, where torch.distributed is initialised with more than one
    rank (never imported here: a process that did not load it has no ranks)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() < 2:
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def _rank() -> int:
    import torch.distributed as dist

    return int(dist.get_rank())


def _publish(store: Any, decides: Mapping[str, Any], member: str) -> None:
    """Tell the other ranks rank 0's choice (``""``: no member compiled)."""
    if store is not None:
        store.set(decides["rank"], member)


def _as_rank_zero_chose(
    run: Run, store: Any, decides: Mapping[str, Any], environ: Mapping[str, str]
) -> Any:
    """On a rank other than 0: compile with the member rank 0 chose, timing nothing; where
    none comes in time, with the chain's first member that verifies, said as a warning."""
    from datetime import timedelta

    limit = _seconds(environ.get(SELECT_TIMEOUT_VAR))
    chosen: str | None = None
    try:
        store.wait([decides["rank"]], timedelta(seconds=limit))
        chosen = store.get(decides["rank"]).decode()
    except Exception as exc:  # the time limit, or rank 0's store gone
        logger.warning(
            "backend %r: warning: rank %d heard no choice from rank 0 within %g s (%s:"
            " %s); it compiles with the chain's first member that verifies",
            run.name,
            _rank(),
            limit,
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc).strip() else "no message",
        )
    if chosen:
        for member, compiled in run.candidates([chosen]):
            return run.use(member, compiled, ", rank 0's choice")
    others = [member for member in run.chain.members if member != chosen]
    for member, compiled in run.candidates(others):
        return run.use(member, compiled, ", the chain's first that verifies")
    raise run.failed()


def _seconds(value: str | None) -> float:
    with contextlib.suppress(TypeError, ValueError):
        seconds = float(value)  # type: ignore[arg-type]
        if 0 < seconds < float("inf"):
            return seconds
    return SELECT_TIMEOUT


# ------------------------------------------------------------------ words


def said(choice: Mapping[str, Any]) -> str:
    """How a choice was made, in words: its speed-up over the first member that verified."""
    member, first = choice.get("member"), choice.get("first")
    speedup = float(choice.get("speedup") or 1.0)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(choice.get("when") or 0)))
    if member == first:
        return f"the chain's first that verified; decided {when}"
    return f"{speedup:.2f}x over {first!r}; decided {when}"


def _duration(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _described(gm: Any, graph: list[Any]) -> str:
    """A graph in a few words: how many operations, and its inputs' shapes."""
    nodes = getattr(getattr(gm, "graph", None), "nodes", ())
    operations = sum(node.op in ("call_function", "call_method", "call_module") for node in nodes)
    shapes = [entry[0] for entry in graph[1] if isinstance(entry, list)][:3]
    more = ", ..." if len(graph[1]) > 3 else ""
    return f"graph of {operations} operations on {', '.join(shapes)}{more}"


def _digest(facts: object) -> str:
    return hashlib.sha256(canonical(facts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
