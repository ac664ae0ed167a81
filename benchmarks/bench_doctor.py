"""What ``doctor`` of this repository's backends costs (SPEC 7), side by side in one run.

Run by hand:  python benchmarks/bench_doctor.py [--quick]

Runs, in turn: ``python -c "import torch"``, then ``torch-backends doctor`` in the
repository's folder: the backends its manifest declares and what they run (op_counts,
trace_shapes, tensorrt, portable, auto, and openvino, inductor, eager through them), with an
empty cache folder each time. The last thing printed is the table; the exit status is 0
when doctor takes at most 10 times the import.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
TARGET = 10.0


def _seconds(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=False, env=env, cwd=ROOT, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run, for a first look")
    runs = 1 if parser.parse_args().quick else 3
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    doctor = [PY, "-m", "torch_backend_registry", "doctor"]
    imports, doctors = [], []
    for _run in range(runs):
        imports.append(_seconds([PY, "-c", "import torch"], base))
        with tempfile.TemporaryDirectory() as cache:
            doctors.append(_seconds(doctor, {**base, "XDG_CACHE_HOME": cache}))
    imported, probed = statistics.median(imports), statistics.median(doctors)
    ratio = probed / imported
    met = ratio <= TARGET
    print(f"medians of {runs} run(s), {os.cpu_count()} cores")
    print("| figure | seconds | ratio | target | met |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| `python -c 'import torch'` | {imported:.2f} |  |  |  |")
    print(
        f"| `doctor` of this repository's backends | {probed:.2f} | {ratio:.1f}x"
        f" | <= {TARGET:g}x | {'yes' if met else '**no**'} |"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
