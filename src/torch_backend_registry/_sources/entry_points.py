"""The installed plugins' ``torch_dynamo_backends`` entry points: read, in the order
PyTorch's would be, and stamped by what decides them (``sys.path`` and its distributions)."""

from __future__ import annotations

import contextlib
import os
import sys

from .._definition import BackendDefinition, Discovery, Problem, Source, distribution_key
from .cache import stamps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from importlib.metadata import Distribution, EntryPoint

#: The entry-point group PyTorch itself reads.
ENTRY_POINT_GROUP = "torch_dynamo_backends"


def entry_point_stamps() -> list[object]:
    """What decides the entry points: each sys.path entry and the distributions in it, with
    the stamps of the folder and of each one's metadata files."""
    stamps_of: list[object] = []
    for entry in sys.path:
        folder = entry or os.curdir
        names: list[str] = []  # a zip file (its own stamp says it changed), or nothing
        with contextlib.suppress(OSError):
            names = sorted(
                name
                for name in os.listdir(folder)
                # As importlib.metadata matches them, whatever the case; EGG-INFO: the
                # metadata of an unzipped .egg that is itself on sys.path.
                if name.lower().endswith((".dist-info", ".egg-info", ".egg", ".egg-link"))
                or name == "EGG-INFO"
            )
        # The folder's own time changes when anything is added, renamed or removed in it; a
        # metadata file's, when it is edited in place.
        files = [os.path.join(folder, n, m) for n in names for m in _METADATA]
        stamps_of.append([entry, names, stamps([folder, *files])])
    return stamps_of


#: The files of a distribution's metadata that say its name, version and entry points.
_METADATA = (
    "entry_points.txt",
    "METADATA",
    "PKG-INFO",
    os.path.join("EGG-INFO", "entry_points.txt"),  # an unzipped .egg
    os.path.join("EGG-INFO", "PKG-INFO"),
)


def read_entry_points() -> Discovery:
    """The entry points of our group, read now, in a deterministic order. One whose name
    could be no backend's, or whose value is no ``module:attribute``, is left out, said."""
    import re

    names = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
    targets = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
    found = Discovery()
    places: dict[str, int] = {}
    for index, entry in enumerate(sys.path):
        places.setdefault(_real(entry), index)
    listed = []
    for ep in _entry_points(found.problems):
        name, version = _name_and_version(ep.dist)
        folder = ""  # a distribution that cannot say where it is: last
        with contextlib.suppress(Exception):
            folder = _real(str(ep.dist.locate_file(""))) if ep.dist else ""
        # Their folder's place on sys.path, then the distribution's name (within one folder,
        # importlib.metadata follows os.listdir).
        order = (places.get(folder, len(places)), distribution_key(name or ""))
        listed.append((order, ep, Source("entry-point", distribution=name, version=version)))
    for _order, ep, source in sorted(listed, key=lambda item: item[0]):
        target = ep.value.split("[", 1)[0].strip()
        wrong = (
            "which is no backend name" if not names.fullmatch(ep.name)
            else f"whose value {ep.value!r} is no module:attribute" if not targets.fullmatch(target)
            else None
        )  # fmt: skip
        if wrong is None:
            found.definitions.append(BackendDefinition(ep.name, source, target=target))
            continue
        said = f"{source.describe()} declares the entry point {ep.name!r}, {wrong}: it is left out"
        found.problems.append(Problem(said, severity="warning"))
    return found


def _real(path: str) -> str:
    with contextlib.suppress(OSError):  # "" or a relative entry, and the working directory is gone
        return os.path.realpath(path or os.curdir)
    return path


def _entry_points(problems: list[Problem]) -> Iterable[EntryPoint]:
    """The entry points of our group; a distribution that cannot be read goes to ``problems``."""
    from importlib.metadata import distributions, entry_points

    # A broken *.dist-info makes this raise: then they are read one by one to spare the others.
    with contextlib.suppress(Exception):
        return entry_points(group=ENTRY_POINT_GROUP)
    eps: list[EntryPoint] = []
    seen: set[str] = set()
    for dist in distributions():
        name, _version = _name_and_version(dist)
        if name is not None:
            # As entry_points() does: the first distribution of a name on sys.path wins.
            if (key := distribution_key(name)) in seen:
                continue
            seen.add(key)
        try:
            eps.extend(dist.entry_points.select(group=ENTRY_POINT_GROUP))
        except Exception as exc:
            where = repr(name) if name is not None else f"in {dist.locate_file('')}"
            said = f"the entry points of distribution {where} cannot be read"
            problems.append(Problem(f"{said} ({type(exc).__name__}: {exc}); reinstall it"))
    return eps


def _name_and_version(dist: Distribution | None) -> tuple[str | None, str | None]:
    if dist is not None:
        with contextlib.suppress(Exception):  # unreadable METADATA: the entry point may be fine
            metadata = dist.metadata  # read and parsed at each access: once here
            return metadata["Name"], metadata["Version"]
    return None, None
