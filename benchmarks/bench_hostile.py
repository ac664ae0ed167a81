"""The cost of the most expensive manifests that fit under the size limit.

Each shape is written at the limit (``MAX_BYTES``) and listed in a fresh
process, as ``torch-backends list --no-torch`` would; the table gives the time
and the peak memory of that process. The limit is chosen so that every shape
lists in under 2 s and 300 MB on a 2-core machine (exit status 0 when so).

    python benchmarks/bench_hostile.py [--size BYTES]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch_backend_registry._sources.files import MAX_BYTES

TIME_LIMIT_S = 2.0
MEMORY_LIMIT_MB = 300.0


def _fill(size: int, line: Callable[[int], str], head: str = "") -> str:
    parts, total, i = [head], len(head), 0
    while True:
        text = line(i)
        if total + len(text) > size:
            return "".join(parts)
        parts.append(text)
        total += len(text)
        i += 1


SHAPES: dict[str, Callable[[int], str]] = {
    # Each key of 300 dotted parts makes 300 nested tables.
    "dotted keys, 300 parts": lambda size: _fill(
        size, lambda i: f"k{i}" + ".a" * 300 + " = 1\n", "[x]\n"
    ),
    "one long line": lambda size: 'description = "' + "x" * (size - 20) + '"\n',
    "deep inline nesting": lambda size: _fill(
        size, lambda i: f"v{i} = " + "[" * 90 + "]" * 90 + "\n"
    ),
    "many backends": lambda size: _fill(size, lambda i: f'[backends.b{i}]\ntarget = "pkg.mod:f"\n'),
    "many table headers, 50 parts": lambda size: _fill(
        size, lambda i: "[t" + ".a" * 50 + f".k{i}]\n"
    ),
    "key-like lines in a string": lambda size: (
        _fill(size, lambda i: f"k{i}.a.b.c.d.e.f = 1\n", 'd = """\n') + '"""\n'
    ),
    "flat keys": lambda size: _fill(size, lambda i: f"k{i}=1\n"),
    "one long array": lambda size: "a = [" + "1," * ((size - 10) // 2) + "]\n",
    "inline tables": lambda size: _fill(size, lambda i: f"t{i} = {{a={{b={{c=1}}}}}}\n"),
    "options, wide and deep": lambda size: _fill(
        size,
        lambda i: (
            f'[backends.b{i}]\ntarget = "m:f"\noptions = {{ a = '
            + "[" * 60
            + "1"
            + "]" * 60
            + " }\n"
        ),
    ),
}

_PROBE = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
start = time.perf_counter()
from torch_backend_registry import Registry
Registry(files=[sys.argv[1]], sources=("env",)).list_backends(exclude_tags=())
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "mb": peak}))
"""


def measure(path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=MAX_BYTES, help="bytes a file")
    args = parser.parse_args()
    met = True
    print(f"{'shape':<30} {'bytes':>9} {'seconds':>8} {'peak MB':>8}  met")
    with tempfile.TemporaryDirectory() as folder:
        for name, build in SHAPES.items():
            path = Path(folder) / "shape.toml"
            path.write_text(build(args.size), encoding="utf-8")
            result = measure(path)
            ok = result["seconds"] < TIME_LIMIT_S and result["mb"] < MEMORY_LIMIT_MB
            met &= ok
            print(
                f"{name:<30} {path.stat().st_size:>9,} {result['seconds']:>8.2f}"
                f" {result['mb']:>8.0f}  {'yes' if ok else 'NO'}"
            )
    print(f"limits: {TIME_LIMIT_S} s and {MEMORY_LIMIT_MB:.0f} MB a file of {args.size:,} bytes")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
