"""The cluster tests' ranks: real processes talking gloo over the loopback address, each
forked from the server that imported PyTorch once (see ``_forked.py``), or a fresh
interpreter where numpy cannot be imported, and started as ``python`` would in its own
folder, with its own environment.

Every rank runs the same steps in order, each a function of this module below that decides
by its rank what to do, all ranks meeting at a gloo barrier before each step; a step a rank
dies in is its last. A rank writes what each step returned as one JSON object to
``rankN.json`` beside the others, and its output to ``rankN.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from . import _forked

#: The time limit of a check that some rank is meant to miss: every rank that does call it
#: has met the others at a barrier just before, so a second is ample.
SHORT = 1.0
#: The time limit of a check every rank makes.
LONG = 30.0


def run(
    here: Path,
    folders: list[Path],
    steps: list[str],
    envs: list[dict[str, str]],
    port: int,
    without_numpy: bool = False,
) -> list[dict[str, Any]]:
    """Start a rank in each folder, with its environment, to run ``steps``; what each
    rank's steps returned, in rank order. A rank that is not done within 120 s fails the
    test, and every rank ends."""
    for stale in here.glob("rank*.json"):
        stale.unlink()  # an earlier run's ranks ended; these did not
    world = len(folders)
    args = [(r, world, port, steps, folders[r], here, envs[r]) for r in range(world)]
    if without_numpy:  # one fresh interpreter, which forks the ranks
        given = json.dumps([sys.path, [[*a[:4], str(a[4]), str(here), a[6]] for a in args]])
        ranks: list[Any] = [
            subprocess.Popen([sys.executable, "-c", NO_NUMPY, given], start_new_session=True)
        ]
    else:
        ranks = [_forked.CONTEXT.Process(target=_rank, args=a) for a in args]
        for process in ranks:
            process.start()
    deadline = time.monotonic() + 120
    while any(map(_running, ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if any(map(_running, ranks)):
        for process in ranks:
            if isinstance(process, subprocess.Popen):
                os.killpg(process.pid, 9)  # its ranks too
            process.kill()
        raise AssertionError("a rank hung")
    results = []
    for r in range(world):
        said = here / f"rank{r}.json"
        assert said.exists(), (here / f"rank{r}.log").read_text()[-3000:]
        results.append(json.loads(said.read_text()))
    return results


def _running(process: Any) -> bool:
    return process.poll() is None if isinstance(process, subprocess.Popen) else process.is_alive()


#: The ranks forked from a fresh interpreter that made numpy unimportable before it imported
#: PyTorch (which imports without it), once for them all.
NO_NUMPY = """
import json, multiprocessing, sys
sys.modules["numpy"] = None
path, ranks = json.loads(sys.argv[1])
sys.path[:0] = path  # the test's: this package, and the tests as a package
import torch.distributed
from pathlib import Path
from tests._ranks import _rank
fork = multiprocessing.get_context("fork")
forked = [fork.Process(target=_rank, args=(*a[:4], Path(a[4]), Path(a[5]), a[6])) for a in ranks]
for rank in forked:
    rank.start()
for rank in forked:
    rank.join()
"""


def _rank(
    rank: int,
    world: int,
    port: int,
    steps: list[str],
    folder: Path,
    here: Path,
    env: dict[str, str],
) -> None:
    log = os.open(here / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    _forked.start(folder, env)
    result: dict[str, Any] = {}
    try:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=timedelta(seconds=60),
        )  # fmt: skip
        me = Rank(rank, world)
        me.registry.facts()  # discovery before the first barrier: no rank is slow after it
        for step in steps:
            dist.barrier()
            result[step] = STEPS[step](me)
            (here / f"rank{rank}.json").write_text(json.dumps(result))
        if "dies" not in steps:
            dist.barrier()  # the store is rank 0's: it stays until every rank is done
    except BaseException:  # said in the log, which the test shows
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


class Rank:
    """What a step knows: this rank, the world's size, and the registry it checks (the
    project's, its manifests on TORCH_BACKENDS_PATH and its plugins: not PyTorch's own
    backends, whose first listing costs a rank seconds and tells the check nothing new)."""

    def __init__(self, rank: int, world: int) -> None:
        import torch_backend_registry as t

        self.rank, self.world = rank, world
        self.registry = t.Registry(sources=("runtime", "env", "project", "entry-point"))

    def check(self, group: Any = None, timeout: float | timedelta = LONG) -> dict[str, Any]:
        """What a check returned, or the error it raised with its ranks and names."""
        import torch_backend_registry as t

        return said(lambda: t.verify_consistent(group, timeout, registry=self.registry))


def said(call: Callable[[], str | None]) -> dict[str, Any]:
    """What ``call`` returned, or the error it raised (with its ranks and names)."""
    import torch_backend_registry as t

    try:
        return {"fingerprint": call()}
    except t.InconsistentRegistryError as exc:
        return {"error": str(exc), "ranks": list(exc.ranks), "names": list(exc.names)}
    except (ValueError, TypeError) as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}


def agree(me: Rank) -> dict[str, Any]:
    return me.check()


def absent(me: Rank) -> dict[str, Any]:
    """The last rank never calls; the others give the world group by name."""
    import torch.distributed as dist

    if me.rank == me.world - 1:
        return {"absent": True}
    return me.check(dist.group.WORLD, SHORT)


def _late(who: int, me: Rank) -> dict[str, Any]:
    """Rank ``who`` calls once the others' time has run out (and they are past it, at a
    barrier); then every rank checks again, and the job's own group still runs."""
    import torch
    import torch.distributed as dist

    if me.rank == who:
        dist.barrier()
    late = me.check(timeout=timedelta(seconds=SHORT))
    if me.rank != who:
        dist.barrier()
    total = torch.ones(1)
    dist.all_reduce(total)
    return {"late": late, "again": me.check(), "sum": total.item()}


def late_last(me: Rank) -> dict[str, Any]:
    return _late(me.world - 1, me)


def late_first(me: Rank) -> dict[str, Any]:
    return _late(0, me)


def refused(me: Rank) -> dict[str, Any]:
    """The last rank's call is refused for its time limit; then every rank calls again."""
    first = me.check(timeout=-1 if me.rank == me.world - 1 else SHORT)
    return {"first": first, "then": me.check()}


def twice(me: Rank) -> dict[str, Any]:
    """Rank 0 calls twice where the others call once: its second call is the others'
    next, which they make only once its time has run out; then every rank calls again."""
    import torch.distributed as dist

    said = [me.check(timeout=SHORT)]
    if me.rank == 0:
        said.append(me.check(timeout=SHORT))
    dist.barrier()
    if me.rank != 0:
        said.append(me.check(timeout=SHORT))
    return {"said": [*said, me.check()]}


def pair(me: Rank) -> dict[str, Any]:
    """A group of the last two ranks, of which only the first calls."""
    import torch.distributed as dist

    group = dist.new_group(ranks=[me.world - 2, me.world - 1], backend="gloo")
    if me.rank != me.world - 2:
        return {"absent": True}
    return me.check(group, SHORT)


def outside(me: Rank) -> dict[str, Any]:
    """Ranks 0 and 1 in a group, which every rank names."""
    import torch.distributed as dist

    return me.check(dist.new_group(ranks=[0, 1], backend="gloo"))


def stages(me: Rank) -> dict[str, Any]:
    """A check of each rank's stage (0 | 1, 2, ...), then of all; the job's own groups are
    still made alike after it."""
    import torch
    import torch.distributed as dist

    stage = dist.new_group(ranks=list(range(1, me.world)), backend="gloo")
    if me.rank:
        assert "fingerprint" in me.check(stage)
    result = me.check(dist.group.WORLD)
    mine = torch.ones(1)
    everyone = dist.new_group(backend="gloo", timeout=timedelta(seconds=LONG))
    dist.all_reduce(mine, group=everyone)
    return {**result, "sum": mine.item()}


def groups(me: Rank) -> dict[str, Any]:
    """Rank 1 gives a group of ranks 1 and 2 where the others give none."""
    import torch.distributed as dist

    group = dist.new_group(ranks=[1, 2], backend="gloo")
    return me.check(group if me.rank == 1 else None, SHORT)


def dies(me: Rank) -> dict[str, Any]:
    """The last rank ends while the others wait for it."""
    if me.rank == me.world - 1:
        time.sleep(SHORT / 4)
        os._exit(3)
    return me.check(timeout=SHORT)


def differ(me: Rank) -> dict[str, Any]:
    """A check where ranks differ, the facts sent in pieces of 100 bytes."""
    from torch_backend_registry import _store

    _store.PIECE = 100
    return me.check()


def install(me: Rank) -> dict[str, Any]:
    """TORCH_BACKENDS_VERIFY: install() checks the default registry (PyTorch's backends
    too); then rank 1 takes rank 0's manifest, and the check at the next install() agrees."""
    import shutil

    import torch_backend_registry as t

    first = said(t.install)
    if me.rank == 1:
        shutil.copy("../rank0/backends.toml", "backends.toml")
        t.refresh()
    return {"first": first, "then": said(t.install)}


STEPS: dict[str, Callable[[Rank], dict[str, Any]]] = {
    step.__name__.replace("_", "-"): step
    for step in (
        agree,
        absent,
        late_last,
        late_first,
        refused,
        twice,
        pair,
        outside,
        stages,
        groups,
        dies,
        differ,
        install,
    )
}
