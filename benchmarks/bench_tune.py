"""What a decision shipped costs a machine that never tuned, against the member compiled alone.

Run by hand:  python benchmarks/bench_tune.py [--quick]

Every measurement is a fresh process with empty caches of its own (the registry's, and
inductor's), the first call of the compiled model timed from ``torch.compile`` to its end:

- ``tune``: the select chain ``eager, aot_eager, inductor`` deciding under ``torch-backends
  tune``, against each member compiled alone, added up (SPEC 7: what select costs, at most
  1.3x);
- shipped: another checkout of the project at another path, with the ``backends.choices``
  tune wrote, against the chosen member compiled alone (at most 1.2x);
- the compile cache: inductor (the chain ``inductor, eager``, whose first is kept, shipped)
  compiling a transformer block (a graph of several kernels) with the file ``tune
  --compile-cache`` saved, against the same without it (at most 0.5x); with
  an empty inductor cache folder, inductor first probes which C++ vector instructions the
  machine builds for (a compile of a test program for each, some seconds, which no compile
  cache holds): measured both with that probe in the first compile and paid before it;
- 10,000 choices in the file against ten: the first compile with the shipped choice (at most
  1.1x: a lookup's cost does not grow with the file).

Each pair alternates, three times (one with ``--quick``), and the medians are compared. Exit 0
where every figure is met.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

MODEL = textwrap.dedent(
    """
    import json, sys, time
    import torch, torch_backend_registry as tbr

    tbr.install()
    torch.manual_seed(0)
    if "transformer" in sys.argv:  # a block whose graph inductor makes several kernels of
        model = torch.nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True)
        x = torch.randn(8, 64, 256)
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
        )
        x = torch.randn(64, 512)
    if "probed" in sys.argv:  # inductor's probe of the machine's C++ vector ISA, paid first
        # (its own function: a compile would make dynamo take the model's shapes for dynamic)
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        pick_vec_isa()
    with torch.no_grad():
        started = time.perf_counter()
        torch.compile(model, backend=sys.argv[1])(x)
        took = time.perf_counter() - started
    chain = tbr.lookup_backend(sys.argv[1])
    print(json.dumps({"seconds": took, "member": getattr(chain, "used", sys.argv[1])}))
    """
)

MANIFEST = """
[backends.auto]
chain = ["eager", "aot_eager", "inductor"]
select = "fastest"

[backends.cached]
chain = ["inductor", "eager"]
select = "fastest"
min-speedup = 100.0
"""


def run(folder: Path, *args: str, **env: str) -> dict[str, Any]:
    """The model's script in a fresh process there, with empty caches of its own."""
    caches = tempfile.mkdtemp(prefix="bench-tune-")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    environ.update(
        XDG_CACHE_HOME=os.path.join(caches, "registry"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "model.py", *args], cwd=folder, env=environ, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    shutil.rmtree(caches, ignore_errors=True)
    said: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return said


def tune(folder: Path, backend: str, *options: str, model: str = "mlp") -> float:
    """``torch-backends tune -- python model.py BACKEND``, its compile timed in the process."""
    caches = tempfile.mkdtemp(prefix="bench-tune-")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    environ.update(
        XDG_CACHE_HOME=os.path.join(caches, "registry"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
    )
    command = [sys.executable, "-m", "torch_backend_registry", "tune", *options, "--"]
    done = subprocess.run(
        [*command, sys.executable, "model.py", backend, model], cwd=folder, env=environ,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    shutil.rmtree(caches, ignore_errors=True)
    return float(json.loads(done.stdout.splitlines()[0])["seconds"])


def medians(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run of each, not three")
    rounds = 1 if parser.parse_args().quick else 3
    rows: list[tuple[str, float, float, float, str]] = []
    with tempfile.TemporaryDirectory() as top:
        here = Path(top, "project")
        here.mkdir()
        (here / "backends.toml").write_text(MANIFEST)
        (here / "model.py").write_text(MODEL)

        # tune against each member alone, added up
        pairs = []
        for _ in range(rounds):
            (here / "backends.choices").unlink(missing_ok=True)
            tuned = tune(here, "auto")
            alone = sum(run(here, m)["seconds"] for m in ("eager", "aot_eager", "inductor"))
            pairs.append((tuned, alone))
        tuned, alone = medians(pairs)
        rows.append(
            ("tune: the chain's first compile vs its members' added up", tuned, alone, 1.3, "<=")
        )

        # shipped: another checkout at another path, caches empty
        chosen = str(run(here, "auto")["member"])
        there = Path(top, "elsewhere", "project")
        shutil.copytree(here, there)
        pairs = []
        for _ in range(rounds):
            pairs.append((run(there, "auto")["seconds"], run(there, chosen)["seconds"]))
        shipped, alone = medians(pairs)
        rows.append((f"shipped: first compile vs {chosen} alone", shipped, alone, 1.2, "<="))

        # the compile cache: inductor's first compile with it, against cold
        tune(here, "cached", "--compile-cache", str(here / "compile.bin"), model="transformer")
        cache = {"TORCH_BACKENDS_COMPILE_CACHE": str(here / "compile.bin")}
        for probed in ((), ("probed",)):
            pairs = []
            for _ in range(rounds):
                warm = run(here, "cached", "transformer", *probed, **cache)["seconds"]
                # The same chain, its shipped choice inductor, without the file: cold.
                pairs.append((warm, run(here, "cached", "transformer", *probed)["seconds"]))
            warm, cold = medians(pairs)
            said = (
                "after inductor's one-time probe of the machine's vector ISA"
                if probed
                else "that probe included"
            )
            figure = f"compile cache: inductor's first compile vs its cold one, {said}"
            rows.append((figure, warm, cold, 0.5, "<="))

        # 10,000 choices against ten
        text = (here / "backends.choices").read_text()
        header, *entries = text.split("[[choice]]")
        [entry] = ["[[choice]]" + e for e in entries if 'chain = "auto"' in e]
        key = entry.split('key = "')[1].split('"')[0]

        def padded(count: int) -> str:
            others = [entry.replace(key, f"{n:032x}") for n in range(count)]
            return header + "".join([*others[: count // 2], entry, *others[count // 2 :]])

        many, few = Path(top, "many"), Path(top, "few")
        for folder, count in ((many, 10_000), (few, 10)):
            shutil.copytree(here, folder)
            (folder / "backends.choices").write_text(padded(count))
        pairs = []
        for _ in range(rounds):
            shipped_only = {"TORCH_BACKENDS_SELECT": "shipped"}
            pairs.append(
                (
                    run(many, "auto", **shipped_only)["seconds"],
                    run(few, "auto", **shipped_only)["seconds"],
                )
            )
        many_s, few_s = medians(pairs)
        rows.append(
            ("10,000 choices vs 10: first compile of a shipped choice", many_s, few_s, 1.1, "<=")
        )

    met = True
    print("| figure | measured | against | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for figure, ours, theirs, target, _ in rows:
        ratio = ours / theirs if theirs else float("inf")
        ok = ratio <= target
        met = met and ok
        verdict = "yes" if ok else "**no**"
        print(
            f"| {figure} | {ours:.2f} s | {theirs:.2f} s | {ratio:.2f}x | <= {target} | {verdict} |"
        )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
