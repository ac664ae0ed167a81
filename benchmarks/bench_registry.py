"""Figures of SPEC section 7, measured side by side with PyTorch's registry in one run.

Run by hand:  python benchmarks/bench_registry.py [--quick]

Every comparison alternates the two sides run by run, so a machine that slows
down mid-run slows both alike, and reports medians. The last thing printed is
one table: each figure, our median, PyTorch's median, the ratio and the target.
The exit status is 0 when every target is met.
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PY = sys.executable
ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass
class Row:
    figure: str
    ours: str
    theirs: str
    ratio: str
    target: str
    met: bool


Env = Callable[[], dict[str, str]]


def _cache_env(cache: str) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": cache}


def _cold_env() -> dict[str, str]:
    """A cache folder nobody used: the first run after an install or an edit."""
    return _cache_env(tempfile.mkdtemp(prefix="tbr-cold-"))


def _seconds(argv: list[str], cwd: str | None = None, env: Env | None = None) -> float:
    environ = env() if env is not None else None
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd, env=environ)
    return time.perf_counter() - start


def _alternate(
    ours: list[str],
    theirs: list[str],
    runs: int,
    cwd: str | None = None,
    env: Env | None = None,
) -> tuple[float, float]:
    """Median seconds of each command, run in turn ``runs`` times after one warm-up each."""
    _seconds(ours, cwd, env), _seconds(theirs, cwd)  # fill the OS file cache for both
    mine, other = [], []
    for i in range(runs):
        # Swap who goes first every run: neither side always follows the other.
        if i % 2:
            other.append(_seconds(theirs, cwd))
            mine.append(_seconds(ours, cwd, env))
        else:
            mine.append(_seconds(ours, cwd, env))
            other.append(_seconds(theirs, cwd))
    return statistics.median(mine), statistics.median(other)


# The command as a user types it: the console script beside this interpreter
# (``python -m`` would add runpy's own imports, about 4 ms, to every run).
_SCRIPT = os.path.join(os.path.dirname(PY), "torch-backends")
LIST = (
    [_SCRIPT, "list", "--no-torch"]
    if os.path.exists(_SCRIPT)
    else [PY, "-m", "torch_backend_registry", "list", "--no-torch"]
)
TORCH_LIST = [PY, "-c", "import torch._dynamo as d; d.list_backends()"]


def fresh_process_listing(runs: int) -> tuple[list[Row], float]:
    """The listing's rows, and PyTorch's fresh listing in seconds (the 10k figure's base)."""
    cold, theirs = _alternate(LIST, TORCH_LIST, runs, ROOT, _cold_env)
    warm_cache = tempfile.mkdtemp(prefix="tbr-warm-")
    # A repeated listing against a bare interpreter start, in turn (SPEC 7: at most 8x).
    warm, bare = _alternate(LIST, [PY, "-c", "pass"], runs, ROOT, lambda: _cache_env(warm_cache))
    rows = [
        Row(
            "fresh process, cold cache: `torch-backends list --no-torch` vs"
            " `torch._dynamo.list_backends()`",
            f"{cold * 1000:.0f} ms",
            f"{theirs * 1000:,.0f} ms",
            f"{theirs / cold:.1f}x faster",
            ">= 10x",
            theirs / cold >= 10,
        ),
        Row(
            "fresh process, warm cache (a repeated listing): the same listing vs a bare"
            " `python -c pass`",
            f"{warm * 1000:.1f} ms",
            f"{bare * 1000:.1f} ms (bare)",
            f"{warm / bare:.1f}x ({theirs / warm:.0f}x faster than PyTorch's)",
            "<= 8x",
            warm / bare <= 8,
        ),
    ]
    return rows, theirs


def import_cost(runs: int) -> Row:
    ours, bare = _alternate([PY, "-c", "import torch_backend_registry"], [PY, "-c", "pass"], runs)
    added = (ours - bare) * 1000
    return Row(
        "`import torch_backend_registry` on top of a bare `python -c pass`",
        f"{ours * 1000:.1f} ms",
        f"{bare * 1000:.1f} ms (bare)",
        f"+{added:.1f} ms",
        "<= +15 ms",
        added <= 15,
    )


HOT = textwrap.dedent(
    """
    import json, statistics, sys, timeit, torch._dynamo
    import torch_backend_registry as tbr
    rounds, n = int(sys.argv[1]), 200_000
    torch_lookup = torch._dynamo.lookup_backend
    torch_lookup("eager")
    tbr.lookup_backend("eager")
    ours, theirs = [], []
    for i in range(rounds):
        sides = [(ours, tbr.lookup_backend), (theirs, torch_lookup)]
        for times, f in sides if i % 2 == 0 else sides[::-1]:
            times.append(timeit.timeit("f('eager')", globals={"f": f}, number=n) / n * 1e9)
    print(json.dumps([statistics.median(ours), statistics.median(theirs)]))
    """
)


def hot_lookup(rounds: int) -> Row:
    out = subprocess.run(
        [PY, "-c", HOT, str(rounds)], check=True, capture_output=True, text=True
    ).stdout
    ours, theirs = json.loads(out)
    ratio = ours / theirs
    return Row(
        "hot `lookup_backend('eager')` vs PyTorch's `lookup_backend`",
        f"{ours:.0f} ns",
        f"{theirs:.0f} ns",
        f"{ratio:.2f}",
        "<= 1.0",
        ratio <= 1.0,
    )


# One fresh process per measurement: the first listing is what a user waits for.
OURS_SCALE = textwrap.dedent(
    """
    import json, sys, time, tracemalloc
    start = time.perf_counter()
    import torch_backend_registry as tbr
    registry = tbr.Registry(sources=("env",), environ={"TORCH_BACKENDS_PATH": sys.argv[1]})
    names = registry.list_backends()
    seconds = time.perf_counter() - start
    # The cost of the backends alone: a second registry, the modules imported already,
    # validating again (the first listing filled the cache).
    import os
    os.environ["TORCH_BACKENDS_NO_CACHE"] = "1"
    registry = tbr.Registry(sources=("env",), environ={"TORCH_BACKENDS_PATH": sys.argv[1]})
    start = time.perf_counter()
    registry.list_backends()
    listing = time.perf_counter() - start
    # Memory in a third, traced: tracing would slow the timed runs.
    registry = tbr.Registry(sources=("env",), environ={"TORCH_BACKENDS_PATH": sys.argv[1]})
    tracemalloc.start()
    registry.list_backends()
    kept = tracemalloc.get_traced_memory()[0]
    print(json.dumps({"n": len(names), "seconds": seconds, "listing": listing, "bytes": kept}))
    """
)
# PyTorch's registry holds functions, not files: register as many and list them.
TORCH_SCALE = textwrap.dedent(
    """
    import json, sys, time
    import torch._dynamo as d
    from torch._dynamo.backends.registry import register_backend
    d.list_backends()
    count = int(sys.argv[1])
    start = time.perf_counter()
    for i in range(count):
        register_backend(lambda gm, inputs: gm.forward, name=f"b{i}", tags=(f"t{i % 5}",))
    names = d.list_backends()
    print(json.dumps({"n": len(names), "seconds": time.perf_counter() - start}))
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


def _json_run(code: str, arg: str, env: dict[str, str] | None = None) -> dict[str, float]:
    out = subprocess.run([PY, "-c", code, arg], check=True, capture_output=True, text=True, env=env)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def scale(runs: int, torch_fresh: float) -> list[Row]:
    """``torch_fresh``: PyTorch's fresh ``list_backends()`` in seconds, measured this run."""
    per_file = {"none": 0, "1k": 10, "10k": 100}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for label, count in per_file.items():
            folders[label] = os.path.join(tmp, label)
            os.mkdir(folders[label])
            _write_manifests(Path(folders[label]), 100, count)
        samples: dict[str, list[dict[str, float]]] = {label: [] for label in per_file}
        torch_10k: list[float] = []
        for i in range(runs):
            order = list(per_file) if i % 2 == 0 else list(per_file)[::-1]
            for label in order:
                samples[label].append(_json_run(OURS_SCALE, folders[label], _cold_env()))
            torch_10k.append(_json_run(TORCH_SCALE, "10000")["seconds"])

    def median(label: str, key: str) -> float:
        return statistics.median(run[key] for run in samples[label])

    large = median("10k", "seconds")
    theirs = statistics.median(torch_10k)
    # Linearity is about what each backend adds: compare listings made after the
    # fixed part (importing pydantic and the parser) is paid.
    ratio = median("10k", "listing") / median("1k", "listing")
    per_backend = (median("10k", "bytes") - median("none", "bytes")) / 10_000
    return [
        Row(
            "first `list_backends()` of 10,000 backends in 100 manifests, fresh process,"
            " imports included, cold cache, vs PyTorch's fresh `list_backends()` of its own",
            f"{large * 1000:.0f} ms",
            f"{torch_fresh * 1000:,.0f} ms (its fresh listing of its own;"
            f" {theirs * 1000:.0f} ms for 10,000 of them after its import)",
            f"{large / torch_fresh:.2f}x",
            "<= 0.2x",
            large <= 0.2 * torch_fresh,
        ),
        Row(
            "10k / 1k listing time, modules imported (100 manifests each:"
            f" {median('1k', 'listing') * 1000:.0f} ms for 1,000, none:"
            f" {median('none', 'listing') * 1000:.1f} ms)",
            f"{ratio:.1f}",
            "",
            "",
            "<= 12",
            ratio <= 12,
        ),
        Row(
            "memory kept a backend",
            f"{per_backend:.0f} bytes",
            "",
            "",
            "< 2 KB",
            per_backend < 2048,
        ),
    ]


# In a process where torch.compile's registry is loaded, after install(): repeated
# listings, each file opened and each folder listed counted by an audit hook.
LOADED = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch._dynamo
    import torch_backend_registry as tbr
    registry = tbr.Registry(environ={"TORCH_BACKENDS_PATH": sys.argv[1]})
    tbr.install(registry)
    registry.list_backends()
    touched = []
    sys.addaudithook(
        lambda event, args: touched.append(event)
        if event in ("open", "os.listdir", "os.scandir") else None
    )
    times = []
    for _ in range(200):
        start = time.perf_counter()
        registry.list_backends()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "touched": len(touched)}))
    """
)


def loaded_listing() -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        _write_manifests(Path(tmp), 1, 100)
        found = _json_run(LOADED, tmp)
    ms, touched = found["seconds"] * 1000, int(found["touched"])
    return Row(
        "repeated `list_backends()` of 100 backends in a process where torch._dynamo is"
        " loaded (files opened and folders listed while repeating)",
        f"{ms:.3f} ms ({touched} opened or listed)",
        "",
        "",
        "< 1 ms, none",
        ms < 1 and touched == 0,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, for a first look")
    args = parser.parse_args()
    runs = 5 if args.quick else 15
    scale_runs = max(3, runs // 3)
    # As an installed package has it: bytecode for our modules (pip compiles a wheel's;
    # this checkout's would otherwise be compiled from source in every fresh process).
    subprocess.run([PY, "-m", "compileall", "-q", os.path.join(ROOT, "src")], check=True)
    listing, torch_fresh = fresh_process_listing(runs)
    rows = [
        *listing,
        import_cost(runs * 3),
        hot_lookup(runs),
        *scale(scale_runs, torch_fresh),
        loaded_listing(),
    ]
    print(f"medians of {runs} alternating runs (import: {runs * 3}; 10k backends: {scale_runs})")
    print()
    print("| figure | ours | PyTorch | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        met = "yes" if row.met else "**no**"
        print(f"| {row.figure} | {row.ours} | {row.theirs} | {row.ratio} | {row.target} | {met} |")
    return 0 if all(row.met for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
