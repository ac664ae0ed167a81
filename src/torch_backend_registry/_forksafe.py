"""Locks that a forked child gets anew: one held by another thread at fork() stays held for ever."""

from __future__ import annotations

import _thread
import os
import sys
from weakref import WeakSet


class ForkSafeLock(_thread.RLock):  # type: ignore[misc]  # final to typeshed, not to Python
    """A re-entrant lock, made free again in the child after ``os.fork()``.

    The child has only the forking thread; if another thread held the lock then
    (say, while discovery imported torch), the child's first lookup would wait on
    it for ever. ``logging`` protects its locks the same way, with the method
    ``threading`` makes its own free with. Being the C lock itself, it is taken and
    released with no call into Python.
    """

    def __init__(self) -> None:  # the lock itself is made by RLock's __new__
        _LOCKS.add(self)

    def renew(self) -> None:
        """Make the lock free (in a forked child, where no other thread is)."""
        self._at_fork_reinit()  # type: ignore[attr-defined]


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
