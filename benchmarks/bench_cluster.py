"""What verify_consistent() costs a rank, at 2, 4 and 8 ranks of gloo on the loopback address.

Each rank first computes its fingerprint once (discovery, which a job pays
anyway), then calls verify_consistent() several times; the table gives the
median a call as seen by rank 0, and the fingerprint alone for comparison.

    python benchmarks/bench_cluster.py [--ranks 2 4 8] [--calls 9]
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
    for _ in range(calls):
        dist.barrier()
        start = time.perf_counter()
        t.verify_consistent(timeout=60, registry=registry)
        times.append(time.perf_counter() - start)
    if rank == 0:
        print(json.dumps({"check": statistics.median(times), "fingerprint": again,
                          "discovery": first, "names": len(registry.list_backends())}))
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def measure(world: int, calls: int, folder: Path) -> dict[str, float]:
    script = folder / "rank.py"
    script.write_text(RANK, encoding="utf-8")
    port = _free_port()
    children = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), str(port), str(calls)],
            stdout=subprocess.PIPE,
            text=True,
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
