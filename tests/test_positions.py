"""TOML positions: the line of every header and key, from hand-written TOML of every shape."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc

import pytest
import tomli
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_backend_registry._keys import toml_key
from torch_backend_registry._sources.positions import key_at, key_lines, physical_lines

# Each case: a document that tomli accepts, then paths with the line they must have,
# and paths that must not be found (they stand inside a value).
SHAPES = {
    "multi-line basic string opened inside an array": (
        'a = [\n  """\n[fake]\nb = 1\n""",\n]\n[real]\nc = 1\n',
        {("a",): 1, ("real",): 7, ("real", "c"): 8},
        [("fake",), ("b",)],
    ),
    "multi-line literal string opened inside an array": (
        "a = ['''\n[fake]\n''', 'x']\n[real]\n",
        {("real",): 4},
        [("fake",)],
    ),
    "escaped quotes before the closing quotes": (
        'a = """x\\"""\n[fake]\n"""\n[real]\nb = 2\n',
        {("real",): 4, ("real", "b"): 5},
        [("fake",)],
    ),
    "an escaped quote then the closing quotes": (
        'a = """x\\""""\n[real]\n',
        {("real",): 2},
        [],
    ),
    "a one-element nested array on its own line": (
        'a = [\n  ["x"],\n  ["y", "z"],\n]\n[real]\n',
        {("a",): 1, ("real",): 5},
        [("x",), ("y",)],
    ),
    "an array of tables inside an array value": (
        "a = [\n  [1, 2],\n  [3],\n]\nb = 2\n",
        {("a",): 1, ("b",): 5},
        [],
    ),
    "a comment holding a bracket inside an array": (
        "a = [ # [fake\n  1,\n]\nb = 2\n",
        {("b",): 4},
        [("fake",)],
    ),
    "a string holding brackets inside an array": (
        'a = ["]", \'[\', "\\"]"\n]\nb = 2\n',
        {("b",): 3},
        [],
    ),
    "four and five quotes closing a multi-line string": (
        'a = \'\'\'x\'\'\'\'\nb = """y"""""\nc = 3\n',
        {("a",): 1, ("b",): 2, ("c",): 3},
        [],
    ),
    "a line continuation in a basic multi-line string": (
        'a = """one \\\n  [fake]\n  two"""\nb = 2\n',
        {("b",): 4},
        [("fake",)],
    ),
    "dotted, quoted and spaced keys": (
        '[ backends . "x.y" ]\ntarget = "m:f"\n\'lit\'.k = 1\n',
        {("backends", "x.y"): 1, ("backends", "x.y", "target"): 2, ("backends", "x.y", "lit"): 3},
        [],
    ),
    "array of tables headers": (
        "[[a]]\nb = 1\n[[a]]\nb = 2\n",
        {("a",): 1, ("a", "b"): 2},
        [],
    ),
}


@pytest.mark.parametrize(("text", "found", "absent"), SHAPES.values(), ids=SHAPES.keys())
def test_every_shape_gives_the_right_lines(
    text: str, found: dict[tuple[str, ...], int], absent: list[tuple[str, ...]]
) -> None:
    tomli.loads(text)  # each case is valid TOML: the parser and the scan must agree
    lines = key_lines(text)
    for path, line in found.items():
        assert lines.line_of(path, exact=True) == line, path
    for path in absent:
        assert lines.line_of(path, exact=True) is None


def test_a_prefix_has_the_line_of_its_first_definition() -> None:
    lines = key_lines("[a.b.c]\nx = 1\n[a.d]\ny = 2\n")
    assert lines.line_of(("a",), exact=True) == 1
    assert lines.line_of(("a", "b"), exact=True) == 1
    assert lines.line_of(("a", "d"), exact=True) == 3
    assert lines.line_of(("a", "d", "y", "deeper")) == 4  # the longest known prefix
    assert lines.line_of(("z",)) is None


def test_memory_is_linear_in_the_number_of_dotted_parts() -> None:
    # 2,000 dotted parts on one line: every prefix stored as a tuple would take
    # millions of tuple slots (quadratic); a trie takes one node a part.
    def peak(parts: int) -> int:
        text = "a" + ".a" * (parts - 1) + " = 1\n"
        tracemalloc.start()
        key_lines(text)
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return size

    small, large = peak(500), peak(2000)
    assert large < 6 * small  # 4x the parts: about 4x the memory, never 16x


def test_key_like_lines_inside_a_multiline_string_are_not_keys() -> None:
    body = "\n".join(f"k{i}.a.b.c = 1" for i in range(2000))
    text = f'd = """\n{body}\n"""\nafter = 1\n'
    lines = key_lines(text)
    assert lines.line_of(("k0",), exact=True) is None
    assert lines.line_of(("after",), exact=True) == 2003


def test_key_at_names_the_key_written_on_a_line() -> None:
    lines = physical_lines('[backends.a]\ntarget = "m:f"\n\n"odd\\nkey" = 1\n')
    assert key_at(lines, 1) == "backends.a"
    assert key_at(lines, 2) == "backends.a.target"
    assert key_at(lines, 3) is None
    assert key_at(lines, 4) == 'backends.a."odd\\u000Akey"'


def test_toml_key_quotes_what_is_not_bare() -> None:
    assert toml_key(("backends", "fast")) == "backends.fast"
    assert toml_key(("backends", "with space")) == 'backends."with space"'
    assert toml_key(("a\x1b[2J",)) == '"a\\u001B[2J"'
    assert toml_key(('q"',)) == '"q\\""'


# Documents built from pieces that reach every state of the scan.
PIECES = st.sampled_from(
    [
        "a = 1",
        "[t]",
        "[[arr]]",
        "k.j = 'x'",
        'm = """',
        "m = '''",
        '"""',
        "'''",
        "v = [",
        "  [1],",
        "]",
        '  """in"""',
        "# c [x]",
        'q = "\\""',
        "w = { a = 1 }",
        'f = ["a", 1, true,]',
        "g = ['x'] # c [",
        't = ["]"',
        'u = ["[", "]"]',
        "e = []",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=25))
def test_the_scan_agrees_with_the_parser_on_valid_documents(pieces: list[str]) -> None:
    text = "\n".join(pieces) + "\n"
    try:
        data = tomli.loads(text)
    except tomli.TOMLDecodeError:
        key_lines(text)  # never crashes on invalid input either
        return
    lines = key_lines(text)
    # Every top-level key the parser found has a line, and only real lines.
    for key in data:
        assert lines.line_of((key,), exact=True) is not None, (key, text)
    assert all(1 <= line <= len(pieces) for line in lines.values())


def test_a_line_that_almost_reads_as_a_plain_key_is_scanned_at_once() -> None:
    # Near misses of the pattern for plain key lines (an array never closed, items without
    # commas, blanks between them) once made it try every way of matching: exponential in
    # the number of items. Each is a key line all the same; the time limit guards a hang.
    code = textwrap.dedent(
        """
        from torch_backend_registry._sources.positions import scan
        for line in [
            'a = [' + '"x"  ' * 60,
            'a = [' + '"x" ,  ' * 60 + '"y" "z"',
            'a = [' + '"x"' + '  "y"' * 60 + ']',
            'a = [' + ' \\t' * 60 + '"x" ]  x',
        ]:
            print(list(scan([line])))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[(1, (), ('a',))]"] * 4
