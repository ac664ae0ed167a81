"""Hostile input: broken manifests, odd files and paths, generated documents, the trust rule.

Every broken manifest must give a ManifestError with its file, line and key, and never
anything else; a file that cannot be used must never hide the other sources.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import importlib.util
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from torch_backend_registry import (
    BackendRegistryError,
    ManifestWarning,
    Problem,
    Registry,
)
from torch_backend_registry._sources.files import MAX_BYTES
from torch_backend_registry._sources.manifest import read_manifest

from .conftest import NOBODY, WriteFn, run_as_nobody, run_forked, run_python, torch_backends

CORPUS = Path(__file__).parent / "corpus"
ROOT = Path(__file__).resolve().parent.parent
EXPECT_RE = re.compile(r"^# expect: (?:(ok)(.*)|(\d+) (.*?): (.*))$")


def expectations(path: Path) -> tuple[list[tuple[int, str | None, str]], list[str]]:
    """The ``# expect:`` lines of a corpus file: problems as (line, key, fragment), usable names.

    ``# expect: LINE KEY: fragment`` is one problem (an empty KEY: none is known);
    ``# expect: ok NAME ...`` names the backends that stay usable. No line: nothing at all.
    """
    raw = path.read_bytes()
    encoding = "utf-16" if raw.startswith(codecs.BOM_UTF16_LE) else "utf-8-sig"
    problems: list[tuple[int, str | None, str]] = []
    usable: list[str] = []
    for line in raw.decode(encoding, errors="replace").split("\n"):
        match = EXPECT_RE.match(line.lstrip("\ufeff").rstrip("\r"))
        if match and match.group(1):
            usable.extend(match.group(2).split())
        elif match:
            problems.append((int(match.group(3)), match.group(4) or None, match.group(5)))
    return problems, usable


CORPUS_FILES = sorted(CORPUS.glob("*.toml"))


def test_the_corpus_covers_what_it_should() -> None:
    names = {path.stem.split("-")[0] for path in CORPUS_FILES}
    assert {"syntax", "type", "name", "targets", "deep", "bom", "empty", "not"} <= names
    assert len(CORPUS_FILES) >= 40


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name for p in CORPUS_FILES])
def test_corpus_file_gives_its_expected_problems(path: Path) -> None:
    expected, usable = expectations(path)
    result = read_manifest(str(path), "env")
    assert result is not None
    got = [(p.line, p.key, p.message) for p in result.problems]
    assert len(got) == len(expected), got
    for (line, key, fragment), (got_line, got_key, message) in zip(
        sorted(expected, key=lambda e: e[0]), sorted(got, key=lambda g: g[0] or 0), strict=True
    ):
        assert (got_line, got_key) == (line, key), message
        assert fragment in message
    for problem in result.problems:
        assert str(problem).startswith(f"{path}:{problem.line}: ")
        assert "\n" not in str(problem)
    assert sorted(d.name for d in result.definitions if d.usable) == sorted(usable)


def test_check_prints_one_clean_line_a_problem_for_the_whole_corpus() -> None:
    files = [str(p.relative_to(ROOT)) for p in CORPUS_FILES]
    done = torch_backends("check", *files, cwd=ROOT, check=1)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stdout.split("\n") if line.startswith("tests/corpus/")]
    assert len(lines) == sum(len(expectations(p)[0]) for p in CORPUS_FILES)
    # Hostile names arrive escaped: nothing a terminal would act on reaches it.
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]", done.stdout)


# ------------------------------------------------------------ files and paths


def test_a_file_too_large_is_refused_without_reading_it(tmp_path: Path) -> None:
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as handle:  # sparse: no disk is written, the size is real
        handle.truncate(MAX_BYTES + 1)
    result = read_manifest(str(huge), "env")
    assert result is not None
    [problem] = result.problems
    assert (problem.path, problem.line) == (str(huge), None)
    assert "too large for a manifest" in problem.message


def test_a_large_file_under_the_limit_loads(tmp_path: Path) -> None:
    blocks = [
        f'[backends.b{i}]\ntarget = "pkg.mod:f{i}"\ndescription = "{"x" * 200}"\n'
        for i in range(4000)
    ]
    big = tmp_path / "big.toml"
    big.write_text("\n".join(blocks), encoding="utf-8")
    assert MAX_BYTES * 0.9 < big.stat().st_size <= MAX_BYTES
    result = read_manifest(str(big), "env")
    assert result is not None
    assert result.problems == []
    assert len(result.definitions) == 4000
    assert result.definitions[-1].source.line == 4 * 3999 + 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_a_named_pipe_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "backends.toml")
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.warns(ManifestWarning, match="is not a regular file"):
        assert registry.list_backends() == []


def test_a_project_manifest_that_is_a_directory_is_reported(tmp_path: Path) -> None:
    (tmp_path / "backends.toml").mkdir()
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.warns(ManifestWarning, match="is a directory, not a manifest"):
        assert registry.list_backends() == []
    [problem] = registry.problems()
    assert problem.path == str(tmp_path / "backends.toml")


def test_an_env_entry_that_is_a_directory_stands_for_its_toml_files(
    tmp_path: Path, write: WriteFn
) -> None:
    write("conf.toml/a.toml", '[backends.a]\ntarget = "m:f"\n')
    (tmp_path / "conf.toml" / "sub.toml").mkdir()  # a directory inside is not a manifest
    registry = Registry(
        cwd=tmp_path, environ={"TORCH_BACKENDS_PATH": "conf.toml"}, sources=("env",)
    )
    assert registry.list_backends() == ["a"]
    assert registry.problems() == []


def test_empty_entries_of_the_env_path_are_ignored(tmp_path: Path, write: WriteFn) -> None:
    write("a.toml", '[backends.a]\ntarget = "m:f"\n')
    write("b.toml", '[backends.b]\ntarget = "m:f"\n')
    env = os.pathsep.join(["", "a.toml", "", " ", "b.toml", ""])
    registry = Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_PATH": env}, sources=("env",))
    assert registry.list_backends() == ["a", "b"]
    assert registry.problems() == []


def test_a_directory_that_vanishes_is_reported_after_refresh_and_spares_the_rest(
    tmp_path: Path, write: WriteFn
) -> None:
    write("conf/a.toml", '[backends.a]\ntarget = "m:f"\n')
    write("project/backends.toml", '[backends.p]\ntarget = "m:f"\n')
    registry = Registry(
        cwd=tmp_path / "project",
        environ={"TORCH_BACKENDS_PATH": str(tmp_path / "conf")},
        sources=("env", "project"),
    )
    assert registry.list_backends() == ["a", "p"]
    shutil.rmtree(tmp_path / "conf")
    assert registry.list_backends() == ["a", "p"]  # discovery is cached until refresh()
    registry.refresh()
    with pytest.warns(ManifestWarning, match="no such file or folder"):
        assert registry.list_backends() == ["p"]
    [problem] = registry.problems()
    assert isinstance(problem, Problem)
    assert problem.path == str(tmp_path / "conf")


def test_a_working_directory_that_vanishes_leaves_the_other_sources(
    tmp_path: Path, write: WriteFn
) -> None:
    write("conf.toml", '[backends.a]\ntarget = "m:f"\n')
    gone = tmp_path / "gone"
    gone.mkdir()
    out = run_python(
        "import os, warnings, torch_backend_registry as t\n"
        # pydantic_core cannot be imported from a removed folder on CPython 3.13.0
        # (a SystemError inside its own import): pydantic's to fix, so import it first.
        "import pydantic\n"
        f"os.chdir({str(gone)!r}); os.rmdir({str(gone)!r})\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    names = t.Registry(sources=('env', 'project')).list_backends()\n"
        "print(names, [str(w.message) for w in caught])",
        env={"TORCH_BACKENDS_PATH": f"{tmp_path / 'conf.toml'}{os.pathsep}relative.toml"},
    ).stdout
    assert "['a']" in out
    assert "working directory no longer exists; no project manifest read" in out
    assert "relative.toml: relative entry of TORCH_BACKENDS_PATH" in out


def test_a_symlink_loop_is_a_clear_error(tmp_path: Path) -> None:
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop)
    result = read_manifest(str(loop), "env")
    assert result is not None
    [problem] = result.problems
    assert problem.message.startswith("cannot read: Too many levels of symbolic links")


def _first_problem_as_user(manifest: Path, uid: int | None) -> str:
    """The first problem of reading ``manifest``; as user nobody in a forked child if ``uid``."""
    if uid is None:
        result = read_manifest(str(manifest), "env")
        return str(result.problems[0]) if result and result.problems else ""
    return run_as_nobody(
        "from torch_backend_registry._sources.manifest import read_manifest\n"
        f"found = read_manifest({str(manifest)!r}, 'env')\n"
        "result = str(found.problems[0]) if found and found.problems else ''\n"
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no POSIX permissions")
def test_an_unreadable_file_is_a_clear_error() -> None:
    # Root reads every file: then the reading runs in a child that gave up root.
    uid = NOBODY if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp())  # not under tmp_path: its parents are closed to others
    try:
        folder.chmod(0o711)
        manifest = folder / "backends.toml"
        manifest.write_text('[backends.a]\ntarget = "m:f"\n', encoding="utf-8")
        assert _first_problem_as_user(manifest, uid) == ""  # readable: the setup is sound
        manifest.chmod(0o000)
        assert (
            _first_problem_as_user(manifest, uid) == f"{manifest}: cannot read: Permission denied"
        )
    finally:
        shutil.rmtree(folder)


def test_a_broken_installed_distribution_spares_the_others(
    tmp_path: Path, make_dist: Callable[..., Path]
) -> None:
    make_dist("good-dist", "1.0", {"good": "good_mod:fn"})
    site = tmp_path / "dists"
    garbled = site / "garbled-2.0.dist-info"  # entry_points.txt that is not INI
    garbled.mkdir()
    (garbled / "METADATA").write_text("Metadata-Version: 2.1\nName: garbled\nVersion: 2.0\n")
    (garbled / "entry_points.txt").write_text("[torch_dynamo_backends]\nno equals sign\n")
    binary = site / "binary-3.0.dist-info"  # neither file is UTF-8
    binary.mkdir()
    (binary / "METADATA").write_bytes(b"\xff\xfe")
    (binary / "entry_points.txt").write_bytes(b"\xff[torch_dynamo_backends]\nx = m:f\n")
    importlib.invalidate_caches()
    registry = Registry(cwd=tmp_path, environ={}, sources=("entry-point",))
    with pytest.warns(ManifestWarning) as caught:
        names = registry.list_backends()
    assert "good" in names
    assert registry.backend_info("good").source.distribution == "good-dist"
    messages = sorted(str(w.message) for w in caught)
    assert any("distribution 'garbled' cannot be read (TypeError" in m for m in messages)
    assert any(f"distribution in {site} cannot be read (UnicodeDecodeError" in m for m in messages)


# ------------------------------------------------------------ generated documents

_SAFE_TARGETS = [
    "tbr_fuzz_nowhere.mod:fn",  # no such module
    "operator:add",  # a real callable
    "builtins:copyright.__class__",  # a real class: callable
    "math:pi",  # real, not callable
    "json:no_such_attribute",
]
_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,6}", fullmatch=True)
_ODD = st.text(max_size=8)
_KNOWN_KEYS = ["target", "chain", "tags", "description", "aliases", "requires", "options"]
_KEY = st.sampled_from(
    [*_KNOWN_KEYS, "enabled", "schema-version", "default", "python-path", "backends", "tag", "x"]
) | _ODD.filter(bool)
_SCALAR = (
    st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.sampled_from(_SAFE_TARGETS)
    | st.dates()
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAME, inner, max_size=3),
    max_leaves=6,
)


def _key_text(parts: list[str]) -> str:
    return ".".join(
        p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else tomli_w.dumps({"k": p})[4:-1] for p in parts
    )


@st.composite
def _toml_lines(draw: st.DrawFn) -> str:
    kind = draw(
        st.sampled_from(["header", "array", "pair", "noise", "comment", "blank", "huge", "deep"])
    )
    if kind in ("header", "array"):
        parts = draw(st.lists(_NAME | _ODD | st.just("backends"), min_size=1, max_size=3))
        if draw(st.booleans()):
            parts = ["backends", *parts]
        key = _key_text(parts)
        return f"[{key}]" if kind == "header" else f"[[{key}]]"
    if kind == "pair":
        key = _key_text(draw(st.lists(_KEY, min_size=1, max_size=2)))
        value = tomli_w.dumps({"v": draw(_VALUE)}).partition(" = ")[2].rstrip("\n")
        if "\n" in value:  # a value tomli_w spread over lines: keep it inline
            value = repr(draw(_SCALAR))
        return f"{key} = {value}"
    if kind == "huge":  # past int()'s digit limit: the parser itself fails
        return f"{draw(_NAME)} = {'9' * draw(st.integers(4290, 4400))}"
    if kind == "deep":
        depth = draw(st.integers(1, 120))
        return f"{draw(_NAME)} = {'[' * depth}1{']' * depth}"
    if kind == "noise":
        return draw(st.text(max_size=20))
    return "# " + draw(st.text(max_size=10)) if kind == "comment" else ""


def _nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


_VALID = {
    "tags": st.lists(_NAME, max_size=2),
    "description": st.text(max_size=10),
    "aliases": st.lists(_NAME, max_size=2),
    "requires": st.lists(
        st.sampled_from(
            ["json", "tbr_fuzz_missing", "os.path", "json.decoder", "tbr_fuzz_missing.sub.mod"]
        ),
        max_size=2,
    ),
    "options": st.dictionaries(_NAME, _SCALAR, max_size=2)
    | st.integers(1, 130).map(_nested),  # around the depth limit
}
# Mostly sound entries with a wrong value here and there, so lookups get exercised.
_ENTRY = st.fixed_dictionaries(
    {"target": st.sampled_from(_SAFE_TARGETS)},
    optional={key: valid | valid | _VALUE for key, valid in _VALID.items()},
)
# Chains whose members repeat, name each other, or nothing: the graph checks' worst cases.
_CHAIN_ENTRY = st.fixed_dictionaries(
    {
        "chain": st.lists(
            st.sampled_from(["c0", "c1", "c2", "eager", "nope"]), min_size=1, max_size=4
        ).map(lambda members: members * 2)
    }
)
_SOUND = st.dictionaries(
    _NAME | st.sampled_from(["c0", "c1", "c2"]), _ENTRY | _CHAIN_ENTRY, min_size=1, max_size=4
).map(lambda backends: tomli_w.dumps({"backends": backends}))
_ANYTHING = st.one_of(
    st.lists(_toml_lines(), max_size=12).map("\n".join),
    st.dictionaries(_NAME, st.dictionaries(_KEY, _VALUE, max_size=4), max_size=3).map(
        lambda backends: tomli_w.dumps({"backends": backends})
    ),
    st.text(max_size=80),
)
# Half the documents declare mostly sound backends, so that lookups get exercised too.
_DOCUMENTS = st.booleans().flatmap(lambda sound: _SOUND if sound else _ANYTHING)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=_DOCUMENTS, newline=st.sampled_from(["\n", "\r\n"]))
@example(text='[backends."\\n".backends]', newline="\n")  # a key of the whole manifest
def test_any_document_loads_or_gives_manifest_errors_only(
    tmp_path: Path, text: str, newline: str
) -> None:
    path = tmp_path / "fuzz.toml"
    data = text.replace("\n", newline).encode("utf-8", errors="surrogatepass")
    path.write_bytes(data)
    result = read_manifest(str(path), "env")
    assert result is not None
    for problem in result.problems:
        assert isinstance(problem, Problem)
        assert problem.path == str(path)
        assert problem.line is None or 1 <= problem.line <= data.count(b"\n") + 1
        assert str(problem).startswith(str(path))
        assert "\n" not in str(problem)
    # Through a registry: listing never fails, and a lookup fails only with our errors.
    registry = Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_PATH": str(path)}, sources=("env",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ManifestWarning)
        names = registry.list_backends(exclude_tags=())
        event(f"backends listed: {min(len(names), 2)}")
        for name in names:
            assert registry.backend_info(name).name == name
        for name in {*names, *(d.name for d in result.definitions)}:
            with contextlib.suppress(BackendRegistryError):
                assert callable(registry.lookup_backend(name))


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=200))
def test_any_bytes_load_or_give_manifest_errors_only(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bytes.toml"
    path.write_bytes(data)
    result = read_manifest(str(path), "env")
    assert result is not None
    assert all(isinstance(p, Problem) and p.path == str(path) for p in result.problems)


# ------------------------------------------------------------ the trust rule

HOSTILE = """
[backends.hostile]
target = "{module}:fn"
description = "\\u001b[2J names a module with side effects"
"""


def test_a_hostile_manifest_can_only_name_a_target_imported_on_that_exact_lookup(
    tmp_path: Path, write: WriteFn
) -> None:
    marker = tmp_path / "imported"
    write("site/tbr_side_effect.py", f"open({str(marker)!r}, 'w').close()\ndef fn(gm, i): ...\n")
    write(
        "backends.toml",
        HOSTILE.format(module="tbr_side_effect") + '[backends.other]\ntarget = "operator:add"\n',
    )
    env = {"PYTHONPATH": str(tmp_path / "site")}
    # Every command that reads manifests, and install(), leave the target alone.
    outputs = []
    for command in (
        ["list", "--all", "--no-torch"],
        ["list", "--json", "--no-torch"],
        ["explain", "hostile"],
        ["check"],
    ):
        outputs.append(torch_backends(*command, cwd=tmp_path, env=env).stdout)
        assert not marker.exists(), command
    # The description's terminal escape is shown, not obeyed.
    assert "\\x1b[2J names a module" in outputs[2]
    assert not any("\x1b" in out for out in outputs)
    install = "t.install(); " if importlib.util.find_spec("torch") is not None else ""
    done = run_forked(
        "import torch_backend_registry as t\n"
        f"t.list_backends(); t.backend_info('hostile'); {install}t.lookup_backend('other')",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    run_python(
        "import torch_backend_registry as t; t.lookup_backend('hostile')", cwd=tmp_path, env=env
    )
    assert marker.exists()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no file ownership")
def test_a_symlink_is_judged_by_the_file_it_points_to(tmp_path: Path, write: WriteFn) -> None:
    target = write("elsewhere/real.toml", '[backends.x]\ntarget = "m:f"\n')
    target.chmod(0o666)
    (tmp_path / "backends.toml").symlink_to(target)
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.warns(ManifestWarning, match=r"backends\.toml: manifest not used: it is writable"):
        assert registry.list_backends() == []


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no file ownership")
def test_an_untrusted_env_manifest_spares_the_next_one(tmp_path: Path, write: WriteFn) -> None:
    bad = write("bad.toml", '[backends.x]\ntarget = "m:bad"\n')
    bad.chmod(0o646)
    write("good.toml", '[backends.x]\ntarget = "m:good"\n[backends.y]\ntarget = "m:y"\n')
    env = os.pathsep.join([str(bad), str(tmp_path / "good.toml")])
    registry = Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_PATH": env}, sources=("env",))
    with pytest.warns(ManifestWarning, match=f"{re.escape(str(bad))}: manifest not used"):
        assert registry.backend_info("x").target == "m:good"
    assert registry.list_backends() == ["x", "y"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["0" * 32, "1" * 32, "2" * 32]),  # keys, some repeated
            st.sampled_from(["[[choice]]", "[[ choice ]]", "  [[choice]]"]),
            st.sampled_from(['key = "{}"', "key='{}'", '  key  =  "{}"']),
            st.sampled_from(["", 'graph = "[[choice]] key = \\"{}\\""', "# key = {}"]),
        ),
        max_size=6,
    ),
    st.sampled_from(["0" * 32, "1" * 32, "2" * 32]),
)
def test_a_choice_is_found_by_its_key_as_a_whole_parse_finds_it(
    written: list[tuple[str, str, str, str]], key: str
) -> None:
    """A hand-written ``backends.choices`` (headers and key lines spaced and quoted as TOML
    allows, a key in another's string or a comment): a lookup finds the first choice of the
    key, at its header's line, as reading the whole file would."""
    from torch_backend_registry._sources.choices import ChoicesFile

    lines, expected = ["# a header"], None
    for their_key, header, key_line, noise in written:
        if expected is None and their_key == key:
            expected = len(lines) + 1
        lines += [header, noise.format(key), key_line.format(their_key), 'member = "m"', ""]
    found = ChoicesFile("backends.choices", "\n".join(lines)).find(key)
    assert (found and (found[0]["key"], found[1])) == (expected and (key, expected))
