"""Locks that a forked child gets anew: one held by another thread at fork() stays held for ever."""

from __future__ import annotations

import os
import sys
from threading import RLock
from weakref import WeakSet


class ForkSafeLock:
    """A re-entrant lock, replaced by a free one in the child after ``os.fork()``.

    The child has only the forking thread; if another thread held the lock then
    (say, while discovery imported torch), the child's first lookup would wait on
    it for ever. ``logging`` protects its locks the same way.
    """

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = RLock()
        _LOCKS.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def renew(self) -> None:
        """Replace the lock by a free one (in a forked child, where no other thread is)."""
        self._lock = RLock()


#: Every lock alive, to be replaced in a forked child.
_LOCKS: WeakSet[ForkSafeLock] = WeakSet()
#: The modules being imported when this process was forked (see :func:`importing_at_fork`).
_importing: frozenset[str] = frozenset()


def importing_at_fork(name: str) -> bool:
    """Whether module ``name`` was being imported when this process was forked: by another
    thread, that import never ends here (only the forking thread came along, and waiting
    for the import waits for ever); the forking thread's own goes on."""
    return name in _importing


def _after_fork_in_child() -> None:
    global _importing
    for lock in list(_LOCKS):  # the child is the only thread that can hold them
        lock.renew()
    _importing = frozenset(
        name
        for name, module in list(sys.modules.items())
        if getattr(getattr(module, "__spec__", None), "_initializing", False)
    )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
