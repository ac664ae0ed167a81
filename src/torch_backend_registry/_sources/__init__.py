"""Discovery sources: each reads one kind of input into a Discovery, and imports no backend code."""

from __future__ import annotations

import os

from .._definition import SOURCE_KINDS, BackendDefinition, Discovery, PluginRule, Problem, Source

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
    from importlib.metadata import Distribution, EntryPoint

    from .._definition import SourceKind
    from .cache import Cache

#: The environment variable naming extra manifests (files or directories).
ENV_VAR = "TORCH_BACKENDS_PATH"
#: Comma-separated distributions whose entry points alone count / never count.
ALLOW_VAR, DENY_VAR = "TORCH_BACKENDS_ALLOW", "TORCH_BACKENDS_DENY"
#: The entry-point group PyTorch itself reads.
ENTRY_POINT_GROUP = "torch_dynamo_backends"
PROJECT_FILES = ("backends.toml", "pyproject.toml")


class Context:
    """The inputs of one discovery, fixed for its whole life."""

    __slots__ = ("cache", "cwd", "entry_point_names", "environ", "files", "fresh", "runtime")

    def __init__(
        self,
        *,
        cwd: str | None,
        environ: Mapping[str, str],
        runtime: Iterable[BackendDefinition],
        cache: Cache,
        files: Sequence[str] | None = None,
        fresh: bool = False,
        entry_point_names: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        #: An absolute path, or ``None`` when the working directory no longer exists.
        self.cwd = cwd
        #: The environment the registry reads its variables from.
        self.environ = environ
        self.runtime = tuple(runtime)
        self.cache = cache
        #: Manifest files given one by one, read instead of ``TORCH_BACKENDS_PATH``.
        self.files = files
        #: Read entry points for real, not from the cache (after ``refresh()``).
        self.fresh = fresh
        #: The names installed distributions declare, read once (PyTorch's registry holds them too).
        self.entry_point_names = entry_point_names


def _read(path: str, kind: SourceKind, ctx: Context, found: Discovery) -> bool:
    """Fold one manifest into ``found``; ``False`` for a pyproject.toml without our table."""
    from .manifest import read_manifest

    result = read_manifest(path, kind, ctx.cache)
    if result is None:
        return False
    found.add(result)
    return True


def runtime_source(ctx: Context) -> Discovery:
    """``register_backend`` calls made in this process."""
    found = Discovery()
    found.definitions.extend(ctx.runtime)
    return found


def env_paths(ctx: Context) -> tuple[list[str], Discovery]:
    """The manifest files named by ``TORCH_BACKENDS_PATH``, highest first, and what went wrong."""
    from .files import NO_SUCH_FILE, untrusted_folder, untrusted_message

    files: list[str] = []
    found = Discovery()
    for entry in ctx.environ.get(ENV_VAR, "").split(os.pathsep):
        if not entry.strip():
            continue
        path = os.path.expanduser(entry)
        if ctx.cwd is not None:
            path = os.path.join(ctx.cwd, path)
        if not os.path.isabs(path):
            found.problems.append(
                Problem(
                    f"relative entry of {ENV_VAR} and the working directory no longer exists;"
                    " use an absolute path",
                    path=entry,
                )
            )
        elif os.path.isdir(path):
            # Whoever can write here can add a manifest: the folder must be trusted.
            reason = untrusted_folder(path)
            if reason is not None:
                message = untrusted_message(f"folder named by {ENV_VAR}", reason)
                found.problems.append(Problem(message, path=path))
                continue
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                found.problems.append(
                    Problem(
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
                Problem(
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
    for kind, var in (("allow", ALLOW_VAR), ("deny", DENY_VAR)):
        value = ctx.environ.get(var)
        if value is not None and value.strip():  # empty: unset
            names = [n.strip() for n in value.split(",") if n.strip()]
            found.rules.append(PluginRule.of(kind, names, var))  # type: ignore[arg-type]
    for path in files:
        if not _read(path, "env", ctx, found):
            found.problems.append(
                Problem(
                    "has no [tool.torch-backends] table; nothing to read"
                    + (f"; did you mean {near}?" if (near := near_table(path)) else ""),
                    path=path,
                )
            )
    if ctx.files is None:
        found.problems.extend(_twins(found.definitions))
    return found


def _twins(definitions: Iterable[BackendDefinition]) -> list[Problem]:
    """A name two ``TORCH_BACKENDS_PATH`` manifests define: the earlier is used, as said."""
    first: dict[str, BackendDefinition] = {}
    said = []
    for definition in definitions:
        used = first.setdefault(definition.name, definition)
        if used is not definition and used.source.path != definition.source.path:
            said.append(
                Problem(
                    f"backend {definition.name!r} is also defined by"
                    f" {definition.source.describe()}; this definition, from the earlier entry"
                    f" of {ENV_VAR}, is used",
                    path=used.source.path,
                    line=used.source.line,
                    severity="warning",
                )
            )
    return said


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
    from .._errors import ManifestError
    from .._keys import PYPROJECT_TABLE
    from .files import Untrusted, parse_toml, read_text
    from .manifest import manifest_table

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
    return manifest_table(data, PYPROJECT_TABLE) is not None


def project_source(ctx: Context) -> Discovery:
    """The nearest project manifest."""
    found = Discovery()
    if ctx.cwd is None:
        found.problems.append(
            Problem(
                "the working directory no longer exists; no project manifest read",
                severity="warning",
            )
        )
        return found
    path = project_manifest(ctx.cwd)
    if path is None:
        return found
    _read(path, "project", ctx, found)
    return found


def replaced_table(manifest: str) -> Problem | None:
    """Where a project's backends.toml stands beside a pyproject.toml that declares
    backends too: those are never read (backends.toml wins), said."""
    beside = os.path.join(os.path.dirname(manifest), PROJECT_FILES[1])
    if not manifest.endswith(PROJECT_FILES[0]) or not os.path.isfile(beside):
        return None
    if not _declares_table(beside):
        return None
    return Problem(
        f"{PROJECT_FILES[1]} beside it has a [tool.torch-backends] table too, which this"
        f" {PROJECT_FILES[0]} replaces: its backends are not read; keep one",
        path=manifest,
        severity="warning",
    )


def near_table(pyproject: str) -> str | None:
    """The ``[tool.X]`` table of a ``pyproject.toml`` that looks like a misspelt
    ``[tool.torch-backends]`` (``torch_backends``, ``torch-backend``), or ``None``."""
    import difflib

    from .._errors import ManifestError
    from .files import Untrusted, parse_toml, read_text

    try:
        data, _lines = parse_toml(pyproject, read_text(pyproject))
    except (ManifestError, Untrusted):
        return None
    tables = data.get("tool")
    names = [str(n) for n in tables] if isinstance(tables, dict) else []
    close = difflib.get_close_matches("torch-backends", names, n=1, cutoff=0.8)
    return f"[tool.{close[0]}]" if close and close[0] != "torch-backends" else None


def entry_point_source(ctx: Context) -> Discovery:
    """Installed distributions' ``torch_dynamo_backends`` entry points.

    Remembered by what is on sys.path, so a warm start needs no importlib.metadata;
    read for real when the context is fresh.
    """
    from .cache import code_key

    key = [code_key(), entry_point_stamps()]
    if not ctx.fresh:
        cached = ctx.cache.get("entry-points", key)
        if isinstance(cached, Discovery):
            return cached
    found = read_entry_points()
    ctx.cache.put("entry-points", key, found)
    return found


def entry_point_stamps() -> list[object]:
    """What decides the entry points: each sys.path entry and the distributions in it,
    with the size and time of each one's metadata files, which an edit in place changes."""
    import sys

    stamps: list[object] = []
    for entry in sys.path:
        folder = entry or os.curdir
        try:
            # The folder's own time changes when anything is added, renamed or removed in it.
            info = os.stat(folder)
            names = sorted(
                name
                for name in os.listdir(folder)
                # As importlib.metadata matches them, whatever the case; EGG-INFO: the
                # metadata of an unzipped .egg that is itself on sys.path.
                if name.lower().endswith((".dist-info", ".egg-info", ".egg", ".egg-link"))
                or name == "EGG-INFO"
            )
        except OSError:
            try:
                info = os.stat(folder)  # a zip file: its size and time say it changed
                stamps.append([entry, info.st_size, info.st_mtime_ns, info.st_ino])
            except OSError:
                stamps.append([entry, None])
            continue
        found = [_stamped(os.path.join(folder, name)) for name in names]
        stamps.append([entry, info.st_mtime_ns, found])
    return stamps


def _stamped(distribution: str) -> list[object]:
    stamps: list[object] = [os.path.basename(distribution)]
    for inside in (
        "entry_points.txt",
        "METADATA",
        "PKG-INFO",
        os.path.join("EGG-INFO", "entry_points.txt"),  # an unzipped .egg
        os.path.join("EGG-INFO", "PKG-INFO"),
    ):
        try:
            info = os.stat(os.path.join(distribution, inside))
        except OSError:
            continue
        stamps.append([inside, info.st_size, info.st_mtime_ns])
    return stamps


def read_entry_points() -> Discovery:
    """The entry points of our group, read now, in a deterministic order. One whose name
    could be no backend's, or whose value is no ``module:attribute``, is left out, said."""
    import re

    names = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
    targets = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
    found = Discovery()
    for ep in sorted(_entry_points(found.problems), key=_search_order()):
        name, version = _name_and_version(ep.dist)
        source = Source("entry-point", distribution=name, version=version)
        target = ep.value.split("[", 1)[0].strip()
        wrong = (
            "which is no backend name" if not names.fullmatch(ep.name)
            else f"whose value {ep.value!r} is no module:attribute" if not targets.fullmatch(target)
            else None
        )  # fmt: skip
        if wrong is not None:
            found.problems.append(
                Problem(
                    f"{source.describe()} declares the entry point {ep.name!r}, {wrong}:"
                    " it is left out",
                    severity="warning",
                )
            )
            continue
        found.definitions.append(BackendDefinition(ep.name, source, target=target))
    return found


def _search_order() -> Callable[[EntryPoint], tuple[int, str]]:
    """A deterministic order of entry points: their folder's place on sys.path, then the
    distribution's name (within one folder, importlib.metadata follows os.listdir)."""
    import sys

    from .._definition import distribution_key

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


def _entry_points(problems: list[Problem]) -> Iterable[EntryPoint]:
    """The entry points of our group; a distribution that cannot be read goes to ``problems``."""
    from importlib.metadata import entry_points

    try:
        return entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken *.dist-info: read them one by one to spare the others
        return _entry_points_one_by_one(problems)


def _entry_points_one_by_one(problems: list[Problem]) -> list[EntryPoint]:
    from importlib.metadata import distributions

    from .._definition import distribution_key

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
                Problem(
                    f"the entry points of distribution {where} cannot be read"
                    f" ({type(exc).__name__}: {exc}); reinstall it"
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
    from .pytorch import torch_definitions

    found = Discovery()
    found.definitions.extend(torch_definitions(ctx.entry_point_names()))
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
