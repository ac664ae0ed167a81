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
import statistics
import sys
import time

from .._definition import ATOL, RTOL
from .._verify import differ as _differ
from .._verify import leaves as _leaves

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: What ``python -I -c`` runs: the import path the parent chose, then :func:`main`.
BOOT = (
    "import json, sys; config = json.loads(sys.stdin.readline()); sys.path[:] = config['path'];"
    " from torch_backend_registry._doctor.probe import main; main(config)"
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
        text = lines[0] if lines else ""
        own = f"{type(current).__name__}: {text}".rstrip(": ")
        if text and text in said:  # a cause its wrapper already quotes says nothing new
            pass
        elif own not in said:
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


#: What a ``--model`` factory returns, said where it returns something else.
FACTORY_SHAPE = (
    "(model, inputs): inputs a tuple of positional inputs, a dict of keyword inputs (a"
    " Hugging Face model's input_ids and attention_mask) or one tensor; or (model, args,"
    " kwargs). For example: return model, (torch.randn(4, 16),)"
)


def build_model(spec: str | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The model ``spec`` (``module:factory``) names, with its positional and keyword
    inputs; :class:`ModelError` where it cannot be built."""
    if spec is None:
        model, args = default_model()
        return model, args, {}
    import importlib

    try:
        module_name, _, attr = spec.partition(":")
        factory: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
        made = factory()
    except Exception as exc:
        raise ModelError(f"--model {spec!r} cannot be built: {_short(exc)}") from exc
    if not isinstance(made, (tuple, list)) or len(made) not in (2, 3) or not callable(made[0]):
        got = type(made).__name__
        raise ModelError(
            f"--model {spec!r}: the factory returned {got}; it must return {FACTORY_SHAPE}"
        )
    model, *rest = made
    if len(rest) == 2:
        args, kwargs = rest
    elif isinstance(rest[0], dict):
        args, kwargs = (), rest[0]
    else:
        args, kwargs = rest[0], {}
    if not isinstance(args, (tuple, list)):
        args = (args,)
    if not isinstance(kwargs, dict):
        got = type(kwargs).__name__
        raise ModelError(
            f"--model {spec!r}: its keyword inputs are {got}; it must return {FACTORY_SHAPE}"
        )
    return model, tuple(args), dict(kwargs)


class _Eager:
    """The model run eagerly, before any backend's code is imported: what it gives, and with
    ``backward`` the gradients of its parameters. It runs on copies of the model, so the
    model itself is as it was built for the backend; a model that gives other values on a
    second run (dropout in training mode) draws random numbers, which compilers draw their
    own way: it is judged by the shapes and types of what it gives."""

    def __init__(self, spec: str | None, device: Any, backward: bool) -> None:
        import copy

        import torch

        model, args, kwargs = build_model(spec)
        self.what = "the built-in model" if spec is None else f"--model {spec!r}"
        try:
            self.model = model.to(device)
            self.args = tuple(_on(x, device) for x in args)
            self.kwargs = {key: _on(x, device) for key, x in kwargs.items()}
            reference = copy.deepcopy(self.model)
            with torch.random.fork_rng(devices=[]):
                self.expected = reference(*self.args, **self.kwargs)
                again = copy.deepcopy(self.model)(*self.args, **self.kwargs)
        except Exception as exc:
            raise ModelError(f"{self.what} cannot be run: {_short(exc)}") from exc
        #: Whether the model draws random numbers: then only shapes and types are compared.
        self.random = _differ(_leaves(self.expected), _leaves(again), "", 0, 0) is not None
        self.tolerance: tuple[float | None, float | None] = (
            (None, None) if self.random else (RTOL, ATOL)
        )
        self.grads: tuple[Any, ...] | None = None
        params = [p for p in reference.parameters() if p.requires_grad]
        if backward and params and _loss(self.expected) is not None:
            try:
                self.grads = torch.autograd.grad(_loss(self.expected), params, allow_unused=True)
            except Exception as exc:
                raise ModelError(
                    f"{self.what} has no backward pass of its own: {_short(exc)}"
                ) from exc

    def __call__(self, fn: Any) -> Any:
        return fn(*self.args, **self.kwargs)

    @property
    def said(self) -> str:
        """What a verdict on this model is worth saying."""
        if not self.random:
            return ""
        return (
            "verified in shapes and types only: the model draws random numbers (dropout in"
            " training mode, say; call model.eval() in the factory to compare values)"
        )


def _on(value: Any, device: Any) -> Any:
    import torch

    return value.to(device) if isinstance(value, torch.Tensor) else value


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
    from .._registry import Registry
    from .._torch import install
    from .verdicts import known_failure

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
        known_failure=known_failure,
        cwd=config.get("cwd"),
        environ=config.get("environ"),
        sources=config.get("sources"),
        files=config.get("files"),
    )
    try:
        info = registry.backend_info(name)
        # A chain that names itself cannot be loaded as written: not "unavailable here".
        loop = registry.index(with_torch=False).chain_problems().get(info.definition.name)
        if loop is not None:
            return verdict("import-error", 2, loop.message)
        why = registry.why_unavailable(info)
    except Exception as exc:  # the manifest holds it, but not as something usable
        return verdict("import-error", 2, _short(exc))
    if why is not None:
        return verdict("unavailable", 1, why)
    import torch

    backward = config.get("level", "backward") == "backward"
    device = _device(config.get("device") or "cpu")
    if device is None:
        return verdict("unavailable", 1, f"no {config.get('device')} device here")
    sys.path.extend(config.get("model_path", ()))  # last: as a python-path folder is
    eager = _Eager(config.get("model"), device, backward)
    rounds = config.get("rounds", 15)
    # Eager is timed before any backend's code is loaded (a backend may start threads that
    # slow every later call): each row's speed-up is against the same eager.
    eager_times = _timed(eager, eager.model, rounds) if config.get("bench") else []
    # The first report: doctor counts the backend's time limit from here, past starting
    # Python, importing PyTorch and running the model eagerly.
    channel.say(level=2)
    try:
        registry.lookup_backend(name)
    except Exception as exc:
        return verdict("import-error", 2, _short(exc), missing=_missing(exc))
    channel.say(level=3)
    install(registry)  # torch.compile(backend=name) is what is probed
    model = eager.model
    try:
        compiled = torch.compile(model, backend=name)
        start = time.perf_counter()
        out = eager(compiled)
        compile_seconds = time.perf_counter() - start
    except Exception as exc:
        return verdict("compile-error", 3, _short(exc), missing=_missing(exc))
    member = getattr(registry.lookup_backend(name), "used", None)
    extra: dict[str, Any] = {"member": member} if member else {}
    wrong = _differ(_leaves(eager.expected), _leaves(out), "forward output", *eager.tolerance)
    if wrong is not None:
        return verdict("wrong-result", 3, wrong, **extra)
    reached = 3
    if backward and eager.grads is not None:
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
        pairs = [(e, g) for e, g in zip(eager.grads, got, strict=True) if e is not None]
        if not pairs:
            said = "no parameter gets a gradient run eagerly: there is no backward to compare"
            return verdict("ok", 3, said, **extra)
        if any(g is None for _e, g in pairs):
            return verdict("wrong-result", 4, "some gradients eager gives are missing", **extra)
        expected, mine = [e for e, _g in pairs], [g for _e, g in pairs]
        wrong = _differ(expected, mine, "gradient", *eager.tolerance)
        if wrong is not None:
            return verdict("wrong-result", 4, wrong, **extra)
        reached = 4
    if not config.get("bench"):
        return verdict("ok", reached, eager.said, **extra)
    channel.say(level=5)
    try:
        timed = _timed(eager, compiled, rounds)
    except Exception as exc:  # the backend works; only timing it failed
        return verdict("ok", reached, f"timing failed: {_short(exc)}", **extra)
    eager_call, per_call = statistics.median(eager_times), statistics.median(timed)
    return verdict(
        "ok",
        5,
        eager.said,
        **extra,
        compile_seconds=round(compile_seconds, 4),
        per_call_seconds=per_call,
        eager_seconds=eager_call,
        speedup=round(eager_call / per_call, 3) if per_call > 0 else None,
        spread=round(max(_spread(eager_times), _spread(timed)), 3),
    )


def _device(spec: str) -> Any:
    """The device to probe on (``None``: there is none of that kind here); :class:`ModelError`
    for what names no device."""
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        import difflib

        kinds = ["cpu", "cuda", "xpu", "mps", "hip", "meta", "npu", "hpu", "mtia"]
        close = difflib.get_close_matches(spec.split(":")[0], kinds, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelError(f"--device {spec!r}: {_short(exc)}{hint}") from exc
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not getattr(accelerator, "is_available", lambda: False)():
        return None
    return device


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


def _timed(eager: _Eager, fn: Any, rounds: int) -> list[float]:
    """Seconds a call of ``fn`` on the model's inputs, for each of ``rounds`` rounds, after
    a call to warm it. Each round is the mean of a batch of calls long enough (some 10 ms)
    that the clock and a stray interruption weigh little in it."""
    import torch

    times = []
    with torch.no_grad():
        start = time.perf_counter()
        eager(fn)
        once = max(time.perf_counter() - start, 1e-7)
        calls = min(10_000, max(5, int(0.01 / once)))
        for _round in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                eager(fn)
            times.append((time.perf_counter() - start) / calls)
    return times


def _spread(times: list[float]) -> float:
    """How far the middle half of the rounds spread, as a share of their median (the
    interquartile range over the median): one stalled round on a busy machine moves it
    little, where the range from fastest to slowest is decided by it."""
    if len(times) < 2:
        return 0.0
    low, middle, high = statistics.quantiles(times, n=4)
    return (high - low) / middle if middle > 0 else 0.0


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
