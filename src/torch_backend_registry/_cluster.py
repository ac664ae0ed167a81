"""Every rank resolves names alike: fingerprints compared over torch.distributed.

The check runs over gloo (the job's group where that is gloo, else a group of its own), so
it works beside an NCCL default group and on machines without a GPU, and only once every
rank has said on the job's store that it called. When all agree, only a 32-byte hash a
rank travels; the facts follow only on a mismatch, and then every rank raises
the same :class:`InconsistentRegistryError`.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections import Counter

from ._environment import CLUSTER_TIMEOUT
from ._errors import BackendRegistryError, InconsistentRegistryError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import timedelta
    from typing import Any

    from ._registry import Registry


def verify_consistent(
    registry: Registry, group: Any = None, timeout: float | timedelta = CLUSTER_TIMEOUT
) -> str:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        _limit(timeout)  # a wrong time limit is said first, as where it is initialised
        raise BackendRegistryError(
            "verify_consistent() needs torch.distributed initialised (init_process_group) first"
        )
    # In the order of the ranks inside the group, which its collectives number them by.
    if group is None:
        members = list(range(dist.get_world_size()))
    else:
        members = sorted(dist.get_process_group_ranks(group))
    # Counted before anything can refuse the call: each rank's count of checks of these
    # ranks pairs its call with the others', also after one of them was refused.
    count = _CALLS[tuple(members)] = _CALLS.get(tuple(members), 0) + 1
    limit = _limit(timeout)
    seconds = limit.total_seconds()
    me = dist.get_rank()
    default_gloo = dist.get_backend() == "gloo"
    if me not in members:  # its collectives would do nothing: it would agree with no one
        if not default_gloo:  # the members make a gloo group, which every rank enters
            dist.new_group(ranks=members, backend="gloo", timeout=limit)
        raise ValueError(
            f"rank {me} is not in the group of ranks {members}: it has no rank to compare with"
        )
    # First every rank says on the store that it is here, so that the missing are named, and
    # no collective waits for a rank that never comes: a gloo barrier that times out leaves
    # the group it ran on unusable, which must never be the job's.
    _arrive(members, me, limit, count)
    if default_gloo and (group is None or dist.get_backend(group) == "gloo"):
        # Gloo already: no group to make. A group made here would have to be made by every
        # rank of the job (PyTorch names groups by a count each process keeps), where only
        # the ranks of ``group`` call.
        gloo = group
    else:
        # A gloo group of its own: the default group may be NCCL, and a CPU-only rank
        # must take part too. Creating it is itself collective over the ranks.
        try:
            gloo = dist.new_group(ranks=members, backend="gloo", timeout=limit)
        except RuntimeError as exc:
            raise InconsistentRegistryError(
                f"rank {me}: not every rank of {members} called verify_consistent() within"
                f" {seconds:g} s ({exc})",
            ) from exc
    return _compare(registry, gloo, members, me, limit)


#: The longest time limit, in days: torch.distributed counts it in nanoseconds in 64 bits,
#: and past some 290 years it wraps around, to a limit already run out.
LONGEST_DAYS = 366


def _limit(timeout: float | timedelta) -> timedelta:
    """``timeout`` as a :class:`~datetime.timedelta`, or :class:`ValueError` (or
    :class:`TypeError`) saying what it must be."""
    from datetime import timedelta  # not for every listing that imports this module

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


def _compare(registry: Registry, gloo: Any, members: list[int], me: int, limit: timedelta) -> str:
    """The fingerprint where every rank of ``gloo`` agrees, else the same error on each."""
    import socket

    import torch
    import torch.distributed as dist

    from ._lock import digest

    seconds = limit.total_seconds()
    started = time.monotonic()
    try:
        # Every rank reports to the first within the limit, which names those that did not.
        dist.monitored_barrier(group=gloo, timeout=limit, wait_all_ranks=True)
    except RuntimeError as exc:
        raise _missing(exc, members, me, seconds, time.monotonic() - started) from exc
    facts = registry.facts()
    full = digest(facts)
    mine = torch.tensor(list(bytes.fromhex(full)), dtype=torch.uint8)
    gathered = [torch.zeros_like(mine) for _ in members]
    dist.all_gather(gathered, mine, group=gloo)
    hashes = [bytes(t.tolist()).hex() for t in gathered]
    if len(set(hashes)) == 1:
        return full[:16]
    # Only now do the facts travel, and with them where each rank runs.
    everyone: list[Any] = [None] * len(members)
    dist.all_gather_object(everyone, (socket.gethostname(), facts), group=gloo)
    raise mismatch(members, hashes, everyone)


#: How many checks of each group of ranks this process made: the same on every rank.
_CALLS: dict[tuple[int, ...], int] = {}


def _arrive(members: list[int], me: int, limit: timedelta, count: int) -> None:
    """Say on the default group's store that this rank called (its ``count``-th check of
    ``members``), and wait within ``limit`` for every rank of ``members`` to say so; the
    first of them names the missing ones."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
    except Exception:  # no store to ask (another PyTorch): the group's creation times out
        return
    prefix = f"torch_backend_registry/verify/{','.join(map(str, members))}/{count}"
    here = [f"{prefix}/{rank}" for rank in members]
    # One key decides, set once: "go" by the last rank to arrive, or "stop N" by the first
    # whose time ran out, N the ranks that had arrived by then. Whichever is set first is
    # what every rank reads, so that no rank goes on to a collective while another gives up.
    verdict = f"{prefix}/verdict"
    seconds = limit.total_seconds()
    try:
        store.set(here[members.index(me)], "1")
        arrived = store.add(f"{prefix}/arrived", 1)  # how many, this one included
        if arrived == len(members):
            store.compare_set(verdict, "", "go")
        started = time.monotonic()
        try:
            store.wait([verdict], limit)
            try:
                decided = store.get(verdict)
            except RuntimeError:  # set, and its host gone since: rank 0 gave up and ended
                decided = f"stop {arrived}".encode()
        except RuntimeError:  # the limit ran out, or the store's host ended
            if time.monotonic() - started < 0.9 * seconds:
                raise  # it did not wait: said below
            try:
                so_far = store.add(f"{prefix}/arrived", 0)
                decided = store.compare_set(verdict, "", f"stop {so_far}")
            except RuntimeError:  # rank 0 gave up first, and ended
                decided = f"stop {arrived}".encode()
        if decided != b"go" and arrived <= int(decided.split()[1]):  # it waited in vain
            missing: tuple[int, ...] = ()
            # The first rank names the missing; where it is one of them, every rank does.
            with contextlib.suppress(RuntimeError):  # rank 0 named them, and ended
                if me == members[0] or not store.check([here[0]]):
                    missing = tuple(
                        rank
                        for rank, key in zip(members, here, strict=True)
                        if not store.check([key])
                    )
            raise _not_called(missing, seconds) if missing else _timed_out(me, members, seconds)
    except RuntimeError as exc:  # the store's host (the default group's first rank) ended
        raise InconsistentRegistryError(
            f"rank {me}: verify_consistent() could not reach the other ranks of {members}:"
            f" they may have stopped waiting after {seconds:g} s, and rank 0 ended"
            f" ({type(exc).__name__}: {exc})",
        ) from exc
    if decided != b"go":  # the others had stopped waiting for this one
        raise InconsistentRegistryError(
            f"rank {me}: verify_consistent() found the other ranks of {members} no longer"
            f" waiting: this rank called it after their {seconds:g} s had run out",
        )


def _not_called(missing: tuple[int, ...], timeout: float) -> InconsistentRegistryError:
    return InconsistentRegistryError(
        f"ranks {list(missing)} did not call verify_consistent() within {timeout:g} s",
        missing,
    )


def _timed_out(me: int, members: list[int], timeout: float) -> InconsistentRegistryError:
    return InconsistentRegistryError(
        f"rank {me}: verify_consistent() timed out after {timeout:g} s waiting for the"
        f" other ranks of {members} (rank {members[0]} names the missing ones)",
    )


def mismatch(
    members: list[int], hashes: list[str], everyone: list[Any]
) -> InconsistentRegistryError:
    """The same error on every rank: the ranks outside the majority (in a tie, outside the
    group of the lowest rank, said so), and where they differ."""
    from ._lock import changes

    counted = Counter(hashes).most_common()  # in a tie, the group of the lowest rank first
    majority, count = counted[0]
    tie = len(counted) > 1 and counted[1][1] == count
    reference = everyone[hashes.index(majority)][1]
    odd = [i for i, h in enumerate(hashes) if h != majority]
    lines = []
    names: set[str] = set()
    for index in odd:
        host, facts = everyone[index]
        found = changes(reference, facts)
        names.update(name for about, _said in found for name in about)
        said = "; ".join(said for _about, said in found[:5])
        more = f"; and {len(found) - 5} more" if len(found) > 5 else ""
        lines.append(f"rank {members[index]} on {host}: {said}{more}")
    odd_ranks = tuple(members[i] for i in odd)
    return InconsistentRegistryError(
        f"ranks {list(odd_ranks)} resolve backend names differently from the other"
        f" {len(members) - len(odd)} (compared to rank {members[hashes.index(majority)]}"
        f"{'; no group of ranks is a majority' if tie else ''}): " + " | ".join(lines),
        odd_ranks,
        tuple(sorted(names)),
    )


def _missing(
    exc: RuntimeError, members: list[int], me: int, timeout: float, waited: float
) -> InconsistentRegistryError:
    # Well before the limit, the barrier failed because a rank's connection closed: it
    # ended (or its host went away), which waiting longer would not have changed.
    ended = waited < 0.9 * timeout
    found = re.search(r"[Rr]anks? ([\d, ]+) failed to pass monitoredBarrier", str(exc))
    if found:
        # Numbered as the group numbers its ranks: from 0, in the order of the job's.
        missing = tuple(members[int(r)] for r in re.findall(r"\d+", found.group(1)))
        if not ended:
            return _not_called(missing, timeout)
        return InconsistentRegistryError(
            f"ranks {list(missing)} ended, or lost their connection, during"
            f" verify_consistent() ({waited:.1f} s into its {timeout:g} s)",
            missing,
        )
    if "successfully reached monitoredBarrier" in str(exc) or me == members[0]:
        if not ended:
            return _timed_out(me, members, timeout)
        return InconsistentRegistryError(
            f"rank {me}: verify_consistent() failed {waited:.1f} s into its {timeout:g} s:"
            f" a rank of {members} ended (rank {members[0]} names it)",
        )
    # It never waited: the first rank had stopped waiting (this one came late) or ended.
    cause = (str(exc).strip().splitlines() or [""])[0]
    return InconsistentRegistryError(
        f"rank {me}: verify_consistent() found rank {members[0]} no longer waiting: this rank"
        f" called it after the others' {timeout:g} s had run out, or rank {members[0]} ended"
        f" ({cause})",
    )


def distributed_ready() -> bool:
    """Whether torch.distributed is loaded and initialised in this process (no import)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()
