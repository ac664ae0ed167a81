"""Zero code: declared backends in every process that imports torch, with
TORCH_BACKENDS_AUTOLOAD=1 and no install() call; and in frameworks that take a backend name
(accelerate and transformers' Trainer: test_integrations.py).

Every test runs real processes (a script, torchrun ranks on the loopback address,
DataLoader workers under spawn) with time limits; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import free_port, run_forked

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

PATIENCE = 240  # seconds a process may take; a hang shows as this running out

COMPILERS = """
import torch

CALLS = []

def traced(gm, example_inputs, *, tag="traced"):
    print(f"[{tag}] {len(list(gm.graph.nodes))} nodes", flush=True)
    return gm.forward
"""

MANIFEST = """
default = "mine"

[backends.mine]
target = "tbr_autoload_compilers:traced"
options = { tag = "mine" }

[backends.careful]
chain = ["not_installed_here", "aot_eager"]
verify = "backward"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "tbr_autoload_compilers.py").write_text(COMPILERS)  # beside the manifest
    (folder / "backends.toml").write_text(MANIFEST)
    return folder


def run(
    code: str, cwd: Path, *, autoload: str | None = "1", args: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    """``code`` as a script of its own in ``cwd``, which calls no install()."""
    script = cwd / "script.py"
    script.write_text(textwrap.dedent(code))
    if autoload is not None:
        env["TORCH_BACKENDS_AUTOLOAD"] = autoload
    return subprocess.run(
        [sys.executable, *args, str(script)], cwd=cwd, env=environment(**env),
        capture_output=True, text=True, timeout=PATIENCE,
    )  # fmt: skip


def environment(**env: str) -> dict[str, str]:
    """This process's environment less ``TORCH_BACKENDS_*``, with ``env``; the folders of
    ``PYTHONPATH`` absolute (``PYTHONPATH=src pytest``: a process in another folder would
    import another copy of this package)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    environ.update(env)
    path = [os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path:
        environ["PYTHONPATH"] = os.pathsep.join(path)
    return environ


SCRIPT = """
import torch
model = torch.nn.Linear(4, 2)
out = torch.compile(model, backend="mine")(torch.randn(3, 4))
print("compiled", tuple(out.shape))
print("default", torch.compiler.get_default_backend())
print("listed", "mine" in torch._dynamo.list_backends(), "careful" in torch._dynamo.list_backends())
"""


def test_a_script_that_only_compiles_gets_the_declared_backend(project: Path) -> None:
    done = run(SCRIPT, project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[mine] 5 nodes",
        "compiled (3, 2)",
        "default mine",  # the manifest's default applied, as install() applies it
        "listed True True",  # a torch.compile name, as vLLM looks for them
    ]
    # Unset, it is off. (The words that turn it off are tested through explain below, which
    # reads them as the hook does.)
    plain = run(SCRIPT, project, autoload=None)
    assert plain.returncode == 1
    assert "Invalid backend: 'mine'" in plain.stderr


def test_a_default_of_pytorchs_own_is_applied_before_pytorch_registers_it(
    project: Path,
) -> None:
    # Autoload installs while torch._dynamo is imported, before PyTorch's backends are
    # registered: "eager" is still taken, as install() takes it, and warned of by nothing.
    (project / "backends.toml").write_text(MANIFEST.replace('"mine"', '"eager"', 1))
    code = "import torch, torch.compiler as c\nprint(c.get_default_backend())\n"
    done = run(code, project, args=("-W", "error"))
    assert (done.returncode, done.stdout) == (0, "eager\n"), done.stderr


def test_a_chain_that_verifies_trains_in_a_process_nobody_changed(project: Path) -> None:
    done = run(
        """
        import logging, torch
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        for name in ("torch",):
            logging.getLogger(name).setLevel(logging.WARNING)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
        compiled = torch.compile(model, backend="careful")
        compiled(torch.randn(6, 4)).sum().backward()
        print("trained", all(p.grad is not None for p in model.parameters()))
        """,
        project,
    )
    assert done.returncode == 0, done.stderr
    assert "trained True" in done.stdout
    assert "static shapes): compiled with 'aot_eager', backward verified against eager" in (
        done.stderr
    )


def test_import_torch_never_fails_for_autoload(project: Path) -> None:
    (project / "backends.toml").write_text('[backends.broken]\ntarget = "no colon"\n[oops\n')
    code = """
    import torch
    print("imported")
    out = torch.compile(torch.nn.Linear(4, 2), backend="eager")(torch.randn(3, 4))
    print("compiled", tuple(out.shape))
    """
    # Warnings as errors, too: what autoload says must not become an exception in torch.
    done = run(code, project, args=("-W", "error"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["imported", "compiled (3, 2)"]
    assert "invalid TOML" in done.stderr  # said, as a warning
    assert "Traceback" not in done.stderr


def test_a_drifted_lock_fails_every_compile_with_installs_error(project: Path) -> None:
    # `torch-backends lock`, in a process of its own (this one's PyTorch registry is every
    # test's), after import torch as the command does.
    lock = "import runpy; runpy.run_module('torch_backend_registry', run_name='__main__')"
    environ = {k: "" for k in os.environ if k.startswith("TORCH_BACKENDS_")}
    locked = run_forked(lock, project, environ, args=("lock",))
    assert locked.returncode == 0, locked.stderr
    (project / "backends.toml").write_text(MANIFEST.replace('tag = "mine"', 'tag = "changed"'))
    code = """
    import torch, torch._dynamo
    print("imported")

    def compile(backend):
        try:
            torch.compile(torch.nn.Linear(4, 2), backend=backend)(torch.randn(3, 4))
        except Exception as exc:
            return f"{type(exc).__name__} {type(exc.__context__).__name__}"
        return "compiled"

    for backend in ("inductor", "eager", "mine", "inductor"):
        print(backend, compile(backend))
    try:
        torch.compile(torch.nn.Linear(4, 2), backend="eager")(torch.randn(3, 4))
    except Exception as exc:
        print("refused:", str(exc).splitlines()[0])
    # reset() clears dynamo's compile-start callbacks, "as if a fresh process": a fresh
    # process here refuses every compile, whatever its backend.
    for reset in (torch._dynamo.reset, torch.compiler.reset):
        reset()
        for backend in ("inductor", "mine", "eager"):
            print("after reset:", backend, compile(backend))
    """
    done = run(code, project, TORCH_BACKENDS_LOCKED="1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "imported"  # importing never fails
    # As PyTorch raises whatever a compile-start callback raised: its own error, with the
    # registry's as the exception it was raised during; the same for every compile.
    refused = "InternalTorchDynamoError LockDriftError"
    assert lines[1:5] == [f"{b} {refused}" for b in ("inductor", "eager", "mine", "inductor")]
    assert lines[5].startswith("refused: ")
    assert "the backends drifted from this lock (1 difference: changed backend 'mine':" in lines[5]
    assert lines[6:] == [f"after reset: {b} {refused}" for b in ("inductor", "mine", "eager") * 2]


PLUGIN = """
import pathlib

pathlib.Path({marker!r}).write_text("imported")  # what any import of this plugin leaves


def backend(gm, example_inputs):
    print("[{dist}]", flush=True)
    return gm.forward
"""


def plugin(project: Path, dist: str, names: tuple[str, ...]) -> str:
    """A real plugin: distribution ``dist`` installed as pip leaves it (a ``*.dist-info``
    with ``torch_dynamo_backends`` entry points ``names``) in a folder of its own; its
    module leaves ``DIST.imported`` in ``project`` when it is imported. The ``PYTHONPATH``
    that has it on the import path."""
    site = project.parent / "site"
    module = f"tbr_plugin_{dist}"
    (site / f"{dist}-1.0.dist-info").mkdir(parents=True)
    (site / f"{dist}-1.0.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n"
    )
    points = "".join(f"{name} = {module}:backend\n" for name in names)
    (site / f"{dist}-1.0.dist-info" / "entry_points.txt").write_text(
        f"[torch_dynamo_backends]\n{points}"
    )
    marker = str(project / f"{dist}.imported")
    (site / f"{module}.py").write_text(PLUGIN.format(marker=marker, dist=dist))
    return os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])


@pytest.mark.parametrize(
    ("manifest", "deny", "allow"),
    [('[plugins]\ndeny = ["sketchy"]\n', "", ""), ("", "sketchy", ""), ("", "", "tidy")],
    ids=["[plugins] deny", "TORCH_BACKENDS_DENY", "TORCH_BACKENDS_ALLOW"],
)
def test_a_plugin_policy_under_autoload_keeps_the_lock_matching(
    project: Path, manifest: str, deny: str, allow: str
) -> None:
    # Two plugins, one left out by the policy: the library's first read of PyTorch's
    # registry imports torch._dynamo, and autoload installs inside that import.
    path = plugin(project, "sketchy", ("sketchy",))
    plugin(project, "tidy", ("tidy",))
    (project / "backends.toml").write_text(MANIFEST + manifest)
    env = {"PYTHONPATH": path, "TORCH_BACKENDS_DENY": deny, "TORCH_BACKENDS_ALLOW": allow}
    # `torch-backends lock` after import torch, as the command does, in a process of its own.
    command = "import runpy; runpy.run_module('torch_backend_registry', run_name='__main__')"
    blank = {k: "" for k in os.environ if k.startswith("TORCH_BACKENDS_")}
    locked = run_forked(command, project, {**blank, **env}, args=("lock",))
    assert locked.returncode == 0, locked.stderr
    code = """
    import torch, torch_backend_registry as tbr
    first = tbr.fingerprint(), tbr.list_backends(exclude_tags=())
    try:
        tbr.install(locked=True)
        print("installed")
    except Exception as exc:
        print(type(exc).__name__, str(exc)[:300])
    print("inductor", "inductor" in first[1], "sketchy", "sketchy" in first[1])
    tbr.refresh()  # read again, PyTorch's registry whole
    print("as read again", first == (tbr.fingerprint(), tbr.list_backends(exclude_tags=())))
    """
    done = run(code, project, PYTHONPATH=path, TORCH_BACKENDS_DENY=deny, TORCH_BACKENDS_ALLOW=allow)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "installed",
        "inductor True sketchy False",
        "as read again True",
    ]
    assert not (project / "sketchy.imported").exists()


RANK = """
import os, sys
if os.environ["RANK"] == "1" and len(sys.argv) > 1:  # this rank reads one manifest more
    os.environ["TORCH_BACKENDS_PATH"] = sys.argv[1]
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
try:
    out = torch.compile(torch.nn.Linear(4, 2), backend="mine")(torch.randn(3, 4))
    said = f"rank {rank} compiled {tuple(out.shape)}"
except Exception as exc:
    said = f"rank {rank} refused: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
with open(f"rank{rank}.said", "w") as out:  # a file each: the ranks' stdout interleave
    out.write(said)
dist.destroy_process_group()
"""


def _torchrun(project: Path, *extra: str) -> list[str]:
    """What each rank said, rank by rank, after a 2-rank torchrun in ``project``."""
    (project / "rank.py").write_text(RANK)
    for old in project.glob("rank*.said"):
        old.unlink()
    environ = environment(
        TORCH_BACKENDS_AUTOLOAD="1", TORCH_BACKENDS_VERIFY="1", GLOO_SOCKET_IFNAME="lo"
    )
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(project / "rank.py"), *extra],
        cwd=project, env=environ, capture_output=True, text=True, timeout=PATIENCE,
    )  # fmt: skip
    said = [(project / f"rank{rank}.said") for rank in (0, 1)]
    assert all(p.exists() for p in said), done.stdout + done.stderr
    return [p.read_text() for p in said]


def test_every_torchrun_rank_compiles_and_the_ranks_are_compared(project: Path) -> None:
    assert _torchrun(project) == ["rank 0 compiled (3, 2)", "rank 1 compiled (3, 2)"]
    # One rank with another backend more: every rank refuses at its first compile.
    extra = project / "extra.toml"
    extra.write_text('[backends.only_on_rank_1]\ntarget = "tbr_autoload_compilers:traced"\n')
    for line in _torchrun(project, str(extra)):
        assert "refused: InternalTorchDynamoError: InconsistentRegistryError: ranks [1]" in line


def test_a_dataloader_worker_under_spawn_compiles_with_a_declared_backend(project: Path) -> None:
    (project / "tbr_autoload_data.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Compiled(torch.utils.data.Dataset):
                def __len__(self):
                    return 4

                def __getitem__(self, i):
                    fn = torch.compile(lambda x: x * 2, backend="mine")
                    return fn(torch.full((2,), float(i)))
            """
        )
    )
    code = """
    import torch
    from tbr_autoload_data import Compiled
    if __name__ == "__main__":
        loader = torch.utils.data.DataLoader(
            Compiled(), batch_size=2, num_workers=1, multiprocessing_context="spawn"
        )
        print("batches", [batch.tolist() for batch in loader])
    """
    done = run(code, project)
    assert done.returncode == 0, done.stderr
    assert "batches [[[0.0, 0.0], [2.0, 2.0]], [[4.0, 4.0], [6.0, 6.0]]]" in done.stdout
    # Compiled in the worker (the main process compiles nothing), with the declared backend.
    assert "[mine]" in done.stdout


def test_a_framework_that_passes_a_configured_name_on(project: Path) -> None:
    # As torchtitan (compile.backend), vLLM's stock modes and Lightning do: a string from a
    # config file, straight to torch.compile, in a process nobody added a line to.
    (project / "train.json").write_text(json.dumps({"compile": {"backend": "mine"}}))
    done = run(
        """
        import json, torch
        backend = json.load(open("train.json"))["compile"]["backend"]
        assert backend in torch._dynamo.list_backends(exclude_tags=())  # vLLM's own check
        out = torch.compile(torch.nn.Linear(4, 2), backend=backend)(torch.randn(3, 4))
        print("compiled", tuple(out.shape))
        """,
        project,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[mine] 5 nodes", "compiled (3, 2)"]


def test_explain_and_check_say_whether_autoload_is_on(project: Path) -> None:
    def command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "torch_backend_registry", *args, "--no-torch"],
            cwd=project, env=environment(**env), capture_output=True, text=True,
            timeout=PATIENCE,
        )  # fmt: skip

    off = command("explain", "mine").stdout
    assert "  autoload:    off: only processes that call install()" in off
    on = command("explain", "mine", TORCH_BACKENDS_AUTOLOAD="1").stdout
    assert "  autoload:    on: every process that imports torch here" in on
    checked = command("check", TORCH_BACKENDS_AUTOLOAD="1").stderr
    assert checked.rstrip().endswith(
        "; autoload on: every process that imports torch here"
        " (TORCH_BACKENDS_AUTOLOAD is set); read backends.toml"
    )
    assert json.loads(command("check", "--json", TORCH_BACKENDS_AUTOLOAD="1").stdout)["autoload"]
    # A switch's words turn it off, as TORCH_BACKENDS_LOCKED's do.
    for word in ("0", "false", "No", "off"):
        said = command("explain", "mine", TORCH_BACKENDS_AUTOLOAD=word).stdout
        assert "  autoload:    off: only processes that call install()" in said, word
    # PyTorch's own switch off: no torch.backends entry point is loaded, this one neither.
    pytorchs_off = command(
        "explain", "mine", TORCH_BACKENDS_AUTOLOAD="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0"
    ).stdout
    assert "  autoload:    off: TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops PyTorch from" in pytorchs_off
