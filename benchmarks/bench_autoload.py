"""What autoload costs ``import torch`` (SPEC 7), side by side in one run.

Run by hand:  python benchmarks/bench_autoload.py [--quick]

Three interpreters import torch, in turn, run after run: one that sees an environment
without this package, one with it installed and ``TORCH_BACKENDS_AUTOLOAD`` unset, one
with it set (in this repository's folder, with its backends.toml). "Without the package"
is the same environment less this package's ``*.dist-info`` (and so less its
``torch.backends`` entry point, which PyTorch reads at ``import torch``): each side runs
``python -S`` on a folder of links to this environment's site-packages. The last thing
printed is the table; the exit status is 0 when both targets are met.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
OURS = "torch_backend_registry"


def _site(with_package: bool) -> str:
    """A folder of links to everything installed here; with or without this package."""
    installed = Path(sysconfig.get_paths()["purelib"])
    folder = Path(tempfile.mkdtemp(prefix="tbr-site-"))
    for entry in installed.iterdir():
        ours = entry.name.startswith((f"{OURS}-", f"__editable__.{OURS}", f"__editable___{OURS}"))
        if ours and not with_package:
            continue
        if entry.suffix == ".pth":  # -S: not read; this package's code is on the path below
            continue
        (folder / entry.name).symlink_to(entry)
    return str(folder)


def _seconds(env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([PY, "-S", "-c", "import torch"], check=True, env=env, cwd=ROOT)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, for a first look")
    runs = 7 if parser.parse_args().quick else 21
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    without = {**base, "PYTHONPATH": _site(False)}
    off = {**base, "PYTHONPATH": os.pathsep.join([_site(True), str(ROOT / "src")])}
    on = {**off, "TORCH_BACKENDS_AUTOLOAD": "1"}
    sides = {"without the package": without, "autoload off": off, "autoload on": on}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for env in sides.values():  # warm the file cache for each
        _seconds(env)
    for i in range(runs):
        order = list(sides.items())
        for name, env in order[i % 3 :] + order[: i % 3]:  # each goes first in turn
            times[name].append(_seconds(env))
    median = {name: statistics.median(found) for name, found in times.items()}
    bare = median["without the package"]
    print(f"medians of {runs} alternating runs of `python -S -c 'import torch'`")
    print()
    print("| `import torch` | median | added | target | met |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| without the package | {bare * 1000:.0f} ms | | | |")
    met = True
    for name, target in (("autoload off", 1.0), ("autoload on", 5.0)):
        added = (median[name] - bare) * 1000
        ok = added <= target
        met = met and ok
        said = "yes" if ok else "**no**"
        ms = median[name] * 1000
        print(f"| {name} | {ms:.0f} ms | {added:+.1f} ms | <= +{target:g} ms | {said} |")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
