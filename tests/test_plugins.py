"""Entry points that cannot surprise: conflicts shown, one rule, a manifest's pick, a policy.

Distributions are real ``*.dist-info`` folders on sys.path, as pip leaves them.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import torch_backend_registry as tbr
from torch_backend_registry import ManifestError, ManifestWarning, Registry, UnknownBackendError
from torch_backend_registry._definition import distribution_key

from .conftest import PLUGINS, Done, WriteFn, run_forked, torch_backends

MakeDist = Callable[..., Path]


def dist_in(folder: Path, name: str, version: str, entry_points: dict[str, str]) -> Path:
    """A distribution installed into ``folder`` (which the caller puts on sys.path)."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\n{lines}")
    importlib.invalidate_caches()
    return info


def registry(folder: Path, **environ: str) -> Registry:
    return Registry(cwd=folder, environ=environ, sources=("env", "project", "entry-point"))


def ours(names: list[str]) -> list[str]:
    """The names a test made (real plugins may be installed beside them)."""
    return [name for name in names if name not in PLUGINS]


def listed(reg: Registry) -> tuple[list[str], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = reg.list_backends(exclude_tags=())
        reg.list_backends(exclude_tags=())  # a second listing says nothing new
    said = [str(w.message) for w in caught if issubclass(w.category, ManifestWarning)]
    return ours(names), said


def test_two_distributions_declaring_a_name_are_shown_and_resolved_by_one_rule(
    tmp_path: Path, make_dist: MakeDist
) -> None:
    make_dist("zeta-dist", "2.0", {"dup": "zeta_mod:fn"})
    make_dist("alpha-dist", "1.0", {"dup": "alpha_mod:fn"})
    reg = registry(tmp_path)
    names, said = listed(reg)
    assert names == ["dup"]
    assert said == [
        "entry point 'dup' is declared by 'alpha-dist' 1.0 and 'zeta-dist' 2.0: 'alpha-dist'"
        " 1.0 is used, the first on sys.path, then by name; say which with"
        ' `distribution = "..."` in a [backends.dup] table of a manifest'
    ]
    info = reg.backend_info("dup")
    assert (info.source.distribution, info.target) == ("alpha-dist", "alpha_mod:fn")
    assert [d.source.distribution for d in info.shadowed] == ["zeta-dist"]
    assert any("declared by 'alpha-dist' 1.0" in str(p) for p in reg.problems())


def test_an_earlier_folder_on_sys_path_wins_whatever_the_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist_in(tmp_path / "first", "zz-early", "1.0", {"dup": "early:fn"})
    dist_in(tmp_path / "second", "aa-late", "1.0", {"dup": "late:fn"})
    monkeypatch.syspath_prepend(str(tmp_path / "second"))
    monkeypatch.syspath_prepend(str(tmp_path / "first"))
    with pytest.warns(ManifestWarning, match="'zz-early' 1.0 is used"):
        assert registry(tmp_path).backend_info("dup").target == "early:fn"


def test_a_manifest_says_which_distribution_provides_a_name(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("alpha-dist", "1.0", {"dup": "alpha_mod:fn"})
    make_dist("zeta-dist", "2.0", {"dup": "zeta_mod:fn"})
    write("backends.toml", '[backends.dup]\ndistribution = "Zeta_Dist"\ntags = ["chosen"]\n')
    reg = registry(tmp_path)
    names, said = listed(reg)
    assert (names, said) == (["dup"], [])  # picked: no conflict to report
    info = reg.backend_info("dup")
    assert info.target == "zeta_mod:fn"
    assert info.tags == ("chosen",)
    assert (info.source.kind, info.source.line) == ("project", 1)
    assert (info.source.distribution, info.source.version) == ("zeta-dist", "2.0")


def test_a_pick_of_a_distribution_that_does_not_declare_the_name_is_a_problem(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("alpha-dist", "1.0", {"dup": "alpha_mod:fn"})
    write("backends.toml", '# pick\n[backends.dup]\ndistribution = "gamma"\n')
    reg = registry(tmp_path)
    with pytest.raises(ManifestError) as caught:
        reg.lookup_backend("dup")
    problem = caught.value
    assert (problem.line, problem.key) == (3, "backends.dup.distribution")  # the key's line
    assert problem.message == (
        "no installed distribution 'gamma' declares the entry point 'dup' (declared by:"
        " 'alpha-dist' 1.0)"
    )


def test_the_same_distribution_seen_twice_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist_in(tmp_path / "site", "once-dist", "1.0", {"once": "once_mod:fn"})
    (tmp_path / "lib64").symlink_to(tmp_path / "site")  # as a lib64 link to lib
    monkeypatch.syspath_prepend(str(tmp_path / "lib64"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(tmp_path / "site") + "/")  # the same folder, spelt again
    reg = registry(tmp_path)
    assert listed(reg) == (["once"], [])
    assert reg.backend_info("once").shadowed == ()


def test_a_deny_list_leaves_a_plugin_out_and_says_where(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("sketchy-plugin", "0.1", {"sketchy": "sketchy_mod:fn"})
    make_dist("good-plugin", "1.0", {"good": "good_mod:fn"})
    path = write("backends.toml", '[plugins]\ndeny = ["Sketchy_Plugin"]\n')
    reg = registry(tmp_path)
    assert ours(reg.list_backends()) == ["good"]
    with pytest.raises(UnknownBackendError) as caught:
        reg.lookup_backend("sketchy")
    assert caught.value.note == (
        f"distribution 'sketchy-plugin' is denied by {path}:2 (plugins.deny)"
    )


def test_an_allow_list_admits_only_its_distributions(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("sketchy-plugin", "0.1", {"sketchy": "sketchy_mod:fn"})
    make_dist("good-plugin", "1.0", {"good": "good_mod:fn"})
    path = write("pyproject.toml", '[tool.torch-backends.plugins]\nallow = ["good-plugin"]\n')
    reg = registry(tmp_path)
    assert reg.list_backends() == ["good"]
    with pytest.raises(UnknownBackendError, match="is not allowed by"):
        reg.lookup_backend("sketchy")
    with pytest.raises(UnknownBackendError) as caught:
        reg.lookup_backend("sketchy")
    assert caught.value.note.endswith(f"{path}:2 (tool.torch-backends.plugins.allow)")


def test_the_environment_policy_outranks_the_manifests(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("sketchy-plugin", "0.1", {"sketchy": "sketchy_mod:fn"})
    make_dist("good-plugin", "1.0", {"good": "good_mod:fn"})
    write("backends.toml", '[plugins]\nallow = ["sketchy-plugin", "good-plugin"]\n')
    reg = registry(tmp_path, TORCH_BACKENDS_DENY="good-plugin, other")
    with pytest.warns(ManifestWarning, match="the deny list names 'other', which is no installed"):
        assert reg.list_backends() == ["sketchy"]
    with pytest.raises(UnknownBackendError, match="'good-plugin' is denied by TORCH_BACKENDS_DENY"):
        reg.lookup_backend("good")
    # An empty variable is unset: the manifest's allow list stands.
    assert registry(tmp_path, TORCH_BACKENDS_DENY="").list_backends() == ["good", "sketchy"]


def test_explain_names_the_policy_and_both_distributions(tmp_path: Path, write: WriteFn) -> None:
    site = tmp_path / "site"
    dist_in(site, "alpha-dist", "1.0", {"dup": "alpha_mod:fn"})
    dist_in(site, "zeta-dist", "2.0", {"dup": "zeta_mod:fn"})
    dist_in(site, "sketchy-plugin", "0.1", {"sketchy": "sketchy_mod:fn"})
    write("backends.toml", '[plugins]\ndeny = ["sketchy-plugin"]\n')

    def explain(name: str) -> Done:
        return torch_backends(
            "explain", name, "--no-torch", cwd=tmp_path, env={"PYTHONPATH": str(site)}, check=None
        )

    both = explain("dup")
    assert "source:      entry-point: distribution 'alpha-dist' 1.0" in both.stdout
    assert "source:      entry-point: distribution 'zeta-dist' 2.0" in both.stdout
    assert "declared by 'alpha-dist' 1.0 and 'zeta-dist' 2.0" in both.stderr  # warned once
    denied = explain("sketchy")
    assert denied.returncode == 1
    assert "denied by backends.toml:2 (plugins.deny)" in denied.stderr or (
        f"denied by {tmp_path / 'backends.toml'}:2 (plugins.deny)" in denied.stderr
    )


def test_torch_compile_agrees_with_the_policy_and_the_pick(
    tmp_path: Path, write: WriteFn, make_module: Callable[..., str], module_name: str
) -> None:
    torch = pytest.importorskip("torch")
    counting = make_module(
        module_name,
        "CALLS = []\n"
        "def first(gm, inputs):\n    CALLS.append('first')\n    return gm.forward\n"
        "def second(gm, inputs):\n    CALLS.append('second')\n    return gm.forward\n",
    )
    uid = module_name[-6:]
    site = tmp_path / "site"
    dist_in(site, f"aa-{uid}", "1.0", {f"dup_{uid}": f"{counting}:first"})
    dist_in(site, f"bb-{uid}", "1.0", {f"dup_{uid}": f"{counting}:second"})
    dist_in(site, f"denied-{uid}", "1.0", {f"denied_{uid}": f"{counting}:first"})
    sys.path.insert(0, str(site))
    try:
        write(
            "backends.toml",
            f'[plugins]\ndeny = ["denied-{uid}"]\n'
            f'[backends.dup_{uid}]\ndistribution = "bb-{uid}"\n',
        )
        reg = registry(tmp_path)
        tbr.install(reg)
        module = __import__(counting)
        torch._dynamo.reset()
        torch.compile(torch.nn.Linear(2, 2), backend=f"dup_{uid}")(torch.ones(1, 2))
        assert module.CALLS == ["second"]  # the pick, not the first on the folder
        with pytest.raises(Exception, match="denied by"):
            torch.compile(torch.nn.Linear(2, 2), backend=f"denied_{uid}")(torch.ones(1, 2))
    finally:
        sys.path.remove(str(site))
        torch._dynamo.reset()


@given(st.text(alphabet=st.sampled_from("aB9-_.-_.x\u0130"), max_size=40) | st.text(max_size=20))
def test_distribution_names_normalise_as_pep_503_says(name: str) -> None:
    assert distribution_key(name) == re.sub(r"[-_.]+", "-", name).lower()


def test_deny_lists_combine_and_only_an_explicit_allow_admits_again(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("sketchy-plugin", "0.1", {"sketchy": "sketchy_mod:fn"})
    make_dist("unrelated-pkg", "1.0", {"unrelated": "unrelated_mod:fn"})
    write("backends.toml", '[plugins]\ndeny = ["sketchy-plugin"]\n')
    # Another deny list elsewhere, or the environment's, does not undo the project's.
    assert "sketchy" not in registry(tmp_path, TORCH_BACKENDS_DENY="unrelated-pkg").list_backends()
    extra = write("site.toml", '[plugins]\ndeny = ["unrelated-pkg"]\n')
    assert "sketchy" not in registry(tmp_path, TORCH_BACKENDS_PATH=str(extra)).list_backends()
    # An allow of that very distribution, above the deny, admits it: explain says why.
    admitting = write("admit.toml", '[plugins]\nallow = ["sketchy-plugin", "unrelated-pkg"]\n')
    reg = registry(tmp_path, TORCH_BACKENDS_PATH=str(admitting))
    assert "sketchy" in reg.list_backends()
    said = reg.index(with_torch=False).admitted["sketchy"]
    assert said.startswith("distribution 'sketchy-plugin' is allowed by")
    assert "over the deny of" in said
    assert "backends.toml:2 (plugins.deny)" in said


def test_a_pick_the_policy_excludes_names_the_policy_line(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    make_dist("acme-fast", "1.0", {"fast": "acme_mod:fn"})
    write(
        "backends.toml",
        '[plugins]\nallow = ["other-dist"]\n[backends.fast]\ndistribution = "acme-fast"\n',
    )
    reg = registry(tmp_path)
    with pytest.warns(ManifestWarning), pytest.raises(ManifestError) as caught:
        reg.lookup_backend("fast")
    assert "is not allowed by" in caught.value.message
    assert "backends.toml:2 (plugins.allow)" in caught.value.message
    assert "no installed distribution" not in caught.value.message


def test_an_allow_list_naming_nothing_installed_says_so(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.mine]\ntarget = "m:f"\n')
    reg = registry(tmp_path, TORCH_BACKENDS_ALLOW="nosuchdist")
    with pytest.warns(
        ManifestWarning, match="TORCH_BACKENDS_ALLOW: the allow list names 'nosuchdist'"
    ):
        reg.list_backends()


def test_an_allow_or_deny_list_of_commas_alone_is_unset(
    tmp_path: Path, make_dist: MakeDist
) -> None:
    make_dist("tbr-commas", "1.0", {"from_commas": "commas_mod:fn"})
    for var in ("TORCH_BACKENDS_ALLOW", "TORCH_BACKENDS_DENY"):
        for value in (",", " , ,", ""):
            listed = registry(tmp_path, **{var: value}).list_backends()
            assert "from_commas" in listed, (var, value)


SELF_REGISTERING = """
import torch._dynamo

@torch._dynamo.register_backend(name="tbr_self_registered")
def compile(gm, example_inputs):
    import pathlib, os
    pathlib.Path(os.environ["TBR_MARKER"]).write_text("ran")
    return gm.forward
"""


def test_a_denied_plugin_that_registers_itself_on_import_never_runs(
    tmp_path: Path, write: WriteFn, make_dist: MakeDist
) -> None:
    pytest.importorskip("torch")
    info = make_dist("tbr-self-reg", "1.0", {})
    (info / "top_level.txt").write_text("tbr_self_reg_mod\n")
    (info.parent / "tbr_self_reg_mod.py").write_text(SELF_REGISTERING)
    marker = tmp_path / "ran"
    write("backends.toml", '[plugins]\ndeny = ["tbr-self-reg"]\n[backends.mine]\ntarget = "m:f"\n')
    code = """
import torch, torch_backend_registry as tbr
import tbr_self_reg_mod  # something imported it: it registered itself
try:
    tbr.lookup_backend("tbr_self_registered")
except tbr.UnknownBackendError as exc:
    print("lookup:", exc)
tbr.install()
try:
    torch.compile(torch.nn.Linear(2, 2), backend="tbr_self_registered")(torch.randn(1, 2))
except Exception as exc:
    print("compile:", type(exc).__name__, "denied by" in str(exc))
"""
    environ = {"PYTHONPATH": str(info.parent), "TBR_MARKER": str(marker)}
    done = run_forked(code, cwd=tmp_path, env=environ)
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert said[0].startswith("lookup: unknown backend 'tbr_self_registered' (distribution")
    assert "denied by" in said[0]
    assert said[1] == "compile: BackendCompilerFailed True"
    assert not marker.exists()
