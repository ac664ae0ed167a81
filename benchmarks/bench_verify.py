"""What a chain that verifies its member costs at compile time, against the same chain unverified.

Run by hand:  python benchmarks/bench_verify.py [--quick]

Each measurement is a fresh process that compiles a small model with a chain
whose one member is PyTorch's ``aot_eager`` (forward and backward compiled),
unverified, ``verify = "forward"`` and ``verify = "backward"``, and times the
first call (which compiles) and a later one. The sides alternate run by run and
the table gives medians; verification is paid once a graph, at compile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PY = sys.executable

MANIFEST = """
[backends.plain]
chain = ["aot_eager"]
[backends.forward]
chain = ["aot_eager"]
verify = "forward"
[backends.backward]
chain = ["aot_eager"]
verify = "backward"
"""

RUN = textwrap.dedent(
    """
    import json, sys, time, torch, torch_backend_registry as tbr
    tbr.install()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.Dropout(0.1),
    )
    x = torch.randn(64, 256)
    compiled = torch.compile(model, backend=sys.argv[1])
    start = time.perf_counter()
    compiled(x).sum().backward()
    first = time.perf_counter() - start
    start = time.perf_counter()
    compiled(x).sum().backward()
    print(json.dumps({"first": first, "later": time.perf_counter() - start}))
    """
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, for a first look")
    runs = 3 if parser.parse_args().quick else 7
    sides = ("plain", "forward", "backward")
    times: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "backends.toml").write_text(MANIFEST, encoding="utf-8")
        environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
        for i in range(runs):
            for side in sides if i % 2 == 0 else sides[::-1]:
                out = subprocess.run(
                    [PY, "-c", RUN, side],
                    cwd=folder,
                    env=environ,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                times[side].append(json.loads(out.splitlines()[-1]))

    def median(side: str, key: str) -> float:
        return statistics.median(t[key] for t in times[side])

    print(f"medians of {runs} alternating runs, a fresh process each")
    print()
    print("| chain | first call (compiles) | later call | first call vs unverified |")
    print("| --- | --- | --- | --- |")
    for side in sides:
        first, later = median(side, "first"), median(side, "later")
        extra = first - median("plain", "first")
        print(
            f"| {side} | {first * 1000:.0f} ms | {later * 1000:.2f} ms | {extra * 1000:+.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
