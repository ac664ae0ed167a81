"""Zero-code install(): with ``TORCH_BACKENDS_AUTOLOAD=1``, every process that imports torch
behaves as if it had called ``install()``.

PyTorch calls :func:`autoload` at ``import torch`` (this package's entry point in its
``torch.backends`` group). Set, it imports nothing: a finder first on ``sys.meta_path``
waits for ``torch._dynamo`` to be imported, and once that module has run, installs the
default registry, ``TORCH_BACKENDS_LOCKED`` and ``TORCH_BACKENDS_VERIFY`` honoured. It waits
for accelerate's ``accelerate.utils.dataclasses`` too, where accelerate checks backend names
against its own enum, and once that has run, imports ``integrations.accelerate``, which makes
the enum take the registry's names: accelerate imports torch before that module, so a
script that imports accelerate first is caught as well.

Nothing here makes ``import torch`` or ``import torch._dynamo`` raise: a problem is a
warning, and what ``install()`` would raise (a lock the backends drifted from, ranks that
resolve names differently) is raised instead by every compile, whatever its backend and
after ``torch._dynamo.reset()`` too, through dynamo's compile-start callbacks; the first
compile is where the ranks are compared.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

# Loaded with every ``import torch`` here, set or not: so that a process forked from now on
# knows what was being imported at the fork (an import no thread of it finishes). Torch has
# loaded the modules above by then.
from . import _forksafe  # noqa: F401

#: The environment variable that turns autoload on (a switch: see ``_environment``).
AUTOLOAD_VAR = "TORCH_BACKENDS_AUTOLOAD"
#: PyTorch's variable that turns its whole ``torch.backends`` group off.
PYTORCH_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: The modules whose import autoload waits for.
DYNAMO = "torch._dynamo"
ACCELERATE = "accelerate.utils.dataclasses"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    from ._environment import switched_on

    return switched_on(environ.get(AUTOLOAD_VAR))


def state(environ: Mapping[str, str] = os.environ) -> str:
    """Whether a process that imports torch here (with ``environ``) gets the registry's
    backends without calling install(), in words for the command to show."""
    if not enabled(environ):
        return f"off: only processes that call install() ({AUTOLOAD_VAR}=1 would make it every one)"
    # PyTorch's own switch for its torch.backends group: only "1" (or unset) loads it.
    if (pytorchs := environ.get(PYTORCH_VAR, "1")) != "1":
        return (
            f"off: {PYTORCH_VAR}={pytorchs} stops PyTorch from loading any torch.backends"
            f" entry point, this package's too, whatever {AUTOLOAD_VAR} says"
        )
    from importlib.metadata import entry_points

    if not any(
        ep.value.startswith(f"{__package__}.") for ep in entry_points(group="torch.backends")
    ):
        return (
            f"{AUTOLOAD_VAR} is set, but no torch.backends entry point of this package is"
            " installed: install torch-backend-registry (pip install .), then it is on"
        )
    return f"on: every process that imports torch here ({AUTOLOAD_VAR} is set)"


def autoload() -> None:
    """PyTorch's ``torch.backends`` entry point: arrange install() for when torch._dynamo
    is imported, and accelerate's adaptation for when accelerate is, where
    ``TORCH_BACKENDS_AUTOLOAD`` asks for it. Never raises."""
    if not enabled():
        return
    try:
        waiting = {
            DYNAMO: functools.partial(_quietly, "install()", _install_or_defer),
            ACCELERATE: functools.partial(_quietly, "adapting accelerate", _adapt_accelerate),
        }
        for module in [name for name in waiting if name in sys.modules]:
            waiting.pop(module)()  # imported already (a process that imported torch twice)
        if waiting and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(waiting))
        _save_compile_cache_at_exit()
    except Exception as exc:  # pragma: no cover - import torch must not fail for us
        _say(f"{AUTOLOAD_VAR} is set, but autoload could not start: {type(exc).__name__}: {exc}")


class _AfterImport:
    """A finder that finds each module it waits for as the others do, and has what is to be
    done then (``waiting``, by the module's name) done once that module has run."""

    def __init__(self, waiting: Mapping[str, Callable[[], None]]) -> None:
        self.waiting = dict(waiting)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        # Once a module: and the finders asked below must not come back here for it.
        if (then := self.waiting.pop(fullname, None)) is None:
            return None
        if not self.waiting and self in sys.meta_path:
            sys.meta_path.remove(self)
        if (spec := importlib.util.find_spec(fullname)) is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, then)  # type: ignore[assignment]
        return spec


class _Then:
    """A loader that runs a module as its own loader does, then ``then``; anything else
    asked of it (``create_module``, its source, its code) is its own loader's answer."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self.loader = loader
        self.then = then

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _adapt_accelerate() -> None:
    from .integrations import accelerate  # noqa: F401  # adapts accelerate as it is imported


def _quietly(what: str, action: Callable[[], None]) -> None:
    """``action``, as a process would call it (``what`` it is, in words); never raises."""
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            action()
        for warning in said:  # said again outside: the filters of the process decide
            try:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
            except Exception:  # -W error: say it rather than raise into torch's import
                _say(str(warning.message))
    except Exception as exc:
        _say(f"{AUTOLOAD_VAR}: {what} failed: {type(exc).__name__}: {exc}")


def _install_or_defer() -> None:
    """install(), its checks at the first compile: while torch._dynamo is still being
    imported, neither PyTorch's registry can be read whole nor may be imported further."""
    from ._api import check_before_install, default_registry, verify_asked
    from ._errors import BackendRegistryError
    from ._lock import lock_from_environment
    from ._torch import install

    # Early: the modules importing torch._dynamo (torch._inductor, say) are not whole yet.
    install(default_registry, early=True)
    lock = lock_from_environment(default_registry)
    verify = verify_asked(default_registry)
    if lock is None and not verify:
        return

    @functools.cache  # each check once; what fails is raised by every compile
    def failure() -> BackendRegistryError | None:
        try:
            unready = "was not initialised by the first torch.compile: the ranks were not compared"
            check_before_install(default_registry, lock, verify, unready, from_environment=True)
        except BackendRegistryError as exc:
            return exc
        return None

    def check(args: object) -> None:
        # The same error each time, without the last raise's frames.
        if (exc := failure()) is not None:
            raise exc.with_traceback(None)

    _at_every_compile(check)


def _at_every_compile(callback: Callable[[Any], None]) -> None:
    """Have dynamo call ``callback`` at the start of every compile, whatever its backend.
    ``torch._dynamo.reset()`` clears compile-start callbacks, "as if you had started a fresh
    process": a fresh process here has this one, so it is registered again after each reset
    (``torch.compiler.reset()`` and PyTorch's own callers go through the module's ``reset``)."""
    from torch._dynamo.callback import on_compile_start

    dynamo: Any = sys.modules[DYNAMO]
    original = dynamo.reset

    @functools.wraps(original)
    def reset() -> None:
        original()
        on_compile_start(callback)

    dynamo.reset = reset
    on_compile_start(callback)


def _save_compile_cache_at_exit() -> None:
    """Under ``torch-backends tune --compile-cache``: this process's compile caches, saved as
    it ends into the folder tune gives it (tune ships them beside the choices)."""
    import atexit

    from ._environment import COMPILE_CACHE_FOLDER, TUNING_VAR

    folder = os.path.join(os.environ.get(TUNING_VAR) or "", COMPILE_CACHE_FOLDER)
    if not os.environ.get(TUNING_VAR) or not os.path.isdir(folder):
        return

    def save() -> None:
        import torch.compiler

        if (saved := torch.compiler.save_cache_artifacts()) is not None:
            with open(os.path.join(folder, f"{os.getpid()}.bin"), "wb") as out:
                out.write(saved[0])

    atexit.register(functools.partial(_quietly, "saving PyTorch's compile caches", save))


def _say(message: str) -> None:
    print(f"torch-backend-registry: warning: {message}", file=sys.stderr)
