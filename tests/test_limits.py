"""Bounded cost for any input, errors that stay on their line, faults that spare the rest."""

from __future__ import annotations

import operator
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from torch_backend_registry import (
    ManifestError,
    ManifestWarning,
    Problem,
    Registry,
    UnknownBackendError,
)
from torch_backend_registry._members import MAX_CHAIN_DEPTH
from torch_backend_registry._sources.files import MAX_BYTES, MAX_KEY_PARTS
from torch_backend_registry._sources.manifest import MAX_PROBLEMS, MAX_VALUE_DEPTH, read_manifest

from .conftest import WriteFn, run_as_nobody, torch_backends

ROOT = Path(__file__).resolve().parent.parent


def env_registry(path: Path, *more: str) -> Registry:
    return Registry(
        cwd=path.parent,
        environ={"TORCH_BACKENDS_PATH": str(path)},
        sources=("runtime", "env", *more),
    )


def problems_of(path: Path) -> list[Problem]:
    result = read_manifest(str(path), "env")
    assert result is not None
    return result.problems


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    return subprocess.run(
        [sys.executable, "-m", "torch_backend_registry", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**environ, **(env or {})},
        timeout=timeout,
    )


# ------------------------------------------------------------------ costly documents


def test_a_document_with_too_many_key_parts_is_refused_before_it_is_parsed(
    tmp_path: Path,
) -> None:
    # k.a.a.a... = 1 makes one table a part: the parser's cost, not the bytes.
    path = tmp_path / "dotted.toml"
    line = "k{}" + ".a" * 299 + " = 1\n"
    path.write_text("".join(line.format(i) for i in range(MAX_KEY_PARTS // 300 + 2)))
    assert path.stat().st_size < MAX_BYTES
    [problem] = problems_of(path)
    assert problem.line == MAX_KEY_PARTS // 300 + 1
    assert f"more than {MAX_KEY_PARTS:,} keys and key parts in one manifest" in problem.message


def test_a_generated_file_of_one_mistake_gives_a_bounded_number_of_problems(
    tmp_path: Path,
) -> None:
    path = tmp_path / "flat.toml"
    path.write_text("".join(f"k{i} = 1\n" for i in range(5000)))
    problems = problems_of(path)
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].message == f"and {5000 - MAX_PROBLEMS} more problems; fix those above first"


def test_a_number_too_long_to_read_is_a_problem_at_its_line_for_its_file_only(
    tmp_path: Path, write: WriteFn
) -> None:
    path = write("huge.toml", f'[backends.a]\ntarget = "m:f"\noptions = {{ n = {"9" * 4301} }}\n')
    registry = env_registry(path)
    registry.register_backend(len, name="eager_like")
    with pytest.warns(ManifestWarning):
        [problem] = registry.problems()
    assert isinstance(problem, Problem)
    assert (problem.line, problem.key) == (3, "backends.a.options")
    assert "a number too long to read; write it as a string" in problem.message
    assert registry.lookup_backend("eager_like") is len  # the other sources keep working


@pytest.mark.parametrize(
    "number",
    ["0x" + "f" * 4000, "0o" + "7" * 5000, "0b1" + "0" * 63, str(2**63), str(-(2**63) - 1)],
)
def test_an_integer_beyond_64_bits_is_a_problem_at_its_line(
    tmp_path: Path, write: WriteFn, number: str
) -> None:
    # TOML's integers are 64-bit; tomli reads a long hexadecimal one, which explain, lock
    # and list --json then failed to print ("Exceeds the limit (4300 digits)").
    path = write("huge.toml", f'[backends.a]\ntarget = "m:f"\noptions = {{ n = [{number}] }}\n')
    registry = env_registry(path)
    with pytest.warns(ManifestWarning):
        [problem] = registry.problems()
    assert (problem.line, problem.key) == (3, "backends.a.options")
    assert "an integer beyond TOML's 64-bit range; write it as a string" in problem.message
    assert registry.list_backends(exclude_tags=()) == []


def test_another_tools_integer_beyond_64_bits_in_pyproject_toml_is_theirs(
    tmp_path: Path, write: WriteFn
) -> None:
    # Only the [tool.torch-backends] table is this library's to refuse: another tool's table
    # may hold any integer that tool reads, and the backends beside it stay usable.
    other = "[project]\nname = 'demo'\n\n[tool.othertool]\nmask = 0xFFFFFFFFFFFFFFFF\n"
    write("pyproject.toml", other + '\n[tool.torch-backends.backends.fast]\ntarget = "m:f"\n')
    done = torch_backends("check", "--no-torch", cwd=tmp_path)
    assert "no problems; 1 of 1 backend(s) usable" in done.stdout + done.stderr
    assert Registry(cwd=tmp_path, environ={}, sources=("project",)).list_backends() == ["fast"]
    # init --pyproject adds its table beside theirs.
    write("pyproject.toml", other)
    torch_backends("init", "--pyproject", cwd=tmp_path)
    assert "[tool.torch-backends" in (tmp_path / "pyproject.toml").read_text()


def test_an_integer_beyond_64_bits_in_the_pyproject_table_is_a_problem_at_its_line(
    tmp_path: Path, write: WriteFn
) -> None:
    huge = "0x1" + "0" * 16  # 2**64
    text = f'[tool.torch-backends.backends.a]\ntarget = "m:f"\noptions = {{ n = {huge} }}\n'
    [problem] = problems_of(write("pyproject.toml", text))
    assert (problem.line, problem.key) == (3, "tool.torch-backends.backends.a.options")
    assert "an integer beyond TOML's 64-bit range" in problem.message


def _deep_table(key: str, depth: int) -> str:
    return f"[backends.a.{key}" + ".x" * depth + "]\ny = 1\n"


def test_a_wrongly_typed_value_nested_deep_is_one_problem_at_its_line(
    tmp_path: Path, write: WriteFn
) -> None:
    path = write(
        "deep.toml",
        '[backends.ok]\ntarget = "m:f"\n[backends.a]\n' + _deep_table("target", 400),
    )
    [problem] = problems_of(path)
    assert (problem.line, problem.key) == (4, "backends.a.target")
    assert problem.message == "expected a string, got table {'x': {'x': {'x': {...}}}}"
    assert len(str(problem)) < 300


def test_options_nested_too_deep_break_that_backend_only_and_check_says_so(
    tmp_path: Path, write: WriteFn
) -> None:
    path = write(
        "deep.toml",
        '[backends.ok]\ntarget = "operator:add"\n[backends.a]\ntarget = "operator:add"\n'
        + _deep_table("options", 400),
    )
    registry = env_registry(path)
    with pytest.warns(ManifestWarning):
        [problem] = registry.problems()
    assert isinstance(problem, Problem)
    assert problem.line == 5
    assert f"values nest more than {MAX_VALUE_DEPTH} levels deep" in problem.message
    with pytest.raises(ManifestError) as caught:
        registry.lookup_backend("a")
    assert caught.value.problem == problem
    assert registry.lookup_backend("ok") is operator.add


def test_options_within_the_depth_limit_pass_check_and_load(tmp_path: Path, write: WriteFn) -> None:
    # What check accepts, lookup can use: hashing, comparing and binding deep options.
    path = write(
        "deep.toml",
        '[backends.a]\ntarget = "builtins:dict"\n' + _deep_table("options", MAX_VALUE_DEPTH - 2),
    )
    registry = env_registry(path)
    assert registry.problems() == []
    compiled = registry.lookup_backend("a")()
    assert "x" in compiled


def test_chains_of_repeated_members_and_of_any_depth_list_and_check(
    tmp_path: Path, write: WriteFn
) -> None:
    levels = 40  # 2**40 paths through c0 for a walk that follows every member
    doubled = "".join(f'[backends.c{i}]\nchain = ["c{i + 1}", "c{i + 1}"]\n' for i in range(levels))
    deep = "".join(f'[backends.d{i}]\nchain = ["d{i + 1}"]\n' for i in range(3000))
    path = write(
        "chains.toml",
        doubled
        + f'[backends.c{levels}]\ntarget = "operator:add"\n'
        + deep
        + '[backends.d3000]\ntarget = "operator:add"\n',
    )
    registry = env_registry(path)
    names = registry.list_backends()
    assert "c0" in names
    assert "d0" in names
    assert registry.why_unavailable(registry.backend_info("c0")) is None
    assert "chains deep, more than" in (registry.why_unavailable(registry.backend_info("d0")) or "")
    problems = {p.key: p for p in registry.problems() if isinstance(p, Problem)}
    assert f"backends.d{2999 - MAX_CHAIN_DEPTH}.chain" in problems
    assert f"backends.d{3000 - MAX_CHAIN_DEPTH}.chain" not in problems
    with pytest.raises(ManifestError, match="nests 3000 chains deep"):
        registry.lookup_backend("d0")
    assert callable(registry.lookup_backend(f"d{3000 - MAX_CHAIN_DEPTH}"))


# ------------------------------------------------------------------ faults around


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root to drop")
def test_an_unreadable_env_folder_is_a_problem_of_that_entry_only() -> None:
    base = Path(tempfile.mkdtemp())  # not under tmp_path: its parents are closed to others
    try:
        base.chmod(0o755)
        closed, good = base / "closed", base / "good"
        closed.mkdir(mode=0o711)
        good.mkdir(mode=0o755)
        (good / "m.toml").write_text('[backends.g]\ntarget = "m:f"\n')
        os.chown(closed, 65534, 65534)  # nobody's own folder, trusted by nobody...
        closed.chmod(0o311)  # ...but not listable
        for folder in (base, good, good / "m.toml"):
            os.chown(folder, 65534, 65534)
        env = os.pathsep.join([str(closed), str(good)])
        out = run_as_nobody(
            "import warnings\nwarnings.simplefilter('ignore')\n"
            "from torch_backend_registry import Registry\n"
            f"r = Registry(environ={{'TORCH_BACKENDS_PATH': {env!r}}}, sources=('env',))\n"
            "result = '\\n'.join([str(r.list_backends()), *map(str, r.problems())])\n"
        )
        assert out.splitlines() == [
            "['g']",
            f"{closed}: cannot list the folder named by TORCH_BACKENDS_PATH: Permission denied",
        ]
    finally:
        shutil.rmtree(base)


def _garbled_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    garbled = site / "garbled-2.0.dist-info"  # entry_points.txt that is not INI
    garbled.mkdir(parents=True)
    (garbled / "METADATA").write_text("Metadata-Version: 2.1\nName: garbled\nVersion: 2.0\n")
    (garbled / "entry_points.txt").write_text("[pydantic]\nno equals sign\n")
    return site


def test_a_garbled_distribution_never_stops_manifests_from_being_validated(
    tmp_path: Path, write: WriteFn
) -> None:
    write("proj/backends.toml", '[backends.mine]\ntarget = "m:f"\n[backends.bad]\ntarget = 1\n')
    env = {"PYTHONPATH": str(_garbled_site(tmp_path))}
    done = cli("list", "--no-torch", cwd=tmp_path / "proj", env=env)
    assert done.returncode == 0, done.stderr
    assert "mine" in done.stdout
    assert "validated without pydantic plugins" in done.stderr
    assert "Traceback" not in done.stderr
    checked = cli("check", cwd=tmp_path / "proj", env=env)
    assert "backends.bad.target: expected a string, got integer 1" in checked.stdout


def test_the_cli_works_in_a_working_directory_that_was_removed(
    tmp_path: Path, write: WriteFn
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    write("env.toml", '[backends.from_env]\ntarget = "m:f"\n')
    # pydantic_core cannot be imported from a removed folder on CPython 3.13.0 (a
    # SystemError inside its own import): pydantic's to fix, so it is imported first.
    code = (
        "import os, sys, pydantic\nos.chdir(sys.argv[1]); os.rmdir(sys.argv[1])\n"
        "from torch_backend_registry._cli import main\nsys.exit(main(sys.argv[2:]))\n"
    )
    # (--no-torch: torch itself cannot load its libraries from a removed folder.)
    for args, expected in (
        (["list", "--no-torch"], "from_env"),
        (["explain", "from_env", "--no-torch"], "env:"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code, str(gone), *args],
            capture_output=True,
            text=True,
            env={**os.environ, "TORCH_BACKENDS_PATH": str(tmp_path / "env.toml")},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout
        assert "Traceback" not in done.stderr
        gone.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", code, str(gone), "init"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.startswith("torch-backends: error: ")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_the_cli_prints_what_the_terminal_cannot_encode_escaped(
    tmp_path: Path, write: WriteFn, encoding: str
) -> None:
    write("backends.toml", '[backends.b]\ntarget = "m:f"\ndescription = "Ümlaut ✓ 中文"\n')

    def command(*words: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "torch_backend_registry", *words],
            capture_output=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONIOENCODING": encoding},
            timeout=120,
        )

    done = command("list", "--all", "--no-torch")
    assert done.returncode == 0, done.stderr
    out = command("explain", "b", "--no-torch").stdout.decode(encoding)
    assert "description: " in out
    assert "\\u2713 \\u4e2d\\u6587" in out


# ------------------------------------------------------------------ pyproject.toml on the way up


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_a_fifo_named_pyproject_toml_above_is_passed_by_not_waited_on(
    tmp_path: Path, write: WriteFn
) -> None:
    os.mkfifo(tmp_path / "pyproject.toml")
    (tmp_path / "sub").mkdir()
    write("env.toml", '[backends.e]\ntarget = "m:f"\n')
    done = cli(
        "list", "--no-torch", cwd=tmp_path / "sub",
        env={"TORCH_BACKENDS_PATH": str(tmp_path / "env.toml")}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "e " in done.stdout


def test_a_huge_pyproject_toml_above_is_not_read(tmp_path: Path, write: WriteFn) -> None:
    with (tmp_path / "pyproject.toml").open("wb") as handle:
        handle.truncate(2**30)  # sparse: 1 GiB that takes no disk
    (tmp_path / "sub").mkdir()
    registry = Registry(cwd=tmp_path / "sub", environ={}, sources=("project",))
    assert registry.list_backends() == []


def test_a_deeply_nested_pyproject_toml_spares_the_other_sources(
    tmp_path: Path, write: WriteFn
) -> None:
    deep = "x = " + "[" * 5000 + "]" * 5000 + "\n"
    (tmp_path / "pyproject.toml").write_text("# [tool.torch-backends] is not here\n" + deep)
    (tmp_path / "sub").mkdir()
    env = write("env.toml", '[backends.e]\ntarget = "m:f"\n')
    registry = Registry(
        cwd=tmp_path / "sub",
        environ={"TORCH_BACKENDS_PATH": str(env)},
        sources=("env", "project"),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert registry.list_backends() == ["e"]
    [message] = [str(w.message) for w in caught]
    assert message.startswith(f"{tmp_path / 'pyproject.toml'}:2: x: invalid TOML:")
    # Without our table's name anywhere, it is another tool's file: not even parsed.
    (tmp_path / "pyproject.toml").write_text(deep)
    registry.refresh()
    assert registry.list_backends() == ["e"]
    with pytest.raises(UnknownBackendError):
        registry.lookup_backend("x")


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no file ownership")
def test_an_untrusted_pyproject_toml_with_our_table_is_not_used(
    tmp_path: Path, write: WriteFn
) -> None:
    path = write("pyproject.toml", '[tool.torch-backends.backends.p]\ntarget = "m:f"\n')
    path.chmod(0o666)
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.warns(ManifestWarning, match="pyproject.toml: manifest not used: it is writable"):
        assert registry.list_backends() == []


def test_what_lock_writes_check_locked_reads_at_ten_thousand_backends(tmp_path: Path) -> None:
    from torch_backend_registry._lock import check_locked, write_lock

    folder = tmp_path / "manifests"
    folder.mkdir()
    for f in range(100):
        body = "".join(
            f'[backends.b{f}_{b}]\ntarget = "pkg_{f}.compilers:compile_{b}"\n'
            f'options = {{ level = {b}, name = "backend number {b} of file {f}" }}\n'
            for b in range(100)
        )
        (folder / f"m{f:03}.toml").write_text(body, encoding="utf-8")
    registry = Registry(environ={"TORCH_BACKENDS_PATH": str(folder)}, sources=("env",))
    path = write_lock(registry, str(tmp_path / "backends.lock"))
    assert Path(path).stat().st_size > MAX_BYTES  # larger than any manifest may be
    check_locked(registry, path)  # no drift
