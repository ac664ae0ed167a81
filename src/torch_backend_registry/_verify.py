"""Checking a compiled graph against the same graph run eagerly, on copies of its inputs.

The eager run is the reference, taken once a compile, before any member of a chain sees
the graph (a compiler may rewrite it in place). Where the graph is compiled for training
(gradients on), at every level, ``none`` included: each output must require grad where
eager's does, and its gradient must reach every input (and parameter) eager's reaches, by a
walk of the autograd graph, with no backward run: a member that loses gradients would train
nothing, silently. With ``forward`` or ``backward``, compared too (see ``_compare``): the
outputs, the inputs as the graph left them, and with ``backward`` the gradients of the
inputs that require them.

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
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._compare import differ, layouts, same, varying
from ._forksafe import ForkSafeLock
from ._runs import Copies, concrete, copies, fake, flat, generators, leaves, restored, said, tensor

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
    """The graph run eagerly on copies of ``example_inputs``, to hold compiled ones to, at
    ``level`` ``"none"`` (where gradients are on: their reach only), ``"forward"`` or
    ``"backward"``.

    ``said`` tells how far a check goes: ``"forward verified against eager"``, or in
    shapes and types only, or ``"not verified: ..."`` where there is nothing to run
    (fake tensors) or the eager run itself fails (then every member passes).
    """

    def __init__(
        self, gm: Any, example_inputs: Sequence[Any], level: str, rtol: float, atol: float
    ) -> None:
        import torch
        from torch.utils._pytree import tree_map

        self.gm = gm
        self.asked = level
        #: Whether the graph is compiled for training: its outputs must then require grad
        #: where eager's do, and reach what eager's reach, whatever the level.
        self.training = torch.is_grad_enabled()
        self.backward = level == "backward" and self.training
        self.close = (rtol, atol)
        #: The outputs (and inputs written in place) that differ from one eager run to the
        #: next: compared where a member draws the same numbers, else in shapes and types.
        self.varying: tuple[set[int], set[int]] = (set(), set())
        #: What the last check said of how far it went, and whether that is all asked.
        self.said, self.complete = "", False
        self.gradients: tuple[Any, ...] | None = None
        #: The inputs the graph writes in place, by number, as they were before anything
        #: ran: what a member that ran the graph on them while compiling is put back from.
        self.clean: dict[int, Any] = {}
        #: Why nothing is compared (then every member passes); what follows is set only where
        #: it is ``None``.
        self.unverified: str | None = None
        try:
            # Lists, tuples and dicts opened: compiled autograd hands its graph one list of
            # tensors.
            if any(map(fake, flat(list(example_inputs)))):
                raise ValueError("fake inputs have no values to run on")
            # Under dynamic=True, sizes come as symbols: each is run at the value it stands for.
            self.inputs: list[Any] = tree_map(concrete, list(example_inputs))
        except ValueError as exc:
            self.unverified = str(exc)
            return
        try:
            with generators():
                out, run = self._run(gm)
                # Run on from where the first run left the generators: does it give other
                # values then (it draws random numbers)?
                again, rerun = self._run(gm) if level != "none" else (out, run)
            # Other values from the same start, in what it gives or what it writes in place:
            # those draw random numbers (or leave memory unset), and so do the gradients.
            self.varying = (
                varying(leaves(out), leaves(again)),
                varying(run.tensors, rerun.tensors),
            )
            loss = _loss(out) if self.backward else None
            if loss is not None and run.leaves:
                self.gradients = torch.autograd.grad(loss, run.leaves, allow_unused=True)
            else:
                self.backward = False  # nothing to differentiate: the forward is all there is
        except Exception as exc:
            self.unverified = f"the graph run eagerly raised {type(exc).__name__}: {exc}"
            return
        self.eager = [o.detach() if tensor(o) else o for o in leaves(out)]
        #: For each tensor output, whether eager's requires grad, and what its gradient reaches.
        self.requires_grad = [o.requires_grad for o in leaves(out) if tensor(o)]
        self.reaches = _reaches(out, run, gm)
        self.written = [x.detach() for x in run.tensors]
        # What the graph writes: by the version counter, and by value (an in-place kernel
        # may write without counting: BatchNorm's running statistics).
        originals = flat(self.inputs)
        self.clean = {
            n: originals[n].detach().clone()
            for n, x in enumerate(run.tensors)
            if x._version != run.versions[n] or not same(x, originals[n])
        }

    def check(self, compiled: Callable[..., Any]) -> str | None:
        """Why ``compiled`` does not compute what the graph does; ``None`` where it does (and
        :attr:`said` says how far that was checked)."""
        if self.unverified is not None:
            self.said, self.complete = f"not verified: {self.unverified}", False
            return None
        drew: tuple[set[int], set[int], set[int]] = (set(), set(), set())
        try:
            with generators():  # from the state the eager run started from
                out, run = self._run(compiled)
        except Exception as exc:
            return f"running it raised {said(exc)}"
        try:
            got = leaves(out)
            why = self._trains(got, run)
            permuted: list[str] = []
            if why is None and self.asked != "none":
                why = differ(
                    self.eager, got, "output", *self.close, self.varying[0],
                    fp64=lambda: self._float64[0], drew=drew[0],
                )  # fmt: skip
                why = why or layouts(self.eager, got, permuted)
                why = why or differ(
                    self.written, run.tensors, "input", *self.close, self.varying[1], drew=drew[1]
                )
                if why is None and self.gradients is not None:
                    why = self._same_gradients(out, run.leaves, drew[2])
        except Exception as exc:  # what it gave cannot even be compared with eager's
            return f"comparing it with eager raised {said(exc)}"
        if why is None:
            self._say(drew, permuted)
        return why

    def _say(self, drew: tuple[set[int], set[int], set[int]], permuted: list[str]) -> None:
        """What :meth:`check` compared of a member that passed: ``drew``, the outputs, inputs
        and gradients that vary between eager runs and differ from eager's too (the member
        draws its own random numbers), so only their shapes and types were; ``permuted``:
        outputs laid out otherwise than eager's, in the same memory."""
        if self.asked == "none":  # nothing asked: nothing to say of the gradients' reach
            self.said, self.complete = "", True
            return
        outputs, inputs, gradients = drew
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
        if permuted:
            said += f" ({'; '.join(permuted)})"
        if level != self.asked:
            said += "; no backward to verify (gradients are off, or no output requires them)"
        whole = self.backward or self.asked != "backward"
        self.said, self.complete = said, whole and not (outputs or inputs or gradients)

    def _trains(self, out: list[Any], run: Copies) -> str | None:
        """Where the graph is compiled for training, why the member's outputs (``out``,
        flattened) would not train as eager's do: one that does not require grad where eager's
        does gives no backward pass (``loss.backward()`` would fail far from here, or train
        nothing); and the gradient of each must reach every input and parameter eager's
        reaches (a member may reach more: AOTAutograd's backward is one function of every
        input that requires grad)."""
        if not self.training:
            return None
        tensors = [o for o in out if tensor(o)]
        if any(self.requires_grad) and not any(o.requires_grad for o in tensors):
            return "no output requires grad, where eager's do: it gives no backward pass"
        for number, (eager, got) in enumerate(zip(self.requires_grad, tensors, strict=False)):
            if eager and not got.requires_grad:
                return (
                    f"output {number} does not require grad where eager's does: its"
                    " gradient would be lost in training"
                )
        mine = _reaches(out, run, self.gm)
        for number, (eager, reached) in enumerate(zip(self.reaches, mine, strict=False)):
            if lost := sorted(eager - reached):
                more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
                return (
                    f"the gradient of output {number} does not reach {', '.join(lost[:3])}{more},"
                    f" where eager's does: {len(lost)} would get no gradient in training"
                )
        return None

    def _run(self, fn: Callable[..., Any]) -> tuple[Any, Copies]:
        """``fn`` on fresh copies, the graph's own state put back: what it gave, and the
        copies as it left them."""
        run = copies(self.inputs, self.training)
        with restored(self.gm):
            out = fn(*run.inputs)
        return out, run

    def _same_gradients(self, out: Any, grads: list[Any], drew: set[int]) -> str | None:
        import torch

        assert self.gradients is not None
        try:
            # An output requires grad: _trains said so before this is asked.
            got = torch.autograd.grad(_loss(out), grads, allow_unused=True)
        except Exception as exc:
            return f"its backward raised {said(exc)}"
        both = list(zip(self.gradients, got, strict=True))
        kept = [n for n, pair in enumerate(both) if pair != (None, None)]
        pairs = [both[n] for n in kept]
        if any(e is None or g is None for e, g in pairs):
            return "its gradients reach other inputs than eager's"
        # Gradients flow through every output: one that varies makes them all vary.
        loose = range(len(pairs)) if any(self.varying) else ()

        def judge() -> list[Any] | None:  # asked only where a gradient misses the tolerances
            fp64 = None if loose else self._float64[1]
            return None if fp64 is None else [fp64[n] for n in kept]

        return differ(
            [e for e, _g in pairs], [g for _e, g in pairs], "gradient", *self.close, loose,
            fp64=judge, drew=drew,
        )  # fmt: skip

    @functools.cached_property
    def _float64(self) -> tuple[list[Any] | None, list[Any] | None]:
        """The outputs and gradients of the graph run in float64, its floating inputs,
        parameters and buffers cast, autocast off; ``None`` for what cannot be run so (a
        graph that makes tensors of a type of its own) or draws random numbers. Run once,
        where a value misses the tolerances: it copies the graph."""
        import torch

        if any(self.varying):
            return None, None
        try:
            held = any(t.is_floating_point() for t in self.gm.state_dict().values())
            gm = copy.deepcopy(self.gm).double() if held else self.gm
            autocast = torch.autocast("cpu", enabled=False)
            with generators(), autocast, contextlib.ExitStack() as stack:
                for kind in ("cuda", "xpu"):
                    if getattr(getattr(torch, kind, None), "is_available", lambda: False)():
                        stack.enter_context(torch.autocast(kind, enabled=False))
                run = copies([_double(x) for x in self.inputs], self.training)
                with restored(gm):
                    out = gm(*run.inputs)
                outputs = [o.detach() if tensor(o) else None for o in leaves(out)]
                gradients = None
                loss = _loss(out) if self.gradients is not None else None
                # Inputs that shared memory share none in float64: their gradients would
                # not line up with eager's.
                if loss is not None and len(run.leaves) == len(self.gradients or ()):
                    gradients = list(torch.autograd.grad(loss, run.leaves, allow_unused=True))
            return outputs, gradients
        except Exception:  # not runnable so: the plain comparison stands
            return None, None


def _reaches(out: Any, run: Copies, gm: Any) -> list[frozenset[str]]:
    """For each tensor output, the inputs and parameters of the graph its gradient reaches:
    a walk of the autograd graph from it to the leaves it accumulates into."""
    named = {id(leaf): f"input {n}" for leaf, n in zip(run.leaves, run.owners, strict=True)}
    for name, p in getattr(gm, "named_parameters", list)():  # none where it is no module
        named[id(p)] = f"parameter {name!r}"
    found = []
    for output in (o for o in leaves(out) if tensor(o)):
        reached: set[str] = set()
        if output.requires_grad and id(output) in named:  # an input returned as it is
            reached.add(named[id(output)])
        todo, seen = [output.grad_fn], set()
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            # An AccumulateGrad: a leaf.
            if (variable := getattr(node, "variable", None)) is not None and id(variable) in named:
                reached.add(named[id(variable)])
            todo.extend(following for following, _ in node.next_functions)
        found.append(frozenset(reached))
    return found


def _loss(out: Any) -> Any:
    """One number from the outputs that require gradients (``None``: none does): each
    weighted by a fixed draw of random numbers of its shape, so that a backward pass that
    mishandles the gradient it is given (drops it, reorders it) gives other gradients than
    eager's, as a plain sum, whose incoming gradients are all ones, would not show."""
    import torch

    outputs = [o for o in leaves(out) if tensor(o) and o.requires_grad]
    if not outputs:
        return None
    draws = torch.Generator().manual_seed(0x7B)
    total: Any = 0
    for o in outputs:
        value = torch.view_as_real(o) if o.is_complex() else o
        weight = torch.randn(value.shape, generator=draws).to(device=value.device)
        total = total + (value.float() * weight).sum()
    return total


def _double(value: Any) -> Any:
    """``value`` in float64 where it is a floating tensor (a leaf again where it was one)."""
    if not (tensor(value) and value.is_floating_point()):
        return value
    return value.detach().double().requires_grad_(value.requires_grad)
