"""How a key of a manifest is written: quoted as TOML quotes it, under the table it stands in."""

from __future__ import annotations

import os

#: The table that holds the manifest inside ``pyproject.toml``.
PYPROJECT_TABLE = ("tool", "torch-backends")


def table_prefix(path: str) -> tuple[str, ...]:
    """Where the manifest stands in its file: under ``[tool.torch-backends]`` in pyproject.toml."""
    return PYPROJECT_TABLE if os.path.basename(path) == "pyproject.toml" else ()


#: The characters of a bare key part, as TOML defines them.
BARE_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def toml_key(parts: tuple[str, ...]) -> str:
    """A dotted key as TOML writes it: bare parts as they are, the others quoted.

    Quoting also keeps a hostile key (a newline, a terminal escape, a bidi
    override) from breaking the one line an error is printed on.
    """
    return ".".join(
        part if part and BARE_KEY_CHARS.issuperset(part) else _quote(part) for part in parts
    )


def _quote(part: str) -> str:
    out = ['"']
    for char in part:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(f"\\U{ord(char):08X}")
    out.append('"')
    return "".join(out)
