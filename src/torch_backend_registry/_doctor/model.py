"""The model doctor probes with: the built-in one or a ``--model`` factory's, run eagerly first."""

from __future__ import annotations

import copy
import importlib

from .._definition import ATOL, RTOL
from .._verify import differ, leaves
from .options import ModelError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the causes it wraps (torch's BackendCompilerFailed holds its own)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while isinstance(current, BaseException) and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or getattr(current, "inner_exception", None)


def one_line(exc: BaseException) -> str:
    """The exception in one line, with the causes it wraps where they say more."""
    said = ""
    for current in causes(exc):
        text = (str(current).strip().splitlines() or [""])[0]
        own = f"{type(current).__name__}: {text}".rstrip(": ")
        # A cause its wrapper already quotes says nothing new.
        if not (text and text in said) and own not in said:
            said = f"{said.rstrip(':')}: {own}" if said else own
    # Bounded; the innermost cause, which says most, comes last: keep the end.
    return said if len(said) <= 300 else f"{said[:99]}…{said[-200:]}"


#: What a ``--model`` factory returns, said where it returns something else.
FACTORY_SHAPE = (
    "(model, inputs): inputs a tuple of positional inputs, a dict of keyword inputs (a"
    " Hugging Face model's input_ids and attention_mask) or one tensor; or (model, args,"
    " kwargs). For example: return model, (torch.randn(4, 16),)"
)


def build_model(spec: str | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The model ``spec`` (``module:factory``) names, with its positional and keyword inputs."""
    if spec is None:  # the built-in model: small, deterministic, with a backward pass
        import torch

        torch.manual_seed(0)
        layers = (torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.Tanh())
        return torch.nn.Sequential(*layers), (torch.randn(4, 16),), {}
    try:
        module_name, _, attr = spec.partition(":")
        factory: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
        made = factory()
    except (Exception, SystemExit) as exc:  # sys.exit("no weights") is the model's too
        raise ModelError(f"--model {spec!r} cannot be built: {one_line(exc)}") from exc
    if not isinstance(made, (tuple, list)) or len(made) not in (2, 3) or not callable(made[0]):
        got = type(made).__name__
        raise ModelError(
            f"--model {spec!r}: the factory returned {got}; it must return {FACTORY_SHAPE}"
        )
    model, args, *rest = made
    kwargs = rest[0] if rest else {}
    if isinstance(args, dict) and not rest:
        args, kwargs = (), args
    elif not isinstance(args, (tuple, list)):
        args = (args,)
    if not isinstance(kwargs, dict):
        got = type(kwargs).__name__
        raise ModelError(
            f"--model {spec!r}: its keyword inputs are {got}; it must return {FACTORY_SHAPE}"
        )
    return model, tuple(args), dict(kwargs)


class Eager:
    """The model run eagerly, before any backend's code is imported: what it gives, and with
    ``backward`` the gradients of its parameters. It runs on copies, so the model itself is
    as it was built for the backend."""

    def __init__(self, spec: str | None, device: Any, backward: bool) -> None:
        import torch

        def on(value: Any) -> Any:
            return value.to(device) if isinstance(value, torch.Tensor) else value

        model, args, kwargs = build_model(spec)
        what = "the built-in model" if spec is None else f"--model {spec!r}"
        try:
            self.model = model.to(device)
            self.args = tuple(on(x) for x in args)
            self.kwargs = {key: on(x) for key, x in kwargs.items()}
            reference = copy.deepcopy(self.model)
            with torch.random.fork_rng(devices=[]):
                self.expected = reference(*self.args, **self.kwargs)
                again = copy.deepcopy(self.model)(*self.args, **self.kwargs)
        except (Exception, SystemExit) as exc:
            raise ModelError(f"{what} cannot be run: {one_line(exc)}") from exc
        # A model that gives other values on a second run (dropout in training mode) draws
        # random numbers, which compilers draw their own way: compared in shapes and types only.
        random = differ(leaves(self.expected), leaves(again), "", 0, 0) is not None
        self.tolerance: tuple[float | None, float | None] = (None, None) if random else (RTOL, ATOL)
        #: What a verdict on this model is worth saying.
        self.said = _RANDOM if random else ""
        self.grads: tuple[Any, ...] | None = None
        params = [p for p in reference.parameters() if p.requires_grad]
        total = loss(self.expected) if backward and params else None
        if total is not None:
            try:
                self.grads = torch.autograd.grad(total, params, allow_unused=True)
            except Exception as exc:
                raise ModelError(
                    f"{what} has no backward pass of its own: {one_line(exc)}"
                ) from exc

    def __call__(self, fn: Any) -> Any:
        return fn(*self.args, **self.kwargs)


_RANDOM = (
    "verified in shapes and types only: the model draws random numbers (dropout in"
    " training mode, say; call model.eval() in the factory to compare values)"
)


def loss(out: Any) -> Any:
    """The sum of a model's floating outputs that require gradients (``None``: none does)."""
    found = [o for o in leaves(out) if getattr(o, "requires_grad", False)]
    if not found:
        return None
    return sum(o.float().sum() for o in found if o.is_floating_point())
