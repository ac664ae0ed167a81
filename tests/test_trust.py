"""Code only from trusted places: the trust rule for files and folders, python-path, requires."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from torch_backend_registry import (
    BackendLoadError,
    LockFileError,
    ManifestWarning,
    Problem,
    Registry,
    UnknownBackendError,
    install,
)

from .conftest import WriteFn, torch_backends

posix_only = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no ownership model")
OTHER_UID = 65534  # nobody


@pytest.fixture(autouse=True)
def _forget_modules() -> Iterator[None]:
    """Modules these tests import come from tmp_path: forget them after each test."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("tbr_trust_"):
            del sys.modules[name]


def project(folder: Path, environ: dict[str, str] | None = None) -> Registry:
    return Registry(cwd=folder, environ=environ or {}, sources=("env", "project"))


def quietly_list(registry: Registry) -> tuple[list[str], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = registry.list_backends(exclude_tags=())
    return names, [str(w.message) for w in caught if issubclass(w.category, ManifestWarning)]


# ------------------------------------------------------------ links and relative paths


@posix_only
def test_a_linked_manifest_takes_code_from_the_real_files_folder_never_the_links(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "trusted/backends.toml",
        'python-path = ["plugins"]\n[backends.b]\ntarget = "tbr_trust_mod:fn"\n',
    )
    write("trusted/plugins/tbr_trust_mod.py", "def fn(gm, inputs):\n    return 'real'\n")
    # Beside the link, where whoever placed it controls the folder, a look-alike.
    write("elsewhere/plugins/tbr_trust_mod.py", "def fn(gm, inputs):\n    return 'attacker'\n")
    (tmp_path / "elsewhere/backends.toml").symlink_to(tmp_path / "trusted/backends.toml")
    registry = project(tmp_path / "elsewhere")
    assert registry.backend_info("b").python_path == (str(tmp_path / "trusted/plugins"),)
    assert registry.lookup_backend("b")(None, []) == "real"


@posix_only
def test_a_link_in_an_env_folder_resolves_against_the_real_file(
    tmp_path: Path, write: WriteFn
) -> None:
    write("real/m.toml", 'python-path = ["p"]\n[backends.e]\ntarget = "tbr_trust_e:fn"\n')
    (tmp_path / "env").mkdir()
    (tmp_path / "env/m.toml").symlink_to(tmp_path / "real/m.toml")
    registry = project(tmp_path, {"TORCH_BACKENDS_PATH": str(tmp_path / "env")})
    assert registry.backend_info("e").python_path == (str(tmp_path / "real/p"),)


# ---------------------------------------------------------------- untrusted places


@posix_only
@pytest.mark.parametrize(
    ("place", "reason"),
    [
        ("file writable by all", "manifest not used: it is writable by every user"),
        (
            "file of another user",
            f"manifest not used: it is owned by another user (uid {OTHER_UID})",
        ),
        (
            "folder writable by all",
            "manifest not used: the folder holding it is writable by every user",
        ),
        (
            "folder of another user",
            f"manifest not used: the folder holding it is owned by another user (uid {OTHER_UID})",
        ),
    ],
)
def test_an_untrusted_manifest_or_folder_is_not_used_and_says_why(
    tmp_path: Path, write: WriteFn, place: str, reason: str
) -> None:
    path = write("proj/backends.toml", '[backends.b]\ntarget = "m:f"\n')
    target = path if place.startswith("file") else path.parent
    if "writable" in place:
        target.chmod(target.stat().st_mode | 0o002)
    else:
        os.chown(target, OTHER_UID, -1)
    names, messages = quietly_list(project(tmp_path / "proj"))
    assert names == []
    assert messages == [f"{path}: {reason}; fix its owner or mode (as git's safe.directory)"]


@posix_only
def test_an_untrusted_lock_or_pyproject_is_refused_in_the_words_of_the_file_it_is(
    tmp_path: Path, write: WriteFn
) -> None:
    # Read by the command and install(), not as a source: the trust rule's refusal is their
    # one-line error, naming the lock as a lock, never a crash of an internal class.
    write("proj/backends.toml", '[backends.b]\ntarget = "m:f"\n')
    torch_backends("lock", cwd=tmp_path / "proj")
    lock = tmp_path / "proj" / "backends.lock"
    lock.chmod(lock.stat().st_mode | 0o002)
    refused = torch_backends("check", "--locked", "--no-torch", cwd=tmp_path / "proj", check=1)
    said = "lock file not used: it is writable by every user; fix its owner or mode"
    assert f"backends.lock: error: {said}" in refused.stdout + refused.stderr
    assert "Untrusted" not in refused.stderr
    registry = Registry(cwd=tmp_path / "proj", environ={"TORCH_BACKENDS_LOCKED": "1"})
    with pytest.raises(LockFileError, match=said):
        install(registry)  # refused before anything is installed
    # A pyproject.toml the rule refuses declares no table: init writes a backends.toml
    # beside it, and init --pyproject says why it will not add to it.
    pyproject = write("other/pyproject.toml", "[tool.black]\n")
    pyproject.chmod(0o666)
    added = torch_backends("init", "--pyproject", cwd=pyproject.parent, check=1)
    assert added.stderr.strip().endswith(
        "pyproject.toml: manifest not used: it is writable by every user; fix its owner or mode"
        " (as git's safe.directory)"
    )
    torch_backends("init", cwd=pyproject.parent)
    assert (pyproject.parent / "backends.toml").exists()


@posix_only
def test_a_sticky_folder_writable_by_all_may_hold_a_trusted_manifest(
    tmp_path: Path, write: WriteFn
) -> None:
    # As the system's temporary folder: only a file's owner can rename or remove it.
    path = write("shared/backends.toml", '[backends.b]\ntarget = "m:f"\n')
    path.parent.chmod(0o1777)
    names, messages = quietly_list(project(path.parent))
    assert (names, messages) == (["b"], [])


@posix_only
def test_a_group_writable_manifest_is_used_as_git_does(tmp_path: Path, write: WriteFn) -> None:
    path = write("proj/backends.toml", '[backends.b]\ntarget = "m:f"\n')
    path.chmod(0o664)
    path.parent.chmod(0o775)
    assert quietly_list(project(path.parent)) == (["b"], [])


@posix_only
def test_an_env_folder_writable_by_all_is_not_read(tmp_path: Path, write: WriteFn) -> None:
    write("drop/evil.toml", '[backends.evil]\ntarget = "m:f"\n')
    (tmp_path / "drop").chmod(0o777)
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    registry = project(tmp_path / "proj", {"TORCH_BACKENDS_PATH": str(tmp_path / "drop")})
    names, messages = quietly_list(registry)
    assert names == ["good"]
    assert messages == [
        f"{tmp_path / 'drop'}: folder named by TORCH_BACKENDS_PATH not used: it is writable by"
        " every user; fix its owner or mode (as git's safe.directory)"
    ]


@posix_only
@pytest.mark.parametrize("how", ["writable by all", "owned by another user"])
def test_an_untrusted_python_path_folder_serves_no_code(
    tmp_path: Path, write: WriteFn, how: str
) -> None:
    write("proj/backends.toml", 'python-path = ["p"]\n[backends.b]\ntarget = "tbr_trust_p:fn"\n')
    module = write("proj/p/tbr_trust_p.py", "def fn(gm, inputs):\n    return 1\n")
    if how == "writable by all":
        module.parent.chmod(0o777)
    else:
        os.chown(module.parent, OTHER_UID, -1)
    registry = project(tmp_path / "proj")
    with (
        pytest.warns(ManifestWarning, match=r"python-path folder .*/p' not used: it is"),
        pytest.raises(BackendLoadError, match=r"No module named 'tbr_trust_p'.*not used"),
    ):
        registry.lookup_backend("b")
    assert "tbr_trust_p" not in sys.modules
    # Nor does it meet a requirement, nor serve doctor's model; check says why, as a lookup.
    write(
        "proj/backends.toml",
        'python-path = ["p"]\n[backends.b]\ntarget = "os:getcwd"\nrequires = ["tbr_trust_p"]\n',
    )
    registry.refresh()
    assert registry.why_unavailable(registry.backend_info("b")) == "missing tbr_trust_p"
    said = torch_backends("check", "--no-torch", cwd=tmp_path / "proj").stdout
    assert "backends.toml:1: warning: python-path: python-path folder" in said
    assert "/p' not used: it is" in said
    if importlib.util.find_spec("torch") is not None:
        model = torch_backends(
            "doctor", "--model", "tbr_trust_p:fn", cwd=module.parent.parent, check=2
        )
        assert "python-path folder" in model.stderr
        assert "not used" in model.stderr
        assert "tbr_trust_p" not in sys.modules


# ---------------------------------------------------------------- python-path isolation


def test_a_python_path_folder_never_shadows_an_importable_module(
    tmp_path: Path, write: WriteFn
) -> None:
    import colorsys

    write(
        "proj/backends.toml", 'python-path = ["p"]\n[backends.c]\ntarget = "colorsys:rgb_to_hsv"\n'
    )
    write("proj/p/colorsys.py", "def rgb_to_hsv(*a):\n    return 'shadowed'\n")
    assert project(tmp_path / "proj").lookup_backend("c") is colorsys.rgb_to_hsv


def test_another_threads_import_never_sees_a_manifests_folder(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "proj/backends.toml", 'python-path = ["p"]\n[backends.slow]\ntarget = "tbr_trust_slow:fn"\n'
    )
    # The target waits, mid-import, until the other thread has tried its own import.
    write(
        "proj/p/tbr_trust_slow.py",
        "import builtins\nbuiltins.tbr_trust_started.set()\nbuiltins.tbr_trust_go.wait(10)\n"
        "def fn(gm, inputs):\n    return 1\n",
    )
    write("proj/p/tbr_trust_other.py", "VALUE = 'from the manifest folder'\n")
    import builtins

    started, go = threading.Event(), threading.Event()
    builtins.tbr_trust_started, builtins.tbr_trust_go = started, go  # type: ignore[attr-defined]
    registry = project(tmp_path / "proj")
    path_before = list(sys.path)
    looker = threading.Thread(target=registry.lookup_backend, args=("slow",))
    looker.start()
    try:
        assert started.wait(10)
        with pytest.raises(ModuleNotFoundError):
            import tbr_trust_other  # type: ignore[import-not-found]  # noqa: F401
    finally:
        go.set()
        looker.join(10)
    assert sys.path == path_before
    assert callable(registry.lookup_backend("slow"))
    del builtins.tbr_trust_started, builtins.tbr_trust_go  # type: ignore[attr-defined]


def test_a_loaded_target_imports_its_siblings_later_at_compile_time(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "proj/backends.toml",
        'python-path = ["p"]\n[backends.lazy]\ntarget = "tbr_trust_lazy:compile"\n',
    )
    # A heavy dependency imported inside the compiler function, not at the module's top.
    write(
        "proj/p/tbr_trust_lazy.py",
        "def compile(gm, inputs):\n"
        "    import tbr_trust_sibling\n"
        "    return tbr_trust_sibling.VALUE\n",
    )
    write("proj/p/tbr_trust_sibling.py", "VALUE = 'the sibling'\n")
    registry = project(tmp_path / "proj")
    path_before = list(sys.path)
    compiler = registry.lookup_backend("lazy")
    try:
        assert compiler(None, []) == "the sibling"  # after the lookup, at compile time
        assert sys.path == path_before
    finally:
        sys.modules.pop("tbr_trust_lazy", None)
        sys.modules.pop("tbr_trust_sibling", None)


def test_sys_path_is_never_changed_by_a_lookup_success_or_failure(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "proj/backends.toml",
        'python-path = ["p", "./p", "p/../p"]\n'
        '[backends.ok]\ntarget = "tbr_trust_ok:fn"\n'
        '[backends.bad]\ntarget = "tbr_trust_bad:fn"\n',
    )
    write("proj/p/tbr_trust_ok.py", "def fn(gm, inputs):\n    return 1\n")
    write("proj/p/tbr_trust_bad.py", "raise RuntimeError('broken on import')\n")
    registry = project(tmp_path / "proj")
    assert registry.backend_info("ok").python_path == (str(tmp_path / "proj/p"),)
    path_before, meta_before = list(sys.path), len(sys.meta_path)
    registry.lookup_backend("ok")
    with pytest.raises(BackendLoadError, match="broken on import"):
        registry.lookup_backend("bad")
    assert sys.path == path_before
    assert len(sys.meta_path) <= meta_before + 1  # at most the one finder, once


@pytest.mark.parametrize(
    ("entry", "message"),
    [('"a\\u0000b"', "without NUL characters"), ('""', "must not be empty")],
)
def test_an_invalid_python_path_entry_is_a_manifest_error_at_its_line(
    tmp_path: Path, write: WriteFn, entry: str, message: str
) -> None:
    path = write("proj/backends.toml", f'python-path = [\n  "ok",\n  {entry},\n]\n')
    registry = project(path.parent)
    with pytest.warns(ManifestWarning):
        [problem] = registry.problems()
    assert isinstance(problem, Problem)
    assert (problem.line, problem.key) == (1, "python-path")
    assert message in problem.message


# ---------------------------------------------------------------- requires


def test_dotted_requires_run_no_code_of_any_parent(tmp_path: Path, write: WriteFn) -> None:
    write("site/tbr_trust_pkg/__init__.py", "raise SystemExit('parent package ran')\n")
    write("site/tbr_trust_pkg/sub/__init__.py", "raise SystemExit('sub package ran')\n")
    write("site/tbr_trust_pkg/sub/mod.py", "")
    write(
        "proj/backends.toml",
        '[backends.b]\ntarget = "m:f"\nrequires = ["tbr_trust_pkg.sub.mod"]\n'
        '[backends.m]\ntarget = "m:f"\nrequires = ["tbr_trust_pkg.sub.missing"]\n',
    )
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        registry = project(tmp_path / "proj")
        assert registry.why_unavailable(registry.backend_info("b")) is None
        assert registry.why_unavailable(registry.backend_info("m")) == (
            "missing tbr_trust_pkg.sub.missing"
        )
        assert not any(name.startswith("tbr_trust_pkg") for name in sys.modules)
    finally:
        sys.path.remove(str(tmp_path / "site"))


def test_requires_are_found_in_the_manifests_python_path(tmp_path: Path, write: WriteFn) -> None:
    write(
        "proj/backends.toml",
        'python-path = ["p"]\n[backends.b]\ntarget = "m:f"\nrequires = ["tbr_trust_helper"]\n',
    )
    write("proj/p/tbr_trust_helper.py", "raise SystemExit('must not run')\n")
    registry = project(tmp_path / "proj")
    assert registry.why_unavailable(registry.backend_info("b")) is None
    assert "tbr_trust_helper" not in sys.modules


# ---------------------------------------------------------------- fix it, look again


def test_a_python_path_folder_created_after_a_failed_lookup_is_used(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "proj/backends.toml", 'python-path = ["later"]\n[backends.b]\ntarget = "tbr_trust_l:fn"\n'
    )
    registry = project(tmp_path / "proj")
    with pytest.raises(BackendLoadError, match="No module named 'tbr_trust_l'"):
        registry.lookup_backend("b")
    write("proj/later/tbr_trust_l.py", "def fn(gm, inputs):\n    return 'now'\n")
    assert registry.lookup_backend("b")(None, []) == "now"


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ("def other(gm, inputs):\n    return 0\n", "has no attribute 'fn'"),
        ("fn = 42\n", "is an int, which is not callable"),
        ("import tbr_trust_dep\ndef fn(gm, inputs):\n    return tbr_trust_dep.X\n", None),
    ],
    ids=["attribute missing", "not callable", "a dependency fails"],
)
def test_fixing_the_code_makes_the_next_lookup_work_without_refresh(
    tmp_path: Path, write: WriteFn, broken: str, reason: str | None
) -> None:
    write("proj/backends.toml", 'python-path = ["p"]\n[backends.b]\ntarget = "tbr_trust_fix:fn"\n')
    write("proj/p/tbr_trust_dep.py", "X = 1\nraise ImportError('dependency broken')\n")
    write("proj/p/tbr_trust_fix.py", broken)
    registry = project(tmp_path / "proj")
    with pytest.raises(BackendLoadError, match=reason or "dependency broken"):
        registry.lookup_backend("b")
    write("proj/p/tbr_trust_dep.py", "X = 'fixed'\n")
    write(
        "proj/p/tbr_trust_fix.py", "import tbr_trust_dep\ndef fn(gm, inputs):\n    return 'fixed'\n"
    )
    assert registry.lookup_backend("b")(None, []) == "fixed"
    with pytest.raises(UnknownBackendError):
        registry.lookup_backend("nothing_of_that_name")
