"""How close a compiled graph's values are to eager's: tolerances, and float64 as the judge.

Values compare as ``torch.testing.assert_close`` compares them, with a chain's tolerances.
Where a floating value misses them, it is judged as PyTorch judges its own compilers
(``torch._dynamo.utils.same``): against the graph run in float64, a member passes when its
error is at most a few times eager's own error (three for 16-bit types and small tensors,
two otherwise) plus a tenth of the absolute tolerance. So a compiler that rounds bfloat16
no worse than eager passes, and a wrong one does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import Any

from ._runs import tensor

#: The least absolute tolerance: torch.testing's for float32. Below it lies rounding noise,
#: as in a gradient that is zero but for it (a bias before a batch norm).
LEAST_ATOL = 1e-5


def differ(
    eager: list[Any],
    mine: list[Any],
    what: str,
    rtol: float,
    atol: float,
    loose: Collection[int] = (),
    *,
    fp64: Callable[[], list[Any] | None] | None = None,
    drew: set[int] | None = None,
) -> str | None:
    """How ``mine`` differs from ``eager``. The values numbered in ``loose`` (random
    numbers) are compared as the others where they match, else in shapes and types, their
    numbers added to ``drew``. ``fp64()`` gives the values in float64 (``None`` where the
    graph cannot run so), asked only where needed."""
    import torch

    if len(eager) != len(mine):
        return f"{len(mine)} {what}s where eager gives {len(eager)}"
    judge: list[Any] | None = None
    for number, (expected, got) in enumerate(zip(eager, mine, strict=True)):
        if expected is None:
            # No value to hold it to: compiled autograd's graph gives None for each gradient
            # it accumulates, where AOTAutograd's compile of it gives the tensor.
            continue
        if tensor(expected) != tensor(got):
            return f"{what} {number} is {type(got).__name__}, eager gives {type(expected).__name__}"
        if not tensor(expected):
            if expected != got and number not in loose:
                return f"{what} {number} is {got!r}, eager gives {expected!r}"
            continue
        if (why := _values(expected, got, rtol, atol)) is None:
            continue
        kind, eagers = (got.shape, got.dtype), (expected.shape, expected.dtype)
        if number in loose:
            if kind != eagers:
                return f"{what} {number} is {kind}, eager gives {eagers}"
            if drew is not None:
                drew.add(number)
            continue
        floating = expected.is_floating_point() and expected.dtype != torch.float64
        if floating and fp64 is not None and _strided(expected) and kind == eagers:
            judge = fp64() if judge is None else judge  # made once, where first needed
            if judge is not None and judge[number] is not None:
                error = _no_worse(judge[number], expected, got, _absolute(expected, rtol, atol))
                if error is None:
                    continue
                why += f"; {error}"
        return f"{what} {number} {why}"
    return None


def _values(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """Why ``got``'s values are not ``expected``'s within the tolerances, or ``None``."""
    import torch

    # The same values (as an input nothing wrote, a parameter, is): no tolerance to work
    # out, which for a large tensor costs more than the run it checks.
    same_kind = _strided(expected) and _strided(got) and expected.dtype == got.dtype
    if same_kind and expected.device == got.device:
        with contextlib.suppress(RuntimeError, TypeError):  # a type it cannot compare
            if torch.equal(expected, got):
                return None
    # Integers, booleans and the like are exact: an index or a count is right or wrong.
    exact = not (expected.is_floating_point() or expected.is_complex())
    tolerances = (0.0, 0.0) if exact else (rtol, _absolute(expected, rtol, atol))
    try:
        torch.testing.assert_close(
            got, expected, rtol=tolerances[0], atol=tolerances[1], equal_nan=True
        )
    except (AssertionError, TypeError) as exc:
        if exact:
            return f"({expected.dtype}) differs from eager's: {summary(exc)}"
        limits = f"rtol={rtol}, atol={atol}"
        if tolerances[1] < atol:
            limits += f" (here {tolerances[1]:.3g}, rtol of its largest value)"
        return f"differs from eager beyond {limits}: {summary(exc)}"
    return None


def _no_worse(fp64: Any, eager: Any, got: Any, atol: float) -> str | None:
    """Why ``got`` is further from the float64 value than eager is (PyTorch's rule, see the
    module's docstring), or ``None`` where it is not."""
    import torch

    def rmse(value: Any) -> float:
        return float((value.detach().double() - fp64).square().mean().sqrt())

    multiplier = 3.0 if got.dtype in (torch.float16, torch.bfloat16) or fp64.numel() < 1000 else 2.0
    eagers, mine = rmse(eager), rmse(got)
    if mine <= multiplier * eagers + atol / 10:
        return None
    return (
        f"and it is further from the graph run in float64 than eager is (root mean square"
        f" error {mine:.3g} against eager's {eagers:.3g})"
    )


def _absolute(expected: Any, rtol: float, atol: float) -> float:
    """The absolute tolerance for ``expected``: ``atol``, but no more than ``rtol`` of its
    largest finite magnitude (nor less than :data:`LEAST_ATOL`). A tolerance above every
    value checks nothing: a softmax's probabilities, or small gradients, all zero or all
    doubled would pass."""
    if not _strided(expected):  # sparse: as given
        return atol
    finite = expected.detach()[expected.detach().isfinite()]
    if finite.numel() == 0:
        return atol
    return min(atol, max(rtol * float(finite.abs().max()), LEAST_ATOL))


def layouts(eager: list[Any], mine: list[Any], permuted: list[str]) -> str | None:
    """An output that fills its memory exactly once (dense, not overlapping itself) from eager
    must do so from the member: one that overlaps itself or leaves gaps makes a caller's
    ``out.view(-1)`` fail, or reads of its storage wrong. The same elements laid out in
    another order of dimensions are right, as PyTorch's own judge of compilers holds (inductor
    may return a key/value cache transposed): each such output is added to ``permuted``."""
    for number, (expected, got) in enumerate(zip(eager, mine, strict=False)):
        if not (_strided(expected) and _strided(got)) or expected.stride() == got.stride():
            continue
        if not dense(expected):
            continue
        if not dense(got):
            return (
                f"output {number} has strides {tuple(got.stride())} where eager's are"
                f" {tuple(expected.stride())}: it overlaps itself or leaves gaps where eager's"
                " fills its memory exactly"
            )
        if got.numel() > 1:
            permuted.append(
                f"output {number} laid out otherwise: strides {tuple(got.stride())}, eager's"
                f" {tuple(expected.stride())}"
            )
    return None


def dense(value: Any) -> bool:
    """Whether a tensor's elements fill its memory exactly once, in some order of its
    dimensions (dimensions of size one say nothing of it)."""
    if value.numel() == 0:
        return True
    dimensions = zip(value.shape, value.stride(), strict=True)
    expected = 1
    for size, stride in sorted((d for d in dimensions if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def same(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same values (``nan`` where both do), ``False`` where they
    cannot be compared so."""
    import torch

    try:
        return bool(
            torch.equal(a, b)
            or (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
        )
    except (RuntimeError, TypeError):
        return False


def varying(first: list[Any], second: list[Any]) -> set[int]:
    """Which of two eager runs' values (from the same start) differ."""
    return {
        n for n, (a, b) in enumerate(zip(first, second, strict=False)) if differ([a], [b], "", 0, 0)
    }


def summary(exc: BaseException) -> str:
    """assert_close's message, shortened to how many elements differ and by how much."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    facts = [line for line in lines if line.startswith(("Mismatched", "Greatest"))]
    return "; ".join(facts) or (lines[0] if lines else "values differ")


def _strided(value: Any) -> bool:
    """A dense tensor: one with strides (not sparse), whose values and layout compare."""
    import torch

    return tensor(value) and value.layout == torch.strided
