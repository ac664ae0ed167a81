"""``backends.choices``: the choices ``torch-backends tune`` wrote, read where a select chain
looks for one (each found by its key's text, and parsed alone: a file of 10,000 choices costs
a lookup the reading of 8 MB, some 10 ms) and read whole for ``check`` and ``explain``.

A choices file is configuration: the trust rule holds for it as for a manifest, and one
that cannot be used is a warning, never an error.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from typing import Any, NamedTuple

from .._definition import BackendDefinition
from .._errors import BackendRegistryError, warn
from . import Context, project_manifest
from .cache import stamps
from .files import parse_toml, read_text

#: The file ``tune`` writes beside the manifest that declares a chain.
CHOICES_FILE = "backends.choices"
#: The largest choices file read: some 10,000 choices take 8 MiB.
MAX_BYTES = 64 * 2**20
#: The most keys and key parts a choices file may hold: 10,000 choices of a chain of ten
#: members take some 600,000.
MAX_KEY_PARTS = 2_000_000
#: Where each choice starts, as ``tune`` writes it (and as TOML allows it written by hand).
_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*choice[ \t]*\]\]", re.MULTILINE)
#: Each choice's key, as ``tune`` writes it.
_KEY = re.compile(r"^[ \t]*key[ \t]*=[ \t]*[\"']([^\"'\n]*)[\"']", re.MULTILINE)


class ChoicesFile:
    """One ``backends.choices`` as read: its ``path`` and ``text``."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text

    def find(self, key: str) -> tuple[dict[str, Any], int] | None:
        """The choice of ``key`` and the line it starts on, parsed alone; ``None`` where there
        is none (or it cannot be read, or the table the key line stands in is not that
        choice's: ``check`` says why)."""
        import tomli

        # The first line that writes the key, found by the key's own text (a scan in C, not
        # a regular expression tried at each of 10,000 choices' lines), then the header above
        # it and the next one below: what a lookup parses is one choice. Each line is looked
        # at once, whatever a hostile file repeats on it.
        text, at = self.text, self.text.find(key)
        while at >= 0:
            if (line := _KEY.match(text, text.rfind("\n", 0, at) + 1)) and line[1] == key:
                break
            at = -1 if (ends := text.find("\n", at)) < 0 else text.find(key, ends)
        if at < 0:
            return None
        start = text.rfind("\n", 0, at) + 1  # the key's line, then each line above with a [[
        while not _HEADER.match(text, start):
            if (bracket := text.rfind("[[", 0, start)) < 0:
                return None
            start = text.rfind("\n", 0, bracket) + 1
        end = _HEADER.search(text, at)  # the next choice's header, if any: the text's end
        with contextlib.suppress(tomli.TOMLDecodeError, ValueError, RecursionError):
            # Not where the key line stands inside a string, or out of its table.
            match tomli.loads(text[start : end.start() if end else None]).get("choice"):
                case [dict() as choice] if choice.get("key") == key:
                    return choice, self.text.count("\n", 0, start) + 1
        return None

    @functools.cached_property
    def every(self) -> list[tuple[dict[str, Any], int]]:
        """Every choice, with the line it starts on; a :class:`ManifestError` at its line
        where the file is no TOML."""
        tables = parse_toml(self.path, self.text, MAX_KEY_PARTS)[0].get("choice")
        lines, line, last = [], 1, 0
        # Where each choice starts, its line counted from one start to the next: linear in
        # the text.
        for start in (match.start() for match in _HEADER.finditer(self.text)):
            line += self.text.count("\n", last, start)
            lines.append(line)
            last = start
        if not isinstance(tables, list):
            return []
        return [(t, line) for t, line in zip(tables, lines, strict=False) if isinstance(t, dict)]


class Shipped(NamedTuple):
    """The choices files a chain's choices may be shipped in, in order: beside the manifest
    that declares it, then beside the project manifest."""

    files: list[ChoicesFile]

    def find(self, key: str) -> tuple[dict[str, Any], str] | None:
        """The choice of ``key``, and where it is (``PATH:LINE``)."""
        for file in self.files:
            if (found := file.find(key)) is not None:
                return found[0], f"{file.path}:{found[1]}"
        return None

    def every(self) -> list[tuple[dict[str, Any], str]]:
        """Every choice that can be read, and where it is."""
        found = []
        for file in self.files:
            with contextlib.suppress(BackendRegistryError):  # check says why
                found += [(table, f"{file.path}:{line}") for table, line in file.every]
        return found


def shipped_for(chain: BackendDefinition, context: Context) -> Shipped:
    """The choices files of ``chain`` that can be read here (perhaps none)."""
    folders = [] if chain.source.path is None else [os.path.dirname(chain.source.path)]
    manifest = None if context.cwd is None else project_manifest(context.cwd)
    folders += [os.path.dirname(manifest)] if manifest else []
    paths = dict.fromkeys(os.path.realpath(os.path.join(f, CHOICES_FILE)) for f in folders)
    files = [file for file in map(choices_file, paths) if file is not None]
    return Shipped(files)


def choices_file(path: str) -> ChoicesFile | None:
    """``path`` read as a choices file (``None``: there is none); one that must not or cannot
    be used is said as a warning, once a version of it."""
    (stamp,) = stamps([path])
    return _read(path, stamp) if stamp else None


@functools.lru_cache(maxsize=64)  # read once a version of the file (its size, time, inode)
def _read(path: str, _stamp: tuple[int, ...]) -> ChoicesFile | None:
    try:
        return read_choices(path)
    except BackendRegistryError as exc:
        warn(f"{exc}; its choices are not used")
        return None


def read_choices(path: str) -> ChoicesFile:
    """``path`` read as a choices file; :class:`ManifestError` where it cannot be (no such
    file among them), :class:`Untrusted` where it must not."""
    return ChoicesFile(path, read_text(path, MAX_BYTES, what="choices file"))
