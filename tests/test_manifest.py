"""The manifest model: parsing, validation, and errors that point at file, line and key."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_backend_registry import BackendDefinition, Problem
from torch_backend_registry._sources.manifest import read_manifest
from torch_backend_registry._sources.positions import key_lines

from .conftest import WriteFn


def read(path: Path) -> tuple[dict[str, BackendDefinition], list[Problem]]:
    result = read_manifest(str(path), "project")
    assert result is not None
    return {d.name: d for d in result.definitions}, result.problems


def test_reads_every_key_of_a_backend(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        """
        schema-version = 1
        default = "fast"
        python-path = ["src"]

        [backends.fast]
        target = "my_pkg.compilers:fast_compile"
        tags = ["experimental"]
        description = "One line"
        aliases = ["f"]
        requires = ["tensorrt"]
        options = { fp16 = true, level = 3 }
        """,
    )
    result = read_manifest(str(path), "project")
    assert result is not None
    assert result.problems == []
    (fast,) = result.definitions
    assert fast.name == "fast"
    assert fast.target == "my_pkg.compilers:fast_compile"
    assert fast.tags == ("experimental",)
    assert fast.description == "One line"
    assert fast.aliases == ("f",)
    assert fast.requires == ("tensorrt",)
    assert dict(fast.options) == {"fp16": True, "level": 3}
    assert fast.chain is None
    assert fast.source.kind == "project"
    assert fast.source.path == str(path)
    assert fast.source.line == 5  # the [backends.fast] header
    assert fast.python_path == (str(path.parent / "src"),)
    assert result.default is not None
    assert (result.default.name, result.default.line) == ("fast", 2)


def test_definitions_are_immutable(write: WriteFn) -> None:
    path = write("backends.toml", '[backends.a]\ntarget = "m:f"\noptions = { x = 1 }\n')
    defs, _ = read(path)
    a = defs["a"]
    with pytest.raises(AttributeError):
        a.target = "other:f"  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.options["x"] = 2  # type: ignore[index]


def test_chain_and_disabled_entries(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        """
        [backends.portable]
        chain = ["tensorrt", "eager"]

        [backends.hidden]
        enabled = false
        """,
    )
    defs, problems = read(path)
    assert problems == []
    assert defs["portable"].chain == ("tensorrt", "eager")
    assert defs["hidden"].enabled is False


def test_dotted_keys_and_inline_tables_get_lines(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        """
        [backends]
        a = { target = "m:a" }
        b.target = "m:b"
        "c".target = "m:c"
        """,
    )
    defs, problems = read(path)
    assert problems == []
    assert [defs[n].source.line for n in "abc"] == [2, 3, 4]


def test_pyproject_table(write: WriteFn) -> None:
    path = write(
        "pyproject.toml",
        """
        [project]
        name = "x"

        [tool.torch-backends]
        default = "fast"

        [tool.torch-backends.backends.fast]
        target = "m:f"
        """,
    )
    result = read_manifest(str(path), "project")
    assert result is not None
    assert result.problems == []
    assert result.definitions[0].source.line == 7
    assert result.default is not None
    assert result.default.name == "fast"


def test_pyproject_without_the_table_is_not_a_manifest(write: WriteFn) -> None:
    path = write("pyproject.toml", '[project]\nname = "x"\n')
    assert read_manifest(str(path), "project") is None


# Each case: the manifest, then the line, the key and a fragment of the message.
BROKEN = {
    "unknown key with suggestion": (
        '[backends.a]\ntarget = "m:f"\ntag = ["x"]\n',
        3,
        "backends.a.tag",
        "unknown key 'tag'; did you mean 'tags'?",
    ),
    "unknown key far from any": (
        '[backends.a]\ntarget = "m:f"\nzzz = 1\n',
        3,
        "backends.a.zzz",
        "unknown key 'zzz'; expected one of target, chain, tags",
    ),
    "a Python boolean": (
        '[backends.a]\ntarget = "m:f"\noptions = { log = True }\n',
        3,
        "backends.a.options",
        "TOML spells booleans in lowercase: true",
    ),
    "a Python None": (
        '[backends.a]\ntarget = "m:f"\ndescription = None\n',
        3,
        "backends.a.description",
        "TOML has no null: leave the key out",
    ),
    "python-path below a backend's table": (
        '[backends.a]\ntarget = "m:f"\npython-path = ["src"]\n',
        3,
        "backends.a.python-path",
        "'python-path' is a key of the whole manifest, not of a backend: move it above",
    ),
    "unknown top-level key": (
        'defualt = "a"\n',
        1,
        "defualt",
        "did you mean 'default'?",
    ),
    "missing target and chain": (
        "# comment\n[backends.a]\ntags = []\n",
        2,
        "backends.a",
        "needs 'target'",
    ),
    "both target and chain": (
        '[backends.a]\ntarget = "m:f"\nchain = ["b"]\n',
        1,
        "backends.a",
        "exactly one of 'target' and 'chain'",
    ),
    "target without colon": (
        '[backends.a]\ntarget = "my_pkg.compile"\n',
        2,
        "backends.a.target",
        "expected a target 'module.path:attribute.path'",
    ),
    "target with bad module": (
        '[backends.a]\ntarget = "my-pkg:f"\n',
        2,
        "backends.a.target",
        "invalid value 'my-pkg:f'",
    ),
    "target of wrong type": (
        "[backends.a]\ntarget = 3\n",
        2,
        "backends.a.target",
        "expected a string, got integer 3",
    ),
    "tags not an array": (
        '[backends.a]\ntarget = "m:f"\ntags = "debug"\n',
        3,
        "backends.a.tags",
        "expected an array, got string 'debug'",
    ),
    "bad tag": (
        '[backends.a]\ntarget = "m:f"\ntags = ["ok", "not ok"]\n',
        3,
        "backends.a.tags",
        "item 1: invalid value 'not ok'",
    ),
    "bad backend name": (
        '[backends."9lives"]\ntarget = "m:f"\n',
        1,
        "backends.9lives",
        "invalid key '9lives': expected a name of letters",
    ),
    "enabled not a boolean": (
        '[backends.a]\ntarget = "m:f"\nenabled = "no"\n',
        3,
        "backends.a.enabled",
        "expected true or false",
    ),
    "empty chain": (
        "[backends.a]\nchain = []\n",
        2,
        "backends.a.chain",
        "must not be empty",
    ),
    "requires not a module": (
        '[backends.a]\ntarget = "m:f"\nrequires = ["tensor rt"]\n',
        3,
        "backends.a.requires",
        "expected a dotted module name",
    ),
    "options not a table": (
        '[backends.a]\ntarget = "m:f"\noptions = [1]\n',
        3,
        "backends.a.options",
        "expected a table",
    ),
    "newer schema version": (
        "schema-version = 2\n",
        1,
        "schema-version",
        "schema version 2 is newer than this release supports (1)",
    ),
    "schema version zero": (
        "schema-version = 0\n",
        1,
        "schema-version",
        "unsupported schema version 0; this release reads 1",
    ),
    "alias used twice": (
        '[backends.a]\ntarget = "m:f"\naliases = ["x"]\n[backends.b]\ntarget = "m:g"\n'
        'aliases = ["x"]\n',
        6,
        "backends.b.aliases",
        "alias 'x' is already used by backend 'a'",
    ),
    "alias equal to a name": (
        '[backends.a]\ntarget = "m:f"\naliases = ["b"]\n[backends.b]\ntarget = "m:g"\n',
        3,
        "backends.a.aliases",
        "alias 'b' is already used by backend 'b'",
    ),
    "toml syntax": (
        '[backends.a]\ntarget = "m:f"\ntags = [\n',
        3,
        "backends.a.tags",
        "invalid TOML",
    ),
    "toml duplicate table": (
        '[backends.a]\ntarget = "m:f"\n[backends.a]\ntarget = "m:g"\n',
        3,
        "backends.a",
        "invalid TOML: Cannot declare",
    ),
    "toml inline table not closed": (
        '[backends.a]\ntarget = "m:f"\noptions = { top = 2\n\n[backends.b]\ntarget = "m:f"\n',
        5,
        None,
        "Unclosed inline table (a { on this line or above is not closed with })",
    ),
    "toml bad value on a key line": (
        "[backends.a]\ntarget = m:f\n",
        2,
        "backends.a.target",
        "invalid TOML",
    ),
}


@pytest.mark.parametrize(("text", "line", "key", "fragment"), BROKEN.values(), ids=BROKEN.keys())
def test_broken_manifests_say_file_line_key(
    write: WriteFn, text: str, line: int, key: str | None, fragment: str
) -> None:
    path = write("backends.toml", text)
    result = read_manifest(str(path), "project")
    assert result is not None
    assert len(result.problems) == 1, result.problems
    problem = result.problems[0]
    assert problem.path == str(path)
    assert problem.line == line
    if key is not None:
        assert problem.key == key
    assert fragment in problem.message
    prefix = f"{path}:{line}: " + (f"{key}: " if key else "")
    assert str(problem).startswith(prefix)


def test_one_broken_backend_keeps_the_others(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        """
        [backends.good]
        target = "m:good"

        [backends.bad]
        target = "m:bad"
        tag = ["x"]

        [backends.also_good]
        chain = ["good"]
        """,
    )
    defs, problems = read(path)
    assert [p.key for p in problems] == ["backends.bad.tag"]
    assert defs["good"].usable
    assert defs["also_good"].usable
    assert defs["bad"].problem == problems[0]


def test_top_level_problem_keeps_the_backends(write: WriteFn) -> None:
    path = write("backends.toml", 'python-path = "src"\n[backends.a]\ntarget = "m:f"\n')
    defs, problems = read(path)
    assert [(p.line, p.key) for p in problems] == [(1, "python-path")]
    assert defs["a"].usable


def test_every_problem_is_reported_not_only_the_first(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        '[backends.a]\ntarget = 1\n[backends.b]\ntarget = "m:f"\ntagz = []\n',
    )
    _, problems = read(path)
    assert sorted((p.line, p.key) for p in problems) == [
        (2, "backends.a.target"),
        (5, "backends.b.tagz"),
    ]


def test_missing_file(tmp_path: Path) -> None:
    result = read_manifest(str(tmp_path / "nope.toml"), "env")
    assert result is not None
    assert str(result.problems[0]) == f"{tmp_path / 'nope.toml'}: no such file"


# ----------------------------------------------------------------- property-based

NAMES = st.text(string.ascii_letters + "_", min_size=1, max_size=1).flatmap(
    lambda head: st.text(string.ascii_letters + string.digits + "_-", max_size=12).map(
        lambda tail: head + tail
    )
)
IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
#: The integers TOML holds: 64-bit ones (a larger one is a problem of its own).
TOML_INTEGERS = st.integers(-(2**63), 2**63 - 1)
TARGETS = st.builds(
    lambda mod, attr: f"{'.'.join(mod)}:{'.'.join(attr)}",
    st.lists(IDENT, min_size=1, max_size=3),
    st.lists(IDENT, min_size=1, max_size=2),
)
ENTRIES = st.fixed_dictionaries(
    {"target": TARGETS},
    optional={
        "tags": st.lists(NAMES, max_size=3),
        "description": st.text(max_size=30),
        "requires": st.lists(st.lists(IDENT, min_size=1, max_size=2).map(".".join), max_size=2),
        "options": st.dictionaries(IDENT, TOML_INTEGERS | st.booleans() | st.text(max_size=5)),
        "enabled": st.booleans(),
    },
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(backends=st.dictionaries(NAMES, ENTRIES, min_size=1, max_size=5))
def test_any_valid_manifest_round_trips(
    tmp_path: Path, backends: dict[str, dict[str, object]]
) -> None:
    path = tmp_path / "roundtrip.toml"
    path.write_text(tomli_w.dumps({"backends": backends}), encoding="utf-8")
    result = read_manifest(str(path), "env")
    assert result is not None
    assert result.problems == []
    by_name = {d.name: d for d in result.definitions}
    assert set(by_name) == set(backends)
    text_lines = path.read_text(encoding="utf-8").split("\n")  # TOML lines end at LF only
    for name, entry in backends.items():
        got = by_name[name]
        assert got.target == entry["target"]
        assert list(got.tags) == entry.get("tags", [])
        assert dict(got.options) == entry.get("options", {})
        assert got.enabled == entry.get("enabled", True)
        # The recorded line is the backend's own table header.
        assert got.source.line is not None
        assert name in text_lines[got.source.line - 1]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=NAMES,
    key=st.sampled_from(["target", "tags", "aliases", "requires", "enabled", "chain"]),
    value=TOML_INTEGERS | st.floats(allow_nan=False) | st.text(max_size=5),
)
def test_any_invalid_value_is_located(tmp_path: Path, name: str, key: str, value: object) -> None:
    path = tmp_path / "bad.toml"
    entry: dict[str, object] = {"target": "m:f"} if key != "target" else {}
    entry[key] = value
    if key == "chain":
        entry.pop("target")
    path.write_text(tomli_w.dumps({"backends": {name: entry}}), encoding="utf-8")
    result = read_manifest(str(path), "env")
    assert result is not None
    if not result.problems:  # a string can be a valid target; then it must parse as one
        assert key == "target"
        assert isinstance(value, str)
        assert ":" in value
        return
    problem = result.problems[0]
    assert problem.path == str(path)
    assert problem.key is not None
    assert problem.key.startswith(f"backends.{name}")
    assert problem.line is not None
    assert problem.line <= path.read_text(encoding="utf-8").count("\n") + 1


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_key_lines_never_crashes_and_stays_in_range(text: str) -> None:
    lines = key_lines(text)
    assert all(1 <= line <= text.count("\n") + 1 for line in lines.values())


def test_quotes_inside_strings_do_not_hide_later_tables() -> None:
    text = (
        "[backends.a]\noptions = { q = \"'''\" }\nnote = '\"\"\"'\n[backends.b]\ntarget = 'm:f'\n"
    )
    lines = key_lines(text)
    assert lines.line_of(("backends", "b"), exact=True) == 4
    assert lines.line_of(("backends", "b", "target"), exact=True) == 5


def test_multiline_strings_are_skipped() -> None:
    text = 'description = """\n[backends.fake]\n"""\n[backends.real]\n'
    lines = key_lines(text)
    assert lines.line_of(("backends", "fake"), exact=True) is None
    assert lines.line_of(("backends", "real"), exact=True) == 4


def test_unicode_line_separators_inside_strings_do_not_shift_lines(write: WriteFn) -> None:
    # TOML ends lines at LF only; str.splitlines() would also split at these.
    path = write(
        "backends.toml",
        '[backends.a]\ntarget = "m:f"\ndescription = "x\u2028y\x85z"\n[backends.b]\ntags = 1\n',
    )
    definitions, problems = read(path)
    assert [(d.name, d.source.line) for d in definitions.values()] == [("a", 1), ("b", 4)]
    assert [(p.line, p.key) for p in problems] == [(5, "backends.b.tags")]


def test_options_on_a_chain_are_refused_not_lost(write: WriteFn) -> None:
    path = write("backends.toml", '[backends.c]\nchain = ["eager"]\noptions = { fp16 = true }\n')
    _, problems = read(path)
    assert [(p.line, p.key) for p in problems] == [(3, "backends.c.options")]  # the key's line
    assert "'options' go with a 'target'" in problems[0].message
