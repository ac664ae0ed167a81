"""The lock of what the project uses: the names its manifests declare and reach, pinned; a
plugin or a PyTorch backend it never names is no drift; ``--all`` pins everything."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import LockDriftError, Registry

from .conftest import WriteFn, torch_backends

MANIFEST = (
    '[backends.mine]\ntarget = "m:f"\n[backends.portable]\nchain = ["plugged", "mine", "eager"]\n'
)


def test_a_plugin_the_project_never_names_is_no_drift_and_one_it_names_is(
    write: WriteFn, tmp_path: Path, make_dist: Callable[..., Path]
) -> None:
    write("backends.toml", MANIFEST)
    named = make_dist("tbr-named", "1.0", {"plugged": "tbr_named:compile"})
    env = {"PYTHONPATH": str(named.parent)}
    torch_backends("lock", "--no-torch", cwd=tmp_path, env=env)
    lock = (tmp_path / "backends.lock").read_text()
    assert 'scope = "project"' in lock
    assert "[backends.plugged]" in lock  # the chain names it
    assert "[backends.eager]" in lock  # and PyTorch's eager, by release
    assert "[backends.inductor]" not in lock  # never named
    # Another plugin installed: nothing the project uses changed.
    make_dist("tbr-unrelated", "2.0", {"elsewhere": "tbr_unrelated:compile"})
    torch_backends("check", "--locked", "--no-torch", cwd=tmp_path, env=env)
    # The named plugin upgraded: drift, said of the name the chain uses.
    os.rename(named, named.with_name("tbr_named-1.1.dist-info"))
    upgraded = named.with_name("tbr_named-1.1.dist-info")
    (upgraded / "METADATA").write_text("Metadata-Version: 2.1\nName: tbr-named\nVersion: 1.1\n")
    drifted = torch_backends("check", "--locked", "--no-torch", cwd=tmp_path, env=env, check=1)
    assert 'changed backend \'plugged\': version: "1.0" -> "1.1"' in drifted.stdout


def test_lock_all_pins_every_listed_name_and_is_judged_as_such(
    write: WriteFn, tmp_path: Path, make_dist: Callable[..., Path]
) -> None:
    write("backends.toml", MANIFEST)
    torch_backends("lock", "--all", "--no-torch", cwd=tmp_path)
    assert 'scope = "all"' in (tmp_path / "backends.lock").read_text()
    make_dist("tbr-new", "1.0", {"newcomer": "tbr_new:compile"})
    drifted = torch_backends("check", "--locked", "--no-torch", cwd=tmp_path, check=1)
    assert "added backend 'newcomer'" in drifted.stdout
    assert "run 'torch-backends lock --all' to accept it" in drifted.stdout


def test_a_lock_written_without_torch_matches_one_read_with_it(
    write: WriteFn, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    write("backends.toml", MANIFEST)
    torch_backends("lock", "--no-torch", cwd=tmp_path)
    said = torch_backends("check", "--locked", cwd=tmp_path).stderr
    assert "backends.lock matched" in said
    # install() holds to the same set (TORCH_BACKENDS_LOCKED): a plugin it never names is no
    # drift there either.
    tbr.install(Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_LOCKED": "1"}))
    (tmp_path / "backends.toml").write_text(MANIFEST.replace('"m:f"', '"m:g"'))
    with pytest.raises(LockDriftError, match="changed backend 'mine': target"):
        tbr.install(Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_LOCKED": "1"}))
