"""A probe: one backend taken through the levels, in a process forked from doctor's forkserver.

:func:`main` runs in that process, in a session of its own (what the backend starts is
killed with it), with the import path, working folder and environment of its run, its
output on a pipe doctor keeps the tail of. It reports each level as it reaches it, so
whatever kills it leaves the last level for doctor to tell. The model is built and run
eagerly before any code of the backend is imported, and held to that run by the reference
chains verify with (:class:`~torch_backend_registry._verify.Reference`).
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._errors import did_you_mean
from .._registry import Registry
from .._torch import install
from .options import ModelError
from .verdicts import one_line

#: What the reference says of gradients and of the backward pass (the rest is of the
#: forward), and of a backward pass that is missing or raises rather than giving other values.
_BACKWARD = re.compile(r"\bgrad|\bbackward")
_NO_BACKWARD = re.compile(r"requires? grad|backward raised|no backward")


def main(config: dict[str, Any], reports: Connection, output: Connection) -> None:
    """The probe process: report each level reached, then the verdict, on ``reports``."""
    os.setsid()  # first: all it starts is in this session, which doctor kills when it ends
    for fd in (1, 2):  # what it prints, C libraries' too, goes to doctor
        os.dup2(output.fileno(), fd)
    output.close()
    for stream in (sys.stdout, sys.stderr):  # last words reach doctor before a crash
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    threading.Thread(target=_end_with_doctor, daemon=True).start()
    reports.send({"level": 0})  # started: multiprocessing has prepared the process
    sys.path[:] = config["path"]  # the run's, less its working folder
    os.environ.clear()
    os.environ.update(config["environ"])
    said: dict[str, Any]
    try:
        said = {"verdict": probe(config, lambda level: reports.send({"level": level}))}
    except ModelError as exc:
        said = {"model_error": str(exc)}
    except BaseException as exc:  # the verdict must reach doctor whatever happens
        said = {"verdict": {"status": "crashed", "level": 0, "reason": one_line(exc)}}
    reports.send(said)
    sys.stdout.flush()
    sys.stderr.flush()
    # At once: a thread the backend left running must not keep this process alive.
    os._exit(0)


def _end_with_doctor() -> None:
    """Kill this probe's session once doctor is gone (killed, say): it has no one to
    report to, and nothing it started may outlive it."""
    if (parent := multiprocessing.parent_process()) is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os.killpg(0, signal.SIGKILL)


def probe(config: dict[str, Any], reached: Callable[[int], None]) -> dict[str, Any]:
    """Go through the levels for ``config["name"]``; the verdict's facts as a dict."""
    verdict = functools.partial(_verdict, time.perf_counter())
    name = config["name"]
    registry = Registry(**config["registry"])
    try:
        definition = registry.backend_info(name).definition
        # A chain that names itself cannot be loaded as written: not "unavailable here".
        if loop := registry.index(with_torch=False).chain_problems.get(definition.name):
            return verdict("import-error", 2, loop.message)
        why = registry.why_unavailable(definition)
    except Exception as exc:  # the manifest holds it, but not as something usable
        return verdict("import-error", 2, one_line(exc))
    if definition.chain is not None:  # how the chain runs, whatever it comes to
        verifies = definition.verify[0] if definition.verify else "none"
        verdict = functools.partial(verdict, select=definition.select, verify=verifies)
    if why is not None:
        return verdict("unavailable", 1, why)
    import torch

    from .model import Model

    if (device := _device(config["device"] or "cpu")) is None:
        return verdict("unavailable", 1, f"no {config['device']} device here")
    sys.path.extend(config["model_path"])  # last: as a python-path folder is
    training = config["level"] == "backward"
    torch.set_grad_enabled(training)  # for inference, no_grad: as it would be compiled
    model = Model(config["model"], device, config["level"])
    reached(2)  # doctor counts the backend's time limit from here
    try:
        registry.lookup_backend(name)
    except Exception as exc:
        return verdict("import-error", 2, one_line(exc))
    reached(3)
    install(registry)  # torch.compile(backend=name) is what is probed
    compiled = model.compiled(name)
    raised: list[BaseException] = []

    def call(*inputs: Any) -> Any:  # compiled, with what compiling it raised kept whole
        try:
            return compiled(*inputs)
        except Exception as exc:
            raised.append(exc)
            raise

    wrong = model.reference.check(call)
    if raised:
        return verdict("compile-error", 3, one_line(raised[0]))
    # The member a chain used; a backend of no members may have a `used` of its own.
    if (member := getattr(registry.lookup_backend(name), "used", None)) and definition.members:
        verdict = functools.partial(verdict, member=member)
    if wrong is not None:
        level = 4 if training and _BACKWARD.search(wrong) else 3
        status = "backward-error" if level == 4 and _NO_BACKWARD.search(wrong) else "wrong-result"
        return verdict(status, level, wrong)
    level = 4 if model.reference.said.startswith("backward") else 3
    return verdict("ok", level, "" if model.reference.complete else model.reference.said)


def _verdict(
    started: float, status: str, level: int, reason: str = "", **facts: Any
) -> dict[str, Any]:
    seconds = round(time.perf_counter() - started, 3)
    return {"status": status, "level": level, "reason": reason, "seconds": seconds, **facts}


def _device(spec: str) -> Any:
    """The device to probe on (``None``: there is none of that kind here)."""
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        from .._sources.schema import DEVICE_TYPES

        hint = did_you_mean(spec.split(":")[0], DEVICE_TYPES, before="; ")
        raise ModelError(f"--device {spec!r}: {one_line(exc)}{hint}") from exc
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not getattr(accelerator, "is_available", lambda: False)():
        return None
    return device
