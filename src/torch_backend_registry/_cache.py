"""The warm start: validated manifests cached by their content, entry points by what is on sys.path.

A manifest's entry holds its text, its path, the source kind and a checksum of
the code that validates it, and is used only when all of them are equal to
what is read now: never time stamps (an edit within the same second that keeps
the size is seen). The entry-point index holds each ``sys.path`` folder's
``*.dist-info`` / ``*.egg-info`` names, which installing, upgrading or removing
a distribution changes, and the size and time of each one's metadata and
entry-points files, which an edit in place changes. The cache lives in the
user's cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``), readable and
writable by its owner only, and is judged by the trust rule; one that is
corrupt, from another format, untrusted or not writable is ignored (and rebuilt
where it can be). ``TORCH_BACKENDS_NO_CACHE`` turns it off.

Entries are :mod:`marshal` data, the format of Python's own bytecode caches:
loading it imports nothing, where :mod:`json` imports :mod:`re` and with it a
third of a warm listing's time. Like a ``.pyc``, an entry is believed only from
its owner's folder, and a CRC-32 over it catches a torn or corrupt file before
:mod:`marshal` reads it.
"""

from __future__ import annotations

import binascii
import marshal
import os
import sys
from itertools import count

from ._definition import (
    BackendDefinition,
    DefaultDeclaration,
    Discovery,
    PluginRule,
    Source,
)
from ._errors import ManifestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The first bytes of every entry; a new layout gets a new number.
MAGIC = b"TBR\x02"
NO_CACHE_VAR = "TORCH_BACKENDS_NO_CACHE"
_MAX_ENTRY = 64 * 2**20  # a cache file larger than this is not ours to read
_SUFFIX = ".bin"


def enabled() -> bool:
    return not os.environ.get(NO_CACHE_VAR)


def folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch-backend-registry")


def verdicts_path() -> str:
    """Where ``doctor`` remembers its verdicts."""
    return os.path.join(folder(), "verdicts" + _SUFFIX)


def _name(*parts: str) -> str:
    """A file name for an entry. Only a name: what the entry holds is compared in full,
    so two keys that share one merely take turns."""
    text = "\0".join((sys.version, *parts))
    return f"{binascii.crc32(text.encode('utf-8', 'surrogateescape')):08x}{_SUFFIX}"


#: Python's version, this layout and the bytes of the code that parses command lines,
#: reads and validates manifests and entry points: an upgrade, or an edit of it,
#: starts afresh.
_CODE: list[int] = []
_CODE_FILES = (
    "_arguments.py",
    "_cache.py",
    "_definition.py",
    "_files.py",
    "_manifest.py",
    "_positions.py",
    "_schema.py",
    "_sources.py",
)


def _code_key() -> int:
    if not _CODE:
        here = os.path.dirname(os.path.abspath(__file__))
        checksum = binascii.crc32(MAGIC + sys.version.encode())
        for name in _CODE_FILES:
            try:
                with open(os.path.join(here, name), "rb") as handle:
                    checksum = binascii.crc32(handle.read(), checksum)
            except OSError:
                checksum = binascii.crc32(name.encode(), checksum)
        _CODE.append(checksum)
    return _CODE[0]


# ----------------------------------------------------------------------------- files


def read_entry(path: str) -> Any:
    """A cache file's value, or ``None`` (absent, untrusted, corrupt, another format)."""
    from ._files import untrusted_file, untrusted_folder

    if untrusted_folder(os.path.dirname(path)) is not None:
        return None
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if untrusted_file(info) is not None or info.st_size > _MAX_ENTRY:
                return None
            blob = handle.read()
    except OSError:
        return None
    head = len(MAGIC) + 4
    if blob[: len(MAGIC)] != MAGIC or len(blob) < head:
        return None
    payload = memoryview(blob)[head:]
    if int.from_bytes(blob[len(MAGIC) : head], "little") != binascii.crc32(payload):
        return None
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None


def write_entry(path: str, value: Any) -> None:
    """Write atomically, owner-only; a folder that cannot be written leaves no cache."""
    try:
        payload = marshal.dumps(value)
        _make_folders(os.path.dirname(path))
        # Owner-only from the start, and a name no other process picks.
        temporary = f"{path}.{os.getpid()}.{next(_COUNTER)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(temporary, flags, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(MAGIC + binascii.crc32(payload).to_bytes(4, "little") + payload)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except (OSError, TypeError, ValueError):
        pass  # a read-only home, a full disk, a value marshal cannot hold: no cache, that is all


def read_keyed(path: str, key: object) -> dict[Any, Any] | None:
    """The table :func:`write_keyed` stored at ``path`` with a key equal to ``key``, or ``None``."""
    data = read_entry(path)
    if type(data) is tuple and len(data) == 2 and data[0] == key and type(data[1]) is dict:
        return data[1]
    return None


def write_keyed(path: str, key: object, table: dict[Any, Any]) -> None:
    """Store ``table`` at ``path``, to be believed only by a reader asking with an equal key."""
    write_entry(path, (key, table))


_COUNTER = count()
_MADE: set[str] = set()


def _make_folders(path: str) -> None:
    """Each folder from the cache's own down to ``path``, owner-only (makedirs gives
    only the last one the mode asked for); once a process."""
    if path in _MADE:
        return
    _MADE.add(path)
    root = folder()
    os.makedirs(os.path.dirname(root), exist_ok=True)  # ~/.cache: the user's, as it is
    current = root
    for part in [root, *os.path.relpath(path, root).split(os.sep)]:
        current = part if part == root else os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            continue


# ----------------------------------------------------------------------------- manifests


class ManifestEntry:
    """Where the reading of one manifest is remembered, and what it must match."""

    def __init__(self, path: str, kind: str, text: str) -> None:
        self.file = os.path.join(folder(), "manifests", _name(kind, path))
        self.key = (_code_key(), kind, path, os.path.realpath(path), text)

    def load(self) -> tuple[bool, Discovery | None]:
        """Whether a reading of exactly this manifest is remembered, and that reading."""
        data = read_keyed(self.file, self.key)
        try:
            if data is None:
                return False, None
            return True, None if data["found"] is None else _discovery(data["found"])
        except (IndexError, KeyError, TypeError, ValueError):
            return False, None

    def store(self, found: Discovery | None) -> None:
        if found is not None and found.warnings:
            return  # judged by the trust rule each time, never remembered
        plain = None if found is None else _plain_discovery(found)
        write_keyed(self.file, self.key, {"found": plain})


def manifest_entry(path: str, kind: str, text: str) -> ManifestEntry | None:
    """The cache entry of this manifest, or ``None`` when the cache is off."""
    return ManifestEntry(path, kind, text) if enabled() else None


# ----------------------------------------------------------------------------- entry points


def _stamps() -> str:
    """What decides the entry points: each sys.path entry and the distributions in it."""
    lines = [str(_code_key())]
    for entry in sys.path:
        lines.append(repr(entry))
        try:
            names = sorted(
                name
                for name in os.listdir(entry or os.curdir)
                if name.endswith((".dist-info", ".egg-info", ".egg", ".egg-link"))
            )
            # An upgrade renames the folder; an edit in place changes these files.
            lines.extend(_stamped(os.path.join(entry or os.curdir, name), name) for name in names)
        except OSError:
            try:
                info = os.stat(entry)  # a zip file: its size and time say it changed
                lines.append(f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}")
            except OSError:
                lines.append("-")
    return "\n".join(lines)


def _stamped(folder: str, name: str) -> str:
    stamps = [repr(name)]
    for inside in ("entry_points.txt", "METADATA", "PKG-INFO"):
        try:
            info = os.stat(os.path.join(folder, inside))
        except OSError:
            continue
        stamps.append(f"{inside}:{info.st_size}:{info.st_mtime_ns}")
    return " ".join(stamps)


class EntryPointsEntry:
    """Where the entry points of this ``sys.path`` are remembered, and what they must match."""

    def __init__(self) -> None:
        self.file = os.path.join(folder(), "entry-points", _name(*sys.path))
        self.key = _stamps()

    def load(self) -> Discovery | None:
        data = read_keyed(self.file, self.key)
        try:
            return None if data is None else _discovery(data)
        except (IndexError, KeyError, TypeError, ValueError):
            return None

    def store(self, found: Discovery) -> None:
        write_keyed(self.file, self.key, _plain_discovery(found))


def entry_points_entry() -> EntryPointsEntry | None:
    """The cache entry of the entry points, or ``None`` when the cache is off."""
    return EntryPointsEntry() if enabled() else None


def installed_version(distribution: str) -> str | None:
    """The version ``importlib.metadata`` gives of an installed distribution, or ``None``.

    Remembered under the same key as the entry points (what is on ``sys.path``),
    so a warm start that needs PyTorch's version (a remembered ``doctor``
    verdict) does not import ``importlib.metadata`` for it.
    """
    file = os.path.join(folder(), "versions", _name(*sys.path))
    key = _stamps() if enabled() else None
    versions = (read_keyed(file, key) if key is not None else None) or {}
    remembered: object = versions.get(distribution, 0)
    if remembered is None or isinstance(remembered, str):
        return remembered
    from importlib.metadata import PackageNotFoundError, version

    found: str | None
    try:
        found = version(distribution)
    except PackageNotFoundError:
        found = None
    if key is not None:
        write_keyed(file, key, {**versions, distribution: found})
    return found


# ----------------------------------------------------------------------------- command lines


class CommandLines:
    """The newest command lines argparse accepted, with its answers (``_arguments``)."""

    #: Enough for every command line a script or a shell history repeats.
    LIMIT = 64

    def __init__(self) -> None:
        self.file = os.path.join(folder(), "command-lines", _name())
        self._lines: dict[tuple[str, ...], dict[str, Any]] | None = None

    def _load(self) -> dict[tuple[str, ...], dict[str, Any]]:
        if self._lines is None:
            self._lines = read_keyed(self.file, _code_key()) or {}
        return self._lines

    def get(self, words: list[str]) -> dict[str, Any] | None:
        found = self._load().get(tuple(words))
        if not isinstance(found, dict) or not all(
            isinstance(name, str) and name.isidentifier() for name in found
        ):
            return None
        return found

    def put(self, words: list[str], parsed: dict[str, Any]) -> None:
        lines = self._load()
        lines.pop(tuple(words), None)
        lines[tuple(words)] = parsed  # the newest last: the oldest go first
        for old in list(lines)[: -self.LIMIT]:
            del lines[old]
        write_keyed(self.file, _code_key(), lines)


def command_lines() -> CommandLines | None:
    """The remembered command lines, or ``None`` when the cache is off."""
    return CommandLines() if enabled() else None


# ------------------------------------------------------------------------ to and from plain data


def _plain_discovery(found: Discovery) -> dict[str, Any]:
    return {
        "definitions": [_plain_definition(d) for d in found.definitions],
        "problems": [_plain_error(p) for p in found.problems],
        "default": None
        if found.default is None
        else [found.default.name, found.default.path, found.default.line, found.default.key],
        "allow": None if found.allow is None else [sorted(found.allow.names), found.allow.where],
        "deny": None if found.deny is None else [sorted(found.deny.names), found.deny.where],
    }


def _discovery(data: dict[str, Any]) -> Discovery:
    found = Discovery()
    found.definitions = [_definition(d) for d in data["definitions"]]
    found.problems = [_error(p) for p in data["problems"]]
    if data["default"] is not None:
        found.default = DefaultDeclaration(*data["default"])
    if data["allow"] is not None:
        found.allow = PluginRule(*data["allow"])
    if data["deny"] is not None:
        found.deny = PluginRule(*data["deny"])
    return found


def _plain_error(error: ManifestError) -> list[Any]:
    return [error.message, error.path, error.line, error.key]


def _error(data: list[Any]) -> ManifestError:
    message, path, line, key = data
    return ManifestError(message, path=path, line=line, key=key)


def _plain_definition(d: BackendDefinition) -> tuple[Any, ...]:
    # A tuple in a fixed order, tuples inside: marshal gives tuples back as tuples,
    # so a warm start unpacks each definition once and converts nothing.
    source = d.source
    return (
        d.name,
        (source.kind, source.path, source.line, source.distribution, source.version, source.module),
        d.target,
        d.chain,
        d.tags,
        d.description,
        d.aliases,
        d.requires,
        _plain_value(dict(d.options)) if d.options else None,
        d.enabled,
        d.python_path,
        d.skip_known_failures,
        d.distribution,
        None if d.problem is None else _plain_error(d.problem),
    )


def _definition(data: tuple[Any, ...]) -> BackendDefinition:
    (
        name,
        (kind, path, line, distribution, version, module),
        target,
        chain,
        tags,
        description,
        aliases,
        requires,
        options,
        enabled,
        python_path,
        skip_known_failures,
        picked,
        problem,
    ) = data
    for value in (chain, tags, aliases, requires, python_path):
        if value is not None and type(value) is not tuple:
            raise TypeError("not a definition")  # a planted entry: the cache is not believed
    return BackendDefinition(
        name,
        Source(
            kind, path=path, line=line, distribution=distribution, version=version, module=module
        ),
        target=target,
        chain=chain,
        tags=tags,
        description=description,
        aliases=aliases,
        requires=requires,
        options=None if options is None else _value(options),
        enabled=enabled,
        python_path=_shared(python_path) if python_path else (),
        skip_known_failures=skip_known_failures,
        distribution=picked,
        problem=None if problem is None else _error(problem),
    )


_SHARED: dict[tuple[str, ...], tuple[str, ...]] = {}


def _shared(value: tuple[str, ...]) -> tuple[str, ...]:
    """One tuple for the python-path every backend of a manifest shares."""
    return _SHARED.setdefault(value, value)


def _plain_value(value: Any) -> Any:
    """A TOML value as plain data: tables and dates tagged, so nothing reads back as another."""
    if isinstance(value, dict):
        return {"t": [[k, _plain_value(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [_plain_value(v) for v in value]
    if isinstance(value, (str, bool, int, float)):
        return value
    import datetime

    if isinstance(value, datetime.datetime):
        return {"dt": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"d": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"tm": value.isoformat()}
    raise TypeError(f"not a TOML value: {type(value).__name__}")


def _value(data: Any) -> Any:
    if isinstance(data, list):
        return [_value(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "t" in data:
        return {k: _value(v) for k, v in data["t"]}
    import datetime

    if "dt" in data:
        return datetime.datetime.fromisoformat(data["dt"])
    if "d" in data:
        return datetime.date.fromisoformat(data["d"])
    return datetime.time.fromisoformat(data["tm"])
