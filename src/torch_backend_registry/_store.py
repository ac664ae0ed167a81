"""What one rank tells the others: the default process group's store, as select and the cluster
check use it.

No collective runs through here: a key set on the store by one rank, waited for by the others
within a time limit, so that no rank can hang another's collectives, and a rank that never comes
is named when the limit runs out. torch.distributed is never imported here: a process that did
not load it has no ranks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

#: The longest time limit, in days: torch.distributed counts it in nanoseconds in 64 bits,
#: and past some 290 years it wraps around, to a limit already run out.
LONGEST_DAYS = 366


def initialised() -> bool:
    """Whether torch.distributed is loaded and initialised in this process."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def default_store() -> Any:
    """The default group's store, where torch.distributed is initialised with more than one
    rank; else ``None``."""
    if not initialised():
        return None
    import torch.distributed as dist

    if dist.get_world_size() < 2:
        return None
    # No public name gives the default group's store; its rendezvous made it.
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def rank() -> int:
    """This process's rank in the default group."""
    import torch.distributed as dist

    return int(dist.get_rank())


def time_limit(timeout: float | timedelta) -> timedelta:
    """``timeout`` (seconds or a :class:`~datetime.timedelta`) as a time limit the store takes,
    or :class:`ValueError` (:class:`TypeError`) saying what it must be."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, timedelta)):
        raise TypeError(
            f"timeout must be seconds or a datetime.timedelta, got {type(timeout).__name__}"
        )
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not 0 < seconds <= LONGEST_DAYS * 86400:  # nan and inf too
        raise ValueError(
            f"timeout must be positive and at most {LONGEST_DAYS} days, got {timeout!r}"
        )
    return timedelta(seconds=seconds)


def wait(store: Any, keys: Sequence[str], limit: timedelta) -> bool:
    """Whether every one of ``keys`` is set on ``store`` within ``limit`` (``False``: the time
    ran out). A store that is gone (rank 0's process ended) raises as the store does."""
    import torch.distributed as dist

    try:
        store.wait(list(keys), limit)
    # What a store raises when a wait runs out of time (PyTorch 2.2+; a RuntimeError before).
    except getattr(dist, "DistStoreError", RuntimeError):
        return False
    return True


#: A value travels in pieces of at most this many bytes: PyTorch's store (libuv's, its default
#: since 2.4) answers a message over 8 MiB by closing the connection that sent it, which is
#: the job's own.
PIECE = 1 << 20


def publish(store: Any, key: str, value: bytes) -> None:
    """Set ``key`` to ``value`` for other ranks to :func:`receive`, whatever its size."""
    pieces = [value[start : start + PIECE] for start in range(0, len(value), PIECE)] or [b""]
    for number, piece in enumerate(pieces):
        store.set(f"{key}/{number}", piece)
    store.set(key, str(len(pieces)))  # last: a rank that sees it finds every piece there


def receive(store: Any, key: str, limit: timedelta) -> bytes | None:
    """The value :func:`publish` set at ``key``, once it is there within ``limit`` (``None``:
    the time ran out). A store that is gone raises as the store does."""
    if not wait(store, [key], limit):
        return None
    count = int(store.get(key))
    return b"".join(store.multi_get([f"{key}/{number}" for number in range(count)]))
