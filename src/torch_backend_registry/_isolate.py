"""What one member of a chain may change, kept from the next member and from dynamo."""

from __future__ import annotations

import copy
import logging

from ._errors import BackendChainError
from ._verify import fake

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

logger = logging.getLogger("torch_backend_registry")


class Inputs:
    """The version counters of a graph's tensor inputs as they came to a chain. A member
    that runs the graph on them while it compiles (``torch.jit.trace``, as tracing
    compilers do) applies the graph's own writes (BatchNorm's running statistics, an
    optimizer's step); if it then fails, the next member, its verification and dynamo would
    run on top of them. Nothing is copied to put them back (an input may be a cache as large
    as the model): the chain stops there, saying so. Fake and inference tensors are left out
    (they cannot be written here)."""

    def __init__(self, example_inputs: Any) -> None:
        import torch

        self.versions = [
            (number, x, x._version)
            for number, x in enumerate(example_inputs)
            if isinstance(x, torch.Tensor)
            and not fake(x)
            and not x.is_inference()  # no version counter; dynamo compiles outside that mode
        ]

    def unchanged(self, chain: str, failures: list[tuple[str, str]]) -> None:
        """A :class:`BackendChainError` where the member that failed last wrote into an input."""
        written = [str(number) for number, x, version in self.versions if x._version != version]
        if written:
            member, said = failures[-1]
            failures[-1] = (
                member,
                f"{said}; it had written into input {', '.join(written)} of the graph, so no"
                " later member is tried on the changed values",
            )
            raise BackendChainError(chain, failures)


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
    mine = vars(new)
    for key, value in vars(old).items():
        if key not in mine:
            setattr(new, key, value)
