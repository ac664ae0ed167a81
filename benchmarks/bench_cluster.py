"""What verify_consistent() costs a rank, at 2, 4 and 8 ranks of gloo on the loopback address.

Each rank first computes its fingerprint once (discovery, which a job pays
anyway), then calls verify_consistent() several times; the table gives the
median a call as seen by rank 0, and the fingerprint alone for comparison.
With --backends N, each rank's project declares N backends, and the last
line times one mismatch (rank 1's options all differ) at 2 ranks: the facts
travel through the store, and every rank compares them.

    python benchmarks/bench_cluster.py [--ranks 2 4 8] [--calls 9] [--backends 10000]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

RANK = textwrap.dedent(
    """
    import json, statistics, sys, time
    from datetime import timedelta
    import torch.distributed as dist
    rank, world, port, calls = (int(a) for a in sys.argv[1:5])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=120),
    )
    import torch_backend_registry as t
    registry = t.Registry(sources=("env", "project", "entry-point", "torch"))
    start = time.perf_counter(); t.fingerprint(registry); first = time.perf_counter() - start
    start = time.perf_counter(); t.fingerprint(registry); again = time.perf_counter() - start
    times = []
    mismatch = None
    if len(sys.argv) > 5:  # the ranks' projects differ: one check, which raises
        dist.barrier()
        start = time.perf_counter()
        try:
            t.verify_consistent(timeout=60, registry=registry)
        except t.InconsistentRegistryError:
            mismatch = time.perf_counter() - start
    else:
        for _ in range(calls):
            dist.barrier()
            start = time.perf_counter()
            t.verify_consistent(timeout=60, registry=registry)
            times.append(time.perf_counter() - start)
    if rank == 0:
        print(json.dumps({"check": statistics.median(times or [0]), "fingerprint": again,
                          "discovery": first, "names": len(registry.list_backends()),
                          "mismatch": mismatch}))
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def measure(world: int, calls: int, folder: Path, backends: int = 0) -> dict[str, float]:
    script = folder / "rank.py"
    script.write_text(RANK, encoding="utf-8")
    port = _free_port()
    differ = ["differ"] if backends else []
    for rank in range(world if backends else 0):
        level = 9 if rank == 1 else "{level}"
        table = '[backends.b{i}]\ntarget = "pkg{m}.compilers:fn{i}"\noptions = {{ level = %s }}\n'
        (folder / f"rank{rank}").mkdir(exist_ok=True)
        (folder / f"rank{rank}" / "backends.toml").write_text(
            "".join((table % level).format(i=i, m=i % 100, level=i % 7) for i in range(backends))
        )
    children = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), str(port), str(calls), *differ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=folder / f"rank{rank}" if backends else None,
        )
        for rank in range(world)
    ]
    out = [child.communicate(timeout=600)[0] for child in children]
    result: dict[str, float] = json.loads(out[0].strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--calls", type=int, default=9)
    parser.add_argument("--backends", type=int, default=0)
    args = parser.parse_args()
    print("| ranks | verify_consistent() a call | fingerprint() alone | backend names |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for world in args.ranks:
            r = measure(world, args.calls, Path(folder))
            print(
                f"| {world} | {r['check'] * 1e3:.1f} ms | {r['fingerprint'] * 1e3:.1f} ms"
                f" | {r['names']:.0f} |"
            )
        if args.backends:
            r = measure(2, 1, Path(folder), args.backends)
            print(f"\na mismatch at {r['names']:.0f} names, 2 ranks: {r['mismatch']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
