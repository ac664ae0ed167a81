"""Reading configuration safely: the trust rule, a size limit, TOML errors as ManifestError."""

from __future__ import annotations

import functools
import itertools
import os
import stat

from .._definition import Problem
from .._errors import BackendRegistryError, ManifestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

    from .positions import KeyLines

#: The largest manifest read. Hand-written manifests take a few kilobytes, and
#: 10,000 typical backends about 1 MB (spread over files, as a generator would).
#: With the budget below, the most costly document of this size that can be built
#: (long lines, deep nesting, huge arrays, many keys) lists in about a second and
#: under 300 MB on 2 cores: benchmarks/bench_hostile.py measures each shape.
MAX_BYTES = 1024 * 1024

#: The most key parts (``a.b.c = 1`` holds three) a manifest may hold. The TOML
#: parser's cost is in the tables it makes, up to one for every two bytes
#: (``k.a.a.a... = 1``): about 10 us and 1.5 KB each. A backend takes 3 to 10 parts.
MAX_KEY_PARTS = 100_000

# A FIFO named like a manifest would block open() until a writer comes; with
# O_NONBLOCK it opens at once and fstat tells it is not a regular file.
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

NO_SUCH_FILE = "no such file"

#: The mode of a file written for people and other processes to read (a lock, a starter
#: manifest), less the umask: never writable by every user, which the rule below refuses.
SHARED_FILE_MODE = 0o664


class Untrusted(BackendRegistryError):
    """Configuration left out by the trust rule (its ``problem``); where no source reads it
    (a lock, ``init``), the error a command or ``install()`` says as it is."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(f"{path}: {message}")
        self.problem = Problem(message, path=path)


def untrusted(info: os.stat_result, *, folder: bool = False, private: bool = False) -> str | None:
    """Why a file (or ``folder``) must not be used, or ``None``: the one trust rule.

    Owned by this user or root and not writable by every user, as git (``safe.directory``)
    and OpenSSH (``StrictModes``) have it; group-writable is accepted, as git does. A folder
    writable by every user is accepted with the sticky bit (as /tmp): there only a file's
    owner can rename or remove it, and every file read is judged by the file rule itself.

    ``private`` is the cache's stricter form, for what only this process's user writes: a
    folder (as ``lstat`` sees it) or regular file of this user alone, not root's, that no
    other user can change nor, a folder, look into.
    """
    if not hasattr(os, "getuid"):  # pragma: no cover - no ownership model (Windows)
        return None
    if private and not (stat.S_ISDIR if folder else stat.S_ISREG)(info.st_mode):
        return "it is not a " + ("folder" if folder else "regular file")
    others = stat.S_IRWXG | stat.S_IRWXO if folder else stat.S_IWGRP | stat.S_IWOTH
    if private and info.st_mode & others:
        return "other users can " + ("reach it" if folder else "change it")
    if info.st_mode & stat.S_IWOTH and not (folder and info.st_mode & stat.S_ISVTX):
        return "it is writable by every user"
    if info.st_uid not in ((os.getuid(),) if private else (0, os.getuid())):
        return f"it is owned by another user (uid {info.st_uid})"
    return None


def untrusted_folder(path: str, *, private: bool = False) -> str | None:
    """Why a folder must not be a place configuration or code comes from (with ``private``,
    nor the cache's), or ``None``; a folder that cannot be examined is not trusted."""
    try:
        return untrusted((os.lstat if private else os.stat)(path), folder=True, private=private)
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror or exc})"


def untrusted_message(what: str, reason: str) -> str:
    return f"{what} not used: {reason}; fix its owner or mode (as git's safe.directory)"


def refused_folders(folders: Iterable[str]) -> dict[str, str]:
    """Each of a backend's python-path ``folders`` that may serve no code, with why; the one
    judgment for its lookup, its ``requires``, a ``--model`` beside it and ``check``."""
    refused = {}
    for folder in folders:
        # One that cannot be examined (it does not exist) serves nothing either way.
        if (reason := untrusted_folder(folder)) and not reason.startswith("it cannot be examined"):
            refused[folder] = untrusted_message(f"python-path folder {folder!r}", reason)
    return refused


def may_hold(path: str, marker: bytes) -> bool:
    """Whether a file that cannot be read as a manifest (refused, not UTF-8, too large, not
    readable) may hold ``marker``: its bytes say, where they can be read; a regular file
    that cannot be read may. A missing file, a folder or a FIFO holds nothing."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        # Not open(fd): it refuses a folder's descriptor, and leaves it open.
        return stat.S_ISREG(os.fstat(fd).st_mode) and marker in os.read(fd, MAX_BYTES)
    except OSError:
        return True
    finally:
        os.close(fd)


def read_text(path: str, limit: int = MAX_BYTES, what: str = "manifest") -> str:
    """A manifest's text (of at most ``limit`` bytes); :class:`ManifestError` where it
    cannot be used, :class:`Untrusted` where it must not."""
    data = read_bytes(path, limit, what)
    try:
        # "utf-8-sig": a byte order mark, as some editors write, is not part of the text.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        from .positions import key_at

        # Up to the byte that is not UTF-8, the last line the one it is on.
        lines = data[: exc.start].decode("utf-8-sig", errors="replace").split("\n")
        raise ManifestError(
            f"not valid UTF-8 (byte {data[exc.start]:#04x}); save the file as UTF-8",
            path=path,
            line=len(lines),
            key=key_at(lines, len(lines)),
        ) from exc


def read_bytes(path: str, limit: int = MAX_BYTES, what: str = "manifest") -> bytes:
    """A file's bytes (at most ``limit``), as :func:`read_text` reads them. The checks are
    made on the opened file, so the file judged is the file read (a link's target, and the
    folder holding it)."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise ManifestError(NO_SUCH_FILE, path=path) from None
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ManifestError(
                "is a directory, not a manifest file; remove or rename it, or name a .toml file",
                path=path,
            )
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError("is not a regular file; name a .toml file", path=path)
        reason = untrusted(info)
        if reason is None and (folder := untrusted_folder(os.path.dirname(os.path.realpath(path)))):
            reason = "the folder holding it " + folder.removeprefix("it ")
        if reason is not None:
            raise Untrusted(untrusted_message(what, reason), path=path)
        # In pieces (a read of the whole limit would ask for all that memory at once), up to
        # a byte past the limit, which tells a file too large.
        size = min(limit + 1, 1 << 24)
        pieces = iter(functools.partial(os.read, fd, size), b"")
        data = b"".join(itertools.islice(pieces, limit // size + 1))
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    finally:
        os.close(fd)
    if len(data) > limit:
        what = "a manifest" if limit == MAX_BYTES else "this file"
        raise ManifestError(
            f"is larger than {limit // 2**20} MiB, too large for {what}; is it the right file?",
            path=path,
        )
    return data


def parse_toml(
    path: str, text: str, budget: int = MAX_KEY_PARTS, *, within: tuple[str, ...] = ()
) -> tuple[dict[str, Any], KeyLines]:
    """Parse ``text``, and find the line of each key (which the parser does not tell).

    Every way of failing is a :class:`ManifestError` with a line: the key budget (checked
    first, so the parser never sees a document too costly to parse), syntax, nesting, numbers
    too long to read, an integer beyond 64 bits in the table ``within`` (the other tables of
    a ``pyproject.toml`` are other tools', which may hold any integer they read).
    """
    import re

    import tomli

    from .positions import TooManyKeys, key_at, key_lines, physical_lines

    try:
        lines = key_lines(text, budget)
    except TooManyKeys as exc:
        advice = (
            "in one manifest; split it into several files (a TORCH_BACKENDS_PATH folder"
            " reads them all)"
            if budget == MAX_KEY_PARTS
            else "in one file, more than this file is read"
        )
        raise ManifestError(
            f"more than {budget:,} keys and key parts {advice}", path=path, line=exc.line
        ) from None
    written = physical_lines(text) or [""]
    deep = False
    try:
        data = tomli.loads(text)
        # Only a long run of digits can write such an integer.
        values = nested(table_at(data, within)) if re.search(_LONG_NUMBER, text) else ()
        beyond = next(
            (keys for value, _, keys in values if type(value) is int and value not in _INT64),
            None,
        )
        if beyond is None:
            return data, lines
        # TOML's integers are 64-bit, and must be refused past that: tomli lets a long
        # hexadecimal one through, which no printing, JSON or key of it could then write.
        line = lines.line_of((*within, *beyond)) or 1
        said = "invalid TOML: an integer beyond TOML's 64-bit range; write it as a string"
    except tomli.TOMLDecodeError as exc:
        # Past the last line is the end of the document: point at the last line.
        line = max(1, min(exc.lineno, len(written)))
        meant = next((m for start, m in _PARSER_WORDS if exc.msg.startswith(start)), None)
        python = re.search(r"=\s*(True|False|None)\b", written[line - 1])
        if python is not None and exc.msg.startswith("Invalid value"):  # a Python habit
            meant = _PYTHON_WORDS[python.group(1)]
        said = f"invalid TOML: {exc.msg}" + (f" ({meant})" if meant else "")
    except RecursionError as exc:  # tomli's own limits on nesting and key parts
        # The parser gives no position here; the line with the most openings and dots
        # is where such nesting is written in any file that reaches the limits.
        line = 1 + max(range(len(written)), key=lambda i: sum(map(written[i].count, "[{.")))
        said, deep = f"invalid TOML: {exc}; nest less deeply", True
    except ValueError as exc:
        # int() refuses more than sys.get_int_max_str_digits() digits; tomli lets it through.
        if (match := re.search(r"[0-9][0-9_]{1000,}", text)) is None:
            raise ManifestError(f"invalid TOML: {exc}", path=path) from None
        line = text.count("\n", 0, match.start()) + 1
        said = "invalid TOML: a number too long to read; write it as a string"
    key = key_at(written, line)
    if deep and key is not None and len(key) > 200:
        key = None  # the key is the problem: a thousand parts help no one read the line
    raise ManifestError(said, path=path, line=line, key=key)


#: What any integer beyond 64 bits is written with: 16 or more digits, hexadecimal ones too.
_LONG_NUMBER = r"[0-9][0-9A-Fa-f_xob]{15,}"
#: The integers TOML can write.
_INT64 = range(-(2**63), 2**63)


def table_at(data: dict[str, Any], path: tuple[str, ...]) -> object:
    """The value at the key ``path`` of a parsed document; ``None`` where there is none."""
    value: object = data
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def nested(value: object) -> Iterator[tuple[object, int, tuple[str, ...]]]:
    """``value`` and each value inside it, depth first: how deep it is, and its key path
    (an array's items have the array's)."""
    # A stack, not recursion: tomli nests as deep as the interpreter's recursion limit.
    stack: list[tuple[object, int, tuple[str, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, keys = stack.pop()
        yield item, depth, keys
        if isinstance(item, dict):
            stack.extend((v, depth + 1, (*keys, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, depth + 1, keys) for v in item)


#: Python's spellings that TOML does not read, and what TOML writes instead.
_PYTHON_WORDS = {
    "True": "TOML spells booleans in lowercase: true",
    "False": "TOML spells booleans in lowercase: false",
    "None": "TOML has no null: leave the key out",
}

#: What the TOML parser says, and what it means for a user writing a manifest.
_PARSER_WORDS = (
    ("Cannot overwrite a value", "a key is given twice (or a table and a key share a name)"),
    ("Cannot declare", "a table is declared twice"),
    ("Cannot mutate immutable namespace", "a table is declared twice"),
    ("Illegal character '\\n'", "a string is not closed on this line"),
    ("Unterminated string", "a string is not closed"),
    ("Invalid value", 'a value TOML cannot read: quote a string (target = "a.b:c")'),
    ("Invalid statement", "not a key = value line or a [table] header"),
    # Where the parser gave up, which may be lines below the opening.
    ("Unclosed inline table", "a { on this line or above is not closed with }"),
    ("Unclosed array", "a [ on this line or above is not closed with ]"),
)
