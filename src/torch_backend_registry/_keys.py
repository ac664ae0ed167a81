"""How a key of a manifest is written: quoted as TOML quotes it, under the table it stands in."""

from __future__ import annotations

import os

#: The table that holds the manifest inside ``pyproject.toml``.
PYPROJECT_TABLE = ("tool", "torch-backends")


def table_prefix(path: str | None) -> tuple[str, ...]:
    """The table a manifest's keys stand in (none for a file's own, or for no file)."""
    return PYPROJECT_TABLE if path and os.path.basename(path) == "pyproject.toml" else ()


#: The characters of a bare key part, as TOML defines them.
BARE_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def toml_key(parts: tuple[str, ...]) -> str:
    """A dotted key as TOML writes it: bare parts as they are, the others quoted.

    Quoting also keeps a hostile key (a newline, a terminal escape, a bidi
    override) from breaking the one line an error is printed on.
    """
    return ".".join(
        part if part and BARE_KEY_CHARS.issuperset(part) else f'"{"".join(map(_escaped, part))}"'
        for part in parts
    )


def _escaped(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    if char.isprintable():
        return char
    return f"\\u{ord(char):04X}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08X}"
