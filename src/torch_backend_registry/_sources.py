"""Discovery sources: each reads one kind of input into a Discovery, and imports no backend code."""

from __future__ import annotations

import os

from ._definition import (
    SOURCE_KINDS,
    BackendDefinition,
    Discovery,
    PluginRule,
    Source,
    distribution_key,
)
from ._errors import ManifestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from importlib.metadata import Distribution, EntryPoint

    from ._definition import SourceKind

#: The environment variable naming extra manifests (files or directories).
ENV_VAR = "TORCH_BACKENDS_PATH"
#: Comma-separated distributions whose entry points alone count / never count.
ALLOW_VAR, DENY_VAR = "TORCH_BACKENDS_ALLOW", "TORCH_BACKENDS_DENY"
#: The entry-point group PyTorch itself reads.
ENTRY_POINT_GROUP = "torch_dynamo_backends"
PROJECT_FILES = ("backends.toml", "pyproject.toml")


class Context:
    """The inputs of a discovery: a working directory, the env entries, runtime entries."""

    __slots__ = ("cwd", "env_entries", "environ", "files", "runtime")

    def __init__(
        self,
        cwd: str | None,
        env_entries: Sequence[str],
        runtime: Mapping[str, BackendDefinition],
        files: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        #: An absolute path, or ``None`` when the working directory no longer exists.
        self.cwd = cwd
        #: The manifest files and directories of the env source, highest first.
        self.env_entries = env_entries
        self.runtime = runtime
        #: Manifest files given one by one, read instead of the env entries.
        self.files = files
        #: The environment's plugin policy variables, among others.
        self.environ = environ or {}


def _read(path: str, kind: SourceKind, found: Discovery) -> bool:
    """Fold one manifest into ``found``; ``False`` for a pyproject.toml without our table."""
    from ._manifest import read_manifest

    result = read_manifest(path, kind)
    if result is None:
        return False
    found.add(result)
    return True


def runtime_source(ctx: Context) -> Discovery:
    """``register_backend`` calls made in this process."""
    found = Discovery()
    found.definitions.extend(ctx.runtime.values())
    return found


def env_paths(ctx: Context) -> tuple[list[str], Discovery]:
    """The manifest files named by ``TORCH_BACKENDS_PATH``, highest first, and what went wrong."""
    from ._files import NO_SUCH_FILE, Untrusted, untrusted_folder, untrusted_message

    files: list[str] = []
    found = Discovery()
    for entry in ctx.env_entries:
        if not entry.strip():
            continue
        path = os.path.expanduser(entry)
        if ctx.cwd is not None:
            path = os.path.join(ctx.cwd, path)
        if not os.path.isabs(path):
            found.problems.append(
                ManifestError(
                    f"relative entry of {ENV_VAR} and the working directory no longer exists;"
                    " use an absolute path",
                    path=entry,
                )
            )
        elif os.path.isdir(path):
            # Whoever can write here can add a manifest: the folder must be trusted.
            reason = untrusted_folder(path)
            if reason is not None:
                found.warnings.append(
                    Untrusted(untrusted_message(f"folder named by {ENV_VAR}", reason), path=path)
                )
                continue
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                found.problems.append(
                    ManifestError(
                        f"cannot list the folder named by {ENV_VAR}: {exc.strerror or exc}",
                        path=path,
                    )
                )
                continue
            files.extend(
                os.path.join(path, name)
                for name in names
                if name.endswith(".toml") and os.path.isfile(os.path.join(path, name))
            )
        elif os.path.lexists(path):
            files.append(path)
        else:
            found.problems.append(
                ManifestError(
                    f"{NO_SUCH_FILE} or folder (named by {ENV_VAR}={entry!r}); remove the"
                    " entry or create the file",
                    path=entry,
                )
            )
    return files, found


def env_source(ctx: Context) -> Discovery:
    """Manifests named by ``TORCH_BACKENDS_PATH`` (or given as files), earlier entries first."""
    if ctx.files is not None:
        files, found = list(ctx.files), Discovery()
    else:
        files, found = env_paths(ctx)
    # The environment's plugin policy outranks every manifest's.
    for field, var in (("allow", ALLOW_VAR), ("deny", DENY_VAR)):
        value = ctx.environ.get(var)
        if value is not None and value.strip():  # empty: unset
            names = [n.strip() for n in value.split(",") if n.strip()]
            setattr(found, field, PluginRule(names, var))
    for path in files:
        if not _read(path, "env", found):
            found.problems.append(
                ManifestError("has no [tool.torch-backends] table; nothing to read", path=path)
            )
    return found


def project_manifest(cwd: str) -> str | None:
    """The nearest ``backends.toml``, else ``pyproject.toml`` with our table, from ``cwd`` up."""
    directory = os.path.abspath(cwd)
    while True:
        candidate = os.path.join(directory, PROJECT_FILES[0])
        # Not isfile(): a backends.toml that is a directory or unreadable is
        # meant as the manifest, and reading it says what is wrong.
        if os.path.lexists(candidate):
            return candidate
        candidate = os.path.join(directory, PROJECT_FILES[1])
        if os.path.lexists(candidate) and _declares_table(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _declares_table(pyproject: str) -> bool:
    """Whether a ``pyproject.toml`` met on the way up holds ``[tool.torch-backends]``.

    Read through the same safe path as manifests (size limit, no waiting on a
    FIFO); one that cannot be read or is another tool's only is passed by. Its
    trust is judged when it is read as the manifest, which warns.
    """
    from ._files import PYPROJECT_TABLE, Untrusted, parse_toml, read_text

    try:
        text = read_text(pyproject)
    except Untrusted:
        return True  # reading it as the manifest says why it is not used
    except ManifestError:
        return False
    # A cheap text test first: most pyproject.toml files have no such table.
    if PYPROJECT_TABLE[1] not in text:
        return False
    try:
        data, _lines = parse_toml(pyproject, text)
    except ManifestError:
        return True  # reading it as the manifest reports the error with its line
    from ._manifest import manifest_table

    return manifest_table(data, PYPROJECT_TABLE) is not None


def project_source(ctx: Context) -> Discovery:
    """The nearest project manifest."""
    found = Discovery()
    if ctx.cwd is None:
        found.warnings.append(
            ManifestError(
                "the working directory no longer exists; no project manifest read", path=None
            )
        )
        return found
    path = project_manifest(ctx.cwd)
    if path is not None:
        _read(path, "project", found)
    return found


def entry_point_source(ctx: Context) -> Discovery:
    """Installed distributions' ``torch_dynamo_backends`` entry points.

    Remembered by what is on sys.path, so a warm start needs no importlib.metadata.
    """
    from ._cache import entry_points_entry

    entry = entry_points_entry()
    cached = entry.load() if entry is not None else None
    if cached is not None:
        return cached
    found = _read_entry_points()
    if entry is not None:
        entry.store(found)
    return found


def _read_entry_points() -> Discovery:
    found = Discovery()
    for ep in sorted(read_entry_points(found.problems), key=_search_order()):
        name, version = _name_and_version(ep.dist)
        source = Source("entry-point", distribution=name, version=version)
        target = ep.value.split("[", 1)[0].strip()
        found.definitions.append(BackendDefinition(ep.name, source, target=target))
    return found


def _search_order() -> Callable[[EntryPoint], tuple[int, str]]:
    """A deterministic order of entry points: their folder's place on sys.path, then the
    distribution's name (within one folder, importlib.metadata follows os.listdir)."""
    import sys

    def real(path: str) -> str:
        try:
            return os.path.realpath(path or os.curdir)
        except OSError:  # "" or a relative entry, and the working directory is gone
            return path

    places: dict[str, int] = {}
    for index, entry in enumerate(sys.path):
        places.setdefault(real(entry), index)

    def key(ep: EntryPoint) -> tuple[int, str]:
        name, _version = _name_and_version(ep.dist)
        try:
            folder = real(str(ep.dist.locate_file(""))) if ep.dist else ""
        except Exception:  # a distribution that cannot say where it is: last
            folder = ""
        return places.get(folder, len(places)), distribution_key(name or "")

    return key


def read_entry_points(problems: list[ManifestError]) -> Iterable[EntryPoint]:
    """The entry points of our group; a distribution that cannot be read goes to ``problems``."""
    from importlib.metadata import entry_points

    try:
        return entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken *.dist-info: read them one by one to spare the others
        return _entry_points_one_by_one(problems)


def _entry_points_one_by_one(problems: list[ManifestError]) -> list[EntryPoint]:
    from importlib.metadata import distributions

    eps: list[EntryPoint] = []
    seen: set[str] = set()
    for dist in distributions():
        name, _version = _name_and_version(dist)
        if name is not None:
            # As entry_points() does: the first distribution of a name on sys.path wins.
            key = distribution_key(name)
            if key in seen:
                continue
            seen.add(key)
        try:
            eps.extend(dist.entry_points.select(group=ENTRY_POINT_GROUP))
        except Exception as exc:
            where = repr(name) if name is not None else f"in {dist.locate_file('')}"
            problems.append(
                ManifestError(
                    f"the entry points of distribution {where} cannot be read"
                    f" ({type(exc).__name__}: {exc}); reinstall it",
                    path=None,
                )
            )
    return eps


def _name_and_version(dist: Distribution | None) -> tuple[str | None, str | None]:
    if dist is None:
        return None, None
    try:
        return dist.name, dist.version
    except Exception:  # unreadable METADATA: the entry point itself may still be fine
        return None, None


def torch_source(ctx: Context) -> Discovery:
    """PyTorch's own backends, where torch is installed."""
    from ._torch import torch_definitions

    found = Discovery()
    found.definitions.extend(torch_definitions())
    return found


#: The reader of each source kind; SOURCE_KINDS gives their precedence.
READERS: Mapping[SourceKind, Callable[[Context], Discovery]] = {
    "runtime": runtime_source,
    "env": env_source,
    "project": project_source,
    "entry-point": entry_point_source,
    "torch": torch_source,
}
assert tuple(READERS) == SOURCE_KINDS
