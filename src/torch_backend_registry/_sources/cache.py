"""The warm start: what was read before, as JSON entries in the user's cache folder.

Each entry is named by a digest of its key, sealed by a digest of its own
text (a torn or changed file is no entry), and its key holds everything the
value depends on: a manifest's full text, path and source kind and the bytes
of this package's code; the folders on ``sys.path`` and the metadata of the
distributions in them. An entry is never checked against a time stamp alone.

The folder is the user's cache folder as ``platformdirs`` knows it
(``$XDG_CACHE_HOME``, else ``~/.cache``, where a relative value is ignored).
It is used only when it is the user's own: created by this user, private, in
a folder the trust rule accepts. Entries are opened without blocking and read
only when they are regular files of this user no larger than a limit; anything
else, or anything that does not parse, is no entry. ``TORCH_BACKENDS_NO_CACHE``
turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
from types import MappingProxyType

from .._definition import (
    EMPTY,
    BackendDefinition,
    DefaultDeclaration,
    Discovery,
    PluginRule,
    Problem,
    Source,
    canonical,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

NO_CACHE_VAR = "TORCH_BACKENDS_NO_CACHE"
#: The format of entries; another value starts afresh.
LAYOUT = 4
_MAX_ENTRY = 64 * 2**20  # larger than any entry this library writes
_OPEN = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)


def cache_folder(environ: Mapping[str, str]) -> str | None:
    """The cache folder, or ``None`` where the cache is off or no home can be found."""
    if environ.get(NO_CACHE_VAR, "").strip() not in ("", "0"):
        return None
    import platformdirs

    try:
        path = platformdirs.user_cache_dir("torch-backend-registry", appauthor=False)
    except RuntimeError:  # no absolute HOME, no password entry
        return None
    # Resolved once: a link re-pointed later must not move the cache under a running process.
    return os.path.realpath(path) if os.path.isabs(path) else None


class Cache:
    """Entries in one folder; every failure quietly means "no entry" or "not written"."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        #: The folders of entries found private (they stay so: only their owner can change it).
        self._private: set[str] = set()

    def _usable(self, folder: str, *, make: bool = False) -> bool:
        """Whether entries may be read from (or with ``make``, written to) ``folder``."""
        if folder not in self._private:
            made = make and _make_private_folders(self.folder, folder)
            if not made and not _private_folders(self.folder, os.path.join(folder, "entry")):
                return False
            self._private.add(folder)
        return True

    def get(self, kind: str, key: object) -> Any:
        """The value stored under ``key``, or ``None``."""
        entry = self._entry(kind, key)
        if entry is None or not self._usable(os.path.dirname(entry[0])):
            return None
        path, name = entry
        try:
            fd = os.open(path, _OPEN | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not _private_file(info) or info.st_size > _MAX_ENTRY:
                return None
            with open(fd, "rb", closefd=False) as handle:
                data = handle.read(_MAX_ENTRY + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        import json

        seal, _, text = data.partition(b"\n")
        if seal != _seal(name, text):
            return None  # torn, truncated, changed or moved since it was written
        try:
            return json.loads(text, object_hook=_decode)
        except (ValueError, TypeError, KeyError, RecursionError):
            return None

    def put(self, kind: str, key: object, value: object) -> None:
        """Store ``value`` under ``key``: atomically, readable by its owner only."""
        entry = self._entry(kind, key)
        if entry is None:
            return
        path, name = entry
        import json

        try:
            text = json.dumps(_encode(value), separators=(",", ":")).encode()
            text = _seal(name, text) + b"\n" + text
            if not self._usable(os.path.dirname(path), make=True):
                return
            write_atomically(path, text, 0o600)
        except (OSError, TypeError, ValueError, RecursionError):
            pass  # a read-only home, a full disk: no cache, that is all

    @contextlib.contextmanager
    def locked(self, kind: str) -> Iterator[None]:
        """Hold the lock of the entries of ``kind`` (a file ``KIND.lock`` beside their folder)
        for the time of the block, so that a read, change and write of them is one step for
        every process. Where there is no lock to take (no cache, no ``fcntl``), the block
        runs unlocked."""
        root = self.folder
        fd = -1
        if root is not None and self._usable(os.path.join(root, kind), make=True):
            flags = (
                os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            )
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(root, f"{kind}.lock"), flags, 0o600)
        try:
            if fd >= 0:
                with contextlib.suppress(ImportError, OSError):
                    import fcntl

                    fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            if fd >= 0:
                os.close(fd)  # closing releases the lock

    def _entry(self, kind: str, key: object) -> tuple[str, bytes] | None:
        """Where the entry of ``key`` lies, and the digest of its key (which its seal holds)."""
        if self.folder is None:
            return None
        import hashlib

        key_text = canonical([LAYOUT, kind, key]).encode("utf-8", "surrogatepass")
        name = hashlib.sha256(key_text).hexdigest()
        return os.path.join(self.folder, kind, name + ".json"), name.encode()


def write_atomically(path: str, data: bytes, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a new file beside it (``mode``,
    less the umask), then renamed over it, so a reader sees the old file or the new one."""
    # A name no other writer, nor one that died before its rename, has used.
    temporary = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(temporary, flags, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _seal(name: bytes, text: bytes) -> bytes:
    """What an entry's first line holds: a digest of its key and its text, so that a torn
    or changed entry, or one moved to another key's name, is no entry."""
    import hashlib

    return hashlib.sha256(name + b"\n" + text).hexdigest().encode()


def _private_file(info: os.stat_result) -> bool:
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _private_folder(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


def _private_folders(root: str | None, entry: str) -> bool:
    """Whether the folders from the cache's own down to ``entry``'s are this user's, private,
    and below a folder the trust rule accepts: nobody else can have put anything there."""
    if root is None or not hasattr(os, "getuid"):
        return root is not None
    from .files import untrusted_folder

    folder = os.path.dirname(entry)
    return (
        untrusted_folder(os.path.dirname(root)) is None
        and _private_folder(root)
        and _private_folder(folder)
    )


def _make_private_folders(root: str | None, folder: str) -> bool:
    """Create the cache's folders, private; ``False`` where one exists that is not ours."""
    if root is None:
        return False
    os.makedirs(os.path.dirname(root), exist_ok=True)  # ~/.cache: the user's, as it is
    for path in (root, folder):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    return _private_folders(root, os.path.join(folder, "entry"))


@functools.cache  # one process runs one version of this code
def code_key() -> str:
    """A digest of the code that reads manifests: this package's, byte by byte, and the
    installed validator and parser (pydantic, tomli) with Python itself; an upgrade or an
    edit of any of them starts afresh."""
    import hashlib
    import importlib.util

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256(sys.version.encode())
    for folder, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                relative = os.path.relpath(path, package)
                digest.update(relative.encode() + b"\0" + handle.read())
    for module in ("pydantic", "pydantic_core", "tomli"):  # found, not imported
        with contextlib.suppress(Exception):
            origin = getattr(importlib.util.find_spec(module), "origin", None) or ""
            info = os.stat(os.path.join(os.path.dirname(origin), ""))
            digest.update(f"{module}:{origin}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


# -------------------------------------------------------------------- values as JSON
#
# Each value is written as {"@": its class's name, "v": [its fields, in order]} and
# read back through its class, each field made again the type its annotation names
# (arrays tuples, a mapping read-only, a set a frozenset), so the round trip follows
# the classes' fields (and the code's digest in every key keeps an entry from
# outliving them). A mapping (a backend's options) is written as {"{}": [[key,
# value]...]}, so a key of the user's never meets a key of this format; inside it,
# arrays stay lists (TOML's).

_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (BackendDefinition, DefaultDeclaration, PluginRule, Problem, Source)
}


def _encode(value: object) -> object:
    """``value`` as plain JSON values, each value class and mapping tagged."""
    kind = type(value)
    if kind in _PLAIN:  # most of what a manifest holds: first, and at once
        return value
    name = _NAMES.get(kind)
    if name is not None or kind is tuple or kind is list:
        items: tuple[object, ...] = value  # type: ignore[assignment]
        if kind is BackendDefinition and items[_COMPILER_FN] is not None:
            raise TypeError("a callable is not kept")
        encoded = [i if type(i) in _PLAIN else _encode(i) for i in items]
        return encoded if name is None else {"@": name, "v": encoded}
    if isinstance(value, Discovery):
        fields = [getattr(value, slot) for slot in Discovery.__slots__]
        return {"@": "Discovery", "v": [_encode(item) for item in fields]}
    if isinstance(value, (dict, MappingProxyType)):
        return {"{}": [[key, _encode(item)] for key, item in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    if isinstance(value, frozenset):
        return sorted(value)
    if value is None or isinstance(value, (str, int, float)):
        return value
    import datetime

    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return {type(value).__name__: value.isoformat()}
    raise TypeError(f"not kept in the cache: {type(value).__name__}")


_PLAIN = frozenset({str, int, float, bool, type(None)})
_NAMES = {cls: name for name, cls in _CLASSES.items()}
_COMPILER_FN = BackendDefinition._fields.index("compiler_fn")


def _decode(data: dict[str, Any]) -> Any:
    if len(data) == 1:
        [(tag, value)] = data.items()
        if tag == "{}" and type(value) is list:
            return dict(value)
        if tag in ("datetime", "date", "time") and type(value) is str:
            import datetime  # only a manifest with a TOML date needs it

            kind: Any = getattr(datetime, tag)
            return kind.fromisoformat(value)
    name = data.get("@")
    if len(data) != 2 or (name != "Discovery" and name not in _CLASSES):
        return data
    if name == "Discovery":
        found = Discovery()
        fields = dict(zip(Discovery.__slots__, data["v"], strict=True))
        found.definitions = list(fields["definitions"])
        found.problems = list(fields["problems"])
        found.rules = list(fields["rules"])
        found.default = fields["default"]
        return found
    cls = _CLASSES[name]
    kinds = _KINDS[name]
    return cls(*(_typed(kind, v) for kind, v in zip(kinds, data["v"], strict=True)))


def _field_kinds(cls: type[Any]) -> tuple[str, ...]:
    """What each field of ``cls`` is, from its annotation: ``Mapping``, ``frozenset``, ``any``."""
    # Annotations are text here (or forward references holding it).
    written = {f: str(getattr(a, "__forward_arg__", a)) for f, a in cls.__annotations__.items()}
    return tuple(
        next((k for k in ("Mapping", "frozenset") if written[f].startswith(k)), "any")
        for f in cls._fields
    )


_KINDS = {name: _field_kinds(cls) for name, cls in _CLASSES.items()}


def _typed(kind: str, value: Any) -> object:
    if kind == "Mapping":
        return MappingProxyType(value) if value else EMPTY
    if kind == "frozenset":
        return frozenset(value)
    return _tuples(value)


def _tuples(value: object) -> object:
    """A value class's own arrays as the tuples they were (a mapping's stay lists)."""
    return tuple(map(_tuples, value)) if type(value) is list else value
