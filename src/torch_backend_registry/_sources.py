"""Discovery sources: each reads one kind of input and returns definitions.

Sources handle strings only; nothing here imports a backend's code.
"""

from __future__ import annotations

import os

from ._definition import BackendDefinition, Source
from ._errors import ManifestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from importlib.metadata import Distribution, EntryPoint
    from typing import Any

    from ._manifest import ManifestResult

#: The environment variable naming extra manifests (files or directories).
ENV_VAR = "TORCH_BACKENDS_PATH"
#: The entry-point group PyTorch itself reads.
ENTRY_POINT_GROUP = "torch_dynamo_backends"
PROJECT_FILES = ("backends.toml", "pyproject.toml")


class Found:
    """What one source yields."""

    __slots__ = ("default", "definitions", "problems", "warnings")

    def __init__(self) -> None:
        self.definitions: list[BackendDefinition] = []
        self.problems: list[ManifestError] = []
        #: ``(name, path, line)`` of the first manifest ``default`` met.
        self.default: tuple[str, str, int | None] | None = None
        #: Manifests left out on purpose (untrusted), reported as warnings.
        self.warnings: list[ManifestError] = []


class Context:
    """The inputs of a discovery: a working directory, the env entries, runtime entries."""

    __slots__ = ("cwd", "env_entries", "runtime")

    def __init__(
        self,
        cwd: str | None,
        env_entries: Sequence[str],
        runtime: Mapping[str, BackendDefinition],
    ) -> None:
        #: An absolute path, or ``None`` when the working directory no longer exists.
        self.cwd = cwd
        #: The manifest files and directories of the env source, highest first.
        self.env_entries = env_entries
        self.runtime = runtime


def _read(path: str, kind: str, found: Found) -> ManifestResult | None:
    from ._manifest import read_manifest

    result = read_manifest(path, kind)
    if result is None:
        return None
    if result.skipped is not None:
        found.warnings.append(result.skipped)
    found.definitions.extend(result.definitions)
    found.problems.extend(result.problems)
    if result.default is not None and found.default is None:
        found.default = (result.default, path, result.default_line)
    return result


def runtime_source(ctx: Context) -> Found:
    """``register_backend`` calls made in this process."""
    found = Found()
    found.definitions.extend(ctx.runtime.values())
    return found


def env_paths(ctx: Context) -> tuple[list[str], list[ManifestError]]:
    """The manifest files named by ``TORCH_BACKENDS_PATH``, highest first."""
    files: list[str] = []
    problems: list[ManifestError] = []
    for entry in ctx.env_entries:
        if not entry.strip():
            continue
        path = os.path.expanduser(entry)
        if ctx.cwd is not None:
            path = os.path.join(ctx.cwd, path)
        if not os.path.isabs(path):
            problems.append(
                ManifestError(
                    f"relative entry of {ENV_VAR} and the working directory no longer exists;"
                    " use an absolute path",
                    path=entry,
                )
            )
        elif os.path.isdir(path):
            files.extend(
                os.path.join(path, name)
                for name in sorted(os.listdir(path))
                if name.endswith(".toml") and os.path.isfile(os.path.join(path, name))
            )
        elif os.path.exists(path):
            files.append(path)
        else:
            problems.append(
                ManifestError(
                    f"no such file or directory (named by {ENV_VAR}={entry!r}); remove the"
                    " entry or create the file",
                    path=entry,
                )
            )
    return files, problems


def env_source(ctx: Context) -> Found:
    """Manifests named by ``TORCH_BACKENDS_PATH``, earlier entries first."""
    found = Found()
    files, found.problems = env_paths(ctx)
    for path in files:
        result = _read(path, "env", found)
        if result is None and os.path.basename(path) == "pyproject.toml":
            found.problems.append(
                ManifestError(f"has no [tool.torch-backends] table (named by {ENV_VAR})", path=path)
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
        if os.path.isfile(candidate) and _declares_table(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _declares_table(pyproject: str) -> bool:
    # A cheap text test first: most pyproject.toml files have no such table,
    # and parsing every one met on the way up would cost more than reading.
    try:
        with open(pyproject, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return False
    if "torch-backends" not in text:
        return False
    from ._manifest import PYPROJECT_TABLE, parse_toml

    try:
        data: Any = parse_toml(text)
    except ValueError:  # tomli.TOMLDecodeError
        return True  # reading it reports the syntax error with its line
    for part in PYPROJECT_TABLE:
        data = data.get(part) if isinstance(data, dict) else None
    return data is not None


def project_source(ctx: Context) -> Found:
    """The nearest project manifest."""
    found = Found()
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


def entry_point_source(ctx: Context) -> Found:
    """Installed distributions' ``torch_dynamo_backends`` entry points."""
    found = Found()
    for ep in read_entry_points(found.problems):
        name, version = _name_and_version(ep.dist)
        source = Source("entry-point", distribution=name, version=version)
        target = ep.value.split("[", 1)[0].strip()
        found.definitions.append(BackendDefinition(ep.name, source, target=target))
    return found


def read_entry_points(problems: list[ManifestError]) -> Iterable[EntryPoint]:
    """The entry points of our group; a distribution that cannot be read goes to ``problems``."""
    from importlib.metadata import entry_points

    try:
        return entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken *.dist-info: read them one by one to spare the others
        return _entry_points_one_by_one(problems)


def _entry_points_one_by_one(problems: list[ManifestError]) -> list[EntryPoint]:
    import re
    from importlib.metadata import distributions

    eps: list[EntryPoint] = []
    seen: set[str] = set()
    for dist in distributions():
        name, _version = _name_and_version(dist)
        if name is not None:
            # As entry_points() does: the first distribution of a name on sys.path wins.
            key = re.sub(r"[-_.]+", "-", name).lower()
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


def torch_source(ctx: Context) -> Found:
    """PyTorch's own backends, where torch is installed."""
    from ._torch import torch_definitions

    found = Found()
    found.definitions.extend(torch_definitions())
    return found


#: The single source of truth for precedence: highest first. The registry
#: folds these in this order; a name resolves to the first source defining it.
SOURCES: tuple[tuple[str, Callable[[Context], Found]], ...] = (
    ("runtime", runtime_source),
    ("env", env_source),
    ("project", project_source),
    ("entry-point", entry_point_source),
    ("torch", torch_source),
)
#: The source kinds, highest precedence first, as SOURCES orders them.
SOURCE_KINDS = tuple(kind for kind, _reader in SOURCES)
