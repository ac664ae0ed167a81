"""Finding modules without running them: a backend's requirements, and its target's file.

``importlib.util.find_spec("a.b")`` imports ``a``; here each level is looked
for in the search locations of the level above, so that no code runs, not even
a dotted name's parent package.
"""

from __future__ import annotations

import importlib.machinery
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec

    from ._definition import BackendDefinition


def file_finder(folder: str) -> importlib.machinery.FileFinder:
    """A finder of the modules directly in ``folder``.

    A new one each time, not ``sys.path_importer_cache``'s: a folder missing at
    one lookup and created before the next must be seen then.
    """
    machinery = importlib.machinery
    return machinery.FileFinder(
        folder,
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    )


def find_in(folders: Sequence[str], name: str) -> ModuleSpec | None:
    """The spec of the top-level module ``name`` in the first of ``folders`` that has it."""
    for folder in folders:
        spec = file_finder(folder).find_spec(name)
        if spec is not None:
            return spec
    return None


def find(module: str, folders: Sequence[str] = ()) -> ModuleSpec | None:
    """The spec ``import module`` would use (``folders`` searched last), running nothing.

    For a module already imported, its own spec.
    """
    import importlib.util

    loaded = sys.modules.get(module)
    if loaded is not None:
        return getattr(loaded, "__spec__", None) or importlib.machinery.ModuleSpec(module, None)
    parts = module.split(".")
    spec: ModuleSpec | None = None
    locations: Sequence[str] | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        parent = sys.modules.get(name)
        try:
            if parent is not None:
                spec = getattr(parent, "__spec__", None)
                locations = getattr(parent, "__path__", None)
                continue
            if depth == 1:
                # Top-level names: every finder on sys.meta_path, as import asks them.
                spec = importlib.util.find_spec(name) or find_in(folders, name)
            elif locations:
                spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
            else:
                return None  # the level above is not a package
        except Exception:  # a finder that fails (a namespace package's parent unseen): not found
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    return spec


def missing_requirements(definition: BackendDefinition) -> list[str]:
    """The ``requires`` modules that cannot be found; no code of any of them runs."""
    return [m for m in definition.requires if find(m, definition.python_path) is None]


def module_stamp(target: str, folders: Sequence[str] = ()) -> tuple[str, int, int] | None:
    """The file the module of ``target`` would be imported from, with its size and
    modification time: what changes when its code is edited. ``None`` where not found."""
    import os

    spec = find(target.partition(":")[0], folders)
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str):
        return None
    try:
        info = os.stat(origin)
    except OSError:
        return None
    return origin, info.st_size, info.st_mtime_ns
