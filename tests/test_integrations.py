"""Frameworks that refuse names they do not know, with the real packages: Hugging Face
accelerate (its Accelerator, its launcher and config file) and transformers' Trainer, with
TORCH_BACKENDS_AUTOLOAD=1 and no code, or through ``integrations.accelerate`` without it.

Each test runs real processes (a script, ``accelerate launch``, spawned workers) that compile
on the CPU with a declared backend accelerate's enum does not list; nothing is mocked.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .test_autoload import PATIENCE, environment, plugin, run

pytest.importorskip("torch")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.torch

COMPILERS = """
def traced(gm, example_inputs, *, tag, **given):
    print(f"[{tag}] compiled, given {given}", flush=True)
    return gm.forward
"""

# "Fast": accelerate upper-cases a name and lower-cases it again, the registry keeps case.
MANIFEST = """
[backends.Fast]
target = "tbr_accelerate_compilers:traced"
options = { tag = "Fast" }

[backends.sketchy]
target = "tbr_accelerate_compilers:traced"
options = { tag = "sketchy" }

[backends.careful]
chain = ["not_installed_here", "aot_eager"]
verify = "backward"
"""

# What a worker does: a plain Accelerator (its backend from ACCELERATE_DYNAMO_BACKEND, or the
# plugin it was sent), saying what accelerate handed torch.compile.
WORKER = """
import torch
from accelerate import Accelerator

def work(plugin=None):
    original = torch.compile

    def compile(model, **kwargs):
        print("torch.compile", sorted(kwargs.items()), flush=True)
        return original(model, **kwargs)

    torch.compile = compile
    model = Accelerator(cpu=True, dynamo_plugin=plugin).prepare(torch.nn.Linear(4, 2))
    print("worker compiled", tuple(model(torch.randn(3, 4)).shape), flush=True)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "tbr_accelerate_compilers.py").write_text(COMPILERS)
    (folder / "tbr_accelerate_worker.py").write_text(textwrap.dedent(WORKER))
    (folder / "backends.toml").write_text(MANIFEST)
    return folder


TRAINER = """
import multiprocessing, os, sys
import torch

IMPORTED = [m for m in sys.modules if m.startswith(("accelerate", "torch_backend_registry.int"))]
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from accelerate.utils import DynamoBackend, TorchDynamoPlugin
from tbr_accelerate_worker import work


class Gradients(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        print("every parameter has a gradient", all(p.grad is not None for p in model.parameters()))


def arguments(backend):
    return TrainingArguments(
        "out", max_steps=2, per_device_train_batch_size=2, use_cpu=True, report_to="none",
        save_strategy="no", disable_tqdm=True, torch_compile_backend=backend,
        torch_compile_mode="max-autotune-no-cudagraphs",
    )


if __name__ == "__main__":
    print("import torch imported", IMPORTED)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)  # random weights: nothing downloaded
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (4, 8))]
    trainer = Trainer(model=model, args=arguments("Fast"), train_dataset=data)
    trainer.add_callback(Gradients())
    print("steps", trainer.train().global_step)
    try:
        Trainer(model=model, args=arguments("fsat"), train_dataset=data)
    except ValueError as exc:
        print("unknown:", type(exc).__name__, exc)
    print("in", "FAST" in DynamoBackend, "FSAT" in DynamoBackend)
    print("accelerate's", DynamoBackend("INDUCTOR") is DynamoBackend.INDUCTOR,
          TorchDynamoPlugin(backend="aot_eager").to_kwargs(), "FAST" in DynamoBackend.__members__)
    os.environ.update(
        ACCELERATE_DYNAMO_BACKEND="fast", ACCELERATE_DYNAMO_MODE="default",
        ACCELERATE_DYNAMO_USE_FULLGRAPH="true", ACCELERATE_DYNAMO_USE_DYNAMIC="true",
    )
    worker = multiprocessing.get_context("spawn").Process(target=work)
    worker.start()
    worker.join()
    print("worker exit", worker.exitcode)
"""


def test_a_trainer_compiles_with_a_declared_backend_with_no_code(project: Path) -> None:
    pytest.importorskip("transformers")
    done = run(TRAINER, project, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "import torch imported []"  # autoload imports nothing of accelerate
    trained = lines[1 : lines.index("steps 2")]
    assert trained.count("every parameter has a gradient True") == 2
    compiled = {line for line in trained if line.startswith("[")}  # and the Trainer's metrics
    assert compiled == {"[Fast] compiled, given {'mode': 'max-autotune-no-cudagraphs'}"}
    manifest = project / "backends.toml"
    assert lines[len(trained) + 2 :] == [
        f"unknown: UnknownDynamoBackendError unknown backend 'fsat' (read {manifest})."
        " Did you mean 'Fast'? list_backends(exclude_tags=()) gives every name.",
        "in True False",
        "accelerate's True {'backend': 'aot_eager'} False",
        # A plain Accelerator in a spawned worker, from accelerate's own variables.
        "torch.compile [('backend', 'Fast'), ('dynamic', True), ('fullgraph', True)]",
        "[Fast] compiled, given {}",
        "worker compiled (3, 2)",
        "worker exit 0",
    ], done.stdout


CHILD = """
from accelerate import Accelerator  # accelerate first, then torch (autoload's hook)
from tbr_accelerate_worker import work

work()
"""

CONFIG = """
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
num_processes: 1
use_cpu: true
mixed_precision: 'no'
dynamo_config:
  dynamo_backend: FAST
  dynamo_mode: max-autotune-no-cudagraphs
  dynamo_use_fullgraph: true
  dynamo_use_dynamic: true
"""


def test_accelerate_launch_compiles_with_a_config_files_declared_backend(project: Path) -> None:
    import subprocess
    import sys

    (project / "child.py").write_text(CHILD)
    (project / "accelerate.yaml").write_text(CONFIG)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    done = subprocess.run(
        [*launch, "accelerate.yaml", "--num_cpu_threads_per_process", "1", "child.py"],
        cwd=project, env=environment(TORCH_BACKENDS_AUTOLOAD="1"), capture_output=True,
        text=True, timeout=PATIENCE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "torch.compile [('backend', 'Fast'), ('dynamic', True), ('fullgraph', True),"
        " ('mode', 'max-autotune-no-cudagraphs')]",
        "[Fast] compiled, given {'mode': 'max-autotune-no-cudagraphs'}",
        "worker compiled (3, 2)",
    ]


WITHOUT_AUTOLOAD = """
import logging, multiprocessing, torch
from accelerate import Accelerator
from accelerate.utils import TorchDynamoPlugin
from torch_backend_registry import UnknownBackendError
from tbr_accelerate_worker import work

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("torch").setLevel(logging.WARNING)
    try:
        TorchDynamoPlugin(backend="careful")
    except ValueError as exc:
        print("accelerate alone:", exc)
    from torch_backend_registry.integrations.accelerate import dynamo_plugin

    try:
        dynamo_plugin("carefull")
    except UnknownBackendError as exc:
        print("unknown:", exc)
    plugin = dynamo_plugin("careful", mode="max-autotune-no-cudagraphs", dynamic=False)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(6, 4)).pow(2).mean())
    optimizer.step()
    print("stepped", all(p.grad is not None for p in model.parameters()))
    # Pickled to a worker in which nothing is installed, nor autoloaded.
    sent = dynamo_plugin("sketchy", options={"sent": True})
    worker = multiprocessing.get_context("spawn").Process(target=work, args=(sent,))
    worker.start()
    worker.join()
    print("worker exit", worker.exitcode)
"""


def test_without_autoload_accelerate_is_as_it_was_and_dynamo_plugin_compiles(
    project: Path,
) -> None:
    # A plugin declares the name the manifest takes for its own backend, and the manifest
    # denies the plugin: its code must run nowhere, in the spawned worker neither, where
    # PyTorch lists the plugin's entry point under that name.
    path = plugin(project, "sketchy", ("sketchy",))
    with (project / "backends.toml").open("a") as manifest:
        manifest.write('\n[plugins]\ndeny = ["sketchy"]\n')
    done = run(WITHOUT_AUTOLOAD, project, autoload=None, PYTHONPATH=path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "accelerate alone: 'CAREFUL' is not a valid DynamoBackend",
        f"unknown: unknown backend 'carefull' (read {project / 'backends.toml'})."
        " Did you mean 'careful'? list_backends(exclude_tags=()) gives every name.",
        "stepped True",
        "torch.compile [('backend', 'sketchy'), ('options', {'sent': True})]",
        "[sketchy] compiled, given {'options': {'sent': True}}",
        "worker compiled (3, 2)",
        "worker exit 0",
    ]
    assert "static shapes): compiled with 'aot_eager', backward verified against eager" in (
        done.stderr
    )
    assert not (project / "sketchy.imported").exists()
