"""Timing a chain's members on a graph, and choosing the fastest: ``select = "fastest"``'s
measurement (``_select`` decides where a choice comes from).

The members take turns on one copy of the example inputs: warm-up calls first, then rounds
in which each member runs untimed for a moment and is then timed in a batch of calls, the
order turning round by one each round, so that no member always follows the same other.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from ._chain import Run
from ._runs import copies, generators, leaves, restored, said

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


def choose(
    order: list[str],
    samples: Mapping[str, list[float]],
    min_speedup: float,
    untimed: str = "it cannot be run to time it",
) -> tuple[str, float, str]:
    """The member chosen of ``order`` (the chain's members that verified, in its order), its
    speed-up over the first, and how it was chosen, in words: the fastest by median of those
    at least ``min_speedup`` times faster than the first by medians and beyond the spread of
    their samples (the first's lower quartile above their upper one), else the first
    (``untimed``: why nothing was timed)."""
    first = order[0]
    timed = [member for member in order if member in samples]
    if first not in samples or len(timed) < 2:
        return first, 1.0, f"the chain's first that verified, not timed ({untimed})"
    medians = {member: statistics.median(samples[member]) for member in timed}
    low = statistics.quantiles(samples[first], n=4)[0]
    sure = [
        member
        for member in timed[1:]
        if medians[first] >= min_speedup * medians[member]
        and low >= statistics.quantiles(samples[member], n=4)[2]
    ]
    # The fastest of those sure to be faster, else of all: how close it comes, in words.
    best = min(sure or timed, key=medians.__getitem__)
    speedup = medians[first] / medians[best] if medians[best] > 0 else 1.0
    if sure:
        return best, speedup, f"the fastest, {speedup:.2f}x over {first!r}"
    if best == first or speedup < min_speedup:
        return first, 1.0, f"the chain's first that verified: none is {min_speedup:g}x faster"
    return (
        first,
        1.0,
        (
            f"too close to call: {best!r} is {speedup:.2f}x faster than {first!r} by medians,"
            f" within the spread of their samples (±{spread(samples[best]) / 2:.0%},"
            f" ±{spread(samples[first]) / 2:.0%}); the chain's first is kept"
        ),
    )


def spread(samples: list[float]) -> float:
    """The middle half of ``samples`` over their median: how much one timing varies."""
    low, middle, high = statistics.quantiles(samples, n=4)
    return round((high - low) / middle, 3) if middle > 0 else 0.0


def timed(
    run: Run, compiled: Mapping[str, Callable[..., Any]]
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """The seconds of a step with each member's compiled graph, a sample a round: the forward,
    and where the graph is compiled for training and an output requires grad, the backward a
    training step runs with it. The members take turns, on one copy of the inputs; the
    graph's state and every random number generator are as they were afterwards. And what
    each member that raised while timed raised, in words (no longer timed)."""
    import torch

    reference = run.reference
    assert reference is not None
    # A training step runs a backward pass: the graph is compiled with gradients on, and an
    # output requires grad.
    backward = reference.training and any(reference.requires_grad)
    copied = copies(reference.inputs, backward)
    grads = copied.leaves + [p for p in getattr(run.gm, "parameters", list)() if p.requires_grad]
    synchronize = getattr(getattr(torch, run.device, None), "synchronize", None)

    def step(fn: Callable[..., Any]) -> None:
        out = fn(*copied.passed())
        if backward:
            outputs = [o for o in leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            if outputs and grads:
                ones = [torch.ones_like(o) for o in outputs]
                torch.autograd.grad(outputs, grads, ones, allow_unused=True)

    def seconds(fn: Callable[..., Any], calls: int) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            step(fn)
        if run.device != "cpu" and synchronize is not None:
            synchronize()
        return (time.perf_counter() - started) / calls

    samples: dict[str, list[float]] = {}
    calls: dict[str, int] = {}
    raised: dict[str, str] = {}

    def turn(member: str) -> None:
        """A member's turn; its first warms it up and sizes its batch of calls."""
        try:
            if member not in calls:
                for _ in range(WARM_UP):
                    step(compiled[member])
                once = max(seconds(compiled[member], 1), 1e-7)
                calls[member] = max(1, min(1000, int(SAMPLE_SECONDS / once)))
                return
            settled = time.perf_counter() + SETTLE_SECONDS
            while time.perf_counter() < settled:
                step(compiled[member])
            samples.setdefault(member, []).append(seconds(compiled[member], calls[member]))
        except Exception as exc:  # a member that raises on a later call: no longer timed
            raised[member] = said(exc)
            samples.pop(member, None)

    with torch.set_grad_enabled(reference.training), generators(), restored(run.gm):
        for round_ in range(ROUNDS + 1):  # the first round warms each member up
            order = [member for member in compiled if member not in raised]
            shift = round_ % max(len(order), 1)
            for member in order[shift:] + order[:shift]:  # a turn can fail its own member only
                turn(member)
    return {member: samples[member] for member in compiled if member in samples}, raised


def timings(choice: Mapping[str, Any]) -> str:
    """Each member's median time and spread, or why it was not timed, in words (what a
    hand-edited file holds otherwise is left out)."""
    seconds, spreads, skipped = (
        value if isinstance(value := choice.get(key), dict) else {}
        for key in ("seconds", "spread", "skipped")
    )
    said = [
        f"{m} {duration(float(s))} ±{float(spreads.get(m, 0)) / 2:.0%}"
        for m, s in seconds.items()
        if isinstance(s, (int, float)) and isinstance(spreads.get(m, 0), (int, float))
    ]
    said += [f"{m} not timed ({why})" for m, why in skipped.items()]
    return ", ".join(said) or "nothing timed"


def duration(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
