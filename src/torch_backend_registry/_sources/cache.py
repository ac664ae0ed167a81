"""The warm start: what was read before, as entries in the user's own private cache folder.

An entry is named by a digest of its key, which holds everything its value depends on (a
manifest's full text, this package's code, what is on ``sys.path``), never a time stamp
alone. It is the value and that name, pickled and compressed by zlib, whose checksum makes a
torn or changed entry fail to read; the name inside makes one moved to another key's name no
entry. Anything in doubt is read again.

Entries are plain pickles, and reading one may run any code it names: that is safe because
the folder is used only while it is this user's own and private (see ``untrusted``). Nobody
else can write there; whoever can is this user or root, who could change the installed
code itself anyway.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib  # the code's digest is in the key of every entry, made or not
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from .._definition import EMPTY, canonical
from .._environment import switched_on
from .files import OPEN_FLAGS, untrusted, untrusted_folder

T = TypeVar("T")

NO_CACHE_VAR = "TORCH_BACKENDS_NO_CACHE"
#: The format of entries; another value starts afresh.
LAYOUT = 6
_OPEN = OPEN_FLAGS | getattr(os, "O_NOFOLLOW", 0)  # as a manifest is opened, no link followed


def cache_folder(environ: Mapping[str, str]) -> str | None:
    """The cache folder, or ``None`` where ``TORCH_BACKENDS_NO_CACHE`` is set or no home
    can be found."""
    if switched_on(environ.get(NO_CACHE_VAR)):
        return None
    import platformdirs

    path = ""  # where there is no absolute HOME, nor a password entry
    with contextlib.suppress(RuntimeError):
        path = platformdirs.user_cache_dir("torch-backend-registry", appauthor=False)
    # Resolved once: a link re-pointed later must not move the cache under a running process.
    return os.path.realpath(path) if os.path.isabs(path) else None


#: The most entries of one kind kept. Each edit of a manifest, change on ``sys.path`` or
#: version of this package writes new ones; past this many, the oldest written go.
MOST_ENTRIES = 1_000
#: How many a trim leaves, the oldest written gone: a tenth of the bound free, so that a
#: process writing many scans the folder again only after that many more.
TRIMMED_TO = MOST_ENTRIES - MOST_ENTRIES // 10


class Cache:
    """Entries in one folder; every failure quietly means "no entry" or "not written".

    The folder and each kind's folder are judged once: found this user's own and private,
    they stay so for this object's life, as only this user or root can change that.
    """

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        #: The folders judged: the one holding the cache's (trusted), the cache's own and
        #: those of kinds (private).
        self.judged: set[str] = set()
        #: How many entries each kind's folder is known to hold, counted when first written:
        #: a long process that writes many trims as often as the bound asks, no more.
        self.counts: dict[str, int] = {}

    def get(self, kind: str, key: object, default: Any = None) -> Any:
        if self.folder is None or not self._private(kind):
            return default
        return self._read(*self._entry(kind, key), default)

    def remembered(
        self, kind: str, key: object, read: Callable[[], T], *, fresh: bool = False
    ) -> T:
        """What ``read()`` gave at this ``key``, kept before; else (or, ``fresh``, in any
        case) what it gives now, kept. The key holds this package's code too: what another
        version of it read is read anew."""
        key = [code_key(), key]
        value = _MISSING if fresh else self.get(kind, key, _MISSING)
        if value is _MISSING:
            value = read()
            self.put(kind, key, value)
        return value  # type: ignore[return-value]

    def entries(self, kind: str) -> Iterator[Any]:
        """Every value of ``kind`` there is (what cannot be read is passed by)."""
        if self.folder is None or not self._private(kind):
            return
        with contextlib.suppress(OSError):
            for entry in os.scandir(os.path.join(self.folder, kind)):
                if (value := self._read(entry.path, entry.name.partition(".")[0])) is not None:
                    yield value

    def _read(self, path: str, name: str, default: Any = None) -> Any:
        import pickle
        import zlib

        try:
            # Through an opener, so that open() closes the file it refuses (a folder).
            with open(path, "rb", opener=lambda path, _: os.open(path, _OPEN)) as handle:
                if untrusted(os.fstat(handle.fileno()), private=True) is not None:
                    return default
                stored, value = pickle.loads(zlib.decompress(handle.read()))
            return value if stored == name else default  # else moved from another key's name
        except Exception:  # torn, changed, or of another format: no entry
            return default

    def put(self, kind: str, key: object, value: object) -> None:
        if self.folder is None or not self._private(kind, make=True):
            return
        path, name = self._entry(kind, key)
        try:
            write_atomically(path, _dumps((name, value)), 0o600)
        except Exception:  # a value pickle refuses, a read-only home, a full disk: not kept
            self.judged.discard(os.path.dirname(path))  # a folder removed is made again
            return
        count = self.counts.get(kind, MOST_ENTRIES) + 1  # unknown: counted by a trim
        if count > MOST_ENTRIES:
            with contextlib.suppress(OSError):
                count = _trim(os.path.dirname(path))
        self.counts[kind] = count

    def _private(self, kind: str, *, make: bool = False) -> bool:
        """Whether the cache's folder and that of ``kind`` (made first, with ``make``) are
        this user's own and private, below a trusted folder: nobody else can write there."""
        assert self.folder is not None
        if (folder := os.path.join(self.folder, kind)) in self.judged:
            return True
        parent = os.path.dirname(self.folder)
        if make:
            # Nothing is made in a folder the trust rule refuses (another user's, as under
            # sudo with that user's HOME): it would be ours there, and keep theirs off.
            existing = parent
            while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
                existing = os.path.dirname(existing)
            if untrusted_folder(existing) is not None:
                return False
            # ~/.cache as it is; ours private (makedirs gives its mode to the last alone). A
            # folder not made is one the judging below cannot examine, and so refuses.
            with contextlib.suppress(OSError):
                os.makedirs(self.folder, 0o700, exist_ok=True)
                os.makedirs(folder, 0o700, exist_ok=True)
        judging = ((parent, False), (self.folder, True), (folder, True))
        if any(f not in self.judged and untrusted_folder(f, private=p) for f, p in judging):
            return False
        self.judged.update(f for f, _ in judging)
        return True

    def _entry(self, kind: str, key: object) -> tuple[str, str]:
        assert self.folder is not None
        key_text = canonical([LAYOUT, kind, key]).encode("utf-8", "surrogatepass")
        name = hashlib.sha256(key_text).hexdigest()
        return os.path.join(self.folder, kind, name + ".pickle"), name


#: The cache that is off: nothing is found, nothing kept.
NO_CACHE = Cache(None)
#: What :meth:`Cache.get` gives where there is no entry, told apart from any value kept.
_MISSING = object()


def _trim(folder: str) -> int:
    """Remove the oldest entries past :data:`TRIMMED_TO`; how many are left."""
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".pickle"):
            with contextlib.suppress(OSError):
                entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    for _written, path in sorted(entries)[: max(len(entries) - TRIMMED_TO, 0)]:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return min(len(entries), TRIMMED_TO)


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


@functools.cache  # one process runs one version of this code
def code_key() -> str:
    """A digest of the code that reads manifests: this package's, byte by byte, pydantic's,
    tomli's and Python's; an upgrade or an edit of any of them starts afresh."""
    import glob
    import importlib.util

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256(sys.version.encode())
    for relative in sorted(glob.glob(os.path.join("**", "*.py"), root_dir=package, recursive=True)):
        with open(os.path.join(package, relative), "rb") as handle:
            digest.update(relative.encode() + b"\0" + handle.read())
    for module in ("pydantic", "pydantic_core", "tomli"):  # found, not imported
        with contextlib.suppress(Exception):
            origin = getattr(importlib.util.find_spec(module), "origin", None) or ""
            info = os.stat(os.path.join(os.path.dirname(origin), ""))
            digest.update(f"{module}:{origin}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


def stamps(paths: Iterable[str]) -> list[tuple[int, ...]]:
    """What tells that each of ``paths`` (a file or folder) changed, for a key, in one call:
    its size, time and inode (which a replacement changes); nothing where it cannot be
    examined."""
    return [_stamp(path) for path in paths]


def _stamp(path: str) -> tuple[int, ...]:
    with contextlib.suppress(OSError):
        info = os.stat(path)
        return info.st_size, info.st_mtime_ns, info.st_ino
    return ()


def _readonly(table: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(table) if table else EMPTY


def _dumps(value: object) -> bytes:
    """``value`` pickled and compressed; a read-only mapping (which pickle refuses) as the
    dict it shows, read back read-only."""
    import copyreg
    import io
    import pickle
    import zlib

    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    # This pickler's own table: copyreg's, which every pickle of the process reads, is unchanged.
    pickler.dispatch_table = copyreg.dispatch_table | {
        MappingProxyType: lambda table: (_readonly, (dict(table),))
    }
    pickler.dump(value)
    return zlib.compress(buffer.getvalue(), 1)
