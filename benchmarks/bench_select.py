"""What ``select = "fastest"`` gives and costs, against each member compiled and timed alone.

Run by hand:  python benchmarks/bench_select.py [--quick]

For each model (an MLP, a CNN, a small transformer block, and a wider MLP) and each mode
(under ``no_grad``, and a training step where members allow it), every measurement is a
fresh process, with PyTorch's own compile caches off so that each compile is a real one:

- each member of the chain ``eager, aot_eager, inductor, openvino`` compiled alone: the
  first call (which compiles; timed from ``torch.compile``, where PyTorch imports a plugin,
  to its end, in a cache folder of its own) and the median of later steps (the oracle is
  the fastest of those the chain's verification accepts);
- the chain with ``select = "fastest"``, with an empty cache folder: its first call (which
  compiles, verifies and times every member) and its steady step;
- the chain again in a second process with that cache: its first call compiles the chosen
  member only (three such processes, alternating with three of the chosen member alone; the
  medians compared).

Steps are timed in the steady state: after the first call, what it left is collected and
steps run for a second before the samples.

Figures (SPEC 7): the chain's step within 10% of the oracle's; its first compile at most
1.3x the members' compiles added up; the second process's at most 1.2x the chosen member's
own compile. It also prints the peak memory of each compile. Exit 0 where every figure is
met.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

MEMBERS = ["eager", "aot_eager", "inductor", "openvino"]

MANIFEST = """
[backends.fastest]
chain = ["eager", "aot_eager", "inductor", "openvino"]
select = "fastest"
"""

WORKER = textwrap.dedent(
    """
    import gc, json, logging, re, resource, statistics, sys, time, warnings
    warnings.simplefilter("ignore")
    import torch, torch_backend_registry as tbr

    def models(name):
        torch.manual_seed(0)
        nn = torch.nn
        if name == "mlp":
            return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)), (64, 512)
        if name == "cnn":
            return nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                nn.Flatten(), nn.Linear(32, 10),
            ), (16, 3, 32, 32)
        if name == "transformer":
            layer = nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True)
            return layer, (8, 64, 256)
        return nn.Sequential(  # "wide": the user's model of choice of size
            nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024)
        ), (32, 1024)

    name, mode, backend = sys.argv[1:4]
    said = []  # what the chain logged: the members it skipped, and why
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("torch_backend_registry").addHandler(handler)
    logging.getLogger("torch_backend_registry").setLevel(logging.INFO)
    tbr.install()
    model, shape = models(name)
    x = torch.randn(*shape)
    if mode == "train":
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    else:
        model.eval()
    # From torch.compile on: it looks the backend up, and PyTorch imports a plugin's code
    # there, where a chain imports its members' at the first compile.
    start = time.perf_counter()
    compiled = torch.compile(model, backend=backend)

    def step():
        if mode == "train":
            optimizer.zero_grad(set_to_none=True)
            compiled(x).float().sum().backward()
            optimizer.step()
        else:
            with torch.no_grad():
                compiled(x)

    try:
        step()
    except Exception as exc:  # what trying it cost counts too: a chain tries it as well
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:100]}"
        print(json.dumps({"error": error, "first": time.perf_counter() - start}))
        sys.exit(0)
    first = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The steady state: what compiling left behind collected, and a second of steps run
    # (the first hundreds after a compile of several members run up to twice as long).
    gc.collect()
    warm = time.perf_counter() + 1.0
    while time.perf_counter() < warm:
        step()
    once = time.perf_counter()
    step()
    calls = max(1, min(200, int(0.02 / max(time.perf_counter() - once, 1e-6))))
    samples = []
    for _ in range(15):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        samples.append((time.perf_counter() - start) / calls)
    used = getattr(tbr.lookup_backend(backend), "used", backend)
    skipped = sorted(set(re.findall(r"skipping '([^']+)': verifying", " ".join(said))))
    print(json.dumps({
        "first": first, "step": statistics.median(samples), "used": used, "peak_mb": peak,
        "skipped": skipped,
    }))
    """
)


def run(folder: Path, model: str, mode: str, backend: str, cache: Path) -> dict[str, Any]:
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")},
        "XDG_CACHE_HOME": str(cache),
        # Every compile a real one: PyTorch's own caches on disk off.
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
    }
    done = subprocess.run(
        [sys.executable, "-c", WORKER, model, mode, backend],
        cwd=folder,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:120]}
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two models, inference only")
    args = parser.parse_args()
    cases = [("mlp", "infer"), ("cnn", "infer"), ("transformer", "infer"), ("wide", "infer")]
    cases += [("mlp", "train"), ("transformer", "train"), ("wide", "train")]
    if args.quick:
        cases = [("mlp", "infer"), ("transformer", "infer")]
    rows, met = [], True
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "backends.toml").write_text(MANIFEST)
        for model, mode in cases:
            # Each its own cache folder: inductor keeps the C++ it built there whatever its
            # graph cache says, and an earlier model's would make its compile look cheap.
            caches = {m: folder / f"c-{model}-{mode}-{m}" for m in MEMBERS}
            alone = {m: run(folder, model, mode, m, caches[m]) for m in MEMBERS}
            ok = {m: r for m, r in alone.items() if "error" not in r}
            cache = folder / f"c-{model}-{mode}"
            cold = run(folder, model, mode, "fastest", cache)
            chosen = str(cold.get("used"))
            # A second process's compile against the chosen member's own, alternating, the
            # median of three each (a compile of a small graph takes a few tenths of a second,
            # within a process's start-up noise).
            warms, owns = [], []
            for _ in range(3 if chosen in ok else 1):
                warms.append(run(folder, model, mode, "fastest", cache))
                if chosen in ok:
                    owns.append(run(folder, model, mode, chosen, caches[chosen]))
            warm = next((r for r in warms if "error" in r), _median(warms, "first"))
            if "error" in cold or "error" in warm or not ok:
                rows.append((model, mode, str(cold.get("error") or warm.get("error"))))
                met = False
                continue
            # The oracle is the fastest member that computes what eager does: one the chain's
            # verification refused (OpenVINO's bfloat16 on a wide layer) is no choice.
            refused = set(cold.get("skipped", ()))
            oracle = min((m for m in ok if m not in refused), key=lambda m: float(ok[m]["step"]))
            step_ratio = float(cold["step"]) / float(ok[oracle]["step"])
            compiles = sum(float(r.get("first", 0)) for r in alone.values())
            first_ratio = float(cold["first"]) / compiles
            own = float(_median(owns, "first")["first"]) if owns else float("nan")
            second_ratio = float(warm["first"]) / own
            good = step_ratio <= 1.10 and first_ratio <= 1.3 and second_ratio <= 1.2
            met = met and good
            rows.append(
                (
                    model,
                    mode,
                    f"chose {chosen}, oracle {oracle}; step {_ms(cold['step'])} vs"
                    f" {_ms(ok[oracle]['step'])} ({step_ratio:.2f}x, <= 1.10);"
                    f" first compile {float(cold['first']):.1f} s vs members' {compiles:.1f} s"
                    f" ({first_ratio:.2f}x, <= 1.3); second process {float(warm['first']):.1f} s"
                    f" vs {chosen} alone {own:.1f} s ({second_ratio:.2f}x, <= 1.2);"
                    f" peak {float(cold['peak_mb']):.0f} MB vs {chosen} alone"
                    f" {float(ok[chosen]['peak_mb']):.0f} MB; each alone:"
                    f" {', '.join(m + ' ' + _ms(r['step']) for m, r in ok.items())};"
                    f" {'met' if good else 'NOT met'}",
                )
            )
            skipped = {m: r["error"] for m, r in alone.items() if "error" in r}
            skipped.update(dict.fromkeys(refused, "refused by the chain's verification"))
            if skipped:
                rows.append((model, mode, f"  members left out: {skipped}"))
            print(*rows[-1], sep=" | ", flush=True)
    print("\n| model | mode | result |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0 if met else 1


def _median(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The result whose ``key`` is the median of ``results`` (those that did not fail)."""
    done = sorted((r for r in results if "error" not in r), key=lambda r: float(r[key]))
    return done[len(done) // 2] if done else {"error": "no run"}


def _ms(seconds: Any) -> str:
    return f"{float(seconds) * 1e3:.3g} ms"


if __name__ == "__main__":
    sys.exit(main())
