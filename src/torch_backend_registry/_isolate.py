"""What one member of a chain may change, kept from the next member and from dynamo."""

from __future__ import annotations

import copy
import logging
from typing import Any

from ._compare import same
from ._runs import fake, flat

logger = logging.getLogger("torch_backend_registry")


class Inputs:
    """The version counters of a graph's tensor inputs as they came to a chain. A member
    that runs the graph on them while it compiles (``torch.jit.trace``, as tracing and
    calibrating compilers do) applies the graph's own writes (BatchNorm's running
    statistics, a cache's update); the next member, its verification and dynamo would run
    on top of them. The chain puts them back from the clean copies the eager reference kept
    of what the graph writes (nothing else is copied: an input may be as large as the
    model). Fake and inference tensors are left out (they cannot be written here)."""

    def __init__(self, example_inputs: Any) -> None:
        self.tensors = {
            number: x
            for number, x in enumerate(flat(example_inputs))
            # An inference tensor has no version counter; dynamo compiles outside that mode.
            if not fake(x) and not x.is_inference()
        }
        self.versions = {number: x._version for number, x in self.tensors.items()}

    def written(self, clean: dict[int, Any]) -> list[int]:
        """The inputs written since last asked (by the member compiled last), by number: those
        whose version counter moved, and of those ``clean`` holds as they were, those whose
        values differ (an in-place kernel may write without counting)."""
        found = {n for n, x in self.tensors.items() if x._version != self.versions[n]}
        found.update(n for n in clean if n in self.tensors and not same(self.tensors[n], clean[n]))
        self.versions.update((n, self.tensors[n]._version) for n in found)
        return sorted(found)

    def put_back(self, numbers: list[int], clean: dict[int, Any]) -> bool:
        """Put the inputs ``numbers`` back as ``clean`` holds them; ``False``, and nothing
        put back, where it does not hold each."""
        import torch

        if not all(number in clean for number in numbers):
            return False
        with torch.no_grad():
            for number in numbers:
                self.tensors[number].copy_(clean[number])
        self.written({})  # the copy is a write too: counted from here
        return True


class Guards:
    """The guards of what dynamo is compiling, as a member starts to compile."""

    def __init__(self) -> None:
        import torch._guards

        context = torch._guards.TracingContext.try_get()
        shapes = getattr(getattr(context, "fake_mode", None), "shape_env", None)
        # A release whose shape environment keeps these otherwise: nothing is checked there.
        known = hasattr(shapes, "guards") and hasattr(shapes, "var_to_range")
        self.shapes = shapes if known else None
        self.count = len(self.shapes.guards) if self.shapes is not None else 0
        self.known = set(self.shapes.var_to_range) if self.shapes is not None else set()

    def take_back(self, chain: str, member: str) -> None:
        """Take back the guards ``member`` added on sizes that are not dynamo's own, saying
        so. A compiler that traces the graph again with dynamo's fake mode (OpenVINO's does)
        makes sizes of its own, which no input of the frame is the source of: they say
        nothing of the frame's inputs, and dynamo, writing the frame's guards after the
        chain returned, would fail the whole frame on them (``torch.compile(backend=
        "openvino")`` of a convolution does). A guard on dynamo's own sizes alone stays: it
        says what the member needs."""
        if self.shapes is None:
            return
        added = self.shapes.guards[self.count :]
        symbols = {symbol for guard in added for symbol in guard.expr.free_symbols}
        strays = sorted(str(symbol) for symbol in symbols - self.known)
        if strays:
            kept = [guard for guard in added if guard.expr.free_symbols <= self.known]
            self.shapes.guards[self.count :] = kept
            logger.info(
                "backend %r: compiling %r guarded sizes of its own (%s), which no input of the"
                " graph has and dynamo cannot check: those guards are taken back",
                chain,
                member,
                ", ".join(strays),
            )


def own_copy(gm: Any) -> Any:
    """A graph module of its own for one member to compile and rewrite in place (as FX passes
    and inductor do): its graph and the graph modules inside it copied, the parameters and
    buffers shared. ``copy.deepcopy`` copies each node's ``meta`` only; what else dynamo set
    (``_dynamo_source`` on each placeholder, which AOTAutograd cannot compile without; the
    module's own sources of its parameters) is carried over, every attribute of each node,
    where PyTorch's own passes carry the ones they know by hand (``propagate_dynamo_source``)."""
    import torch.fx

    if not isinstance(gm, torch.fx.GraphModule):
        return gm
    graph = copy.deepcopy(gm.graph)
    for old, new in zip(gm.graph.nodes, graph.nodes, strict=True):
        _carry_over(old, new)
    copied = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    for name, child in list(copied.named_children()):
        if isinstance(child, torch.fx.GraphModule):
            setattr(copied, name, own_copy(child))
    _carry_over(gm, copied)  # dynamo's own: _param_name_to_source, _source_to_user_stacks
    copied.meta = dict(gm.meta)
    copied.training = gm.training
    return copied


def _carry_over(old: object, new: object) -> None:
    for key, value in vars(old).items():
        if key not in vars(new):
            setattr(new, key, value)
