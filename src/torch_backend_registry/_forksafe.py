"""Locks that a forked child gets anew: one held by another thread at fork() stays held for ever."""

from __future__ import annotations

import os

# The C lock itself: `threading` would add milliseconds to `import torch_backend_registry`.
from _thread import RLock
from _weakrefset import WeakSet


class ForkSafeLock:
    """A re-entrant lock, replaced by a free one in the child after ``os.fork()``.

    The child has only the forking thread; if another thread held the lock then
    (say, while discovery imported torch), the child's first lookup would wait on
    it for ever. ``logging`` protects its locks the same way.
    """

    __slots__ = ("__weakref__", "_lock")
    _instances: WeakSet[ForkSafeLock] = WeakSet()

    def __init__(self) -> None:
        self._lock = RLock()
        self._instances.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def reset(self) -> None:
        """A new, free lock (the child of a fork is the only thread that can hold it)."""
        self._lock = RLock()

    @classmethod
    def after_fork_in_child(cls) -> None:
        for lock in list(cls._instances):
            lock.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=ForkSafeLock.after_fork_in_child)
