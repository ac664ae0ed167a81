"""The warm start: what was read before, as sealed entries in the user's cache folder.

An entry is named by a digest of its key, which holds everything its value depends on (a
manifest's full text, this package's code, what is on ``sys.path``), never a time stamp
alone; its first line seals its text, so a torn, changed or moved entry is no entry. The
folder is used only while it is this user's own and private. Anything in doubt is read again.
"""

from __future__ import annotations

import contextlib
import functools
import os
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
from .._environment import switched_on
from .files import untrusted, untrusted_folder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

NO_CACHE_VAR = "TORCH_BACKENDS_NO_CACHE"
#: The format of entries; another value starts afresh.
LAYOUT = 5
_MAX_ENTRY = 64 * 2**20  # larger than any entry this library writes
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# A FIFO at an entry's name opens at once, and fstat tells it is no entry.
_OPEN = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW


def cache_folder(environ: Mapping[str, str]) -> str | None:
    """The cache folder, or ``None`` where ``TORCH_BACKENDS_NO_CACHE`` is set or no home
    can be found."""
    if switched_on(environ.get(NO_CACHE_VAR)):
        return None
    import platformdirs

    try:
        path = platformdirs.user_cache_dir("torch-backend-registry", appauthor=False)
    except RuntimeError:  # no absolute HOME, no password entry
        return None
    # Resolved once: a link re-pointed later must not move the cache under a running process.
    return os.path.realpath(path) if os.path.isabs(path) else None


#: The most entries of one kind kept. Each edit of a manifest, change on ``sys.path`` or
#: version of this package writes new ones; past this many, the oldest written go.
MOST_ENTRIES = 1_000


class Cache:
    """Entries in one folder; every failure quietly means "no entry" or "not written"."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        #: The kinds whose folder this object has trimmed: once each is enough.
        self.trimmed: set[str] = set()

    def get(self, kind: str, key: object) -> Any:
        if self.folder is None or not self._private(kind):
            return None
        path, name = self._entry(kind, key)
        try:
            # Through an opener, so that open() closes the file it refuses (a folder).
            with open(path, "rb", opener=lambda path, _: os.open(path, _OPEN)) as handle:
                info = os.fstat(handle.fileno())
                if untrusted(info, private=True) is not None or info.st_size > _MAX_ENTRY:
                    return None
                data = handle.read(_MAX_ENTRY + 1)
            seal, _, text = data.partition(b"\n")
            if seal != _seal(name, text):
                return None  # torn, truncated, changed or moved since it was written
            return _loads(text)
        except Exception:  # unreadable; unpickling can raise anything, a sealed entry rarely
            return None

    def put(self, kind: str, key: object, value: object) -> None:
        if self.folder is None:
            return
        path, name = self._entry(kind, key)
        # A read-only home, a full disk, a value pickle refuses: no cache.
        with contextlib.suppress(Exception):
            text = _dumps(value)
            if self._private(kind, make=True):
                write_atomically(path, _seal(name, text) + b"\n" + text, 0o600)
                if kind not in self.trimmed:
                    self.trimmed.add(kind)
                    _trim(os.path.dirname(path))

    @contextlib.contextmanager
    def locked(self, kind: str) -> Iterator[None]:
        """Make a read, change and write of the entries of ``kind`` one step for every
        process (``flock`` on ``KIND.lock``); without a cache or ``fcntl``, run unlocked."""
        with contextlib.ExitStack() as stack:
            if self.folder is not None and self._private(kind, make=True):
                with contextlib.suppress(ImportError, OSError):
                    lock = os.path.join(self.folder, f"{kind}.lock")
                    fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
                    stack.callback(os.close, fd)  # closing releases the lock
                    import fcntl

                    fcntl.flock(fd, fcntl.LOCK_EX)
            yield

    def _private(self, kind: str, *, make: bool = False) -> bool:
        """Whether the cache's folder and that of ``kind`` (made first, with ``make``) are
        this user's own and private, below a trusted folder: nobody else can write there."""
        assert self.folder is not None
        folders = (self.folder, os.path.join(self.folder, kind))
        parent = os.path.dirname(self.folder)
        try:
            if make:
                # Nothing is made in a folder the trust rule refuses (another user's, as under
                # sudo with that user's HOME): it would be ours there, and keep theirs off.
                existing = parent
                while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
                    existing = os.path.dirname(existing)
                if untrusted_folder(existing) is not None:
                    return False
                os.makedirs(parent, exist_ok=True)  # ~/.cache, as it is
                for folder in folders:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(folder, 0o700)
        except OSError:
            return False
        return untrusted_folder(parent) is None and not any(
            untrusted_folder(folder, private=True) for folder in folders
        )

    def _entry(self, kind: str, key: object) -> tuple[str, bytes]:
        """Where the entry of ``key`` lies, and the digest of its key (which its seal holds)."""
        import hashlib

        assert self.folder is not None
        key_text = canonical([LAYOUT, kind, key]).encode("utf-8", "surrogatepass")
        name = hashlib.sha256(key_text).hexdigest()
        return os.path.join(self.folder, kind, name + ".pickle"), name.encode()


#: The cache that is off: nothing is found, nothing kept.
NO_CACHE = Cache(None)


def _trim(folder: str) -> None:
    """Remove the oldest entries past :data:`MOST_ENTRIES`, and those of an earlier layout."""
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".json"):  # layout 4 and before
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        elif entry.name.endswith(".pickle"):
            with contextlib.suppress(OSError):
                entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    for _written, path in sorted(entries)[: max(len(entries) - MOST_ENTRIES, 0)]:
        with contextlib.suppress(OSError):
            os.unlink(path)


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
    import hashlib

    return hashlib.sha256(name + b"\n" + text).hexdigest().encode()


@functools.cache  # one process runs one version of this code
def code_key() -> str:
    """A digest of the code that reads manifests: this package's, byte by byte, pydantic's,
    tomli's and Python's; an upgrade or an edit of any of them starts afresh."""
    import hashlib
    import importlib.util

    from .finding import python_files

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256(sys.version.encode())
    for path in python_files(package):
        with open(path, "rb") as handle:
            relative = os.path.relpath(path, package)
            digest.update(relative.encode() + b"\0" + handle.read())
    for module in ("pydantic", "pydantic_core", "tomli"):  # found, not imported
        with contextlib.suppress(Exception):
            origin = getattr(importlib.util.find_spec(module), "origin", None) or ""
            info = os.stat(os.path.join(os.path.dirname(origin), ""))
            digest.update(f"{module}:{origin}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


# Values as pickles, read back by an unpickler that knows the few functions below and the
# dates and times TOML writes, and nothing else: an entry cannot name any other code to run.
# A value of this package is written as a call of a function given its class's name, never
# as the class: an unpickler that hands out a class lets an entry set attributes on it
# (BUILD), and so rename it for the next entry. A read-only mapping is stored as the dict it
# shows. The code's digest in every key keeps an entry from outliving the classes.

_VALUES: dict[str, Any] = {
    cls.__name__: cls
    for cls in (BackendDefinition, DefaultDeclaration, PluginRule, Problem, Source)
}


def _value(kind: str, *fields: object) -> object:
    return _VALUES[kind](*fields)


def _discovery(*fields: Any) -> Discovery:
    found = Discovery()
    for slot, value in zip(Discovery.__slots__, fields, strict=True):
        setattr(found, slot, value)
    return found


def _readonly(table: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(table) if table else EMPTY


#: What an entry may name: written out here, not read from objects an entry could change.
_KNOWN = frozenset(
    [(__name__, f.__name__) for f in (_value, _discovery, _readonly)]
    + [("datetime", kind) for kind in ("date", "time", "datetime", "timedelta", "timezone")]
)


def _dumps(value: object) -> bytes:
    import copyreg
    import io
    import pickle

    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    # This pickler's own table: copyreg's, which every pickle of the process reads, is unchanged.
    pickler.dispatch_table = {
        **copyreg.dispatch_table,
        **dict.fromkeys(_VALUES.values(), lambda item: (_value, (type(item).__name__, *item))),
        Discovery: lambda d: (_discovery, tuple(getattr(d, s) for s in Discovery.__slots__)),
        MappingProxyType: lambda table: (_readonly, (dict(table),)),
    }
    pickler.dump(value)
    return buffer.getvalue()


def _loads(data: bytes) -> object:
    import io
    import pickle

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) not in _KNOWN:
                raise pickle.UnpicklingError(f"{module}.{name} is not a value of this cache")
            return super().find_class(module, name)

    return Unpickler(io.BytesIO(data)).load()
