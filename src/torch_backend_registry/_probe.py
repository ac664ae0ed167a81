"""One backend probed in this process as far as it goes: the child side of ``doctor``.

Started by :data:`BOOT` under ``python -I`` (no working folder on the import
path, no ``PYTHON*`` variables), its configuration as one JSON line on stdin,
never on the command line (which every user can read). It reports on a pipe of
its own, whatever the backend prints: each level as it is reached, then the
verdict. Whatever kills this process (a crash, a hang, ``os.abort()``) leaves
the last level reported for the parent to tell.
"""

from __future__ import annotations

import os
import sys
import time

from ._verdict import ATOL, RTOL
from ._verify import differ as _differ
from ._verify import leaves as _leaves

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: What ``python -I -c`` runs: the import path the parent chose, then :func:`main`.
BOOT = (
    "import json, sys; config = json.loads(sys.stdin.readline()); sys.path[:] = config['path'];"
    " from torch_backend_registry._probe import main; main(config)"
)


class ModelError(Exception):
    """The model to probe with cannot be built (the same for every backend)."""


def _short(exc: BaseException) -> str:
    """The exception in one line, and the causes it wraps (torch's BackendCompilerFailed)
    where they say more than it already does."""
    said = ""
    seen: set[int] = set()
    current: BaseException | None = exc
    while isinstance(current, BaseException) and id(current) not in seen:
        seen.add(id(current))
        lines = str(current).strip().splitlines()
        own = f"{type(current).__name__}: {lines[0] if lines else ''}".rstrip(": ")
        if own not in said:
            said = f"{said.rstrip(':')}: {own}" if said else own
        current = current.__cause__ or getattr(current, "inner_exception", None)
    # Bounded; the innermost cause, which says most, comes last: keep the end.
    return said if len(said) <= 300 else f"{said[:99]}…{said[-200:]}"


def default_model() -> tuple[Any, tuple[Any, ...]]:
    """The built-in model: small, deterministic, with a backward pass."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.Tanh()
    )
    return model, (torch.randn(4, 16),)


def build_model(spec: str | None) -> tuple[Any, tuple[Any, ...]]:
    """The model and example inputs ``spec`` (``module:factory``) names; :class:`ModelError`."""
    if spec is None:
        return default_model()
    import importlib

    try:
        module_name, _, attr = spec.partition(":")
        factory: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
        model, inputs = factory()
    except Exception as exc:
        raise ModelError(f"--model {spec!r} cannot be built: {_short(exc)}") from exc
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


class _Channel:
    """The pipe to the parent: one JSON object a line, nothing else on it."""

    def __init__(self, fd: int) -> None:
        os.set_inheritable(fd, False)  # a backend's own children must not hold it open
        self.fd = fd

    def say(self, **fields: Any) -> None:
        import json

        data = (json.dumps(fields) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]


def probe(config: dict[str, Any], channel: _Channel) -> dict[str, Any]:
    """Go through the levels for ``config["name"]``; the verdict as a dict.

    The model is built and run eagerly before any code of the backend is imported, so
    that what the backend does to this process cannot be taken for the model's fault.
    """
    from ._registry import Registry
    from ._torch import install

    name = config["name"]
    started = time.perf_counter()

    def verdict(status: str, level: int, reason: str = "", **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "status": status,
            "level": level,
            "reason": reason,
            "seconds": round(time.perf_counter() - started, 3),
            **extra,
        }

    registry = Registry(
        cwd=config.get("cwd"),
        environ=config.get("environ"),
        sources=config.get("sources"),
        files=config.get("files"),
    )
    try:
        why = registry.why_unavailable(registry.backend_info(name))
    except Exception as exc:
        return verdict("unavailable", 1, _short(exc))
    if why is not None:
        return verdict("unavailable", 1, why)
    import torch

    backward = config.get("level", "backward") == "backward"
    device = _device(config.get("device") or "cpu")
    if device is None:
        return verdict("unavailable", 1, f"no {config.get('device')} device here")
    sys.path.extend(config.get("model_path", ()))  # last: as a python-path folder is
    model, inputs, expected, grads = _eager(config.get("model"), device, backward)
    # The first report: doctor counts the backend's time limit from here, past starting
    # Python, importing PyTorch and running the model eagerly.
    channel.say(level=2)
    try:
        registry.lookup_backend(name)
    except Exception as exc:
        return verdict("import-error", 2, _short(exc), missing=_missing(exc))
    channel.say(level=3)
    install(registry)  # torch.compile(backend=name) is what is probed
    try:
        compiled = torch.compile(model, backend=name)
        start = time.perf_counter()
        out = compiled(*inputs)
        compile_seconds = time.perf_counter() - start
    except Exception as exc:
        return verdict("compile-error", 3, _short(exc), missing=_missing(exc))
    member = getattr(registry.lookup_backend(name), "used", None)
    extra: dict[str, Any] = {"member": member} if member else {}
    wrong = _differ(_leaves(expected), _leaves(out), "forward output", RTOL, ATOL)
    if wrong is not None:
        return verdict("wrong-result", 3, wrong, **extra)
    reached = 3
    if backward and grads is not None:
        channel.say(level=4)
        params = [p for p in model.parameters() if p.requires_grad]
        loss = _loss(out)
        if loss is None:
            said = "no output of the compiled model requires grad: it gives no backward pass"
            return verdict("backward-error", 4, said, **extra)
        try:
            got = torch.autograd.grad(loss, params, allow_unused=True)
        except Exception as exc:
            return verdict("backward-error", 4, _short(exc), **extra)
        pairs = [(e, g) for e, g in zip(grads, got, strict=True) if e is not None]
        if any(g is None for _e, g in pairs):
            return verdict("wrong-result", 4, "some gradients eager gives are missing", **extra)
        wrong = _differ([e for e, _g in pairs], [g for _e, g in pairs], "gradient", RTOL, ATOL)
        if wrong is not None:
            return verdict("wrong-result", 4, wrong, **extra)
        reached = 4
    if not config.get("bench"):
        return verdict("ok", reached, **extra)
    channel.say(level=5)
    try:
        eager, timed = _bench(model, compiled, inputs, config.get("rounds", 15))
    except Exception as exc:  # the backend works; only timing it failed
        return verdict("ok", reached, f"timing failed: {_short(exc)}", **extra)
    per_call = timed[1]
    return verdict(
        "ok",
        5,
        **extra,
        compile_seconds=round(compile_seconds, 4),
        per_call_seconds=per_call,
        eager_seconds=eager[1],
        speedup=round(eager[1] / per_call, 3) if per_call > 0 else None,
        spread=round(max((hi - lo) / mid for lo, mid, hi in (eager, timed) if mid > 0), 3),
    )


def _device(spec: str) -> Any:
    """The device to probe on (``None``: there is none of that kind here); :class:`ModelError`
    for what names no device."""
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"--device {spec!r}: {_short(exc)}") from exc
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not getattr(accelerator, "is_available", lambda: False)():
        return None
    return device


def _eager(spec: str | None, device: Any, backward: bool) -> tuple[Any, Any, Any, Any]:
    """The model on ``device``, its inputs, what it gives run eagerly, and with ``backward``
    its gradients; :class:`ModelError` for a model that cannot give them."""
    import copy

    import torch

    model, inputs = build_model(spec)
    what = "the built-in model" if spec is None else f"--model {spec!r}"
    try:
        model = model.to(device)
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
        expected = copy.deepcopy(model)(*inputs)
    except Exception as exc:
        raise ModelError(f"{what} cannot be run: {_short(exc)}") from exc
    params = [p for p in model.parameters() if p.requires_grad]
    if (
        not backward
        or not params
        or not any(getattr(o, "requires_grad", False) for o in _leaves(expected))
    ):
        return model, inputs, expected, None  # nothing to differentiate: forward it is
    try:
        grads = torch.autograd.grad(_loss(expected), params, allow_unused=True)
    except Exception as exc:
        raise ModelError(f"{what} has no backward pass of its own: {_short(exc)}") from exc
    return model, inputs, expected, grads


def _loss(out: Any) -> Any:
    """One number from a model's floating outputs that require gradients: their sum
    (``None`` where none does)."""
    leaves = [o for o in _leaves(out) if getattr(o, "requires_grad", False)]
    if not leaves:
        return None
    return sum(o.float().sum() for o in leaves if o.is_floating_point())


def _missing(exc: BaseException) -> list[str]:
    """The modules an exception says are not there (installing one changes the verdict)."""
    names = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            names.append(current.name)
        current = current.__cause__ or getattr(current, "inner_exception", None)
    return names


def imported_code() -> list[list[object]]:
    """The files of the modules this process imported that are neither Python's nor
    installed (a project's own code, wherever it lies), each with its size and time."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    installed = [paths["stdlib"], paths["platstdlib"], *site.getsitepackages()]
    installed.append(site.getusersitepackages())
    ours = os.path.dirname(os.path.abspath(__file__))
    skipped = tuple(os.path.join(os.path.realpath(p), "") for p in [*installed, ours])
    found = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and not os.path.realpath(path).startswith(skipped):
            try:
                info = os.stat(path)
            except OSError:
                continue
            found.append([path, info.st_size, info.st_mtime_ns])
    return sorted(found)[:10_000]


def _bench(
    eager: Any, compiled: Any, inputs: tuple[Any, ...], rounds: int
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Seconds a call, eager and compiled, alternating run by run: (fastest, median,
    slowest) of the rounds, each round the mean of a batch of calls."""
    import statistics

    import torch

    calls = 20
    times: dict[int, list[float]] = {0: [], 1: []}
    with torch.no_grad():
        for fn in (eager, compiled):  # warm both
            fn(*inputs)
        for i in range(rounds):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for side in order:
                fn = (eager, compiled)[side]
                start = time.perf_counter()
                for _ in range(calls):
                    fn(*inputs)
                times[side].append((time.perf_counter() - start) / calls)
    return tuple(  # type: ignore[return-value]
        (min(t), statistics.median(t), max(t)) for t in (times[0], times[1])
    )


def main(config: dict[str, Any]) -> None:
    """Probe, report the verdict and the code it ran on the channel, and end at once."""
    channel = _Channel(config["channel"])
    started = time.perf_counter()
    try:
        result: dict[str, Any] = {"verdict": probe(config, channel)}
    except ModelError as exc:
        result = {"model_error": str(exc)}
    except BaseException as exc:  # the verdict must reach the parent whatever happens
        seconds = round(time.perf_counter() - started, 3)
        verdict = {"name": config.get("name"), "status": "crashed", "level": 0}
        result = {"verdict": {**verdict, "reason": _short(exc), "seconds": seconds}}
    try:
        result["code"] = imported_code()
    except Exception:
        result["code"] = None  # not known: the verdict holds for this probe only
    channel.say(**result)
    sys.stdout.flush()
    sys.stderr.flush()
    # At once: a thread the backend left running must not keep this process alive.
    os._exit(0)
