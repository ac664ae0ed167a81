"""Small, real compilers used by this project's own ``backends.toml``.

Each takes ``(graph_module, example_inputs)`` as every torch.compile backend
does and returns a callable that runs the graph.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _op_name(node: Any) -> str:
    target = node.target
    if node.op == "call_module":
        return f"module:{target}"
    return getattr(target, "__name__", str(target))


def count_ops(gm: Any, example_inputs: list[Any], *, top: int = 10) -> Any:
    """Print how many of each operation the graph holds, then run it eagerly."""
    ops = Counter(
        _op_name(node)
        for node in gm.graph.nodes
        if node.op in ("call_function", "call_method", "call_module")
    )
    summary = ", ".join(f"{name} x{count}" for name, count in ops.most_common(top))
    print(f"[op_counts] {sum(ops.values())} ops: {summary}")
    return gm.forward


def trace_shapes(gm: Any, example_inputs: list[Any]) -> Any:
    """Print each input's shape and dtype, then run the graph eagerly."""
    for position, tensor in enumerate(example_inputs):
        shape = tuple(getattr(tensor, "shape", ()))
        print(
            f"[trace_shapes] input {position}: shape={shape} dtype={getattr(tensor, 'dtype', '?')}"
        )
    return gm.forward


def tensorrt_compile(gm: Any, example_inputs: list[Any]) -> Any:
    """Compile with Torch-TensorRT (needs an NVIDIA GPU and torch_tensorrt)."""
    import torch_tensorrt  # type: ignore[import-not-found]

    return torch_tensorrt.compile(gm, inputs=example_inputs, ir="dynamo")
