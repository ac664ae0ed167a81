"""The cluster tests' ranks: real processes talking gloo over the loopback address, each
forked from the server that imported PyTorch once (see ``_forked.py``) and started as
``python`` would in its own folder, with its own environment.

A rank writes what it found as one JSON object to ``rankN.json`` beside the others, and its
output to ``rankN.log``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from . import _forked


def run(
    here: Path, folders: list[Path], modes: list[str], envs: list[dict[str, str]], port: int
) -> list[dict[str, Any]]:
    """Start a rank in each folder, each with its mode and environment; their results, in
    rank order. A rank that is not done within 180 s fails the test, and every rank ends."""
    for stale in [*here.glob("rank*.done"), *here.glob("rank*.json")]:
        stale.unlink()  # an earlier run's ranks ended; these did not
    world = len(folders)
    ranks = [
        _forked.CONTEXT.Process(
            target=_rank, args=(r, world, port, modes[r], folders[r], here, envs[r])
        )
        for r in range(world)
    ]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + 180
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    if any(process.is_alive() for process in ranks):
        for process in ranks:
            process.kill()
        raise AssertionError("a rank hung")
    results = []
    for r in range(world):
        said = here / f"rank{r}.json"
        assert said.exists(), (here / f"rank{r}.log").read_text()[-2000:]
        results.append(json.loads(said.read_text()))
    return results


def _rank(
    rank: int, world: int, port: int, mode: str, folder: Path, here: Path, env: dict[str, str]
) -> None:
    log = os.open(here / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    _forked.start(folder, env)
    try:
        result = _check(rank, world, port, mode, here)
    except BaseException:  # said in the log, which the test shows
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    (here / f"rank{rank}.json").write_text(json.dumps(result))
    (here / f"rank{rank}.done").touch()
    os._exit(0)


def _wait_for(paths: list[Path]) -> None:
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)


def _check(rank: int, world: int, port: int, mode: str, here: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    import torch_backend_registry as t

    others = [here / f"rank{r}.done" for r in range(world) if r != rank]
    try:
        if mode == "absent":  # never calls verify_consistent(): waits until the others end
            _wait_for(others)
            return {"absent": True}
        if mode == "dies":  # ends while the others wait for it
            (here / f"rank{rank}.json").write_text(json.dumps({"died": True}))
            time.sleep(1)
            os._exit(3)
        if mode.startswith("late"):  # calls once the others' time has run out
            time.sleep(float(mode[4:]) + 2)
            return {"fingerprint": t.verify_consistent(timeout=float(mode[4:]))}
        if mode.startswith("world"):  # a group given: the check makes a gloo group of it
            return {"fingerprint": t.verify_consistent(dist.group.WORLD, float(mode[5:]))}
        if mode == "outside":  # every rank but the first in a group of their own
            group = dist.new_group(ranks=list(range(1, world)), backend="gloo")
            try:
                return {"fingerprint": t.verify_consistent(group, timeout=20)}
            except ValueError as exc:
                _wait_for(others)  # it holds the store: it waits for them
                return {"refused": str(exc)}
        if mode == "stages":  # a check of each rank's stage (0 | 1, 2), then of all
            stage = dist.new_group(ranks=list(range(1, world)), backend="gloo")
            if rank:
                t.verify_consistent(stage, timeout=10)
            result: dict[str, Any] = {
                "fingerprint": t.verify_consistent(dist.group.WORLD, timeout=10)
            }
            mine = torch.ones(1)  # and the job's own groups are still made alike
            everyone = dist.new_group(backend="gloo", timeout=timedelta(seconds=10))
            dist.all_reduce(mine, group=everyone)
            result["sum"] = mine.item()
            return result
        if mode == "pair":  # a group of the last two ranks, of which only the first calls
            pair = dist.new_group(ranks=[world - 2, world - 1], backend="gloo")
            if rank != world - 2:
                _wait_for([here / f"rank{world - 2}.done"])
                return {"absent": True}
            return {"fingerprint": t.verify_consistent(pair, timeout=3)}
        if mode == "again":  # rank 1 comes too late once; then both check twice, and train
            if rank == 1:
                time.sleep(5)
            said: list[str] = []
            for _ in range(3):
                try:
                    said.append(t.verify_consistent(timeout=3))
                except t.InconsistentRegistryError as exc:
                    said.append(str(exc))
            total = torch.ones(1)
            dist.all_reduce(total)  # the job's own group is as it was
            return {"said": said, "sum": total.item()}
        if mode == "refused":  # the last rank's first call is refused; then all call again
            said = []
            try:
                t.verify_consistent(timeout=-1 if rank == world - 1 else 3)
            except (ValueError, t.InconsistentRegistryError) as exc:
                said.append(f"{type(exc).__name__}: {exc}")
            said.append(t.verify_consistent(timeout=10))
            return {"said": said}
        if mode == "install":  # TORCH_BACKENDS_VERIFY: the check at install()
            t.install()
            return {"installed": True}
        return {"fingerprint": t.verify_consistent(timeout=float(mode))}
    except t.InconsistentRegistryError as exc:
        return {"error": str(exc), "ranks": list(exc.ranks), "names": list(exc.names)}
