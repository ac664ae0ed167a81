"""The warm start: validated manifests cached by their content, entry points by what is on sys.path.

A manifest's entry is keyed by its bytes, its path, the source kind and the
code that validates it, never by time stamps (an edit within the same second
that keeps the size is seen). The entry-point index is keyed by each
``sys.path`` folder's ``*.dist-info`` / ``*.egg-info`` names, which installing,
upgrading or removing a distribution changes, and by the size and time of each
one's metadata and entry-points files, which an edit in place changes. The cache lives in the user's
cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``), readable and writable by
its owner only, and is judged by the trust rule; one that is corrupt, from
another format, untrusted or not writable is ignored (and rebuilt where it
can be). ``TORCH_BACKENDS_NO_CACHE`` turns it off.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

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

FORMAT = 1
NO_CACHE_VAR = "TORCH_BACKENDS_NO_CACHE"
_MAX_ENTRY = 64 * 2**20  # a cache file larger than this is not ours to read


def enabled() -> bool:
    return not os.environ.get(NO_CACHE_VAR)


def folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch-backend-registry")


def verdicts_path() -> str:
    """Where ``doctor`` remembers its verdicts."""
    return os.path.join(folder(), "verdicts.json")


def _digest(*parts: bytes) -> str:
    import hashlib

    sha = hashlib.sha256()
    for part in parts:
        sha.update(len(part).to_bytes(8, "little"))
        sha.update(part)
    return sha.hexdigest()


_CODE: list[str] = []


def _code_key() -> str:
    """The validating code's own content: an upgrade, or an edit of it, starts afresh."""
    if not _CODE:
        here = os.path.dirname(os.path.abspath(__file__))
        parts = [str(FORMAT).encode(), sys.version.encode()]
        for name in ("_schema.py", "_manifest.py", "_positions.py", "_files.py", "_cache.py"):
            try:
                with open(os.path.join(here, name), "rb") as handle:
                    parts.append(handle.read())
            except OSError:
                parts.append(name.encode())
        _CODE.append(_digest(*parts))
    return _CODE[0]


# ----------------------------------------------------------------------------- files


def read_json(path: str) -> Any:
    """A cache file's JSON, or ``None`` (absent, untrusted, corrupt, another format)."""
    from ._files import untrusted_file, untrusted_folder

    if untrusted_folder(os.path.dirname(path)) is not None:
        return None
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if untrusted_file(info) is not None or info.st_size > _MAX_ENTRY:
                return None
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write atomically, owner-only; a folder that cannot be written leaves no cache."""
    try:
        _make_folders(os.path.dirname(path))
        # Owner-only from the start, and a name no other process picks.
        temporary = f"{path}.{os.getpid()}.{next(_COUNTER)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(temporary, flags, 0o600)
        try:
            # dumps, not dump: one pass of the C encoder instead of a write a token.
            text = json.dumps({"format": FORMAT, **data}, separators=(",", ":"))
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except (OSError, TypeError, ValueError):
        pass  # a read-only home, a full disk, a value JSON cannot hold: no cache, and that is all


_COUNTER = __import__("itertools").count()
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
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, 0o700)


# ----------------------------------------------------------------------------- manifests


def _manifest_file(path: str, kind: str, text: str) -> str:
    key = _digest(
        _code_key().encode(),
        kind.encode(),
        path.encode("utf-8", "surrogateescape"),
        os.path.realpath(path).encode("utf-8", "surrogateescape"),
        text.encode("utf-8", "surrogatepass"),
    )
    return os.path.join(folder(), "manifests", key[:2], key + ".json")


def load_manifest(path: str, kind: str, text: str) -> tuple[str, bool, Discovery | None]:
    """The cache entry for this content, whether it holds a reading, and that reading."""
    if not enabled():
        return "", False, None
    entry = _manifest_file(path, kind, text)
    data = read_json(entry)
    if data is None:
        return entry, False, None
    try:
        found = data["found"]
        return entry, True, None if found is None else _discovery(found)
    except (KeyError, TypeError, ValueError):
        return entry, False, None


def store_manifest(entry: str, found: Discovery | None) -> None:
    if not entry or (found is not None and found.warnings):
        return  # off; or judged by the trust rule each time, never remembered
    write_json(entry, {"found": None if found is None else _plain_discovery(found)})


# ----------------------------------------------------------------------------- entry points


def _path_key() -> str:
    """What decides the entry points: each sys.path entry and the distributions in it."""
    parts = [sys.version.encode()]
    for entry in sys.path:
        parts.append(entry.encode("utf-8", "surrogateescape"))
        try:
            names = sorted(
                name
                for name in os.listdir(entry or os.curdir)
                if name.endswith((".dist-info", ".egg-info", ".egg", ".egg-link"))
            )
            # An upgrade renames the folder; an edit in place changes these files.
            names = [_stamped(os.path.join(entry or os.curdir, name), name) for name in names]
        except OSError:
            try:
                info = os.stat(entry)  # a zip file: its size and time say it changed
                names = [f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}"]
            except OSError:
                names = ["-"]
        parts.append("\n".join(names).encode("utf-8", "surrogateescape"))
    return _digest(*parts)


def _stamped(folder: str, name: str) -> str:
    stamps = [name]
    for inside in ("entry_points.txt", "METADATA", "PKG-INFO"):
        try:
            info = os.stat(os.path.join(folder, inside))
        except OSError:
            continue
        stamps.append(f"{inside}:{info.st_size}:{info.st_mtime_ns}")
    return " ".join(stamps)


def _entry_points_file(key: str) -> str:
    return os.path.join(folder(), "entry-points", key + ".json")


def load_entry_points() -> tuple[str, Discovery | None]:
    """The key of the entry points now, and what the source found for it before."""
    if not enabled():
        return "", None
    key = _path_key()
    data = read_json(_entry_points_file(key))
    if data is None:
        return key, None
    try:
        return key, _discovery(data["found"])
    except (KeyError, TypeError, ValueError):
        return key, None


def store_entry_points(key: str, found: Discovery) -> None:
    if enabled() and key:
        write_json(_entry_points_file(key), {"found": _plain_discovery(found)})


# ----------------------------------------------------------------------------- to and from JSON


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


def _plain_definition(d: BackendDefinition) -> dict[str, Any]:
    source = d.source
    plain: dict[str, Any] = {
        "name": d.name,
        "source": [
            source.kind,
            source.path,
            source.line,
            source.distribution,
            source.version,
            source.module,
        ],
    }
    for field in ("target", "chain", "tags", "description", "aliases", "requires"):
        value = getattr(d, field)
        if value:
            plain[field] = value
    if d.options:
        plain["options"] = _plain_value(dict(d.options))
    if not d.enabled:
        plain["enabled"] = False
    if d.python_path:
        plain["python_path"] = d.python_path
    if d.skip_known_failures:
        plain["skip_known_failures"] = True
    if d.distribution is not None:
        plain["distribution"] = d.distribution
    if d.problem is not None:
        plain["problem"] = _plain_error(d.problem)
    return plain


def _definition(data: dict[str, Any]) -> BackendDefinition:
    kind, path, line, distribution, version, module = data["source"]
    get = data.get
    chain, tags, aliases, requires = get("chain"), get("tags"), get("aliases"), get("requires")
    python_path = get("python_path")
    return BackendDefinition(
        data["name"],
        Source(
            kind, path=path, line=line, distribution=distribution, version=version, module=module
        ),
        target=get("target"),
        chain=None if chain is None else tuple(chain),
        # Most are empty: the one empty tuple rather than a new one each.
        tags=tuple(tags) if tags else (),
        description=get("description"),
        aliases=tuple(aliases) if aliases else (),
        requires=tuple(requires) if requires else (),
        options=_value(data["options"]) if "options" in data else None,
        enabled=get("enabled", True),
        python_path=_shared(tuple(python_path)) if python_path else (),
        skip_known_failures=get("skip_known_failures", False),
        distribution=get("distribution"),
        problem=_error(data["problem"]) if "problem" in data else None,
    )


_SHARED: dict[tuple[str, ...], tuple[str, ...]] = {}


def _shared(value: tuple[str, ...]) -> tuple[str, ...]:
    """One tuple for the python-path every backend of a manifest shares."""
    return _SHARED.setdefault(value, value)


def _plain_value(value: Any) -> Any:
    """A TOML value as JSON: tables and dates tagged, so nothing reads back as another."""
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
