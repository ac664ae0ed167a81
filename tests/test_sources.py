"""Sources and precedence: runtime > env > project > entry-point > torch."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_backend_registry import (
    ManifestWarning,
    Problem,
    Registry,
    UnknownBackendError,
)

from .conftest import NO_TORCH, WriteFn


def make(
    tmp_path: Path,
    env: str = "",
    cwd: Path | None = None,
    sources: tuple[str, ...] = ("runtime", "env", "project"),
) -> Registry:
    environ = {"TORCH_BACKENDS_PATH": env} if env else {}
    return Registry(cwd=cwd or tmp_path, environ=environ, sources=sources)


def test_precedence_runtime_env_project_entry_point(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    make_dist("plugin-dist", "1.2", {"fast": "plugin_pkg:fast", "only_ep": "plugin_pkg:x"})
    project = write("proj/backends.toml", '[backends.fast]\ntarget = "proj:fast"\n')
    env = write("env/extra.toml", '[backends.fast]\ntarget = "env:fast"\n')
    registry = make(tmp_path, env=str(env), cwd=project.parent, sources=NO_TORCH)

    info = registry.backend_info("fast")
    assert (info.source.kind, info.target) == ("env", "env:fast")
    assert [(d.source.kind, d.target) for d in info.shadowed] == [
        ("project", "proj:fast"),
        ("entry-point", "plugin_pkg:fast"),
    ]

    def fast(gm: object, inputs: object) -> object:
        return gm

    registry.register_backend(fast)
    info = registry.backend_info("fast")
    assert info.source.kind == "runtime"
    assert info.source.module == __name__
    assert [d.source.kind for d in info.shadowed] == ["env", "project", "entry-point"]
    assert registry.lookup_backend("fast") is fast

    ep = registry.backend_info("only_ep")
    assert (ep.source.distribution, ep.source.version) == ("plugin-dist", "1.2")
    assert ep.source.path is None
    assert ep.source.line is None


def test_what_resolving_found_stands_beside_the_definition(tmp_path: Path, write: WriteFn) -> None:
    project = write("proj/backends.toml", '[backends.fast]\ntarget = "proj:fast"\n')
    env = write("env/extra.toml", '[backends.fast]\ntarget = "env:fast"\naliases = ["f"]\n')
    registry = make(tmp_path, env=str(env), cwd=project.parent)
    [listed] = registry.definitions()
    info = registry.backend_info("f")
    # The definition is what was declared: equal to itself whatever it shadows.
    assert info.definition == listed
    assert info.definition == registry.backend_info("fast").definition
    assert (info.alias, registry.backend_info("fast").alias) == ("f", None)
    assert [d.source.kind for d in info.shadowed] == ["project"]
    assert info.target == "env:fast"  # the definition's fields read through


def test_env_entries_in_order_and_directories_sorted(tmp_path: Path, write: WriteFn) -> None:
    write("dir/b.toml", '[backends.x]\ntarget = "b:x"\n[backends.y]\ntarget = "b:y"\n')
    write("dir/a.toml", '[backends.x]\ntarget = "a:x"\n')
    write("dir/notes.txt", "not a manifest")
    first = write("first.toml", '[backends.y]\ntarget = "first:y"\n')
    registry = make(tmp_path, env=os.pathsep.join([str(first), str(tmp_path / "dir")]))
    with pytest.warns(ManifestWarning) as said:
        assert registry.backend_info("x").target == "a:x"
    assert sorted(str(w.message).split(": ", 1)[1] for w in said) == [
        f"backend 'x' is also defined by {tmp_path / 'dir' / 'b.toml'}:1; this definition,"
        " from the earlier entry of TORCH_BACKENDS_PATH, is used",
        f"backend 'y' is also defined by {tmp_path / 'dir' / 'b.toml'}:3; this definition,"
        " from the earlier entry of TORCH_BACKENDS_PATH, is used",
    ]
    assert [d.target for d in registry.backend_info("x").shadowed] == ["b:x"]
    assert registry.backend_info("y").target == "first:y"


def test_env_relative_entries_resolve_against_the_working_directory(
    tmp_path: Path, write: WriteFn
) -> None:
    write("conf/extra.toml", '[backends.rel]\ntarget = "m:f"\n')
    registry = make(tmp_path, env="conf/extra.toml")
    assert registry.backend_info("rel").source.path == str(tmp_path / "conf/extra.toml")


def test_missing_env_entry_is_a_manifest_error_never_ignored(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.fine]\ntarget = "m:f"\n')
    registry = make(tmp_path, env=str(tmp_path / "typo.toml"))
    with pytest.warns(ManifestWarning, match="typo.toml: no such file or folder"):
        problems = registry.problems()
    assert len(problems) == 1
    assert isinstance(problems[0], Problem)
    assert problems[0].path == str(tmp_path / "typo.toml")
    # The other manifests still work, and an unknown name points at the problem.
    assert registry.backend_info("fine").target == "m:f"
    with pytest.raises(UnknownBackendError, match="1 manifest problem"):
        registry.lookup_backend("from_typo")


def test_an_env_folder_with_no_manifest_is_said_never_passed_over(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.fine]\ntarget = "m:f"\n')
    write("deploy/README.txt", "the manifests go here")  # but none is here yet
    registry = make(tmp_path, env=str(tmp_path / "deploy"))
    with pytest.warns(ManifestWarning, match="holds no [*].toml manifest: nothing is read"):
        [problem] = registry.problems()
    assert (problem.path, problem.severity) == (str(tmp_path / "deploy"), "warning")
    assert registry.backend_info("fine").target == "m:f"


def test_nearest_project_manifest_from_a_subdirectory(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.top]\ntarget = "m:top"\n')
    write("pkg/pyproject.toml", '[tool.torch-backends.backends.near]\ntarget = "m:near"\n')
    deep = tmp_path / "pkg" / "src" / "deeper"
    deep.mkdir(parents=True)
    registry = make(tmp_path, cwd=deep)
    assert registry.list_backends() == ["near"]
    assert registry.backend_info("near").source.line == 1


def test_backends_toml_wins_over_pyproject_in_the_same_folder(
    tmp_path: Path, write: WriteFn
) -> None:
    write("pyproject.toml", '[tool.torch-backends.backends.py]\ntarget = "m:py"\n')
    write("backends.toml", '[backends.bt]\ntarget = "m:bt"\n')
    assert make(tmp_path).list_backends() == ["bt"]


def test_pyproject_without_table_is_skipped_on_the_way_up(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.top]\ntarget = "m:top"\n')
    write("sub/pyproject.toml", '[project]\nname = "torch-backends-like-name"\n')
    assert make(tmp_path, cwd=tmp_path / "sub").list_backends() == ["top"]


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no ownership model")
def test_a_pyproject_that_cannot_be_read_is_judged_by_what_it_holds(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.top]\ntarget = "m:top"\n')
    # Another tool's pyproject.toml, refused by the trust rule: not this tool's, passed by.
    other = write("refused/pyproject.toml", '[project]\nname = "x"\n')
    other.chmod(0o666)
    registry = make(tmp_path, cwd=other.parent)
    assert (registry.list_backends(), registry.problems()) == (["top"], [])
    # One with the table that is not UTF-8: its error, never the manifest above it instead.
    mine = tmp_path / "latin1" / "pyproject.toml"
    mine.parent.mkdir()
    mine.write_bytes(
        b'[project]\nauthors = [{name = "Jos\xe9"}]\n'
        b'[tool.torch-backends.backends.near]\ntarget = "m:near"\n'
    )
    registry = make(tmp_path, cwd=mine.parent)
    with pytest.warns(ManifestWarning, match="not valid UTF-8"):
        assert registry.list_backends() == []
    [problem] = registry.problems()
    assert (problem.path, problem.line) == (str(mine), 2)
    # A folder of that name holds no table: passed by, as a missing file is.
    (tmp_path / "folder" / "pyproject.toml").mkdir(parents=True)
    registry = make(tmp_path, cwd=tmp_path / "folder")
    assert (registry.list_backends(), registry.problems()) == (["top"], [])


def test_a_file_that_breaks_in_one_table_says_the_whole_file_is_left_out(
    tmp_path: Path, write: WriteFn
) -> None:
    (tmp_path / "backends.toml").write_bytes(
        b'[backends.first]\ntarget = "m:f"\n[backends.second]\ndescription = "caf\xe9"\n'
    )
    with pytest.warns(ManifestWarning) as caught:
        assert make(tmp_path).list_backends() == []
    [said] = [str(w.message) for w in caught]
    assert said.endswith("save the file as UTF-8; no backend of this file is used until then")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_an_env_folder_says_each_toml_that_is_no_file_and_reads_a_file_named_twice_once(
    tmp_path: Path, write: WriteFn
) -> None:
    write("deploy/a.toml", '[backends.a]\ntarget = "m:f"\n')
    os.mkfifo(tmp_path / "deploy" / "fifo.toml")
    (tmp_path / "deploy" / "gone.toml").symlink_to(tmp_path / "nowhere.toml")
    (tmp_path / "deploy" / "same.toml").symlink_to("a.toml")
    env = os.pathsep.join([str(tmp_path / "deploy"), str(tmp_path / "deploy" / "a.toml")])
    registry = make(tmp_path, env=env)
    with pytest.warns(ManifestWarning):
        problems = {Path(p.path or "").name: p.message for p in registry.problems()}
    assert problems == {
        "fifo.toml": "is not a regular file; name a .toml file",
        "gone.toml": "no such file",
    }
    info = registry.backend_info("a")  # one manifest: it shadows no copy of itself
    assert (Path(info.source.path).name, info.shadowed) == ("a.toml", ())


def test_disabled_hides_lower_sources(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    make_dist("noisy", "0.1", {"noisy": "noisy:compile"})
    write("backends.toml", "[backends.noisy]\nenabled = false\n")
    registry = make(tmp_path, sources=NO_TORCH)
    assert "noisy" not in registry.list_backends(exclude_tags=())
    with pytest.raises(UnknownBackendError, match=r"disabled by .*backends.toml:1"):
        registry.lookup_backend("noisy")


def test_aliases_resolve_and_follow_precedence(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.fast]\ntarget = "m:fast"\naliases = ["f", "quick"]\n')
    env = write("env.toml", '[backends.quick]\ntarget = "env:quick"\n')
    registry = make(tmp_path, env=str(env))
    assert registry.backend_info("f").name == "fast"
    assert registry.backend_info("quick").target == "env:quick"
    assert registry.list_backends() == ["fast", "quick"]


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no file ownership")
def test_world_writable_manifest_is_not_used(tmp_path: Path, write: WriteFn) -> None:
    path = write("backends.toml", '[backends.x]\ntarget = "m:f"\n')
    path.chmod(0o666)
    registry = make(tmp_path)
    with pytest.warns(ManifestWarning, match="manifest not used: it is writable by every user"):
        assert registry.list_backends() == []
    path.chmod(0o644)
    registry.refresh()
    assert registry.list_backends() == ["x"]


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown")
def test_manifest_of_another_user_is_not_used(tmp_path: Path, write: WriteFn) -> None:
    path = write("backends.toml", '[backends.x]\ntarget = "m:f"\n')
    os.chown(path, 12345, -1)
    registry = make(tmp_path)
    with pytest.warns(ManifestWarning, match=r"owned by another user \(uid 12345\)"):
        assert registry.list_backends() == []
    assert any("owned by another user" in str(p) for p in registry.problems())


def test_entry_point_with_extras_and_two_distributions(
    tmp_path: Path, make_dist: Callable[..., Path]
) -> None:
    make_dist("first-dist", "1.0", {"dup": "first_mod:fn [extra]"})
    make_dist("second-dist", "2.0", {"dup": "second_mod:fn"})
    with pytest.warns(ManifestWarning, match="'first-dist' 1.0 is used"):
        info = make(tmp_path, sources=NO_TORCH).backend_info("dup")
    assert info.target == "first_mod:fn"  # the extras are not part of the target
    assert len(info.shadowed) == 1
    assert {info.source.distribution, info.shadowed[0].source.distribution} == {
        "first-dist",
        "second-dist",
    }


def test_registry_rejects_unknown_source_kinds() -> None:
    with pytest.raises(ValueError, match="unknown source kind 'pip'"):
        Registry(sources=("pip",))


def test_sources_given_in_any_order_keep_the_documented_precedence() -> None:
    assert Registry(sources=("torch", "runtime", "env")).sources == ("runtime", "env", "torch")


def test_pyproject_problems_name_the_full_key(tmp_path: Path, write: WriteFn) -> None:
    write(
        "pyproject.toml",
        """
        [tool.torch-backends]
        default = "nowhere"

        [tool.torch-backends.backends.loop]
        chain = ["loop"]

        [tool.torch-backends.backends.typo]
        target = "m:f"
        tag = []
        """,
    )
    registry = make(tmp_path)
    with pytest.warns(ManifestWarning):
        problems = [p for p in registry.problems() if isinstance(p, Problem)]
    assert sorted((p.line, p.key) for p in problems) == [
        (2, "tool.torch-backends.default"),
        (5, "tool.torch-backends.backends.loop.chain"),  # the chain key's own line
        (9, "tool.torch-backends.backends.typo.tag"),
    ]


LAYERS = ("env", "project", "entry-point")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    placement=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.sets(st.sampled_from(LAYERS), min_size=1),
        min_size=1,
    )
)
def test_any_placement_resolves_to_the_highest_source(
    tmp_path_factory: pytest.TempPathFactory, placement: dict[str, set[str]]
) -> None:
    root = tmp_path_factory.mktemp("placement")
    env_lines, project_lines, entry_points = [], [], []
    for name, layers in placement.items():
        if "env" in layers:
            env_lines.append(f'[backends.{name}]\ntarget = "env_mod:{name}"\n')
        if "project" in layers:
            project_lines.append(f'[backends.{name}]\ntarget = "project_mod:{name}"\n')
        if "entry-point" in layers:
            entry_points.append(f"{name} = ep_mod:{name}\n")
    (root / "env.toml").write_text("".join(env_lines), encoding="utf-8")
    (root / "backends.toml").write_text("".join(project_lines), encoding="utf-8")
    info = root / "dists" / "placed-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: placed\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\n" + "".join(entry_points))
    sys.path.insert(0, str(root / "dists"))
    importlib.invalidate_caches()
    try:
        registry = Registry(
            cwd=root,
            environ={"TORCH_BACKENDS_PATH": str(root / "env.toml")},
            sources=("env", "project", "entry-point"),
        )
        # Other installed distributions may add names; ours are single letters.
        assert [n for n in registry.list_backends() if len(n) == 1] == sorted(placement)
        for name, layers in placement.items():
            expected = [kind for kind in LAYERS if kind in layers]
            info_ = registry.backend_info(name)
            got = [info_.source.kind] + [d.source.kind for d in info_.shadowed]
            assert got == expected
    finally:
        sys.path.remove(str(root / "dists"))
        importlib.invalidate_caches()
