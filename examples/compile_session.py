"""A real session: compile a model with backends declared in the top-level backends.toml.

Run from the repository root:  python examples/compile_session.py
"""

from __future__ import annotations

import logging
import sys

import torch

import torch_backend_registry as tbr


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    tbr.install()  # every backend of backends.toml becomes a torch.compile name

    print("declared here:", [n for n in tbr.list_backends() if n in ("op_counts", "portable")])
    print("imported yet?", "demo_backends" in sys.modules)

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 8)

    # A manifest backend, by an alias; its options (top = 5) are bound at load.
    out = torch.compile(model, backend="ops")(x)
    print("op_counts matches eager:", torch.allclose(out, model(x)))
    print("imported now?", "demo_backends" in sys.modules)

    # The manifest's default ("portable", a chain that verifies): no TensorRT on a
    # CPU machine, so for inference (no gradients) it falls back to OpenVINO (an entry
    # point) or Inductor, keeping the first whose forward pass matches eager's.
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model)(x)
    print("portable matches eager:", torch.allclose(out, model(x), atol=1e-2))

    # For training, OpenVINO gives no backward pass (its outputs do not require grad):
    # verifying sees that too, and the chain takes the next member.
    torch._dynamo.reset()
    compiled = torch.compile(model)
    compiled(x).sum().backward()
    print("portable trains:", all(p.grad is not None for p in model.parameters()))

    # "auto" picks by the device of the graph's inputs: the CPU's backend here, openvino,
    # which a table does not replace when it is missing (a chain would skip it).
    if "openvino" not in tbr.list_backends(exclude_tags=()):
        print("auto is unavailable here: openvino is not installed")
        return 0
    torch._dynamo.reset()
    out = torch.compile(model, backend="auto")(x)
    print("auto matches eager:", torch.allclose(out, model(x), atol=1e-2))

    openvino = tbr.backend_info("openvino")
    print("openvino comes from:", openvino.source.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
