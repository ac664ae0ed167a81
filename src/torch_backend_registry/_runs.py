"""Running a graph on the side: on copies of its inputs, its own state and every random number
generator put back afterwards, so that nothing of the model changes."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any, NamedTuple


class Copies(NamedTuple):
    """Copies of a graph's inputs: what to pass (``inputs``), the tensors among them in the
    order :func:`flat` gives and their version counters as made (``versions``: a copy's
    starts where copying left it), and with gradients on, the ``leaves`` to differentiate by,
    each with the number of the first flat input it stands for (``owners``)."""

    inputs: list[Any]
    tensors: list[Any]
    versions: list[int]
    leaves: list[Any]
    owners: list[int]

    def passed(self) -> list[Any]:
        """The inputs to pass to one call: a list among them anew (compiled autograd's graph
        takes its tensors in one list, which a call empties, as a boxed call does)."""
        return [list(x) if isinstance(x, list) else x for x in self.inputs]


def copies(inputs: list[Any], grad: bool) -> Copies:
    """Copies of the tensor inputs, parameters included, in one ``deepcopy`` so that inputs
    sharing memory still do, each with its own strides and offset (compiled code holds the
    strides it was compiled for); those inside a list or tuple too, in new ones. With
    ``grad``, each storage of inputs that require grad gets one leaf to differentiate by;
    each such input is a view of one clone of it (a graph may write its inputs in place,
    which a leaf may not be)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten(inputs)
    copied = copy.deepcopy({i: x.detach() for i, x in enumerate(flat) if tensor(x)})
    passed, leaves, owners = list(flat), [], []
    roots: dict[tuple[int, Any], Any] = {}
    for i, y in copied.items():
        if grad and flat[i].requires_grad and (y.is_floating_point() or y.is_complex()):
            storage = y.untyped_storage()
            key = (storage.data_ptr(), y.dtype)
            if (through := roots.get(key)) is None:
                size = storage.nbytes() // y.element_size()
                leaf = y.new_empty(0).set_(storage, 0, (size,), (1,)).detach().requires_grad_(True)
                leaves.append(leaf)
                owners.append(i)
                through = roots[key] = leaf.clone()
            y = torch.as_strided(through, y.size(), y.stride(), y.storage_offset())
        passed[i] = y
    # Taken now: a graph given its inputs in a list (compiled autograd's) may empty it, as
    # a boxed call does.
    flat_copies = [x for x in passed if tensor(x)]
    versions = [x._version for x in flat_copies]
    return Copies(tree_unflatten(passed, spec), flat_copies, versions, leaves, owners)


def flat(inputs: list[Any]) -> list[Any]:
    """The tensors among a graph's inputs, in lists and tuples too, numbered as messages say
    "input N"."""
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(list(inputs))[0] if tensor(x)]


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
            if started is not None and started():
                count = getattr(module, "device_count", lambda: 1)()
                stack.enter_context(torch.random.fork_rng(devices=range(count), device_type=kind))
        yield


@contextlib.contextmanager
def restored(gm: Any) -> Iterator[None]:
    """The graph's own state (its parameters' and buffers' values: BatchNorm's running
    statistics, say) as it was, after the block."""
    import torch

    state = gm.state_dict(keep_vars=True) if hasattr(gm, "state_dict") else {}
    kept = {name: t.detach().clone() for name, t in state.items()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, t in state.items():
                t.copy_(kept[name])


def leaves(value: Any) -> list[Any]:
    """The values a graph returned, flattened (tuples, lists and dicts of tensors)."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=repr) for leaf in leaves(value[key])]
    return [value]


def tensor(x: object) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def fake(x: object) -> bool:
    """Whether ``x`` is one of dynamo's fake tensors: a shape with no values to run on."""
    return type(x).__name__ == "FakeTensor"


def concrete(value: Any) -> Any:
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


def said(exc: BaseException) -> str:
    """An exception as a log line has room for: its type and its message's first line."""
    line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
