"""Every rank resolves names alike: fingerprints compared on the default group's store.

Each rank adds its fingerprint and host to a key of this call (``_store``); the last to come,
or the first whose time runs out, sets the verdict every rank reads. No collective runs, so
there is no group to make (the default group may be NCCL, the ranks compared any subgroup)
and none that a rank which never comes can leave unusable. The facts travel only on a
mismatch, once for each fingerprint, and then every rank raises the same error.
"""

from __future__ import annotations

import hashlib
import pickle
import socket
import zlib
from collections import Counter
from datetime import timedelta
from typing import Any, NamedTuple, NoReturn

from . import _store
from ._environment import CLUSTER_TIMEOUT
from ._errors import BackendRegistryError, InconsistentRegistryError
from ._lock import changes, digest, fingerprint
from ._registry import Registry

#: Where the check keeps its keys on the job's store, apart from PyTorch's own.
KEYS = "torch_backend_registry/verify"


def verify_consistent(
    registry: Registry, group: Any = None, timeout: float | timedelta = CLUSTER_TIMEOUT
) -> str:
    if not _store.initialised():
        _store.time_limit(timeout)  # a wrong time limit is said first, as where it is initialised
        raise BackendRegistryError(
            "verify_consistent() needs torch.distributed initialised (init_process_group) first"
        )
    import torch.distributed as dist

    members = sorted(dist.get_process_group_ranks(group or dist.group.WORLD))
    me = _store.rank()
    if me not in members:
        raise ValueError(
            f"rank {me} is not in the group of ranks {members}: it has no rank to compare with"
        )
    if (store := _store.default_store()) is None:  # one rank: none to differ from
        _store.time_limit(timeout)
        return fingerprint(registry)
    # Named by the ranks' list's hash: a key sent with every request stays short.
    ranks = f"{KEYS}/{hashlib.sha256(str(members).encode()).hexdigest()[:16]}"
    try:
        # Each rank's n-th check of these ranks pairs with the others' n-th, counted before
        # anything can refuse it: a refused call pairs with the others', which time out.
        count = store.add(f"{ranks}/calls/{me}", 1)
        store.set(f"{KEYS}/last/{me}", str(members))  # read where another waits for it in vain
        check = _Check(store, ranks, count, members, me, _store.time_limit(timeout))
        return check.run(registry.facts())
    except getattr(dist, "DistError", RuntimeError) as exc:  # timeouts are caught inside
        raise InconsistentRegistryError(
            f"rank {me}: verify_consistent() could not reach the other ranks of {members}:"
            " the job's store has gone with rank 0 (which may have stopped waiting for this"
            f" rank, and ended) ({type(exc).__name__}: {exc})",
        ) from exc


class _Check(NamedTuple):
    """This rank's part in the ``nth`` check of ``members``, whose keys on ``store``
    start with ``ranks``."""

    store: Any
    ranks: str
    nth: int
    members: list[int]
    me: int
    limit: timedelta

    @property
    def call(self) -> str:
        return f"{self.ranks}/{self.nth}"

    def run(self, facts: dict[str, Any]) -> str:
        """The fingerprint where every rank agrees, else the same error on each."""
        full = digest(facts)
        self.store.append(f"{self.call}/said", f"{self.me} {full} {socket.gethostname()}\n")
        # One key decides, set once: by the last rank to come, which alone reads what all
        # said, or by the first whose time ran out, naming the ranks absent. Whichever is set
        # first is what every rank reads, one that comes later too: none goes on while
        # another gives up.
        verdict = f"{self.call}/verdict"
        last = self.store.add(f"{self.call}/came", 1) == len(self.members)
        if last or not _store.wait(self.store, [verdict], self.limit):
            self.store.compare_set(verdict, "", self._decide())
        decided = self.store.get(verdict).decode()
        if decided == "differ":
            self._differ(full, facts)
        if decided == "go":
            self._leave(len(self.members))
            return full[:16]
        absent, said = decided.split(" ", 1)
        missing = tuple(int(rank) for rank in absent.split(","))
        if self.me in missing:
            # Counted past the checks the others gave up on without this rank, so that its
            # next call pairs with their next: one it skipped costs one failed check, not all.
            later = self.nth
            while self.store.check([f"{self.ranks}/{later + 1}/verdict"]):
                later += 1
            self.store.add(f"{self.ranks}/calls/{self.me}", later - self.nth)
            raise InconsistentRegistryError(
                f"rank {self.me}: verify_consistent() found the other ranks of {self.members}"
                " no longer waiting: this rank called it after their"
                f" {self.limit.total_seconds():g} s had run out",
            )
        self._leave(len(self.members) - len(missing))
        raise InconsistentRegistryError(said, missing)

    def _said(self) -> dict[int, list[str]]:
        """What each rank that came said: its fingerprint and its host."""
        lines = self.store.get(f"{self.call}/said").decode().splitlines()
        return {int(rank): rest for rank, *rest in (line.split(" ") for line in lines)}

    def _decide(self) -> str:
        """The verdict: "go" where every rank came and all agree, "differ" where they came and
        do not, else the ranks absent and the error that names them, with the ranks the first
        few last checked where those were others (a group given differently, or a stage
        checked before)."""
        came = self._said()
        absent = [rank for rank in self.members if rank not in came]
        if not absent:
            return "go" if len({fingerprint for fingerprint, _ in came.values()}) == 1 else "differ"
        elsewhere = [
            f"rank {rank}'s last check was of ranks {last}"
            for rank in absent[:5]
            if self.store.check([f"{KEYS}/last/{rank}"])
            and (last := self.store.get(f"{KEYS}/last/{rank}").decode()) != str(self.members)
        ]
        return (
            f"{','.join(map(str, absent))} ranks {absent} did not call verify_consistent()"
            f" within {self.limit.total_seconds():g} s"
            + (f" ({'; '.join(elsewhere)})" if elsewhere else "")
        )

    def _differ(self, full: str, facts: dict[str, Any]) -> NoReturn:
        """Raise what differs, the same on every rank: the facts of each fingerprint are
        published by its first rank, and read by the others."""
        said = self._said()
        hashes = [said[rank][0] for rank in self.members]
        # Each fingerprint's first rank: of a rank and the ranks after it, the first is kept.
        first = dict(zip(reversed(hashes), reversed(self.members), strict=True))
        # This rank's own fingerprint's facts are known here: only the others' are read below.
        if first.pop(full) == self.me:
            _store.publish(self.store, f"{self.call}/{full}", zlib.compress(pickle.dumps(facts)))
        known = {full: facts}
        for other, rank in first.items():
            if (data := _store.receive(self.store, f"{self.call}/{other}", self.limit)) is None:
                self._leave(len(self.members) - 1)
                raise InconsistentRegistryError(
                    f"ranks {[rank]} ended during verify_consistent(): their backends, which"
                    f" differ from other ranks', did not come within"
                    f" {self.limit.total_seconds():g} s",
                    (rank,),
                )
            # Unpickled from the job's own store, as torch.distributed's object collectives do.
            known[other] = pickle.loads(zlib.decompress(data))
        self._leave(len(self.members))
        everyone = [(said[rank][1], known[said[rank][0]]) for rank in self.members]
        raise mismatch(self.members, hashes, everyone)

    def _leave(self, came: int) -> None:
        """Say this rank has read all it needs. Rank 0 then waits for the ``came`` ranks that
        came in time to say so: torch.distributed's rendezvous puts the store in its process,
        and its ending (an error raised here ends most jobs) would cut them off mid-read."""
        if self.store.add(f"{self.call}/read", 1) == came:
            self.store.set(f"{self.call}/all read", "")
        if self.me == 0:
            _store.wait(self.store, [f"{self.call}/all read"], self.limit)


def mismatch(
    members: list[int], hashes: list[str], everyone: list[Any]
) -> InconsistentRegistryError:
    """The same error on every rank: the ranks outside the majority (in a tie, outside the
    group of the lowest rank, said so), and where they differ, once a name; the first ten
    ranks said, the differences of each fingerprint found once."""
    # In a tie, the group of the lowest rank first.
    (majority, count), *others = Counter(hashes).most_common()
    tie = bool(others) and others[0][1] == count
    reference = everyone[hashes.index(majority)][1]
    odd = [i for i, h in enumerate(hashes) if h != majority]
    found = {hashes[i]: changes(reference, everyone[i][1], by_name=True) for i in odd}
    names = {name for each in found.values() for about, _said in each for name in about}
    lines = []
    for index in odd[:10]:
        said = [said for _about, said in found[hashes[index]]]
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
