"""The module-level API: PyTorch's registry functions on one default Registry, and the tools."""

from __future__ import annotations

import functools
import os

from ._environment import CLUSTER_TIMEOUT, DOCTOR_TIMEOUT, VERIFY_VAR, switched_on
from ._errors import warn
from ._registry import Registry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import timedelta
    from typing import Any, Protocol, TypeVar, overload

    from ._doctor.verdicts import Verdict

    F = TypeVar("F", bound=Callable[..., Any])

    class Tagged(Protocol):
        """``register_backend`` with its tags given, typed as it is used: bare or called."""

        @overload
        def __call__(self, compiler_fn: F, name: str | None = None) -> F: ...
        @overload
        def __call__(
            self, compiler_fn: None = None, name: str | None = None
        ) -> Callable[[F], F]: ...


#: The registry the module-level functions act on. Building it reads nothing:
#: discovery waits for the first lookup or listing.
default_registry = Registry()

# Bound once: a hot lookup is then one call and one dict hit.
lookup_backend = default_registry.lookup_backend
is_registered_backend = default_registry.is_registered_backend
backend_info = default_registry.backend_info
refresh = default_registry.refresh
list_backends = default_registry.list_backends
#: A decorator used bare or called, as PyTorch's; returns the function.
register_backend = default_registry.register_backend
# As PyTorch spells them.
register_debug_backend: Tagged = functools.partial(register_backend, tags=("debug",))
register_experimental_backend: Tagged = functools.partial(register_backend, tags=("experimental",))


def install(
    registry: Registry | None = None, *, locked: bool | str | os.PathLike[str] | None = None
) -> None:
    """Make every backend usable as ``torch.compile(backend="name")``, importing no target.

    Also applies a manifest's ``default``. Idempotent. With ``locked`` (``True``
    for the ``backends.lock`` beside the project manifest, or a lock's path),
    or ``TORCH_BACKENDS_LOCKED`` in the registry's environment, a registry that
    drifted from its lock raises :class:`LockDriftError` and installs nothing.
    With ``TORCH_BACKENDS_VERIFY`` set and torch.distributed initialised, every
    rank's backends are compared first (:func:`verify_consistent`).
    """
    from ._lock import lock_from_environment, lock_path
    from ._torch import install as install_into_torch

    registry = registry or default_registry
    if locked is None:
        lock = lock_from_environment(registry)
    elif locked is False:
        lock = None
    else:
        lock = lock_path(registry) if locked is True else os.fspath(locked)
    unready = (
        "is not initialised: call install() after init_process_group(), or"
        " verify_consistent() yourself"
    )
    check_before_install(registry, lock, verify_asked(registry), unready, locked is None)
    install_into_torch(registry)


def manifests_read(registry: Registry) -> list[str]:
    """The manifests ``registry`` reads: the files given, else TORCH_BACKENDS_PATH's and the
    project's (what a message about a name says was looked in)."""
    from ._sources import env_paths, project_manifest

    context = registry.context
    if context.files is not None:
        return list(context.files)
    found = env_paths(context, [])
    project = None if context.cwd is None else project_manifest(context.cwd)
    if project is None or os.path.realpath(project) in {os.path.realpath(p) for p in found}:
        return found  # the project's manifest named on TORCH_BACKENDS_PATH too is one file
    return [*found, project]


def verify_asked(registry: Registry) -> bool:
    return switched_on(registry.context.environ.get(VERIFY_VAR))


def check_before_install(
    registry: Registry, lock: str | None, verify: bool, unready: str, from_environment: bool
) -> None:
    """What install() checks first: the ``lock`` the backends must match (one that
    ``TORCH_BACKENDS_LOCKED`` names, ``from_environment``), then, with ``verify``, that
    every rank resolves names alike (a warning ``unready`` says what torch.distributed
    was, where it was not initialised)."""
    from ._lock import check_locked
    from ._store import initialised

    if lock is not None:
        check_locked(registry, lock, from_environment=from_environment)
    if verify and initialised():
        verify_consistent(registry=registry)
    elif verify:
        warn(f"{VERIFY_VAR} is set but torch.distributed {unready}")


def doctor(
    names: Sequence[str] | None = None,
    *,
    registry: Registry | None = None,
    timeout: float | timedelta = DOCTOR_TIMEOUT,
    model: str | None = None,
    device: str = "cpu",
    level: str = "backward",
    jobs: int | None = None,
    on_progress: Callable[[str, int, float, bool], None] | None = None,
) -> list[Verdict]:
    """Probe each backend in its own subprocess: by default those the project's manifests
    (and ``TORCH_BACKENDS_PATH``'s) declare, and those they run (chain members, ``by-device``
    entries), each of these with ``via`` the declared backend that reached it.

    Each goes as far as it can: requirements found, target imported,
    ``torch.compile`` forward matching eager, backward gradients matching (as a chain
    verifies); a chain as it runs, with its ``select`` and ``verify``, and the member it
    compiled with said. ``level`` (``"forward"`` or ``"backward"``) is how far a backend
    must get to be ``ok``: ``"forward"`` judges inference backends. One :class:`Verdict` a
    backend, best first; nothing is remembered between runs (``torch-backends tune`` times
    a chain's members on the user's own graphs). ``on_progress(name, level, seconds,
    done)`` hears of each step. ``timeout``: seconds or a :class:`datetime.timedelta`. A name
    no source declares raises :class:`UnknownBackendError` before any probe; one declared
    in a table that cannot be used as written gets an ``import-error`` verdict saying why.
    Probes are forked by :mod:`multiprocessing`'s forkserver: as with any program that
    starts processes so, a script calling this guards its own code with
    ``if __name__ == "__main__":``, which each probe imports again.
    """
    from datetime import timedelta

    from ._doctor.options import Options
    from ._doctor.run import run

    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    options = Options(seconds, model, device, level, jobs)
    return run(registry or default_registry, names, options, on_progress)


def fingerprint(registry: Registry | None = None) -> str:
    """A short stable hash of what every name resolves to: the same inputs give the
    same hash in any process on any machine (no paths, no line numbers in it)."""
    from ._lock import fingerprint

    return fingerprint(registry or default_registry)


def verify_consistent(
    group: Any = None,
    timeout: float | timedelta = CLUSTER_TIMEOUT,
    *,
    registry: Registry | None = None,
) -> str:
    """Check, over torch.distributed, that every rank resolves names alike.

    Every rank calls it once the process group is initialised. Returns the
    fingerprint when all agree; otherwise every rank raises the same
    :class:`InconsistentRegistryError` naming the differing ranks, hosts,
    names and fields. A rank that never calls makes the others raise after
    ``timeout`` (seconds or a :class:`datetime.timedelta`), naming it.
    """
    from ._cluster import verify_consistent

    return verify_consistent(registry or default_registry, group, timeout)
