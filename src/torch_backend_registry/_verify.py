"""Checking a compiled graph against the same graph run eagerly, on copies of its inputs.

The eager run is the reference, taken once a compile, before any member of a chain sees
the graph (a compiler may rewrite it in place). Compared: the outputs, the inputs as the
graph left them, and with ``backward`` the gradients of the inputs that require them.

Nothing of the model changes: every run gets copies of the tensor inputs, the graph's
parameters and buffers are put back after it, gradients are taken with
``torch.autograd.grad`` (never into ``.grad``), and every random number generator starts
each run from one state, restored afterwards. A graph that gives other values on a second
run from that state draws random numbers (dropout), as compilers do each their own way:
it is held to the shapes and types of what it gives, and the log says so.
"""

from __future__ import annotations

import contextlib
import copy

from ._forksafe import ForkSafeLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Sequence
    from typing import Any

#: Compiling for a backward check changes a setting of the whole process: one at a time.
_SERIAL = ForkSafeLock()


@contextlib.contextmanager
def compiling(level: str | None) -> Iterator[None]:
    """Where a member of a chain that verifies is compiled. AOTAutograd compiles a backward
    pass at its first run: run while torch.compile still compiles the forward, it would take
    that compile for its own. For ``backward``, members compile it at once, as PyTorch's
    ahead-of-time compiles do (``force_non_lazy_backward_lowering``)."""
    if level == "backward":
        import torch._functorch.config as config

        if hasattr(config, "force_non_lazy_backward_lowering"):
            with _SERIAL, config.patch(force_non_lazy_backward_lowering=True):
                yield
            return
    yield


class Reference:
    """The graph run eagerly on copies of ``example_inputs``, to hold compiled ones to.

    ``said`` tells how far a check goes: ``"forward verified against eager"``, or in
    shapes and types only, or ``"not verified: ..."`` where there is nothing to run
    (fake tensors) or the eager run itself fails (then every member passes).
    """

    def __init__(
        self, gm: Any, example_inputs: Sequence[Any], level: str, rtol: float, atol: float
    ) -> None:
        import torch
        from torch.utils._pytree import tree_flatten, tree_unflatten

        self.gm = gm
        self.asked = level
        #: Whether the graph is compiled for training: its outputs must then require grad
        #: where eager's do, whatever the level.
        self.training = torch.is_grad_enabled()
        self.backward = level == "backward" and self.training
        self.close: tuple[float | None, float | None] = (rtol, atol)
        #: The outputs (and inputs written in place) that differ from one eager run to the
        #: next: held to their shapes and types only; the others keep their values checked.
        self.varying: tuple[set[int], set[int]] = (set(), set())
        self.gradients: tuple[Any, ...] | None = None
        #: Why nothing is compared (then every member passes); what follows is set only where
        #: it is ``None``.
        self.unverified: str | None = None
        try:
            # Lists, tuples and dicts opened: compiled autograd hands its graph one list of
            # tensors.
            flat, spec = tree_flatten(list(example_inputs))
            if any(map(fake, flat)):
                raise ValueError("fake inputs have no values to run on")
            # Under dynamic=True, sizes come as symbols: each is run at the value it stands for.
            self.inputs: list[Any] = tree_unflatten([_concrete(x) for x in flat], spec)
        except ValueError as exc:
            self.unverified = str(exc)
            return
        try:
            with _generators():
                out, passed, grads = self._run(gm, self.backward)
                # Run on from where the first run left the generators: does it give other
                # values then (it draws random numbers)?
                again, written, _ = self._run(gm, False)
            # Other values from the same start, in what it gives or what it writes in place:
            # those draw random numbers (or leave memory unset), and so do the gradients.
            self.varying = (_varying(leaves(out), leaves(again)), _varying(passed, written))
            if len(self.varying[0]) == len(leaves(out)):  # every output: the whole graph
                self.close = (None, None)
            loss = _loss(out) if self.backward else None
            if loss is not None and grads:
                self.gradients = torch.autograd.grad(loss, grads, allow_unused=True)
            else:
                self.backward = False  # nothing to differentiate: the forward is all there is
        except Exception as exc:
            self.unverified = f"the graph run eagerly raised {type(exc).__name__}: {exc}"
            return
        self.eager = [o.detach() if _tensor(o) else o for o in leaves(out)]
        #: For each tensor output, whether eager's requires grad.
        self.requires_grad = [o.requires_grad for o in leaves(out) if _tensor(o)]
        self.written = [x.detach() for x in passed]

    @property
    def complete(self) -> bool:
        """Whether a check compares all that was asked, values included."""
        whole = self.backward or self.asked != "backward"
        return self.unverified is None and not any(self.varying) and whole

    @property
    def said(self) -> str:
        if self.unverified is not None:
            return f"not verified: {self.unverified}"
        level = "backward" if self.backward else "forward"
        said = f"{level} verified against eager"
        if self.close == (None, None):
            said = f"{level} verified in shapes and types only (the graph draws random numbers)"
        elif any(self.varying):
            which = [f"output {n}" for n in sorted(self.varying[0])]
            which += [f"input {n}" for n in sorted(self.varying[1])]
            said += (
                f", but {', '.join(which)} in shapes and types only (they differ from one eager"
                " run to the next: random numbers, or memory left unset)"
            )
            if self.backward:
                said += " and the gradients too"
        if level != self.asked:
            said += "; no backward to verify (gradients are off, or no output requires them)"
        return said

    def check(self, compiled: Callable[..., Any]) -> str | None:
        """Why ``compiled`` does not compute what the graph does; ``None`` where it does."""
        if self.unverified is not None:
            return None
        try:
            with _generators():  # from the state the eager run started from
                out, passed, grads = self._run(compiled, self.backward)
        except Exception as exc:
            return f"running it raised {type(exc).__name__}: {exc}"
        try:
            why = differ(self.eager, leaves(out), "output", *self.close, self.varying[0])
            why = why or _same_layout(self.eager, leaves(out))
            why = why or self._same_requires_grad(leaves(out))
            why = why or differ(self.written, passed, "input", *self.close, self.varying[1])
            if why is None and self.gradients is not None:
                why = self._same_gradients(out, grads)
        except Exception as exc:  # what it gave cannot even be compared with eager's
            return f"comparing it with eager raised {type(exc).__name__}: {exc}"
        return why

    def _same_requires_grad(self, out: list[Any]) -> str | None:
        """Where the graph is compiled for training, an output that does not require grad
        where eager's does gives no backward pass: ``loss.backward()`` would fail far from
        here."""
        if not self.training:
            return None
        tensors = [o for o in out if _tensor(o)]
        if any(self.requires_grad) and not any(o.requires_grad for o in tensors):
            return "no output requires grad, where eager's do: it gives no backward pass"
        for number, (eager, got) in enumerate(zip(self.requires_grad, tensors, strict=False)):
            if eager and not got.requires_grad:
                return (
                    f"output {number} does not require grad where eager's does: its"
                    " gradient would be lost in training"
                )
        return None

    def _run(self, fn: Callable[..., Any], grad: bool) -> tuple[Any, list[Any], list[Any]]:
        """``fn`` on fresh copies, the graph's own state put back. Returns what it gave,
        the inputs as it left them, and the leaves to differentiate by."""
        import torch
        from torch.utils._pytree import tree_flatten

        passed, grads = _copies(self.inputs, self.training)
        grads = grads if grad else []
        # Taken before the run: a graph given its inputs in a list (compiled autograd's) may
        # empty it, as a boxed call does.
        tensors = [x for x in tree_flatten(passed)[0] if _tensor(x)]
        state = {name: t.detach().clone() for name, t in self.gm.state_dict(keep_vars=True).items()}
        try:
            out = fn(*passed)
        finally:
            with torch.no_grad():
                for name, t in self.gm.state_dict(keep_vars=True).items():
                    if name in state:
                        t.copy_(state[name])
        return out, tensors, grads

    def _same_gradients(self, out: Any, grads: list[Any]) -> str | None:
        import torch

        assert self.gradients is not None
        try:
            # An output requires grad: _same_requires_grad said so before this is asked.
            got = torch.autograd.grad(_loss(out), grads, allow_unused=True)
        except Exception as exc:
            return f"its backward raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
        pairs = [(e, g) for e, g in zip(self.gradients, got, strict=True) if (e, g) != (None, None)]
        if any(e is None or g is None for e, g in pairs):
            return "its gradients reach other inputs than eager's"
        # Gradients flow through every output: one that varies makes them all vary.
        close = (None, None) if any(self.varying) else self.close
        return differ([e for e, _g in pairs], [g for _e, g in pairs], "gradient", *close)


def _concrete(value: Any) -> Any:
    """The value a symbolic size (``SymInt``, ``SymFloat``, ``SymBool``) stands for in this
    compile, as dynamo recorded it; anything else as it is. A :class:`ValueError` where a
    symbol has no such value."""
    import torch

    if not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value
    hint = getattr(getattr(value, "node", None), "hint", None)
    if hint is None:
        raise ValueError(f"the symbolic input {value} has no concrete value to run on")
    return hint


def _tensor(x: object) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def fake(x: object) -> bool:
    """Whether ``x`` is one of dynamo's fake tensors: a shape with no values to run on."""
    return type(x).__name__ == "FakeTensor"


def _copies(inputs: list[Any], grad: bool) -> tuple[list[Any], list[Any]]:
    """Copies of the tensor inputs, parameters included, in one ``deepcopy`` so that inputs
    sharing memory still do, each with its own strides and offset (compiled code holds the
    strides it was compiled for); those inside a list or tuple too, in new ones. With
    ``grad``, each storage of inputs that require grad gets one leaf, returned to
    differentiate by; each such input is a view of one clone of it (a graph may write its
    inputs in place, which a leaf may not be)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten(inputs)
    tensors = {i: x.detach() for i, x in enumerate(flat) if _tensor(x)}
    copied = copy.deepcopy(tensors)
    passed, leaves_ = list(flat), []
    roots: dict[tuple[int, Any], Any] = {}
    for i, y in copied.items():
        if grad and flat[i].requires_grad and (y.is_floating_point() or y.is_complex()):
            storage = y.untyped_storage()
            key = (storage.data_ptr(), y.dtype)
            through = roots.get(key)
            if through is None:
                size = storage.nbytes() // y.element_size()
                whole = y.new_empty(0).set_(storage, 0, (size,), (1,))
                leaf = whole.detach().requires_grad_(True)
                leaves_.append(leaf)
                through = roots[key] = leaf.clone()
            y = torch.as_strided(through, y.size(), y.stride(), y.storage_offset())
        passed[i] = y
    return tree_unflatten(passed, spec), leaves_


def _loss(out: Any) -> Any:
    """One number from the outputs that require gradients (``None``: none does): each
    weighted by a fixed draw of random numbers of its shape, so that a backward pass that
    mishandles the gradient it is given (drops it, reorders it) gives other gradients than
    eager's, as a plain sum, whose incoming gradients are all ones, would not show."""
    import torch

    outputs = [o for o in leaves(out) if _tensor(o) and o.requires_grad]
    if not outputs:
        return None
    draws = torch.Generator().manual_seed(0x7B)
    total: Any = 0
    for o in outputs:
        value = torch.view_as_real(o) if o.is_complex() else o
        weight = torch.randn(value.shape, generator=draws).to(device=value.device)
        total = total + (value.float() * weight).sum()
    return total


@contextlib.contextmanager
def _generators() -> Iterator[None]:
    """Every random number generator in use as it was, afterwards: the CPU's and each
    accelerator's that is initialised (``torch.random.fork_rng`` for each kind)."""
    import torch

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))
        for kind in ("cuda", "xpu", "mps"):
            module = getattr(torch, kind, None)
            started = getattr(module, "is_initialized", getattr(module, "is_available", None))
            if started is None or not started():
                continue
            count = getattr(module, "device_count", lambda: 1)()
            stack.enter_context(torch.random.fork_rng(devices=range(count), device_type=kind))
        yield


def leaves(value: Any) -> list[Any]:
    """The values a graph returned, flattened (tuples, lists and dicts of tensors)."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=repr) for leaf in leaves(value[key])]
    return [value]


def _same_layout(eager: list[Any], mine: list[Any]) -> str | None:
    """An output that is contiguous from eager must be so from the member: a caller's
    ``out.view(-1)`` works on eager's and fails on the other (inductor keeps eager's)."""
    for number, (expected, got) in enumerate(zip(eager, mine, strict=False)):
        if not (_strided(expected) and _strided(got)):
            continue
        if expected.is_contiguous() and not got.is_contiguous():
            return (
                f"output {number} has strides {tuple(got.stride())} where eager's are"
                f" {tuple(expected.stride())}: it is not contiguous as eager's is"
            )
    return None


def _strided(value: Any) -> bool:
    """A dense tensor: one with strides (not sparse), whose values and layout compare."""
    import torch

    return _tensor(value) and value.layout == torch.strided


def _varying(first: list[Any], second: list[Any]) -> set[int]:
    """Which of two eager runs' values (from the same start) differ."""
    return {
        n for n, (a, b) in enumerate(zip(first, second, strict=False)) if differ([a], [b], "", 0, 0)
    }


def differ(
    eager: list[Any],
    mine: list[Any],
    what: str,
    rtol: float | None,
    atol: float | None,
    loose: Collection[int] = (),
) -> str | None:
    """How ``mine`` differs from ``eager``; with no tolerances, and for the values numbered
    in ``loose``, in shapes and types only."""
    import torch

    if len(eager) != len(mine):
        return f"{len(mine)} {what}s where eager gives {len(eager)}"
    for number, (expected, got) in enumerate(zip(eager, mine, strict=True)):
        if expected is None:
            # No value to hold it to: compiled autograd's graph gives None for each gradient
            # it accumulates, where AOTAutograd's compile of it gives the tensor.
            continue
        if _tensor(expected) != _tensor(got):
            return f"{what} {number} is {type(got).__name__}, eager gives {type(expected).__name__}"
        if not _tensor(expected):
            if expected != got:
                return f"{what} {number} is {got!r}, eager gives {expected!r}"
            continue
        if rtol is None or atol is None or number in loose:
            kind = (got.shape, got.dtype)
            if kind != (expected.shape, expected.dtype):
                return f"{what} {number} is {kind}, eager gives {(expected.shape, expected.dtype)}"
            continue
        # Integers, booleans and the like are exact: an index or a count is right or wrong.
        exact = not (expected.is_floating_point() or expected.is_complex())
        tolerances = (0.0, 0.0) if exact else (rtol, _absolute(expected, rtol, atol))
        try:
            torch.testing.assert_close(
                got, expected, rtol=tolerances[0], atol=tolerances[1], equal_nan=True
            )
        except (AssertionError, TypeError) as exc:
            if exact:
                return f"{what} {number} ({expected.dtype}) differs from eager's: {summary(exc)}"
            limits = f"rtol={rtol}, atol={atol}"
            if tolerances[1] < atol:
                limits += f" (here {tolerances[1]:.3g}, rtol of its largest value)"
            return f"{what} {number} differs from eager beyond {limits}: {summary(exc)}"
    return None


#: The least absolute tolerance: torch.testing's for float32. Below it lies rounding noise,
#: as in a gradient that is zero but for it (a bias before a batch norm).
_LEAST_ATOL = 1e-5


def _absolute(expected: Any, rtol: float, atol: float) -> float:
    """The absolute tolerance for ``expected``: ``atol``, but no more than ``rtol`` of its
    largest finite magnitude (nor less than :data:`_LEAST_ATOL`). A tolerance above every
    value checks nothing: a softmax's probabilities, or small gradients, all zero or all
    doubled would pass."""
    if not _strided(expected):  # sparse: as given
        return atol
    finite = expected.detach()[expected.detach().isfinite()]
    if finite.numel() == 0:
        return atol
    return min(atol, max(rtol * float(finite.abs().max()), _LEAST_ATOL))


def summary(exc: BaseException) -> str:
    """assert_close's message, shortened to how many elements differ and by how much."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    facts = [line for line in lines if line.startswith(("Mismatched", "Greatest"))]
    return "; ".join(facts) or (lines[0] if lines else "values differ")
