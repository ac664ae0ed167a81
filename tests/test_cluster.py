"""The same backends on every rank: fingerprints, lock files, and a check over torch.distributed.

The cluster tests start 2 to 4 real ranks as processes that talk gloo over the
loopback address, each with its own folder and environment, under time limits.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import LockDriftError, Registry
from torch_backend_registry._lock import (
    changes,
    lock_facts,
    lock_path,
    read_lock,
    write_lock,
)

from .conftest import NO_TORCH, Done, WriteFn, free_port, run_forked, torch_backends


def differences(locked: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The drift from ``locked`` to ``now``, as ``check --locked`` prints it."""
    return [said for _names, said in changes(locked, now)]


MANIFEST = """
[backends.fast]
target = "builtins:len"
options = { level = 2 }
aliases = ["f"]
tags = ["t"]

[backends.slow]
target = "builtins:abs"

[backends.portable]
chain = ["fast", "slow"]
"""


def project(folder: Path, body: str = MANIFEST, **environ: str) -> Registry:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "backends.toml").write_text(body, encoding="utf-8")
    return Registry(cwd=folder, environ=environ, sources=("env", "project", "entry-point"))


# ------------------------------------------------------------------ fingerprints


def test_the_fingerprint_is_content_not_place(tmp_path: Path) -> None:
    here = tbr.fingerprint(project(tmp_path / "checkout_a"))
    # Another folder, other line numbers, other order: the same backends.
    moved = "\n\n# a comment\n" + MANIFEST.replace("tags", "# moved\ntags")
    assert tbr.fingerprint(project(tmp_path / "elsewhere" / "b", moved)) == here
    assert len(here) == 16
    # What decides what runs changes it.
    for changed in (
        MANIFEST.replace("level = 2", "level = 3"),
        MANIFEST.replace("builtins:len", "builtins:abs"),
        MANIFEST.replace('["fast", "slow"]', '["slow", "fast"]'),
        MANIFEST.replace('aliases = ["f"]', 'aliases = ["g"]'),
        'default = "slow"\n' + MANIFEST,
    ):
        assert tbr.fingerprint(project(tmp_path / "c", changed)) != here


def test_the_default_is_part_of_the_lock(tmp_path: Path) -> None:
    locked = read_lock(write_lock(project(tmp_path / "p", 'default = "fast"\n' + MANIFEST)))
    now = lock_facts(project(tmp_path / "p", 'default = "slow"\n' + MANIFEST))
    assert differences(locked, now) == ['changed default: "fast" -> "slow"']


def test_unusual_option_values_are_stable_in_the_fingerprint_and_the_lock(tmp_path: Path) -> None:
    body = MANIFEST.replace("level = 2", "level = nan, big = inf, when = 1979-05-27T07:32:00Z")
    first, second = project(tmp_path / "a", body), project(tmp_path / "b", body)
    assert tbr.fingerprint(first) == tbr.fingerprint(second)
    assert differences(read_lock(write_lock(first)), lock_facts(second)) == []


def test_a_date_and_its_text_are_different_options(tmp_path: Path) -> None:
    as_date = project(tmp_path / "a", MANIFEST.replace("level = 2", "level = 2020-01-01"))
    as_text = project(tmp_path / "b", MANIFEST.replace("level = 2", 'level = "2020-01-01"'))
    assert tbr.fingerprint(as_date) != tbr.fingerprint(as_text)
    assert differences(read_lock(write_lock(as_date)), lock_facts(as_text)) == [
        'changed backend \'fast\': options: {"level": 2020-01-01} -> {"level": "2020-01-01"}'
    ]


def test_a_folder_outside_the_checkout_counts_as_it_is_one_inside_as_relative(
    tmp_path: Path,
) -> None:
    body = 'python-path = ["/opt/shared/tbr", "src"]\n' + MANIFEST
    here = tbr.fingerprint(project(tmp_path / "a" / "proj", body))
    assert tbr.fingerprint(project(tmp_path / "b" / "c" / "proj", body)) == here
    facts = project(tmp_path / "a" / "proj", body).facts()["backends"]["fast"]
    assert facts["python-path"] == ["/opt/shared/tbr", "src"]


def test_the_fingerprint_is_the_same_in_another_process(tmp_path: Path) -> None:
    registry = project(tmp_path / "p")
    code = (
        "import torch_backend_registry as t\n"
        "print(t.fingerprint(t.Registry(environ={}, sources=('env', 'project', 'entry-point'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "p", capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == tbr.fingerprint(registry)


def test_a_plugins_version_is_part_of_the_fingerprint(
    tmp_path: Path, make_dist: Callable[..., Path]
) -> None:
    info = make_dist("tbr-plug", "1.0", {"plugged": "tbr_plug:compile"})
    before = tbr.fingerprint(project(tmp_path / "p"))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tbr-plug\nVersion: 1.1\n")
    after = tbr.fingerprint(project(tmp_path / "p"))
    assert before != after


# ------------------------------------------------------------------ lock files


def test_a_lock_round_trips_and_matches_from_another_folder(tmp_path: Path) -> None:
    registry = project(tmp_path / "a")
    path = write_lock(registry)
    assert path == str(tmp_path / "a" / "backends.lock")
    text = Path(path).read_text(encoding="utf-8")
    assert text.startswith("# Generated by `torch-backends lock`")
    assert text == Path(write_lock(registry)).read_text(encoding="utf-8")  # deterministic
    assert differences(read_lock(path), lock_facts(registry)) == []
    # A checkout elsewhere (another machine's folder layout) matches the same lock.
    shutil.copytree(tmp_path / "a", tmp_path / "deep" / "b")
    other = Registry(cwd=tmp_path / "deep" / "b", environ={}, sources=registry.sources)
    assert lock_path(other) == str(tmp_path / "deep" / "b" / "backends.lock")
    assert differences(read_lock(lock_path(other)), lock_facts(other)) == []


def test_a_python_path_beside_the_manifests_folder_is_the_same_in_any_checkout(
    tmp_path: Path,
) -> None:
    body = 'python-path = ["../src", "/opt/tbr-shared"]\n' + MANIFEST
    prints = set()
    for checkout in (tmp_path / "a", tmp_path / "deeper" / "b"):
        (checkout / "src").mkdir(parents=True)
        registry = project(checkout / "conf", body)
        facts = registry.facts()["backends"]["fast"]
        assert facts["python-path"] == ["../src", "/opt/tbr-shared"]
        prints.add(tbr.fingerprint(registry))
    assert len(prints) == 1


def test_each_kind_of_drift_is_named_field_by_field(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    info = make_dist("tbr-drift", "1.0", {"plugged": "tbr_drift:compile"})
    registry = project(tmp_path / "p")
    locked = read_lock(write_lock(registry, scope="all"))  # a plugin it never names
    project(
        tmp_path / "p",
        MANIFEST.replace("level = 2", "level = 3").replace('aliases = ["f"]', "")
        + '[backends.extra]\ntarget = "builtins:abs"\n',
    )
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tbr-drift\nVersion: 2.0\n")
    registry.refresh()
    assert differences(locked, lock_facts(registry, "all")) == [
        'added backend \'extra\': {"kind": "manifest", "target": "builtins:abs"}',
        'changed backend \'fast\': options: {"level": 2} -> {"level": 3}',
        'changed backend \'plugged\': version: "1.0" -> "2.0"',
        "removed alias 'f' (was \"fast\")",
    ]


def test_the_command_line_locks_and_finds_drift(tmp_path: Path) -> None:
    project(tmp_path / "p")

    def cli(*args: str) -> Done:
        return torch_backends(*args, cwd=tmp_path / "p", check=None)

    done = cli("lock")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote backends.lock: ")
    assert "3 manifest" in done.stdout  # what was locked, by source
    assert " backends, 1 alias; fingerprint " in done.stdout
    for torch_or_not in ((), ("--no-torch",)):
        # Without torch read, PyTorch's entries of the lock are neither compared nor reported.
        matched = cli("check", "--locked", *torch_or_not)
        assert matched.returncode == 0, matched.stdout
        assert matched.stdout == ""
        assert "; backends.lock matched (fingerprint " in matched.stderr
    (tmp_path / "p" / "backends.toml").write_text(MANIFEST.replace("level = 2", "level = 5"))
    drifted = cli("check", "--locked")
    assert drifted.returncode == 1
    assert (
        'backends.lock: error: changed backend \'fast\': options: {"level": 2} -> {"level": 5};'
        " run 'torch-backends lock' to accept it"
    ) in drifted.stdout
    assert "matched" not in drifted.stderr


def test_check_locked_compares_with_the_lock_install_holds_to(tmp_path: Path) -> None:
    # A lock written elsewhere (an image's), named by TORCH_BACKENDS_LOCKED for install():
    # check --locked compares with that one too.
    project(tmp_path / "p")
    elsewhere = tmp_path / "image" / "app.lock"
    elsewhere.parent.mkdir()

    def cli(*args: str, **env: str) -> Done:
        return torch_backends(*args, "--no-torch", cwd=tmp_path / "p", env=env, check=None)

    assert torch_backends("lock", "--output", str(elsewhere), cwd=tmp_path / "p").returncode == 0
    named = {"TORCH_BACKENDS_LOCKED": str(elsewhere)}
    matched = cli("check", "--locked", **named)
    assert matched.returncode == 0, matched.stdout
    assert "app.lock matched (fingerprint " in matched.stderr
    assert cli("check", "--locked").returncode == 1  # no backends.lock beside the manifest
    (tmp_path / "p" / "backends.toml").write_text(MANIFEST.replace("level = 2", "level = 5"))
    drifted = cli("check", "--locked", **named)
    assert drifted.returncode == 1
    assert "app.lock: error: changed backend 'fast': options: " in drifted.stdout
    # Its advice, followed as written, accepts the change in that lock.
    [advice] = re.findall(r"run '(torch-backends [^']*)' to accept it", drifted.stdout)
    accepted = torch_backends(*shlex.split(advice)[1:], cwd=tmp_path / "p", check=None)
    assert accepted.returncode == 0, accepted.stderr
    assert cli("check", "--locked", **named).returncode == 0


def test_a_lock_holds_whether_the_manifest_is_the_projects_or_named(tmp_path: Path) -> None:
    # Locked in the checkout; a job launched elsewhere names the same file by its path.
    project(tmp_path / "p")
    assert torch_backends("lock", cwd=tmp_path / "p").returncode == 0
    elsewhere = tmp_path / "job"
    elsewhere.mkdir()
    env = {
        "TORCH_BACKENDS_PATH": str(tmp_path / "p" / "backends.toml"),
        "TORCH_BACKENDS_LOCKED": str(tmp_path / "p" / "backends.lock"),
    }
    done = torch_backends("check", "--locked", "--no-torch", cwd=elsewhere, env=env, check=None)
    assert done.returncode == 0, done.stdout
    assert "backends.lock matched (fingerprint " in done.stderr


def test_the_lock_commands_refuse_what_they_cannot_mean(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()

    def cli(*args: str, cwd: Path) -> Done:
        return torch_backends(*args, cwd=cwd, check=None)

    # No manifest: a lock of PyTorch's backends alone would pin nobody's.
    nothing = cli("lock", cwd=empty)
    assert nothing.returncode == 1
    assert "no manifest found" in nothing.stderr
    assert not (empty / "backends.lock").exists()
    # --locked compares what is found here, never a file given beside it.
    project(tmp_path / "p")
    both = cli("check", "--locked", "backends.toml", "--no-torch", cwd=tmp_path / "p")
    assert both.returncode == 1
    assert "--locked compares the backends found here" in both.stderr
    # A lock that cannot be written (a folder is there) leaves no temporary file behind.
    (tmp_path / "p" / "folder").mkdir()
    refused = cli("lock", "--output", "folder", cwd=tmp_path / "p")
    assert refused.returncode == 1
    assert refused.stderr.startswith("torch-backends: error: cannot write folder: ")
    assert "Traceback" not in refused.stderr
    assert sorted(os.listdir(tmp_path / "p")) == ["backends.toml", "folder"]


def test_a_lock_says_exactly_its_own_version(tmp_path: Path) -> None:
    registry = project(tmp_path / "p")
    path = Path(write_lock(registry))
    text = path.read_text(encoding="utf-8")
    assert "\nlock-version = 3\n" in text
    for wrong in ("true", "2.0", '"2"', "1"):  # 1: a lock of an earlier release
        path.write_text(text.replace("lock-version = 3", f"lock-version = {wrong}"))
        with pytest.raises(tbr.LockFileError, match="run 'torch-backends lock' again"):
            read_lock(str(path))


def test_verify_consistent_takes_seconds_or_a_timedelta() -> None:
    pytest.importorskip("torch")
    from datetime import timedelta

    # No limit at all, or one past what torch.distributed can count, is refused before any
    # rank waits: past some 290 years it wraps around to a limit already run out.
    for wrong in (timedelta(seconds=-1), 0, float("nan"), float("inf"), 1e17, timedelta.max):
        with pytest.raises(ValueError, match="timeout must be positive and at most 366 days"):
            tbr.verify_consistent(timeout=wrong)
    with pytest.raises(TypeError, match=r"timeout must be seconds or a datetime\.timedelta"):
        tbr.verify_consistent(timeout=None)  # type: ignore[arg-type]
    # Accepted: what is missing then is the process group, not a number of seconds.
    for timeout in (timedelta(seconds=5), 5, 5.0):
        with pytest.raises(tbr.BackendRegistryError, match=r"needs torch\.distributed initialised"):
            tbr.verify_consistent(timeout=timeout)


def test_install_refuses_a_registry_that_drifted_from_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    registry = project(tmp_path / "p")
    write_lock(registry)
    write_lock(registry, str(tmp_path / "p" / "app.lock"))  # an image's, say
    tbr.install(registry, locked=True)  # as locked: installs
    project(tmp_path / "p", MANIFEST.replace("builtins:len", "builtins:abs"))
    registry.refresh()
    with pytest.raises(LockDriftError) as caught:
        tbr.install(registry, locked=True)
    assert caught.value.changes == (
        'changed backend \'fast\': target: "builtins:len" -> "builtins:abs"',
    )

    def by_env(value: str) -> Registry:
        environ = {"TORCH_BACKENDS_LOCKED": value}
        return Registry(cwd=tmp_path / "p", environ=environ, sources=registry.sources)

    # "1", or a switch's words: the lock beside the manifest. A relative path is the
    # registry's working folder's, as its manifests are, whatever the process's is; the
    # advice writes the lock that was named.
    for value in ("1", "true", "ON", "app.lock"):
        with pytest.raises(LockDriftError) as caught:
            tbr.install(by_env(value))
        lock = "app.lock" if value == "app.lock" else "backends.lock"
        assert caught.value.lock == str(tmp_path / "p" / lock)
        accept = "lock --output " + str(tmp_path / "p" / lock) if value == "app.lock" else "lock"
        assert f"'torch-backends {accept}' to accept them" in str(caught.value)
    for value in ("0", "false", "off", ""):
        tbr.install(by_env(value))
    # The registry's own environment decides, never the process's behind it.
    monkeypatch.setenv("TORCH_BACKENDS_LOCKED", "1")
    tbr.install(Registry(cwd=tmp_path / "p", environ={}, sources=registry.sources))


# ------------------------------------------------------------------ the cluster check


def run_ranks(
    tmp_path: Path,
    folders: list[Path],
    steps: list[str],
    *,
    envs: list[dict[str, str]] | None = None,
    without_numpy: bool = False,
) -> list[dict[str, Any]]:
    """Start one process a rank, each in its folder, to run ``steps`` (see ``_ranks.py``,
    whose checks that some rank misses wait 1 s); what each rank's steps returned, in rank
    order."""
    pytest.importorskip("torch")
    from . import _ranks

    world = len(folders)
    base = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    envs = [{**base, **env} for env in (envs or [{}] * world)]
    return _ranks.run(tmp_path, folders, steps, envs, free_port(), without_numpy)


def rank_projects(tmp_path: Path, count: int) -> list[Path]:
    """A folder for each of ``count`` ranks, each with the same project."""
    folders = [tmp_path / f"rank{i}" for i in range(count)]
    for folder in folders:
        project(folder)
    return folders


def tbr_fingerprint(folder: Path) -> str:
    """The fingerprint a lone process gets in ``folder``, of what the ranks check."""
    code = "import torch_backend_registry as t; print(t.fingerprint(t.Registry(sources=SOURCES)))"
    alone = run_forked(code.replace("SOURCES", repr(NO_TORCH)), folder)
    return alone.stdout.strip()


def did_not_call(*ranks: int, hint: str = "") -> dict[str, Any]:
    """What every rank that waited says of ``ranks``, which did not call within 1 s."""
    said = f"ranks {list(ranks)} did not call verify_consistent() within 1 s{hint}"
    return {"error": said, "ranks": list(ranks), "names": []}


def came_late(rank: int) -> dict[str, Any]:
    said = (
        f"rank {rank}: verify_consistent() found the other ranks of [0, 1, 2] no longer"
        " waiting: this rank called it after their 1 s had run out"
    )
    return {"error": said, "ranks": [], "names": []}


def test_ranks_that_never_call_call_late_or_end_are_named_and_the_next_check_works(
    tmp_path: Path,
) -> None:
    folders = rank_projects(tmp_path, 3)
    steps = ["agree", "absent", "late-last", "late-first", "refused", "dies"]
    results = run_ranks(tmp_path, folders, steps)
    # Identical ranks agree, on the fingerprint a lone process gets there (PyTorch's
    # registry is process-wide, so this test's own process, which other tests used, is no
    # reference).
    agreed = {"fingerprint": tbr_fingerprint(folders[0])}
    assert [r["agree"] for r in results] == [agreed] * 3
    # A rank that never calls is named by every rank that waited, also where the world
    # group is given by name: the same error on each.
    assert [r["absent"] for r in results] == [did_not_call(2)] * 2 + [{"absent": True}]
    # A rank that calls once the others' time has run out (the last, or the first, which
    # holds the store) is named by the others and told it came late; then every rank's next
    # check agrees, and the job's own group still runs.
    for step, late in (("late-last", 2), ("late-first", 0)):
        said = [r[step] for r in results]
        assert [s["late"] for s in said] == [
            came_late(late) if rank == late else did_not_call(late) for rank in range(3)
        ]
        assert [s["again"] for s in said] == [agreed] * 3
        assert [s["sum"] for s in said] == [3.0] * 3
    # A call refused for its time limit counts as the others' did: they name its rank, and
    # the next check pairs up and agrees.
    assert [r["refused"]["first"] for r in results] == [did_not_call(2)] * 2 + [
        {"refused": "ValueError: timeout must be positive and at most 366 days, got -1"}
    ]
    assert [r["refused"]["then"] for r in results] == [agreed] * 3
    # A rank that ends before it calls is one that never called.
    assert [r.get("dies") for r in results] == [did_not_call(2)] * 2 + [None]


def test_a_check_of_a_group_names_the_job_ranks_and_pairs_each_ranks_nth_calls(
    tmp_path: Path,
) -> None:
    folders = rank_projects(tmp_path, 3)
    results = run_ranks(tmp_path, folders, ["stages", "twice", "pair", "groups"])
    # A check of some ranks (rank 0 is no member of the others' stage) leaves a later check
    # of all, and the job's own groups, working.
    agreed = {"fingerprint": results[0]["stages"]["fingerprint"]}
    assert [r["stages"] for r in results] == [{**agreed, "sum": 3.0}] * 3
    # Each rank's n-th check pairs with the others' n-th: rank 0's extra call waits for
    # them in vain, their next call comes too late for it, and the one after agrees.
    assert [r["twice"]["said"] for r in results] == [
        [agreed, late_or_missing, agreed]
        for late_or_missing in (did_not_call(1, 2), came_late(1), came_late(2))
    ]
    # Ranks 1 and 2 make a group; rank 1 calls, rank 2 does not: rank 2 is named, not
    # rank 1 (its number inside the group, and the caller), with the check it made last.
    assert [r["pair"] for r in results] == [
        {"absent": True},
        did_not_call(2, hint=" (rank 2's last check was of ranks [0, 1, 2])"),
        {"absent": True},
    ]
    # Ranks that give different groups: each names the rank it waited for, and the ranks
    # that rank is checking.
    assert [r["groups"] for r in results] == [
        did_not_call(1, hint=" (rank 1's last check was of ranks [1, 2])"),
        did_not_call(2, hint=" (rank 2's last check was of ranks [0, 1, 2])"),
        did_not_call(1, hint=" (rank 1's last check was of ranks [1, 2])"),
    ]


def differing_ranks(tmp_path: Path) -> tuple[list[Path], list[dict[str, str]]]:
    """Four ranks: 0 and 1 agree; rank 2 has an extra manifest and another option, rank 3
    another version of a plugin."""
    folders = rank_projects(tmp_path, 4)
    envs: list[dict[str, str]] = [{}, {}, {}, {}]
    site = tmp_path / "site"
    for rank, version in enumerate(("1.0", "1.0", "1.0", "2.0")):
        info = site / f"v{rank}" / f"tbr_cluster_plug-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: tbr-cluster-plug\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text("[torch_dynamo_backends]\nplug = tbr_plug:fn\n")
        envs[rank]["PYTHONPATH"] = str(info.parent)
    extra = tmp_path / "extra.toml"
    extra.write_text('[backends.only_here]\ntarget = "builtins:abs"\n')
    envs[2]["TORCH_BACKENDS_PATH"] = str(extra)
    project(folders[2], MANIFEST.replace("level = 2", "level = 9"))
    return folders, envs


def test_a_different_rank_makes_every_rank_raise_the_same_error(tmp_path: Path) -> None:
    folders, envs = differing_ranks(tmp_path)
    results = run_ranks(tmp_path, folders, ["differ", "outside"], envs=envs)
    # Each difference is found, and every rank says the same (the facts sent in pieces).
    errors = {r["differ"]["error"] for r in results}
    assert len(errors) == 1, results  # the same error on every rank
    [error] = errors
    assert all(r["differ"]["ranks"] == [2, 3] for r in results)
    assert all(r["differ"]["names"] == ["fast", "only_here", "plug"] for r in results)
    assert error.startswith("ranks [2, 3] resolve backend names differently from the other 2")
    assert f"rank 2 on {socket.gethostname()}: " in error
    assert f"rank 3 on {socket.gethostname()}: " in error
    # Ranks outside the group they name are refused, not agreed with; its members agree.
    refused = (
        "ValueError: rank {} is not in the group of ranks [0, 1]: it has no rank to compare with"
    )
    assert [r["outside"] for r in results] == [
        {"fingerprint": results[0]["outside"]["fingerprint"]}
    ] * 2 + [
        {"refused": refused.format(2)},
        {"refused": refused.format(3)},
    ]


def test_a_mismatch_is_reported_where_numpy_cannot_be_imported(tmp_path: Path) -> None:
    # torch.distributed's object collectives need numpy, which neither torch nor this
    # package declares; PyTorch itself imports without it.
    folders = rank_projects(tmp_path, 2)
    project(folders[1], MANIFEST.replace("level = 2", "level = 9"))
    results = run_ranks(tmp_path, folders, ["differ"], without_numpy=True)
    assert [r["differ"]["names"] for r in results] == [["fast"], ["fast"]], results
    assert results[0] == results[1]


def test_the_check_can_run_itself_at_install(tmp_path: Path) -> None:
    folders = [tmp_path / f"rank{i}" for i in range(2)]
    project(folders[0])
    project(folders[1], MANIFEST.replace("level = 2", "level = 4"))
    verify = {"TORCH_BACKENDS_VERIFY": "1"}
    results = run_ranks(tmp_path, folders, ["install"], envs=[verify, verify])
    # Rank 1 differs: install() refuses on both; with rank 0's manifest, both install.
    assert [r["install"]["first"].get("names") for r in results] == [["fast"], ["fast"]]
    assert [r["install"]["then"] for r in results] == [{"fingerprint": None}] * 2


# ------------------------------------------------------------------ one identity, any checkout


def test_an_absolute_python_path_is_the_same_from_every_checkout(tmp_path: Path) -> None:
    # The shared folder lies beside the checkouts, not at the root: one manifest, one print.
    shared = tmp_path / "shared" / "kernels"
    shared.mkdir(parents=True)
    body = f'python-path = ["{shared}"]\n' + MANIFEST
    prints = {
        tbr.fingerprint(project(checkout / "proj", body))
        for checkout in (tmp_path / "one", tmp_path / "a" / "b" / "two")
    }
    assert len(prints) == 1
    registry = project(tmp_path / "one" / "proj", body)
    assert registry.facts()["backends"]["fast"]["python-path"] == [str(shared)]


def test_a_lock_of_a_cpu_build_holds_on_a_cuda_build_of_the_same_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch_backend_registry._sources.pytorch as pytorch

    pytest.importorskip("torch")  # the lock pins PyTorch's version where it is installed
    body = MANIFEST + '\n[backends.fallback]\nchain = ["fast", "inductor"]\n'
    registry = Registry(cwd=tmp_path, environ={}, sources=("project", "torch"))
    monkeypatch.setattr(pytorch, "torch_version", lambda: "2.13.0+cpu")
    (tmp_path / "backends.toml").write_text(body, encoding="utf-8")
    write_lock(registry)
    for version, drifts in (("2.13.0+cu128", False), ("2.13.0", False), ("2.14.0+cpu", True)):
        monkeypatch.setattr(pytorch, "torch_version", lambda v=version: v)
        again = Registry(cwd=tmp_path, environ={}, sources=("project", "torch"))
        changes = differences(read_lock(lock_path(again)), lock_facts(again))
        assert bool(changes) is drifts, (version, changes)


def test_what_a_runtime_registration_runs_is_its_identity(tmp_path: Path) -> None:
    import functools
    import operator

    class Compiler:
        def __init__(self, level: int) -> None:
            self.level = level

        def __call__(self, gm: Any, example_inputs: Any) -> Any:
            return gm

    class Other(Compiler):
        pass

    def fingerprint_of(fn: Any) -> str:
        registry = Registry(cwd=tmp_path, environ={}, sources=("runtime",))
        registry.register_backend(fn, name="mine")
        return tbr.fingerprint(registry)

    made = [
        functools.partial(operator.add, 1),
        functools.partial(operator.sub, 1),
        functools.partial(operator.add, 2),
        functools.partial(max, key=len),
        functools.partial(max, key=abs),
        Compiler(2),
        Compiler(9),
        Other(2),
    ]
    prints = [fingerprint_of(fn) for fn in made]
    assert len(set(prints)) == len(made)  # each runs other code: each its own print
    assert fingerprint_of(Compiler(2)) == prints[5]  # the same code: the same print


def test_lock_writes_what_its_reader_reads_at_some_20000_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch_backend_registry._lock import lock_text

    facts: dict[str, Any] = {"scope": "all", "backends": {}, "aliases": {}}
    for i in range(20_000):
        facts["backends"][f"b{i}"] = {
            "kind": "env",
            "target": f"pkg{i % 100}.compilers:fn{i}",
            "options": {"level": i % 7, "fast": True},
        }
        facts["aliases"][f"a{i}"] = f"b{i}"
    path = tmp_path / "backends.lock"
    path.write_text(lock_text(facts), encoding="utf-8")
    assert read_lock(str(path))["backends"] == facts["backends"]
    # Past what a lock is read at, lock refuses to write one (never one its reader refuses).
    from torch_backend_registry import _lock

    monkeypatch.setattr(_lock, "LOCK_MAX_KEY_PARTS", 10)
    registry = project(tmp_path / "p")
    with pytest.raises(tbr.LockFileError, match="larger than a lock is read"):
        write_lock(registry)
    assert not (tmp_path / "p" / "backends.lock").exists()
    monkeypatch.undo()
    read_lock(write_lock(registry))


def test_a_missing_lock_says_how_to_make_one(tmp_path: Path) -> None:
    project(tmp_path / "p")
    done = torch_backends("check", "--locked", "--no-torch", cwd=tmp_path / "p", check=None)
    assert done.returncode == 1
    assert done.stdout == (
        "backends.lock: error: no such file; run 'torch-backends lock' to write it, and commit it\n"
    )
    # Named elsewhere, it is written there; a folder, the manifest, an empty file: no lock.
    (tmp_path / "p" / "sub").mkdir()
    (tmp_path / "p" / "empty.lock").write_text("")
    said = {}
    for named in ("sub/elsewhere.lock", "sub", "backends.toml", "empty.lock"):
        env = {"TORCH_BACKENDS_LOCKED": named}
        done = torch_backends(
            "check", "--locked", "--no-torch", cwd=tmp_path / "p", env=env, check=1
        )
        said[named] = done.stdout
    assert said == {
        "sub/elsewhere.lock": "sub/elsewhere.lock: error: no such file (named by"
        " TORCH_BACKENDS_LOCKED); run 'torch-backends lock --output sub/elsewhere.lock' to"
        " write it, and commit it\n",
        "sub": "sub: error: is a folder, not a lock file; name the lock file itself\n",
        "backends.toml": "backends.toml: error: not a lock file: it has no lock-version and no"
        " fingerprint; name the file 'torch-backends lock' wrote, or run it again\n",
        "empty.lock": "empty.lock: error: not a lock file: it has no lock-version and no"
        " fingerprint; name the file 'torch-backends lock' wrote, or run it again\n",
    }


def test_a_mismatch_says_how_many_differences_it_cuts_and_when_there_is_no_majority(
    tmp_path: Path,
) -> None:
    from torch_backend_registry._cluster import mismatch
    from torch_backend_registry._lock import digest

    extra = "".join(f'[backends.b{i}]\ntarget = "builtins:abs"\n' for i in range(8))
    same = project(tmp_path / "same").facts(with_torch=False)
    more = project(tmp_path / "more", MANIFEST + extra).facts(with_torch=False)
    everyone = [("node-a", same), ("node-a", same), ("node-b", more), ("node-b", more)]
    hashes = [digest(facts) for _host, facts in everyone]
    error = mismatch([0, 1, 2, 3], hashes, everyone)
    assert error.ranks == (2, 3)
    assert error.names == tuple(f"b{i}" for i in range(8))  # every name, though not said
    assert str(error).startswith(
        "ranks [2, 3] resolve backend names differently from the other 2 (compared to rank 0;"
        " no group of ranks is a majority): rank 2 on node-b: added backend 'b0'"
    )
    assert str(error).count("; and 3 more") == 2  # five said a rank, and how many were not
    # Three against one: a majority, said as before.
    three = [everyone[0]] * 3 + [everyone[2]]
    error = mismatch([0, 1, 2, 3], [digest(facts) for _host, facts in three], three)
    assert "(compared to rank 0): rank 3 on node-b" in str(error)
    # Past ten odd ranks, the rest are counted, not said (all are in .ranks).
    many = [everyone[0]] * 13 + [everyone[2]] * 12
    error = mismatch(list(range(25)), [digest(facts) for _host, facts in many], many)
    assert error.ranks == tuple(range(13, 25))
    assert str(error).count(" on node-b: ") == 10
    assert str(error).endswith(" | and 2 more ranks")
    # A backend changed in several fields is named once, with each field.
    changed = MANIFEST.replace("level = 2", "level = 9").replace("builtins:len", "builtins:abs")
    other = project(tmp_path / "other", changed).facts(with_torch=False)
    two = [("node-a", same), ("node-c", other)]
    error = mismatch([0, 1], [digest(facts) for _host, facts in two], two)
    assert str(error).endswith(
        'rank 1 on node-c: changed backend \'fast\': options: {"level": 2} -> {"level": 9},'
        ' target: "builtins:len" -> "builtins:abs"'
    )
