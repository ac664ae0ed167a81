"""Where things are in a TOML text: the line of each table header and key (tomli gives none).

The scan follows TOML's strings, multi-line arrays and inline tables, and comments, so that
nothing inside a value is taken for a key or a header; its cost is linear in the text.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator

from .._keys import BARE_KEY_CHARS, toml_key

#: A bare key part, as TOML defines it.
BARE_KEY = re.compile(f"[{re.escape(''.join(sorted(BARE_KEY_CHARS)))}]+")
_BASIC = r'"(?:[^"\\\n]|\\.)*"'
_LITERAL = r"'[^'\n]*'"
_PART = rf"(?:{BARE_KEY.pattern}|{_BASIC}|{_LITERAL})"
_DOTTED_KEY = rf"{_PART}(?:[ \t]*\.[ \t]*{_PART})*"
_HEADER_RE = re.compile(rf"[ \t]*\[\[?[ \t]*({_DOTTED_KEY})[ \t]*\]\]?")
_KEY_RE = re.compile(rf"[ \t]*({_DOTTED_KEY})[ \t]*=")
_PART_RE = re.compile(_PART)
# Characters after a key's `=` that may start a value spanning several lines.
_MULTILINE_HINT = re.compile(r"""[\[{]|\"\"\"|'''""")
# A one-line array of plain strings and bare values, closed on its line (`tags = ["a"]`).
_SIMPLE_ARRAY = re.compile(
    r"""[ \t]*\[(?:[ \t]*(?:"[^"\\\n]*"|'[^'\n]*'|[\w.+-]+)[ \t]*,)*"""
    r"""[ \t]*(?:"[^"\\\n]*"|'[^'\n]*'|[\w.+-]+)?[ \t]*\][ \t\r]*(?:#.*)?$"""
)
# Most lines of a manifest: a bare key and a value closed on its line (a basic string with no
# escape, a number, a boolean, a date, an array of such strings), a comment after it. Each
# item of the array but the last ends at its comma, so that no two ways of matching a line
# are tried (an optional comma let the blanks between items go either way: exponential).
_PLAIN_KEY_LINE = re.compile(
    r"""[ \t]*([A-Za-z0-9_-]+)[ \t]*=[ \t]*"""
    r"""(?:"[^"\\\n]*"|[A-Za-z0-9_.:+-]+"""
    r"""|\[(?:[ \t]*"[^"\\\n]*"[ \t]*,)*[ \t]*(?:"[^"\\\n]*"[ \t]*)?\])"""
    r"""[ \t\r]*(?:#.*)?$"""
)
Path = tuple[str, ...]


def physical_lines(text: str) -> list[str]:
    """The lines of ``text`` as TOML counts them: ended by LF only (``str.splitlines()``
    also splits at ``\\f``, U+2028 and others, which TOML allows in comments and strings)."""
    return text.removesuffix("\n").split("\n") if text else []


class KeyLines:
    """The first line (1-based) on which each table and key path of a text is defined;
    ``[a.b.c]`` also defines ``a`` and ``a.b`` unless they came before, and a key inside an
    inline table has the line of the table's own key.

    A trie of key parts, so that a key of many dotted parts costs memory in proportion to
    its length, not its square: one flat dict from ``(node, part)`` to ``(child, line)``,
    strings and integers only, which the cyclic garbage collector does not follow.
    """

    __slots__ = ("_edges",)

    ROOT = 0

    def __init__(self) -> None:
        self._edges: dict[tuple[int, str], tuple[int, int]] = {}

    def add(self, path: Path, line: int, node: int = ROOT) -> int:
        """Define ``path`` below ``node`` (unless it was), at ``line``; the node it ends at."""
        for part in path:
            node = self._edges.setdefault((node, part), (len(self._edges) + 1, line))[0]
        return node

    def line_of(self, path: Path, *, exact: bool = False) -> int | None:
        """The line of ``path``, or of its longest prefix that is defined (with ``exact``,
        of ``path`` itself); ``None`` if none is."""
        node, line = self.ROOT, None
        for part in path:
            if (found := self._edges.get((node, part))) is None:
                return None if exact else line
            node, line = found
        return line

    def values(self) -> Iterator[int]:
        """Every recorded line (each path once)."""
        return (line for _node, line in self._edges.values())


class TooManyKeys(Exception):
    """A text holds more key parts than the budget; ``line`` is where it ran out."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


def key_lines(text: str, budget: float = math.inf) -> KeyLines:
    """The line of each table header and key path of a TOML text; with ``budget``,
    :class:`TooManyKeys` once they hold more parts than that (``a.b.c = 1`` holds three):
    each part may make a table, and a parser's cost is in its tables, not in the bytes."""
    lines = KeyLines()
    spent = 0
    table_node = KeyLines.ROOT
    for number, under, parts in scan(physical_lines(text)):
        spent += len(parts)
        if spent > budget:
            raise TooManyKeys(number)
        if under:  # a key of the last header (scan's table): it starts at that header's node
            lines.add(parts, number, table_node)
        else:  # a header, or a key before any header
            table_node = lines.add(parts, number)
    return lines


def key_at(lines: list[str], line: int) -> str | None:
    """The key (or table) written on ``line`` of ``lines``, dotted and quoted as TOML writes it."""
    found = (toml_key(table + parts) for n, table, parts in scan(lines[:line]) if n == line)
    return next(found, None)


def _split_key(dotted: str) -> Path:
    if '"' not in dotted and "'" not in dotted:
        # Bare keys (nearly all of them) hold no dots or quotes of their own.
        return tuple(part.strip(" \t") for part in dotted.split("."))
    return tuple(map(_unquoted, _PART_RE.findall(dotted)))


def _unquoted(part: str) -> str:
    if part[0] == '"' and "\\" in part:
        # Escapes are rare in keys; the parser itself reads them exactly as TOML does (an
        # escape it refuses leaves the part as written between its quotes, as below).
        import tomli

        with contextlib.suppress(ValueError, StopIteration):
            return next(iter(tomli.loads(f"{part} = 0")))
    return part[1:-1] if part[0] in "\"'" else part


def scan(lines: list[str]) -> Iterator[tuple[int, Path, Path]]:
    """Each table header and key line as ``(number, table, parts)``; a header has no table.
    Lines inside a value that spans several lines are never keys or headers."""
    table: Path = ()
    #: What is left open at the end of a line: arrays and tables, a multi-line string.
    depth, string = 0, ""
    for number, line in enumerate(lines, start=1):
        if depth or string:  # inside a value that spans lines
            depth, string = _feed(line, 0, depth, string)
            continue
        # (No key starts with a "[": a line that does and is no header is neither.)
        if plain := _PLAIN_KEY_LINE.match(line):
            yield number, table, (plain.group(1),)
        elif header := _HEADER_RE.match(line):
            table = _split_key(header.group(1))
            yield number, (), table
        elif key := _KEY_RE.match(line):
            yield number, table, _split_key(key.group(1))
            # Most values fit on their line; only these need the careful scan.
            if _MULTILINE_HINT.search(line, key.end()) and not _SIMPLE_ARRAY.match(line, key.end()):
                depth, string = _feed(line, key.end(), 0, "")


# What matters inside a value: brackets, comments, and strings (skipped whole),
# the quotes of a multi-line string first.
_TOKEN = re.compile(r"""\"\"\"|'''|"(?:[^"\\\n]|\\.)*"?|'[^'\n]*'?|[\[\]{}#]""")
#: The end of an open multi-line string, with the up to two more quotes that may end its
#: content ('''a'''' holds a'); in a basic string, quotes that no backslash escapes.
_STRING_END = {"'''": re.compile(r".*?'{3,5}"), '"""': re.compile(r'(?:\\.|[^\\])*?"{3,5}')}


def _feed(line: str, i: int, depth: int, string: str) -> tuple[int, str]:
    """Scan a value's text from ``line[i]`` to the end of the line, with ``depth`` arrays and
    tables open and ``string`` the quotes of an open multi-line string (or ""): what is
    left open after it."""
    while i < len(line):
        if string:
            if (end := _STRING_END[string].match(line, i)) is None:
                break
            i, string = end.end(), ""
            continue
        if (token := _TOKEN.search(line, i)) is None:
            break
        text = token.group()
        i = token.end()
        if text in ("[", "{"):
            depth += 1
        elif text in ("]", "}"):
            depth = max(depth - 1, 0)
        elif text == "#":
            break
        elif text in ('"""', "'''"):
            string = text
        # else a one-line string, skipped whole (an unclosed one runs to the line's end)
    return depth, string
