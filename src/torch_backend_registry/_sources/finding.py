"""Finding modules without running them, as importing would find them: a backend's
requirements, its target's file, and the ``python-path`` folders a lookup searches.

A manifest's ``python-path`` folders are served by a finder placed after every other
finder on ``sys.meta_path``, so a folder never shadows a module importable without it
and ``sys.path`` is never touched. While a target is looked up, its folders are served to
that lookup only (a context variable: another thread's imports never see them); once it
is loaded, they stay searchable, last, for the rest of the process.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import NamedTuple

from .._definition import BackendDefinition
from .files import refused_folders

#: The python-path folders of the lookup running in this thread (or context).
_FOLDERS: ContextVar[tuple[str, ...]] = ContextVar("torch_backend_registry_folders", default=())

#: What a folder's modules are loaded with, as the standard path finder has it.
_LOADERS = (
    (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
    (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
)


class PythonPathFinder:
    """Finds top-level modules in the current lookup's python-path folders, then in those of
    every target loaded so far."""

    #: Folders of loaded targets, in the order they were first needed (a new tuple each time).
    loaded: tuple[str, ...] = ()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        # Top-level modules only: a submodule is found through its package.
        return _found_in(_FOLDERS.get() + self.loaded, fullname) if path is None else None


def _found_in(folders: Iterable[str], name: str) -> ModuleSpec | None:
    """The top-level module ``name`` in the first of ``folders`` that holds it."""
    # A new finder each time, not sys.path_importer_cache's: a folder missing at
    # one lookup and created before the next must be seen then.
    finders = (importlib.machinery.FileFinder(folder, *_LOADERS) for folder in folders)
    return next((spec for f in finders if (spec := f.find_spec(name)) is not None), None)


def python_path_finder() -> PythonPathFinder:
    """The finder of python-path folders, last on ``sys.meta_path`` (placed there once)."""
    if (found := next((f for f in sys.meta_path if isinstance(f, PythonPathFinder)), None)) is None:
        found = PythonPathFinder()
        sys.meta_path.append(found)
    return found


@contextmanager
def searching(folders: Sequence[str]) -> Iterator[None]:
    """Serve ``folders`` to this thread's imports and searches for the time of the block."""
    if folders:
        python_path_finder()
    token = _FOLDERS.set(tuple(folders))
    try:
        yield
    finally:
        _FOLDERS.reset(token)


def find(module: str, folders: Sequence[str] = (), *, files: bool = False) -> ModuleSpec | None:
    """The spec ``import module`` would use (``folders`` searched last), running nothing:
    ``importlib.util.find_spec("a.b")`` imports ``a``; here each level is looked for in the
    search locations of the level above. With ``files``, in the files alone, whatever is
    imported: the same answer before and after (a package that extends its ``__path__`` as
    it is imported has modules only an import finds)."""
    import importlib.util

    if not files and (loaded := sys.modules.get(module)) is not None:
        return getattr(loaded, "__spec__", None) or importlib.machinery.ModuleSpec(module, None)
    parts = module.split(".")
    spec: ModuleSpec | None = None
    locations: Sequence[str] | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        parent = None if files else sys.modules.get(name)
        try:
            if parent is not None:  # never the module itself, which is not loaded
                locations = getattr(parent, "__path__", None)
                continue
            if depth == 1:
                # Top-level names: every finder on sys.meta_path, as import asks them,
                # ``folders`` served as to the lookup importing them.
                with searching(folders):
                    spec = importlib.util.find_spec(name)
            else:  # none where the level above is not a package (no locations)
                spec = importlib.machinery.PathFinder.find_spec(name, list(locations or ()))
        except Exception:  # a finder that fails (a namespace package's parent unseen): not found
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    return spec


def shadowed(module: str, folders: Sequence[str]) -> tuple[str, str] | None:
    """Where the top-level package of ``module`` lies in one of ``folders`` (beside a
    manifest) and a module of that name is imported from somewhere else first (the standard
    library, an installed package): that file and the other.
    ``sys.path`` entries naming one of ``folders`` (a script's folder, ``python -m``'s working
    folder) are left out, so that every process finds the same answer."""
    top = module.split(".")[0]
    if not isinstance(origin := getattr(_found_in(folders, top), "origin", None), str):
        return None
    if top in sys.builtin_module_names:
        return origin, "a module built into Python"
    real = {os.path.realpath(folder) for folder in folders}
    path = [e for e in sys.path if os.path.realpath(e or os.curdir) not in real]
    loaded = sys.modules.get(top)
    other = getattr(loaded, "__spec__", None) or importlib.machinery.PathFinder.find_spec(top, path)
    theirs = getattr(other, "origin", None)
    if not isinstance(theirs, str) or os.path.realpath(theirs) == os.path.realpath(origin):
        return None
    return origin, theirs


def missing_requirements(definition: BackendDefinition) -> list[str]:
    """The ``requires`` modules that cannot be found; no code of any of them runs."""
    return locate(definition).missing if definition.requires else []


class Located(NamedTuple):
    """All that loading a target needs to know, found without running any of its code, as
    importlib's ``ModuleSpec`` is for a module (see :func:`locate`)."""

    #: The ``requires`` modules that cannot be found.
    missing: list[str]
    #: Each python-path folder the trust rule refuses, with why: it serves nothing.
    refused: dict[str, str]
    #: The python-path folders to search while importing, in order, and to keep searchable
    #: once the target is loaded (the refused ones left out).
    folders: tuple[str, ...]
    #: The module's file beside the manifest and another of its name imported first, where
    #: there is one (see :func:`shadowed`).
    shadowed: tuple[str, str] | None


def locate(definition: BackendDefinition, module: str | None = None) -> Located:
    """What loading ``module``, ``definition``'s target's, needs, in one answer: its folders
    judged once (without ``module``, nothing is ``shadowed``)."""
    refused = refused_folders(definition.search_path)
    folders = tuple(f for f in definition.search_path if f not in refused)
    missing = [m for m in definition.requires if find(m, folders) is None]
    # Beside the manifest is where a script or a working folder puts a module first on the
    # path: one process would import one file, another the other.
    beside = None if module is None else shadowed(module, definition.search_path[-1:])
    return Located(missing, refused, folders, beside)


def keep(folders: Sequence[str]) -> None:
    """Keep ``folders`` searchable, last, for the rest of the process (a target loaded from
    them): one tuple swap, so that the finder's readers need no lock."""
    if folders:
        finder = python_path_finder()
        finder.loaded += tuple(f for f in folders if f not in finder.loaded)
