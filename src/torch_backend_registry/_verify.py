"""Checking a compiled graph against the same graph run eagerly, on copies of its inputs.

What is compared: the outputs, the inputs the graph writes in place (BatchNorm's
running statistics), and with ``backward`` the gradients of the inputs that
require them. Nothing of the model changes: parameters are shared but never
written (a forward pass does not write them; gradients are taken with
``torch.autograd.grad``, never accumulated into ``.grad``), every other input is
copied, the graph's own buffers are put back, and the random number generators
are as they were: both runs start from the same state, which is then restored.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from contextlib import AbstractContextManager
    from typing import Any


def compiling(level: str | None) -> AbstractContextManager[object]:
    """Where a member of a chain that verifies is compiled.

    A backward pass is compiled lazily, at its first run (AOTAutograd's): run while
    torch.compile is still compiling the forward, that compile would take the one under
    way for its own. For ``backward``, members compile it at once, as PyTorch does for
    its ahead-of-time compiles (``force_non_lazy_backward_lowering``).
    """
    import contextlib

    if level != "backward":
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    patch: AbstractContextManager[object] = functorch_config.patch(
        force_non_lazy_backward_lowering=True
    )
    return patch


def check(
    gm: Any,
    example_inputs: Sequence[Any],
    compiled: Callable[..., Any],
    level: str,
    rtol: float,
    atol: float,
) -> str | None:
    """Why ``compiled`` does not compute what ``gm`` does on ``example_inputs``; ``None``."""
    if any(type(x).__name__ == "FakeTensor" for x in example_inputs):
        return None  # no values to run on: nothing to compare, nothing refused
    return _check(gm, example_inputs, compiled, level, rtol, atol)


def _check(
    gm: Any,
    example_inputs: Sequence[Any],
    compiled: Callable[..., Any],
    level: str,
    rtol: float,
    atol: float,
) -> str | None:
    import torch

    backward = level == "backward" and torch.is_grad_enabled()
    devices = sorted(
        {x.device.index or 0 for x in example_inputs if _tensor(x) and x.device.type == "cuda"}
    )
    buffers = {name: b.detach().clone() for name, b in gm.named_buffers()}
    with torch.random.fork_rng(devices=devices):
        start = _rng_state(devices)
        try:
            eager_inputs = _copies(example_inputs, backward)
            eager = gm(*eager_inputs)
            # Run again (a graph that drew random numbers moved the generators on): does
            # it give other values (dropout)?
            random = differ(leaves(eager), leaves(gm(*_copies(example_inputs, False))), "", 0, 0)
            _set_rng_state(start, devices)
            mine = _copies(example_inputs, backward)
            try:
                out = compiled(*mine)  # as torch.compile calls what a backend returns
            except Exception as exc:
                return f"running it raised {type(exc).__name__}: {exc}"
        finally:
            with torch.no_grad():
                for name, b in gm.named_buffers():
                    b.copy_(buffers[name])
    # A graph that draws random numbers is held to running, and to the shapes and types of
    # what it gives: compilers draw random numbers their own way, so values cannot agree.
    close: tuple[float | None, float | None] = (rtol, atol) if random is None else (None, None)
    why = differ(leaves(eager), leaves(out), "output", *close)
    written = [i for i, x in enumerate(example_inputs) if _tensor(x) and not _parameter(x)]
    why = why or differ(
        [eager_inputs[i] for i in written], [mine[i] for i in written], "input", *close
    )
    if why is None and backward:
        why = _gradients(eager, out, eager_inputs, mine, *close)
    return why


def _tensor(x: object) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _parameter(x: object) -> bool:
    import torch

    return isinstance(x, torch.nn.Parameter)


def _copies(inputs: Sequence[Any], grad: bool) -> list[Any]:
    """Parameters shared (a forward pass does not write them), other tensors copied."""
    copies = []
    for x in inputs:
        if _tensor(x):
            y = x.detach() if _parameter(x) else x.detach().clone()
            if grad and x.requires_grad:
                y.requires_grad_(True)
            x = y
        copies.append(x)
    return copies


def _rng_state(devices: Sequence[int]) -> tuple[Any, list[Any]]:
    import torch

    return torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]


def _set_rng_state(state: tuple[Any, list[Any]], devices: Sequence[int]) -> None:
    import torch

    torch.set_rng_state(state[0])
    for device, cuda in zip(devices, state[1], strict=True):
        torch.cuda.set_rng_state(cuda, device)


def leaves(value: Any) -> list[Any]:
    """The values a graph returned, flattened (tuples, lists and dicts of tensors)."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=repr) for leaf in leaves(value[key])]
    return [value]


def differ(
    eager: list[Any], mine: list[Any], what: str, rtol: float | None, atol: float | None
) -> str | None:
    """How ``mine`` differs from ``eager``; with no tolerances, in shapes and types only."""
    import torch

    if len(eager) != len(mine):
        return f"{len(mine)} {what}s where eager gives {len(eager)}"
    for number, (expected, got) in enumerate(zip(eager, mine, strict=True)):
        if not _tensor(expected):
            if expected != got:
                return f"{what} {number} is {got!r}, eager gives {expected!r}"
            continue
        if rtol is None or atol is None:
            kind = (getattr(got, "shape", None), getattr(got, "dtype", None))
            if kind != (expected.shape, expected.dtype):
                return f"{what} {number} is {kind}, eager gives {(expected.shape, expected.dtype)}"
            continue
        try:
            torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
        except (AssertionError, TypeError) as exc:
            limits = f"rtol={rtol}, atol={atol}"
            return f"{what} {number} differs from eager beyond {limits}: {summary(exc)}"
    return None


def summary(exc: BaseException) -> str:
    """assert_close's message, shortened to how many elements differ and by how much."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    facts = [line for line in lines if line.startswith(("Mismatched", "Greatest"))]
    return "; ".join(facts) or (lines[0] if lines else "values differ")


def _gradients(
    eager: Any,
    out: Any,
    eager_inputs: list[Any],
    mine: list[Any],
    rtol: float | None,
    atol: float | None,
) -> str | None:
    import torch

    floating = [
        (e, m)
        for e, m in zip(leaves(eager), leaves(out), strict=True)
        if _tensor(e) and e.is_floating_point() and e.requires_grad
    ]
    wanted = [i for i, x in enumerate(eager_inputs) if _tensor(x) and x.requires_grad]
    if not floating or not wanted:
        return None
    expected = torch.autograd.grad(
        sum(e.float().sum() for e, _m in floating),
        [eager_inputs[i] for i in wanted],
        allow_unused=True,
    )
    try:
        got = torch.autograd.grad(
            sum(m.float().sum() for _e, m in floating), [mine[i] for i in wanted], allow_unused=True
        )
    except Exception as exc:
        return f"its backward raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
    pairs = [(e, g) for e, g in zip(expected, got, strict=True) if e is not None or g is not None]
    if any(e is None or g is None for e, g in pairs):
        return "its gradients reach other inputs than eager's"
    return differ([e for e, _g in pairs], [g for _e, g in pairs], "gradient", rtol, atol)
