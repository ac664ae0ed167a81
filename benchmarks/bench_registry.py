"""Figures of SPEC section 7, measured side by side with PyTorch's registry in one run.

Run by hand:  python benchmarks/bench_registry.py
Each figure prints the two measurements, their ratio and the target.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PY = sys.executable


def _median_seconds(argv: list[str], runs: int, cwd: str | None = None) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=cwd)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fresh_process_listing(runs: int = 7) -> bool:
    root = str(Path(__file__).resolve().parent.parent)
    ours = _median_seconds([PY, "-m", "torch_backend_registry", "list", "--no-torch"], runs, root)
    theirs = _median_seconds(
        [PY, "-c", "import torch._dynamo; torch._dynamo.list_backends()"], runs, root
    )
    ratio = theirs / ours
    print(
        f"fresh-process listing: ours {ours * 1000:.0f} ms, torch {theirs * 1000:.0f} ms,"
        f" {ratio:.1f}x faster (target >= 15x)"
    )
    return ratio >= 15


def import_cost(runs: int = 41) -> bool:
    bare = _median_seconds([PY, "-c", "pass"], runs)
    ours = _median_seconds([PY, "-c", "import torch_backend_registry"], runs)
    added = (ours - bare) * 1000
    print(
        f"import cost: bare start {bare * 1000:.1f} ms, with the import {ours * 1000:.1f} ms,"
        f" adds {added:.1f} ms (target <= 15 ms)"
    )
    return added <= 15


HOT = textwrap.dedent(
    """
    import timeit, torch._dynamo
    import torch_backend_registry as tbr
    torch_lookup = torch._dynamo.lookup_backend
    torch_lookup("eager")
    tbr.lookup_backend("eager")
    n = 1_000_000
    ours = min(timeit.repeat("f('eager')", globals={"f": tbr.lookup_backend}, number=n, repeat=5))
    theirs = min(timeit.repeat("f('eager')", globals={"f": torch_lookup}, number=n, repeat=5))
    print(ours / n * 1e9, theirs / n * 1e9)
    """
)


def hot_lookup() -> bool:
    out = subprocess.run([PY, "-c", HOT], check=True, capture_output=True, text=True).stdout
    ours, theirs = map(float, out.split())
    ratio = ours / theirs
    print(
        f"hot lookup: ours {ours:.0f} ns, torch {theirs:.0f} ns, ratio {ratio:.2f} (target <= 1.0)"
    )
    return ratio <= 1.0


SCALE = textwrap.dedent(
    """
    import json, os, sys, time, tracemalloc
    folder = sys.argv[1]
    import torch_backend_registry as tbr
    environ = {"TORCH_BACKENDS_PATH": folder}
    start = time.perf_counter()
    names = tbr.Registry(sources=("env",), environ=environ).list_backends()
    seconds = time.perf_counter() - start
    # Memory in a second registry, traced: tracing would slow the timed run.
    registry = tbr.Registry(sources=("env",), environ=environ)
    tracemalloc.start()
    registry.list_backends()
    kept = tracemalloc.get_traced_memory()[0]
    print(json.dumps({"n": len(names), "seconds": seconds, "bytes": kept}))
    """
)


def _write_manifests(folder: Path, files: int, per_file: int) -> None:
    for f in range(files):
        lines = ["schema-version = 1\n"]
        for b in range(per_file):
            lines.append(
                f'\n[backends.b{f}_{b}]\ntarget = "pkg_{f}.compilers:compile_{b}"\n'
                f'tags = ["t{b % 5}"]\ndescription = "Backend {b} of file {f}"\n'
            )
        (folder / f"m{f:03}.toml").write_text("".join(lines), encoding="utf-8")


def _scale_run(files: int, per_file: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        _write_manifests(Path(tmp), files, per_file)
        runs = []
        for _ in range(3):
            out = subprocess.run([PY, "-c", SCALE, tmp], check=True, capture_output=True, text=True)
            runs.append(json.loads(out.stdout))
        return min(runs, key=lambda r: r["seconds"])


def scale() -> bool:
    small = _scale_run(100, 10)
    large = _scale_run(100, 100)
    # The fixed part (importing pydantic, building the models) is measured too;
    # subtract a run with no backends to see the per-backend cost on its own.
    empty = _scale_run(100, 0)
    ratio = (large["seconds"] - empty["seconds"]) / (small["seconds"] - empty["seconds"])
    per_backend = (large["bytes"] - empty["bytes"]) / large["n"]
    print(
        f"10,000 backends in 100 manifests: first list {large['seconds'] * 1000:.0f} ms"
        f" (target < 500 ms); 1,000: {small['seconds'] * 1000:.0f} ms; no backends:"
        f" {empty['seconds'] * 1000:.0f} ms"
    )
    print(f"  10k/1k ratio beyond the fixed cost: {ratio:.1f} (target <= 12)")
    print(f"  memory kept: {per_backend:.0f} bytes a backend (target < 2048)")
    return large["seconds"] < 0.5 and ratio <= 12 and per_backend < 2048


def main() -> int:
    results = [fresh_process_listing(), import_cost(), hot_lookup(), scale()]
    print("all figures met" if all(results) else "some figures missed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
