"""One backend probed in this process as far as it goes: the child side of ``doctor``.

Run as ``python -m torch_backend_registry._probe``, its configuration as JSON on
stdin (never on the command line, which every user can read). It reports on
stdout, in lines marked :data:`MARK` (a backend may print too): each level as
it is reached, then the verdict. Whatever kills this process (a crash, a hang,
``os.abort()``) leaves the last level reported for the parent to tell.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Starts every line meant for the parent: a record separator and a name.
MARK = "\x1etorch-backends-doctor "

#: How close compiled results must be to eager ones (``torch.testing.assert_close``):
#: what bfloat16 arithmetic reaches (8 bits of mantissa), which CPU plugins such as
#: OpenVINO may use for float32 models. A wrong kernel misses it by far more.
RTOL, ATOL = 1e-2, 1e-2


def _say(**fields: Any) -> None:
    import json  # the child's side only: the parent imports this module for its names

    sys.stdout.write(MARK + json.dumps(fields) + "\n")
    sys.stdout.flush()


def _short(exc: BaseException) -> str:
    """The exception in one line; for a wrapper (torch's BackendCompilerFailed), its cause too."""
    text = str(exc).strip().splitlines()
    said = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    inner = exc.__cause__ or getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException) and inner is not exc:
        said = f"{said.rstrip(':')}: {_short(inner)}"
    return said[:300]


def _mismatch(exc: AssertionError) -> str:
    """assert_close's message, shortened to how many elements differ and by how much."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    facts = [line for line in lines if line.startswith(("Mismatched", "Greatest"))]
    return "; ".join(facts) or (lines[0] if lines else "values differ")


def default_model() -> tuple[Any, tuple[Any, ...]]:
    """The built-in model: small, deterministic, with a backward pass."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.Tanh()
    )
    return model, (torch.randn(4, 16),)


def _model(spec: str | None) -> tuple[Any, tuple[Any, ...]]:
    if spec is None:
        return default_model()
    import importlib

    module_name, _, attr = spec.partition(":")
    factory: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    model, inputs = factory()
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def probe(config: dict[str, Any]) -> dict[str, Any]:
    """Go through the levels for ``config["name"]``; the verdict as a dict."""
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

    _say(level=1)
    registry = Registry(
        cwd=config.get("cwd"),
        environ=config.get("environ"),
        sources=config.get("sources"),
        files=config.get("files"),
    )
    try:
        info = registry.backend_info(name)
        why = registry.why_unavailable(info.definition)
    except Exception as exc:
        return verdict("unavailable", 1, _short(exc))
    if why is not None:
        return verdict("unavailable", 1, why)
    _say(level=2)
    try:
        registry.lookup_backend(name)
    except Exception as exc:
        return verdict("import-error", 2, _short(exc))
    _say(level=3)
    import copy

    import torch

    device = torch.device(config.get("device") or "cpu")
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not getattr(accelerator, "is_available", lambda: False)():
        return verdict("unavailable", 3, f"no {device.type} device here")
    try:
        model, inputs = _model(config.get("model"))
        model = model.to(device)
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
        twin = copy.deepcopy(model)
    except Exception as exc:
        return verdict("compile-error", 3, f"the model could not be built: {_short(exc)}")
    install(registry)  # torch.compile(backend=name) is what is probed
    expected = twin(*inputs)
    try:
        compiled = torch.compile(model, backend=name)
        start = time.perf_counter()
        out = compiled(*inputs)
        compile_seconds = time.perf_counter() - start
    except Exception as exc:
        return verdict("compile-error", 3, _short(exc))
    member = getattr(registry.lookup_backend(name), "used", None)
    extra: dict[str, Any] = {"member": member} if member else {}
    try:
        torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)
    except AssertionError as exc:
        reason = f"forward differs from eager beyond rtol={RTOL}, atol={ATOL}: {_mismatch(exc)}"
        return verdict("wrong-result", 3, reason, **extra)
    _say(level=4)
    try:
        out.float().sum().backward()
    except Exception as exc:
        return verdict("backward-error", 4, _short(exc), **extra)
    expected.float().sum().backward()
    for (param_name, mine), theirs in zip(model.named_parameters(), twin.parameters(), strict=True):
        if mine.grad is None or theirs.grad is None:
            continue
        try:
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=RTOL, atol=ATOL)
        except AssertionError as exc:
            reason = f"gradient of {param_name} differs from eager: {_mismatch(exc)}"
            return verdict("wrong-result", 4, reason, **extra)
    if not config.get("bench"):
        return verdict("ok", 4, **extra)
    _say(level=5)
    eager_s, compiled_s = _bench(twin, compiled, inputs, config.get("rounds", 15))
    return verdict(
        "ok",
        5,
        **extra,
        compile_seconds=round(compile_seconds, 4),
        per_call_seconds=compiled_s,
        eager_seconds=eager_s,
        speedup=round(eager_s / compiled_s, 3) if compiled_s > 0 else None,
    )


def _bench(eager: Any, compiled: Any, inputs: tuple[Any, ...], rounds: int) -> tuple[float, float]:
    """Median seconds a call, eager and compiled, alternating run by run."""
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
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> int:
    import json

    config = json.loads(sys.stdin.read())
    try:
        result = probe(config)
    except BaseException as exc:  # the verdict must reach the parent whatever happens
        result = {
            "name": config.get("name"),
            "status": "crashed",
            "level": 0,
            "reason": _short(exc),
        }
    _say(verdict=result)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # At once: a thread the backend left running must not keep this process alive.
    os._exit(code)
