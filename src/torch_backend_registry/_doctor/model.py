"""The model doctor probes with, the built-in one or a ``--model`` factory's, held to eager."""

from __future__ import annotations

import pkgutil
from typing import Any

import torch

from .._definition import ATOL, RTOL
from .._verify import Reference
from .options import ModelError
from .verdicts import one_line

#: What a ``--model`` factory returns, said where it returns something else.
FACTORY_SHAPE = (
    "(model, inputs): inputs a tuple of positional inputs, a dict of keyword inputs (a"
    " Hugging Face model's input_ids and attention_mask) or one tensor; or (model, args,"
    " kwargs). For example: return model, (torch.randn(4, 16),)"
)


def build_model(spec: str | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The model ``spec`` (``module:factory``) names, with its positional and keyword inputs."""
    if spec is None:  # the built-in model: small, deterministic, with a backward pass
        torch.manual_seed(0)
        layers = (torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.Tanh())
        return torch.nn.Sequential(*layers), (torch.randn(4, 16),), {}
    try:
        made = pkgutil.resolve_name(spec)()
    except (Exception, SystemExit) as exc:  # sys.exit("no weights") is the model's too
        raise ModelError(f"--model {spec!r} cannot be built: {one_line(exc)}") from exc
    if not isinstance(made, (tuple, list)) or len(made) not in (2, 3) or not callable(made[0]):
        got = f"the factory returned {type(made).__name__}"
        raise ModelError(f"--model {spec!r}: {got}; it must return {FACTORY_SHAPE}")
    model, args, *rest = made
    kwargs = rest[0] if rest else {}
    if isinstance(args, dict) and not rest:
        args, kwargs = (), args
    elif not isinstance(args, (tuple, list)):
        args = (args,)
    if not isinstance(kwargs, dict):
        got = f"its keyword inputs are {type(kwargs).__name__}"
        raise ModelError(f"--model {spec!r}: {got}; it must return {FACTORY_SHAPE}")
    return model, tuple(args), dict(kwargs)


class Model:
    """The model on ``device``, called as a graph is (:meth:`_calling`): every input
    positional, its trainable parameters first, so that verification takes their gradients
    as a chain's does of a graph's. Built, and run eagerly to be held to, before any
    backend's code is imported: what a backend does to the process cannot be taken for the
    model's fault."""

    def __init__(self, spec: str | None, device: Any, level: str) -> None:
        from torch.utils._pytree import tree_map_only

        module, args, kwargs = build_model(spec)
        what = "the built-in model" if spec is None else f"--model {spec!r}"
        try:
            self.module = module.to(device) if isinstance(module, torch.nn.Module) else module
            args, kwargs = tree_map_only(torch.Tensor, lambda t: t.to(device), (args, kwargs))
            self.module(*args, **kwargs)  # its own error first, before verification words it
        except (Exception, SystemExit) as exc:
            raise ModelError(f"{what} cannot be run: {one_line(exc)}") from exc
        self._shape = (len(args), list(kwargs))
        self._params = [p for p in getattr(module, "parameters", list)() if p.requires_grad]
        params = [p.detach().requires_grad_(level == "backward") for p in self._params]
        inputs = [*params, *args, *kwargs.values()]
        self.reference = Reference(self._calling(self.module), inputs, level, RTOL, ATOL)
        if self.reference.unverified is not None:  # its backward failed, say
            raise ModelError(f"{what} cannot be run: {self.reference.unverified}")

    def compiled(self, backend: str) -> Any:
        """The model compiled as a user compiles it, ``torch.compile(model)``, called as
        the eager one is (the reference it is held to was made so)."""
        return self._calling(torch.compile(self.module, backend=backend))

    def _calling(self, model: Any) -> Any:
        by_id = {id(p): name for name, p in getattr(model, "named_parameters", dict)()}
        return _Called(model, [by_id[id(p)] for p in self._params], *self._shape)


class _Called(torch.nn.Module):  # type: ignore[misc]
    """``model`` called with its ``names`` parameters, then its inputs, all positional.
    Swapped in outside ``model``: a compiled one traces the model as a user's does."""

    def __init__(self, model: Any, names: list[str], positional: int, keywords: list[str]) -> None:
        super().__init__()
        self.model, self.names, self.positional, self.keywords = model, names, positional, keywords

    def forward(self, *inputs: Any) -> Any:
        params, rest = dict(zip(self.names, inputs, strict=False)), inputs[len(self.names) :]
        args = rest[: self.positional]
        kwargs = dict(zip(self.keywords, rest[self.positional :], strict=True))
        if not params:
            return self.model(*args, **kwargs)
        return torch.func.functional_call(self.model, params, args, kwargs)
