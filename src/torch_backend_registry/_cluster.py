"""Every rank resolves names alike: fingerprints compared on torch.distributed's store.

Each rank adds its fingerprint and host to a key of this call on the default group's store;
the last to come reads them all and sets the verdict every rank waits for. No collective runs,
so there is no group to make (the default group may be NCCL, the ranks compared any subgroup),
none that a rank which never comes can leave unusable, and the ranks missing are those absent
from the key. The facts travel only on a mismatch, once for each fingerprint, and then every
rank raises the same :class:`InconsistentRegistryError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import socket
import sys
import zlib
from collections import Counter
from dataclasses import dataclass

from ._environment import CLUSTER_TIMEOUT
from ._errors import BackendRegistryError, InconsistentRegistryError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import timedelta
    from typing import Any

    from ._registry import Registry

#: Where the check keeps its keys on the job's store, apart from PyTorch's own.
KEYS = "torch_backend_registry/verify"
#: The facts travel in pieces of at most this many bytes: PyTorch's store (libuv's, its
#: default since 2.4) answers a message over 8 MiB by closing the connection that sent it,
#: which is the job's own.
PIECE = 1 << 20


def verify_consistent(
    registry: Registry, group: Any = None, timeout: float | timedelta = CLUSTER_TIMEOUT
) -> str:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store  # no public name

    if not (dist.is_available() and dist.is_initialized()):
        _limit(timeout)  # a wrong time limit is said first, as where it is initialised
        raise BackendRegistryError(
            "verify_consistent() needs torch.distributed initialised (init_process_group) first"
        )
    if group is None:
        members = list(range(dist.get_world_size()))
    else:
        members = sorted(dist.get_process_group_ranks(group))
    me = dist.get_rank()
    if me not in members:
        raise ValueError(
            f"rank {me} is not in the group of ranks {members}: it has no rank to compare with"
        )
    store = _get_default_store()
    # The ranks' list named by its hash: a key sent with every request stays short at
    # thousands of ranks.
    ranks = f"{KEYS}/{hashlib.sha256(str(members).encode()).hexdigest()[:16]}"
    try:
        # Each rank's n-th check of these ranks pairs with the others' n-th, counted before
        # anything can refuse it: a refused call pairs with the others', which time out, and
        # the next calls pair up. On the store, a new process group counts from 1 again.
        count = store.add(f"{ranks}/calls/{me}", 1)
        if not store.check([ranks]):
            store.set(ranks, str(members))  # read where another rank waits for it in vain
        store.set(f"{KEYS}/last/{me}", ranks)
        return _Call(store, ranks, count, members, me, _limit(timeout)).compare(registry.facts())
    except getattr(dist, "DistError", RuntimeError) as exc:  # timeouts are caught inside
        raise InconsistentRegistryError(
            f"rank {me}: verify_consistent() could not reach the other ranks of {members}:"
            " the job's store has gone with rank 0 (which may have stopped waiting for this"
            f" rank, and ended) ({type(exc).__name__}: {exc})",
        ) from exc


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


def _timed_out() -> type[Exception]:
    """What a store raises when a wait runs out of time (PyTorch 2.2+; a RuntimeError before)."""
    import torch.distributed as dist

    return getattr(dist, "DistStoreError", RuntimeError)


@dataclass(frozen=True)
class _Call:
    """This rank's part in the ``count``-th check of ``members``, whose keys on the job's
    store start with ``ranks``."""

    store: Any
    ranks: str
    count: int
    members: list[int]
    me: int
    limit: timedelta

    @property
    def name(self) -> str:
        return f"{self.ranks}/{self.count}"

    def compare(self, facts: dict[str, Any]) -> str:
        """The fingerprint where every rank agrees, else the same error on each."""
        from ._lock import digest

        full = digest(facts)
        if self.arrive(f"{self.me} {full} {socket.gethostname()}\n") == "go":
            self.leave(len(self.members))
            return full[:16]
        said = self.said()
        hashes = [said[rank][0] for rank in self.members]
        known = self.facts(hashes, full, facts)
        self.leave(len(self.members))
        everyone = [(said[rank][1], known[said[rank][0]]) for rank in self.members]
        raise mismatch(self.members, hashes, everyone)

    def said(self) -> dict[int, list[str]]:
        """What each rank that came said: its fingerprint and its host."""
        lines = self.store.get(f"{self.name}/said").decode().splitlines()
        return {int(rank): rest for rank, *rest in (line.split(" ") for line in lines)}

    def arrive(self, line: str) -> str:
        """Add this rank's ``line`` to what the ranks said; once every rank has, "go" where
        all agree, "differ" where not, else the error that names the ranks absent."""
        self.store.append(f"{self.name}/said", line)
        # One key decides, set once: by the last rank to come, which alone reads what all
        # said (so that agreeing ranks read nothing else), or by the first whose time ran
        # out, the ranks still absent. Whichever is set first is what every rank reads, one
        # that comes later too: none goes on while another gives up.
        verdict = f"{self.name}/verdict"
        if self.store.add(f"{self.name}/came", 1) == len(self.members):
            self.store.compare_set(verdict, "", self.decide())
        try:
            self.store.wait([verdict], self.limit)
        except _timed_out():
            self.store.compare_set(verdict, "", self.decide())
        decided = str(self.store.get(verdict).decode())
        if decided in ("go", "differ"):
            return decided
        absent, said = decided.split(" ", 1)
        missing = tuple(int(rank) for rank in absent.split(","))
        if self.me in missing:
            # Counted past the checks the others gave up on without this rank, so that its
            # next call pairs with their next: one it skipped costs one failed check, not all.
            later = self.count
            while self.store.check([f"{self.ranks}/{later + 1}/verdict"]):
                later += 1
            self.store.add(f"{self.ranks}/calls/{self.me}", later - self.count)
            raise InconsistentRegistryError(
                f"rank {self.me}: verify_consistent() found the other ranks of {self.members}"
                " no longer waiting: this rank called it after their"
                f" {self.limit.total_seconds():g} s had run out",
            )
        self.leave(len(self.members) - len(missing))
        raise InconsistentRegistryError(said, missing)

    def decide(self) -> str:
        """The verdict on what the ranks said so far: "go" where every rank came and all
        agree, "differ" where they came and do not, else the ranks absent and the error that
        names them, with the ranks the first few last checked where those were others (a
        group given differently, or a stage checked before)."""
        came = self.said()  # this rank's own line among them
        absent = [rank for rank in self.members if rank not in came]
        if not absent:
            return "go" if len({fingerprint for fingerprint, _ in came.values()}) == 1 else "differ"
        elsewhere = [
            f"rank {rank}'s last check was of ranks {self.store.get(last).decode()}"
            for rank in absent[:5]
            if self.store.check([f"{KEYS}/last/{rank}"])
            and (last := self.store.get(f"{KEYS}/last/{rank}").decode()) != self.ranks
        ]
        return (
            f"{','.join(map(str, absent))} ranks {absent} did not call verify_consistent()"
            f" within {self.limit.total_seconds():g} s"
            + (f" ({'; '.join(elsewhere)})" if elsewhere else "")
        )

    def facts(self, hashes: list[str], full: str, facts: dict[str, Any]) -> dict[str, Any]:
        """The facts of each fingerprint, sent by its first rank: every rank reads the same,
        and ranks that agree with each other send them once."""
        first: dict[str, int] = {}
        for rank, fingerprint in zip(self.members, hashes, strict=True):
            first.setdefault(fingerprint, rank)
        known = {full: facts} if first[full] == self.me else {}
        if known:
            blob = zlib.compress(pickle.dumps(facts))
            pieces = [blob[i : i + PIECE] for i in range(0, len(blob), PIECE)]
            for i, piece in enumerate(pieces):
                self.store.set(f"{self.name}/facts/{full}/{i}", piece)
            self.store.set(f"{self.name}/facts/{full}", str(len(pieces)))  # all there
        wanted = {f: f"{self.name}/facts/{f}" for f in first if f not in known}
        try:
            self.store.wait(list(wanted.values()), self.limit)
        except _timed_out() as exc:
            gone = [first[f] for f, key in wanted.items() if not self.store.check([key])]
            self.leave(len(self.members) - len(gone))
            raise InconsistentRegistryError(
                f"ranks {gone} ended during verify_consistent(): their backends, which differ"
                f" from other ranks', did not come within {self.limit.total_seconds():g} s",
                tuple(gone),
            ) from exc
        for fingerprint, key in wanted.items():
            count = int(self.store.get(key))
            pieces = self.store.multi_get([f"{key}/{i}" for i in range(count)])
            # Unpickled from the job's own store, as torch.distributed's object collectives do.
            known[fingerprint] = pickle.loads(zlib.decompress(b"".join(pieces)))
        return known

    def leave(self, came: int) -> None:
        """Say this rank has read all it needs. Rank 0 then waits for the ``came`` ranks that
        came in time to say so: torch.distributed's rendezvous puts the store in its process,
        and its ending (an error raised here ends most jobs) would cut them off mid-read."""
        if self.store.add(f"{self.name}/read", 1) == came:
            # Read by all: a job that checks often keeps no line a rank a call in rank 0.
            self.store.delete_key(f"{self.name}/said")
            self.store.set(f"{self.name}/all read", "")
        if self.me == 0:
            with contextlib.suppress(_timed_out()):
                self.store.wait([f"{self.name}/all read"], self.limit)


def mismatch(
    members: list[int], hashes: list[str], everyone: list[Any]
) -> InconsistentRegistryError:
    """The same error on every rank: the ranks outside the majority (in a tie, outside the
    group of the lowest rank, said so), and where they differ, once a name; the first ten
    ranks said, the differences of each fingerprint found once."""
    from ._lock import changes

    counted = Counter(hashes).most_common()  # in a tie, the group of the lowest rank first
    majority, count = counted[0]
    tie = len(counted) > 1 and counted[1][1] == count
    reference = everyone[hashes.index(majority)][1]
    odd = [i for i, h in enumerate(hashes) if h != majority]
    found = {hashes[i]: changes(reference, everyone[i][1]) for i in odd}
    names = {name for each in found.values() for about, _said in each for name in about}
    lines = []
    for index in odd[:10]:
        said = _by_name([said for _about, said in found[hashes[index]]])
        more = f"; and {len(said) - 5} more" if len(said) > 5 else ""
        lines.append(f"rank {members[index]} on {everyone[index][0]}: {'; '.join(said[:5])}{more}")
    if len(odd) > 10:
        lines.append(f"and {len(odd) - 10} more ranks")
    odd_ranks = tuple(members[i] for i in odd)
    return InconsistentRegistryError(
        f"ranks {list(odd_ranks)} resolve backend names differently from the other"
        f" {len(members) - len(odd)} (compared to rank {members[hashes.index(majority)]}"
        f"{'; no group of ranks is a majority' if tie else ''}): " + " | ".join(lines),
        odd_ranks,
        tuple(sorted(names)),
    )


def _by_name(differences: list[str]) -> list[str]:
    """``changed backend 'x': a: 1 -> 2, b: 3 -> 4``: the name once, with each of its fields
    (the lock says a field a line, and they come sorted by name)."""
    lines: list[str] = []
    previous = ""
    for said in differences:
        head, _, fields = said.partition(": ")
        if head == previous and head.startswith("changed "):
            lines[-1] += f", {fields}"
        else:
            lines.append(said)
        previous = head
    return lines


def distributed_ready() -> bool:
    """Whether torch.distributed is loaded and initialised in this process (no import)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()
