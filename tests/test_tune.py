"""``torch-backends tune``: a command run with every select chain deciding afresh, each choice
written to ``backends.choices``; a machine that never tuned runs the shipped member; ``check``
and ``explain`` know the file; PyTorch's compile caches shipped beside it.

The commands tuned are real scripts in interpreters of their own, which never call
``install()`` (autoload does, as ``tune`` turns it on)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomli as tomllib

from .conftest import Done, free_port, run_forked, run_ranks, torch_backends

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

MEMBERS = """
import json, os, time

def _record(name):
    with open("compiled.jsonl", "a") as out:
        out.write(json.dumps(name) + "\\n")

def member(name, delay):
    def compiler(gm, example_inputs):
        _record(name)
        def run(*args):
            time.sleep(delay)
            return gm(*args)
        return run
    return compiler

slow = member("slow", 0.004)
fast = member("fast", 0.0)
"""

MANIFEST = """
[backends.pick]
chain = ["slow", "fast"]
select = "fastest"

[backends.slow]
target = "members:slow"

[backends.fast]
target = "members:fast"
"""

TRAIN = """
import logging, sys, torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
logging.getLogger("torch").setLevel(logging.WARNING)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
with torch.no_grad():
    torch.compile(model, backend="pick")(torch.randn(int(sys.argv[1]) if sys.argv[1:] else 5, 8))
"""


SHIPPED = """
import logging, sys, torch
import torch_backend_registry as tbr
logging.basicConfig(level=logging.INFO, format="%(message)s")
logging.getLogger("torch").setLevel(logging.WARNING)
tbr.install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
with torch.no_grad():
    torch.compile(model, backend="pick")(torch.randn(int(sys.argv[1]) if sys.argv[1:] else 5, 8))
"""


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A project tuned once, and what tune printed: tests copy it, each to change its own."""
    here = project(tmp_path_factory.mktemp("tuned") / "project")
    done = torch_backends("tune", "--", sys.executable, "train.py", cwd=here)
    return here, done.stdout


def copy_of(tuned: tuple[Path, str], to: Path) -> Path:
    shutil.copytree(tuned[0], to, ignore=shutil.ignore_patterns("compiled.jsonl", "cache"))
    return to


def shipped(folder: Path, *args: str, script: str = SHIPPED, **env: str) -> Done:
    """A machine that never tuned runs ``script`` (as a process forked from one that imported
    PyTorch: its cache folder empty), the chain's log on stderr."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    environ.update({"XDG_CACHE_HOME": str(folder / "cache"), **env})
    done = run_forked(script, cwd=folder, env=environ, args=args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def project(folder: Path, manifest: str = MANIFEST) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "backends.toml").write_text(textwrap.dedent(manifest).lstrip())
    (folder / "members.py").write_text(MEMBERS)
    (folder / "train.py").write_text(TRAIN)
    return folder


def compiled(folder: Path) -> list[str]:
    """The members compiled there since last asked."""
    path = folder / "compiled.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return sorted(found)


def test_tune_writes_each_choice_and_another_checkout_runs_it_timing_nothing(
    tuned: tuple[Path, str], tmp_path: Path
) -> None:
    here, printed = tuned
    [line, device] = printed.splitlines()
    assert line.startswith("chain 'pick': graph of 3 operations on ")
    # Each member's median and spread (slow sleeps 4 ms a call; a busy machine oversleeps).
    assert re.search(r"\(inference, static shapes\): slow \d[\d.]* ms ±\d+%, fast ", line), line
    assert "; chose 'fast' (the fastest, " in line
    assert device.startswith("tuned for cpu ")
    assert device.endswith(": 1 graph; fast 1")
    text = (here / "backends.choices").read_text()
    assert text.startswith("# Written by `torch-backends tune`")
    assert '[[choice]]\nchain = "pick"\nmember = "fast"\ngraph = "graph of 3 operations' in text
    for fact in ("torch = ", "device = ", "threads = ", "[choice.members]", "[choice.seconds]"):
        assert fact in text
    # Another checkout, at another path, caches empty: the shipped member alone is compiled,
    # and the log says where it came from.
    there = copy_of(tuned, tmp_path / "elsewhere" / "checkout")
    ran = shipped(there)
    assert compiled(there) == ["fast"]
    assert f"compiled with 'fast', as shipped ({there / 'backends.choices'}:6)" in ran.stderr
    # With TORCH_BACKENDS_SELECT=shipped, a graph no choice applies to is timed by nobody.
    ran = shipped(there, "7", TORCH_BACKENDS_SELECT="shipped")
    assert compiled(there) == ["slow"]  # the chain's first that verifies
    assert "no shipped choice applies (the nearest shipped choice differs: another graph" in (
        ran.stderr
    )


def test_a_choice_decided_under_other_threads_does_not_apply_and_says_why(
    tuned: tuple[Path, str], tmp_path: Path
) -> None:
    there = copy_of(tuned, tmp_path / "checkout")
    threads = torch.get_num_threads()
    code = f"import torch\ntorch.set_num_threads({threads + 1})\n" + SHIPPED
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    environ.update({"XDG_CACHE_HOME": str(there / "cache"), "TORCH_BACKENDS_SELECT": "shipped"})
    ran = run_forked(code, cwd=there, env=environ)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert compiled(there) == ["slow"]
    assert f"(the nearest shipped choice differs: threads {threads} -> {threads + 1})" in ran.stderr


def test_tuning_again_replaces_the_same_key_and_keeps_the_others(
    tuned: tuple[Path, str], tmp_path: Path
) -> None:
    # The command tuned hands tune its choice as a select chain's process does (stub.py).
    here = copy_of(tuned, tmp_path / "checkout")
    (here / "stub.py").write_text(STUB)
    first = (here / "backends.choices").read_text()
    made = tomllib.loads(first)["choice"][0]
    made["when"] = made["when"].timestamp()  # as the process hands it over
    other = {**made, "key": "another-graph", "graph": "another graph"}
    torch_backends("tune", "--", sys.executable, "stub.py", json.dumps(other), cwd=here)
    both = (here / "backends.choices").read_text()
    assert both.count("[[choice]]") == 2
    assert both.startswith(first.split("[[choice]]")[0])
    # The same graph decided again, other times: its choice replaced in its place.
    slower = {**made, "seconds": {m: t * 2 for m, t in made["seconds"].items()}}
    torch_backends("tune", "--", sys.executable, "stub.py", json.dumps(slower), cwd=here)
    again = (here / "backends.choices").read_text()
    assert again.count("[[choice]]") == 2
    # In a stable order: only the facts of the choice tuned again change.
    changed = [(a, b) for a, b in zip(both.splitlines(), again.splitlines(), strict=True) if a != b]
    assert changed
    assert all(a.split(" = ")[0] == b.split(" = ")[0] for a, b in changed)
    assert not any(a.startswith(("chain", "member", "key", "graph =")) for a, _b in changed)
    assert {c["key"]: c["seconds"] for c in tomllib.loads(again)["choice"]} == {
        made["key"]: slower["seconds"],
        "another-graph": made["seconds"],
    }


def test_a_command_that_fails_or_compiles_no_chain_writes_nothing(tmp_path: Path) -> None:
    here = project(tmp_path)
    (here / "fails.py").write_text("import sys\nsys.exit(3)\n")
    done = torch_backends("tune", "--", sys.executable, "fails.py", cwd=here, check=3)
    assert "exited with 3: nothing written" in done.stderr
    # Killed by a signal: its exit status as a shell gives it, 128 and the signal.
    done = torch_backends("tune", "--", "sh", "-c", "kill -TERM $$", cwd=here, check=143)
    assert "'sh' was killed by SIGTERM: nothing written" in done.stderr
    (here / "idle.py").write_text("print('served, compiling nothing')\n")
    done = torch_backends("tune", "--", sys.executable, "idle.py", cwd=here, check=1)
    assert 'compiled no graph with a select = "fastest" chain: nothing written' in done.stderr
    assert not (here / "backends.choices").exists()
    done = torch_backends("tune", cwd=here, check=2)
    assert "tune runs a command: torch-backends tune -- python train.py" in done.stderr
    # A compile cache over the project's own files is refused before anything runs.
    for own in ("backends.choices", "backends.toml", "build/settings.toml"):
        done = torch_backends("tune", "--compile-cache", own, "--", "false", cwd=here, check=2)
        assert "names a file of the project's own" in done.stderr
    (here / "build").mkdir(exist_ok=True)
    done = torch_backends("tune", "--compile-cache", "build", "--", "false", cwd=here, check=2)
    assert "--compile-cache 'build' is a folder" in done.stderr


def test_a_file_tune_cannot_read_whole_is_refused_not_replaced(
    tuned: tuple[Path, str], tmp_path: Path
) -> None:
    here = copy_of(tuned, tmp_path / "checkout")
    (here / "stub.py").write_text(STUB)
    text = (here / "backends.choices").read_text()
    # A merge that left its markers: another machine's choices are in it.
    merged = text.replace("[[choice]]", "<<<<<<< HEAD\n[[choice]]", 1)
    (here / "backends.choices").write_text(merged)
    made = tomllib.loads(text)["choice"][0]
    made.pop("when")
    done = torch_backends(
        "tune", "--", sys.executable, "stub.py", json.dumps({**made, "key": "new"}),
        cwd=here, check=1,
    )  # fmt: skip
    assert done.stderr.startswith("torch-backends: error: ")
    assert "backends.choices:" in done.stderr
    assert "fix it or move it away, then tune again" in done.stderr
    assert (here / "backends.choices").read_text() == merged


def test_check_and_explain_know_the_file(tuned: tuple[Path, str], tmp_path: Path) -> None:
    here = copy_of(tuned, tmp_path / "checkout")
    said = torch_backends("explain", "pick", cwd=here).stdout
    assert "  shipped:     1 in backends.choices" in said
    assert "shipped at backends.choices:6: graph of 3 operations on " in said
    assert ": fast (applies here)" in said
    [shipped] = json.loads(torch_backends("explain", "pick", "--json", cwd=here).stdout)["shipped"]
    assert (shipped["at"], shipped["member"], shipped["applies"]) == (
        "backends.choices:6",
        "fast",
        True,
    )
    assert torch_backends("check", cwd=here).stderr.startswith("no problems;")
    torch_backends("lock", cwd=here)
    torch_backends("check", "--locked", cwd=here)  # choices are no drift
    # Hand-edited: a member not in its chain, an undeclared chain, an entry tune never
    # writes; the chain changed since.
    text = (here / "backends.choices").read_text()
    entry = text[text.index("[[choice]]") :]
    edited = (
        text.replace('member = "fast"', 'member = "fats"', 1)
        + "\n" + entry.replace('chain = "pick"', 'chain = "pikc"', 1)
        + '\n[[choice]]\nchain = "pick"\n'
    )  # fmt: skip
    (here / "backends.choices").write_text(edited)
    done = torch_backends("check", cwd=here, check=1)
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("backends.choices:6: error: choice: member 'fats' is not in chain 'pick';")
        and "did you mean 'fast'?" in line
        for line in lines
    ), lines
    assert any(
        "chain 'pikc' is no select = \"fastest\" chain declared here; did you mean 'pick'?" in line
        for line in lines
    )
    assert any("a choice needs member, graph, key (each a string)" in line for line in lines)
    # Times that are no numbers, a key twice: errors, and explain still says the rest.
    duplicated = text.replace("[choice.seconds]\n", '[choice.seconds]\nnoise = "fast"\n') + (
        "\n" + entry.replace('member = "fast"', 'member = "slow"')
        + "\n" + entry.replace('member = "fast"', 'member = "fast"\nskipped = 1', 1)
    )  # fmt: skip
    (here / "backends.choices").write_text(duplicated)
    lines = torch_backends("check", cwd=here, check=1).stdout.splitlines()
    assert any("seconds and spread as tables of numbers" in line for line in lines), lines
    assert any("a choice needs skipped as a table, as tune writes it" in line for line in lines)
    assert any(
        "the same key as the choice at line 6, which is the one used" in line for line in lines
    )
    assert "shipped at backends.choices:6:" in torch_backends("explain", "pick", cwd=here).stdout
    # A file every process refuses is an error of check, as a manifest would be.
    (here / "backends.choices").write_text(text)
    (here / "backends.choices").chmod(0o666)
    done = torch_backends("check", cwd=here, check=1)
    assert "backends.choices: error: choices file not used: it is writable by every user" in (
        done.stdout
    )
    (here / "backends.choices").chmod(0o644)
    (here / "backends.toml").write_text(MANIFEST.replace('"slow", "fast"', '"fast", "slow"'))
    done = torch_backends("check", cwd=here)
    assert "backends.choices:6: warning: choice: chain 'pick' or a backend it runs changed" in (
        done.stdout
    )
    assert "run 'torch-backends tune -- COMMAND' again" in done.stdout
    assert (
        "not here: the chain or a member changed since"
        in torch_backends("explain", "pick", cwd=here).stdout
    )


def test_a_truncated_or_hostile_file_is_no_choice_and_never_an_error(
    tuned: tuple[Path, str], tmp_path: Path
) -> None:
    here = copy_of(tuned, tmp_path / "checkout")
    text = (here / "backends.choices").read_text()
    (here / "backends.choices").write_text(text[: text.index('member = "fast"') + 11])
    shipped(here, TORCH_BACKENDS_NO_CACHE="1")
    assert compiled(here) == ["fast", "slow"]  # decided again: no shipped choice read
    done = torch_backends("check", cwd=here, check=None)
    assert "backends.choices:" in done.stdout
    # Writable by every user: not used, and said so.
    (here / "backends.choices").write_text(text)
    (here / "backends.choices").chmod(0o666)
    ran = shipped(here, TORCH_BACKENDS_NO_CACHE="1")
    assert compiled(here) == ["fast", "slow"]
    assert "choices file not used: it is writable by every user" in ran.stderr


def test_a_choice_among_ten_thousand_is_found(tuned: tuple[Path, str], tmp_path: Path) -> None:
    here = copy_of(tuned, tmp_path / "checkout")
    text = (here / "backends.choices").read_text()
    entry = text[text.index("[[choice]]") :]
    key = entry.split('key = "')[1].split('"')[0]
    others = "".join(entry.replace(key, f"{n:032x}") for n in range(10_000))
    (here / "backends.choices").write_text(
        text.replace(entry, others[: len(others) // 2] + entry + others[len(others) // 2 :])
    )
    shipped(here)
    assert compiled(here) == ["fast"]


STUB = """
import json, os, sys, time
# As a select chain's process hands tune a choice (each run its own graph), slowly: the two
# runs overlap.
choice = json.loads(sys.argv[1])
with open(os.path.join(os.environ["TORCH_BACKENDS_TUNING"], "choice-stub.json"), "w") as out:
    json.dump(choice, out)
time.sleep(0.5)
"""


def test_two_tunes_at_once_keep_each_others_choices(
    tuned: tuple[Path, str], tmp_path: Path
) -> None:
    here = copy_of(tuned, tmp_path / "checkout")
    (here / "stub.py").write_text(STUB)
    made = tomllib.loads((here / "backends.choices").read_text())["choice"][0]
    made.pop("when")
    command = [sys.executable, "-m", "torch_backend_registry", "tune", "--", sys.executable]
    runs = [
        subprocess.Popen(
            [*command, "stub.py", json.dumps({**made, "key": key, "graph": key})],
            cwd=here,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for key in ("first-run", "second-run")
    ]
    for run in runs:
        assert run.wait(timeout=120) == 0, run.stderr.read() if run.stderr else ""
    keys = {c["key"] for c in tomllib.loads((here / "backends.choices").read_text())["choice"]}
    assert keys == {made["key"], "first-run", "second-run"}


INDUCTOR = """
[backends.pick]
chain = ["inductor", "eager"]
select = "fastest"
min-speedup = 100.0
"""

COUNTED = """
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
with torch.no_grad():
    torch.compile(model, backend="pick")(torch.randn(5, 8))
from torch._dynamo.utils import counters
print(json.dumps(dict(counters["inductor"])))
"""


def test_the_compile_cache_ships_beside_the_choices(tmp_path: Path) -> None:
    # Inductor's compile on a machine that never compiled: found in the cache tune saved.
    here = project(tmp_path / "a", INDUCTOR)
    (here / "train.py").write_text(COUNTED)
    own = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-a")}
    torch_backends(
        "tune", "--compile-cache", "build/compile.bin", "--", sys.executable, "train.py",
        cwd=here, env=own,
    )  # fmt: skip
    assert (here / "build" / "compile.bin").stat().st_size > 0
    there = tmp_path / "b"
    shutil.copytree(here, there)
    (there / "backends.toml").write_text(
        'compile-cache = "build/compile.bin"\n' + textwrap.dedent(INDUCTOR)
    )
    # Another inductor cache folder without the graphs compiled (its probe of the machine's
    # vector instructions kept, which no compile cache holds): a hit comes from the file.
    shutil.copytree(
        tmp_path / "inductor-a",
        tmp_path / "inductor-b",
        ignore=shutil.ignore_patterns("fxgraph", "aotautograd"),
    )
    warm = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-b")}
    counted = "import torch_backend_registry as tbr\ntbr.install()\n" + COUNTED
    ran = shipped(there, script=counted, **warm)
    assert json.loads(ran.stdout).get("fxgraph_cache_hit", 0) >= 1, ran.stderr[-2000:]
    # Another machine's file, or a torn one: a warning, and the compile goes on (found in
    # the inductor cache folder that compiled it, so as not to compile it a third time).
    (there / "build" / "compile.bin").write_bytes(b"not PyTorch's")
    torn = shipped(there, script=counted, **own)
    assert "PyTorch's compile caches not loaded" in torn.stderr


RANKS = """
import logging, torch, torch.distributed as dist
logging.basicConfig(level=logging.INFO, format="%(message)s")
logging.getLogger("torch").setLevel(logging.WARNING)
dist.init_process_group("gloo")
if dist.get_rank() == 1:  # another machine's thread count: no shipped choice of its own
    torch.set_num_threads(torch.get_num_threads() + 1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
with torch.no_grad():
    torch.compile(model, backend="pick")(torch.randn(5, 8))
dist.barrier()
dist.destroy_process_group()
"""


def test_a_torchrun_job_is_tuned_by_rank_zero_and_shipped_to_every_rank(tmp_path: Path) -> None:
    here = project(tmp_path)
    (here / "ranks.py").write_text(RANKS)
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "ranks.py",
    ]  # fmt: skip
    done = torch_backends("tune", "--", *torchrun, cwd=here)
    assert "tuned for cpu " in done.stdout
    assert "1 graph; fast 1" in done.stdout  # rank 0's choice, once: rank 1 decided nothing
    assert compiled(here) == ["fast", "fast", "slow"]  # rank 1 compiled rank 0's choice alone
    # Shipped: each rank takes it on its own, times nothing and waits on no other (the ranks
    # of a job as torchrun starts them, forked from a process that imported PyTorch: a
    # thread each, as torchrun's OMP_NUM_THREADS=1 gives them).
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    ranks = run_ranks(
        "import torch, torch_backend_registry as tbr\ntorch.set_num_threads(1)\ntbr.install()\n"
        + RANKS,
        cwd=here,
        env={**environ, "TORCH_BACKENDS_SELECT_TIMEOUT": "60",
             "XDG_CACHE_HOME": str(here / "cache")},
    )  # fmt: skip
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr[-3000:] for r in ranks]
    assert compiled(here) == ["fast", "fast"], [r.stderr[-3000:] for r in ranks]
    said = "".join(r.stdout + r.stderr for r in ranks)
    # Rank 0 takes the shipped choice and tells rank 1, whose own key found none: no wait.
    assert said.count("as shipped (") == 1
    assert said.count("rank 0's choice") == 1
    assert "heard no choice" not in said
