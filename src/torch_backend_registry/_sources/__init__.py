"""Discovery sources: each reads one kind of input into a Discovery, and imports no backend code."""

from __future__ import annotations

import contextlib
import os
from typing import Any, NamedTuple

from .._definition import SOURCE_KINDS, BackendDefinition, Discovery, PluginRule, Problem
from .._errors import ManifestError, closest
from .._keys import PYPROJECT_TABLE
from .entry_points import entry_point_stamps, read_entry_points
from .files import (
    NO_SUCH_FILE,
    Untrusted,
    may_hold,
    parse_toml,
    read_text,
    table_at,
    untrusted_folder,
    untrusted_message,
)
from .manifest import read_manifest
from .pytorch import torch_definitions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

    from .._definition import SourceKind
    from .cache import Cache

#: The environment variable naming extra manifests (files or directories).
ENV_VAR = "TORCH_BACKENDS_PATH"
#: Comma-separated distributions whose entry points alone count / never count.
ALLOW_VAR, DENY_VAR = "TORCH_BACKENDS_ALLOW", "TORCH_BACKENDS_DENY"
PROJECT_FILES = ("backends.toml", "pyproject.toml")


class Context(NamedTuple):
    """The inputs of one discovery, fixed for its whole life."""

    #: An absolute path, or ``None`` when the working directory no longer exists.
    cwd: str | None
    #: The environment the registry reads its variables from.
    environ: Mapping[str, str]
    #: ``register_backend`` calls made in this process.
    runtime: Sequence[BackendDefinition]
    cache: Cache
    #: Manifest files given one by one, read instead of ``TORCH_BACKENDS_PATH``.
    files: Sequence[str] | None = None
    #: Read entry points for real, not from the cache (after ``refresh()``).
    fresh: bool = False
    #: The names installed distributions declare, read once (PyTorch's registry holds them too).
    entry_point_names: Callable[[], Collection[str]] = frozenset


def env_paths(ctx: Context, problems: list[Problem]) -> list[str]:
    """The manifest files named by ``TORCH_BACKENDS_PATH``, highest first; what went wrong
    goes to ``problems``."""
    # One file named twice (an entry and its folder, a link to it) is one manifest, read
    # where it is first named: it neither shadows nor doubles itself.
    files: dict[str, str] = {}
    for entry in filter(str.strip, ctx.environ.get(ENV_VAR, "").split(os.pathsep)):
        path = os.path.join(ctx.cwd or "", os.path.expanduser(entry))
        if not os.path.isabs(path):
            said = (
                f"relative entry of {ENV_VAR} and the working directory no longer exists;"
                " use an absolute path"
            )
            path = entry
        elif not os.path.isdir(path):
            if os.path.lexists(path):
                files.setdefault(os.path.realpath(path), path)
                continue
            said = (
                f"{NO_SUCH_FILE} or folder (named by {ENV_VAR}={entry!r}); remove the"
                " entry or create the file"
            )
            path = entry
        # Whoever can write here can add a manifest: the folder must be trusted.
        elif reason := untrusted_folder(path):
            said = untrusted_message(f"folder named by {ENV_VAR}", reason)
        else:
            try:
                names = sorted(n for n in os.listdir(path) if n.endswith(".toml"))
            except OSError as exc:
                said = f"cannot list the folder named by {ENV_VAR}: {exc.strerror or exc}"
            else:
                # Every *.toml file in it, a dangling link or a FIFO too (said when read,
                # never passed over); a folder inside is no manifest, as in a conf.d.
                inside = [p for p in (os.path.join(path, n) for n in names) if not os.path.isdir(p)]
                for file in inside:
                    files.setdefault(os.path.realpath(file), file)
                if inside:
                    continue
                # Explicit configuration that reads nothing is said, not passed over.
                said = f"the folder named by {ENV_VAR} holds no *.toml manifest: nothing is read"
                problems.append(Problem(said, path=path, severity="warning"))
                continue
        problems.append(Problem(said, path=path))
    return list(files.values())


def env_source(ctx: Context) -> Discovery:
    """Manifests named by ``TORCH_BACKENDS_PATH`` (or given as files), earlier entries first."""
    found = Discovery()
    files = env_paths(ctx, found.problems) if ctx.files is None else ctx.files
    # The environment's plugin policy outranks every manifest's.
    for kind, var in (("allow", ALLOW_VAR), ("deny", DENY_VAR)):
        # Empty, or commas alone: unset.
        if names := [n.strip() for n in ctx.environ.get(var, "").split(",") if n.strip()]:
            found.rules.append(PluginRule(kind, frozenset(names), var))  # type: ignore[arg-type]
    for path in files:
        if (result := read_manifest(path, "env", ctx.cache)) is not None:
            found.add(result)
        else:
            said = "has no [tool.torch-backends] table; nothing to read"
            if near := near_table(path):
                said += f"; did you mean {near}?"
            found.problems.append(Problem(said, path=path))
    if ctx.files is None:
        found.problems.extend(_twins(found.definitions))
    return found


def _twins(definitions: Iterable[BackendDefinition]) -> Iterator[Problem]:
    """A name two ``TORCH_BACKENDS_PATH`` manifests define: the earlier is used, as said.
    (One file defines a name once: TOML allows no table twice, and a file is read once.)"""
    first: dict[str, BackendDefinition] = {}
    for definition in definitions:
        if (used := first.setdefault(definition.name, definition)) is not definition:
            said = (
                f"backend {definition.name!r} is also defined by {definition.source.describe()};"
                f" this definition, from the earlier entry of {ENV_VAR}, is used"
            )
            yield Problem(said, path=used.source.path, line=used.source.line, severity="warning")


def project_manifest(cwd: str) -> str | None:
    """The nearest ``backends.toml``, else ``pyproject.toml`` with our table, from ``cwd`` up."""
    directory, below = os.path.abspath(cwd), None
    while directory != below:  # up to the root, which is its own parent
        backends, pyproject = (os.path.join(directory, name) for name in PROJECT_FILES)
        # Not isfile(): a backends.toml that is a directory or unreadable is
        # meant as the manifest, and reading it says what is wrong.
        if os.path.lexists(backends):
            return backends
        if os.path.lexists(pyproject) and _declares_table(pyproject):
            return pyproject
        directory, below = os.path.dirname(directory), directory
    return None


def _declares_table(pyproject: str) -> bool:
    """Whether a ``pyproject.toml`` met on the way up holds ``[tool.torch-backends]``, read
    as manifests are (size limit, no waiting on a FIFO). One that the trust rule refuses or
    that cannot be read or parsed is taken to where it may hold the table: reading it as the
    manifest then says why it is not used (a parse error with its line). Another tool's is
    passed by."""
    # A cheap test of its bytes first: most pyproject.toml files have no such table.
    if not may_hold(pyproject, PYPROJECT_TABLE[1].encode()):
        return False
    data = _parsed(pyproject)
    return data is None or table_at(data, PYPROJECT_TABLE) is not None


def _parsed(pyproject: str) -> dict[str, Any] | None:
    """A ``pyproject.toml`` as manifests are read (the trust rule, the limits, the integers
    of our table); ``None`` where it must not or cannot be."""
    with contextlib.suppress(Untrusted, ManifestError):
        return parse_toml(pyproject, read_text(pyproject), within=PYPROJECT_TABLE)[0]
    return None


def project_source(ctx: Context) -> Discovery:
    if ctx.cwd is None:
        said = "the working directory no longer exists; no project manifest read"
        return Discovery(problems=[Problem(said, severity="warning")])
    path = project_manifest(ctx.cwd)
    return (read_manifest(path, "project", ctx.cache) if path else None) or Discovery()


def replaced_table(manifest: str) -> Problem | None:
    """Where a project's backends.toml stands beside a pyproject.toml that declares
    backends too: those are never read (backends.toml wins), said."""
    beside = os.path.join(os.path.dirname(manifest), PROJECT_FILES[1])
    if not manifest.endswith(PROJECT_FILES[0]) or not _declares_table(beside):
        return None  # (one that is missing or not a file declares nothing)
    return Problem(
        f"{PROJECT_FILES[1]} beside it has a [tool.torch-backends] table too, which this"
        f" {PROJECT_FILES[0]} replaces: its backends are not read; keep one",
        path=manifest,
        severity="warning",
    )


def near_table(pyproject: str) -> str | None:
    """The ``[tool.X]`` table of a ``pyproject.toml`` that looks like a misspelt
    ``[tool.torch-backends]`` (``torch_backends``, ``torch-backend``), or ``None``."""
    tables = (_parsed(pyproject) or {}).get("tool")
    close = closest("torch-backends", list(tables) if isinstance(tables, dict) else [], cutoff=0.8)
    return f"[tool.{close[0]}]" if close and close[0] != "torch-backends" else None


def entry_point_source(ctx: Context) -> Discovery:
    """Installed distributions' ``torch_dynamo_backends`` entry points.

    Remembered by what is on sys.path, so a warm start needs no importlib.metadata;
    read for real when the context is fresh.
    """
    stamps = entry_point_stamps()
    return ctx.cache.remembered("entry-points", stamps, read_entry_points, fresh=ctx.fresh)


#: The reader of each source kind; SOURCE_KINDS gives their precedence.
READERS: Mapping[SourceKind, Callable[[Context], Discovery]] = {
    "runtime": lambda ctx: Discovery(list(ctx.runtime)),
    "env": env_source,
    "project": project_source,
    "entry-point": entry_point_source,
    "torch": lambda ctx: torch_definitions(ctx.entry_point_names()),
}
assert tuple(READERS) == SOURCE_KINDS
