"""Checking a compiled graph against the same graph run eagerly, on copies of its inputs.

The eager run is the reference, taken once a compile, before any member of a chain sees
the graph (a compiler may rewrite it in place). Compared (see ``_compare``): the outputs,
the inputs as the graph left them, and with ``backward`` the gradients of the inputs that
require them.

Nothing of the model changes: every run gets copies of the tensor inputs, the graph's
parameters and buffers are put back after it, gradients are taken with
``torch.autograd.grad`` (never into ``.grad``), and every random number generator starts
each run from one state, restored afterwards. A value that differs between two eager runs
from that state is drawn at random (dropout), or left unset: a member's is compared with
eager's where it draws the same numbers (eager and AOTAutograd do), and held to its shape
and type where it draws its own (inductor does), which the log says.
"""

from __future__ import annotations

import contextlib
import copy

from ._compare import differ, same_layout, varying
from ._forksafe import ForkSafeLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
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
        self.close = (rtol, atol)
        #: The outputs (and inputs written in place) that differ from one eager run to the
        #: next: compared where a member draws the same numbers, else in shapes and types.
        self.varying: tuple[set[int], set[int]] = (set(), set())
        #: What the last check said of how far it went, and whether that is all asked.
        self.said, self.complete = "", False
        self._fp64: tuple[list[Any] | None, list[Any] | None] | None = None
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
            with generators():
                out, passed, grads = self._run(gm, self.backward)
                # Run on from where the first run left the generators: does it give other
                # values then (it draws random numbers)?
                again, written, _ = self._run(gm, False)
            # Other values from the same start, in what it gives or what it writes in place:
            # those draw random numbers (or leave memory unset), and so do the gradients.
            self.varying = (varying(leaves(out), leaves(again)), varying(passed, written))
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
    def backward_runs(self) -> bool:
        """Whether a training step runs a backward pass through the graph: it is compiled
        with gradients on, and an output requires grad."""
        return self.unverified is None and self.training and any(self.requires_grad)

    def check(self, compiled: Callable[..., Any]) -> str | None:
        """Why ``compiled`` does not compute what the graph does; ``None`` where it does (and
        :attr:`said` says how far that was checked)."""
        if self.unverified is not None:
            self.said, self.complete = f"not verified: {self.unverified}", False
            return None
        drew: tuple[set[int], set[int], set[int]] = (set(), set(), set())
        try:
            with generators():  # from the state the eager run started from
                out, passed, grads = self._run(compiled, self.backward)
        except Exception as exc:
            return f"running it raised {_said(exc)}"
        try:
            got = leaves(out)
            why = differ(
                self.eager, got, "output", *self.close, self.varying[0],
                fp64=lambda: self._float64()[0], drew=drew[0],
            )  # fmt: skip
            why = why or same_layout(self.eager, got)
            why = why or self._same_requires_grad(got)
            why = why or differ(
                self.written, passed, "input", *self.close, self.varying[1], drew=drew[1]
            )
            if why is None and self.gradients is not None:
                why = self._same_gradients(out, grads, drew[2])
        except Exception as exc:  # what it gave cannot even be compared with eager's
            return f"comparing it with eager raised {_said(exc)}"
        if why is None:
            self._say(*drew)
        return why

    def _say(self, outputs: set[int], inputs: set[int], gradients: set[int]) -> None:
        """What :meth:`check` compared of a member that passed: ``outputs``, ``inputs`` and
        ``gradients`` vary between eager runs and differ from eager's too (the member draws
        its own random numbers), so only their shapes and types were."""
        level = "backward" if self.backward else "forward"
        said = f"{level} verified against eager"
        if len(outputs) == len(self.eager):  # every output: the whole graph
            said = f"{level} verified in shapes and types only (the graph draws random numbers)"
        elif outputs or inputs:
            which = [f"output {n}" for n in sorted(outputs)]
            which += [f"input {n}" for n in sorted(inputs)]
            said += (
                f", but {', '.join(which)} in shapes and types only (they differ from one eager"
                " run to the next: random numbers, or memory left unset)"
            )
            said += " and the gradients too" if gradients else ""
        elif any(self.varying):
            said += ", with the same random numbers as eager"
        if level != self.asked:
            said += "; no backward to verify (gradients are off, or no output requires them)"
        whole = self.backward or self.asked != "backward"
        self.said, self.complete = said, whole and not (outputs or inputs or gradients)

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
        from torch.utils._pytree import tree_flatten

        passed, grads = copies(self.inputs, self.training)
        grads = grads if grad else []
        # Taken before the run: a graph given its inputs in a list (compiled autograd's) may
        # empty it, as a boxed call does.
        tensors = [x for x in tree_flatten(passed)[0] if _tensor(x)]
        with restored(self.gm):
            out = fn(*passed)
        return out, tensors, grads

    def _same_gradients(self, out: Any, grads: list[Any], drew: set[int]) -> str | None:
        import torch

        assert self.gradients is not None
        try:
            # An output requires grad: _same_requires_grad said so before this is asked.
            got = torch.autograd.grad(_loss(out), grads, allow_unused=True)
        except Exception as exc:
            return f"its backward raised {_said(exc)}"
        pairs = [(e, g) for e, g in zip(self.gradients, got, strict=True) if (e, g) != (None, None)]
        if any(e is None or g is None for e, g in pairs):
            return "its gradients reach other inputs than eager's"
        kept = [
            n
            for n, pair in enumerate(zip(self.gradients, got, strict=True))
            if pair != (None, None)
        ]
        # Gradients flow through every output: one that varies makes them all vary.
        loose = range(len(pairs)) if any(self.varying) else ()
        fp64 = self._float64()[1] if not loose else None

        def judge() -> list[Any] | None:
            return None if fp64 is None else [fp64[n] for n in kept]

        return differ(
            [e for e, _g in pairs], [g for _e, g in pairs], "gradient", *self.close, loose,
            fp64=judge, drew=drew,
        )  # fmt: skip

    def _float64(self) -> tuple[list[Any] | None, list[Any] | None]:
        """The outputs and gradients of the graph run in float64, its floating inputs,
        parameters and buffers cast, autocast off; ``None`` for what cannot be run so (a
        graph that makes tensors of a type of its own) or draws random numbers. Run once,
        where a value misses the tolerances: it copies the graph."""
        import torch

        if self._fp64 is not None:
            return self._fp64
        self._fp64 = (None, None)
        if any(self.varying):
            return self._fp64
        try:
            held = any(t.is_floating_point() for t in self.gm.state_dict().values())
            gm = copy.deepcopy(self.gm).double() if held else self.gm
            inputs = [_double(x) for x in self.inputs]
            autocast = torch.autocast("cpu", enabled=False)
            with generators(), autocast, contextlib.ExitStack() as stack:
                for kind in ("cuda", "xpu"):
                    if getattr(getattr(torch, kind, None), "is_available", lambda: False)():
                        stack.enter_context(torch.autocast(kind, enabled=False))
                passed, leaves_ = copies(inputs, self.training)
                with restored(gm):
                    out = gm(*passed)
                outputs = [o.detach() if _tensor(o) else None for o in leaves(out)]
                gradients = None
                loss = _loss(out) if self.gradients is not None else None
                # Inputs that shared memory share none in float64: their gradients would
                # not line up with eager's.
                if loss is not None and len(leaves_) == len(self.gradients or ()):
                    gradients = list(torch.autograd.grad(loss, leaves_, allow_unused=True))
            self._fp64 = (outputs, gradients)
        except Exception:  # not runnable so: the plain comparison stands
            pass
        return self._fp64


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


def copies(inputs: list[Any], grad: bool) -> tuple[list[Any], list[Any]]:
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
def generators() -> Iterator[None]:
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


@contextlib.contextmanager
def restored(gm: Any) -> Iterator[None]:
    """The graph's own state (its parameters' and buffers' values: BatchNorm's running
    statistics, say) as it was, after the block."""
    import torch

    state_dict = getattr(gm, "state_dict", None)
    state = {} if state_dict is None else state_dict(keep_vars=True)
    kept = {name: t.detach().clone() for name, t in state.items()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, t in state.items():
                t.copy_(kept[name])


def _double(value: Any) -> Any:
    """``value`` in float64 where it is a floating tensor (a leaf again where it was one)."""
    if not (_tensor(value) and value.is_floating_point()):
        return value
    return value.detach().double().requires_grad_(value.requires_grad)


def _said(exc: BaseException) -> str:
    """An exception as a log line has room for: its type and its message's first line."""
    line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
