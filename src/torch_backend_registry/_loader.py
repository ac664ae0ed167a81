"""Turning a definition into a callable: the one place that imports backend code.

A manifest's ``python-path`` folders are served by a finder placed after every
other finder on ``sys.meta_path``, and only to the lookup that needs them (a
context variable, so another thread's imports never see them). So a folder
never shadows a module importable without it, and ``sys.path`` is never touched.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from contextvars import ContextVar

from ._errors import BackendLoadError, warn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    from ._definition import BackendDefinition

#: The python-path folders of the lookup running in this thread (or context).
_FOLDERS: ContextVar[tuple[str, ...]] = ContextVar("torch_backend_registry_folders", default=())


def _file_finder(folder: str) -> importlib.machinery.FileFinder:
    # A new finder each time, not sys.path_importer_cache's: a folder missing at
    # one lookup and created before the next must be seen then.
    machinery = importlib.machinery
    return machinery.FileFinder(
        folder,
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    )


def _find_in(folders: Sequence[str], name: str) -> ModuleSpec | None:
    for folder in folders:
        spec = _file_finder(folder).find_spec(name)
        if spec is not None:
            return spec
    return None


class _PythonPathFinder:
    """Finds top-level modules in the python-path folders of the current lookup only."""

    @staticmethod
    def find_spec(
        fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        folders = _FOLDERS.get()
        if not folders or path is not None:  # submodules: found through their package
            return None
        return _find_in(folders, fullname)

    @staticmethod
    def invalidate_caches() -> None:
        """Nothing cached: each lookup makes new finders."""


def _install_finder() -> None:
    if not any(type(f) is _PythonPathFinder for f in sys.meta_path):
        sys.meta_path.append(_PythonPathFinder())


# ------------------------------------------------------------------ requirements


def missing_requirements(definition: BackendDefinition) -> list[str]:
    """The ``requires`` modules that cannot be found; no code of any of them runs."""
    return [m for m in definition.requires if not findable(m, definition.python_path)]


def findable(module: str, folders: Sequence[str] = ()) -> bool:
    """Whether ``module`` can be imported, found without importing it or its parents.

    ``importlib.util.find_spec("a.b")`` imports ``a``; here each level is looked
    for in the search locations of the level above, without running it.
    """
    if module in sys.modules:
        return True
    parts = module.split(".")
    locations: Sequence[str] | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        if loaded is not None:
            locations = getattr(loaded, "__path__", None)  # where the import system looks
        else:
            try:
                if depth == 1:
                    spec = _find_top_level(name) or _find_in(folders, name)
                elif locations:
                    spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
                else:
                    return False  # the level above is not a package
            except (ImportError, ValueError):
                return False
            if spec is None:
                return False
            locations = spec.submodule_search_locations
    return True


def _find_top_level(name: str) -> ModuleSpec | None:
    """Ask every finder on ``sys.meta_path``, as ``import`` does; none imports anything
    to find a top-level name. (``importlib.util`` would cost a warm listing its
    ``contextlib`` import.)"""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, None) if find_spec is not None else None
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None


def check_requirements(definition: BackendDefinition) -> None:
    """Raise :class:`BackendLoadError` if a ``requires`` module cannot be found."""
    missing = missing_requirements(definition)
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise _error(definition, f"requires {names}, which cannot be found; install it") from (
            ModuleNotFoundError(f"No module named {missing[0]!r}")
        )


# ----------------------------------------------------------------------- loading


def trusted_folders(definition: BackendDefinition) -> tuple[list[str], list[str]]:
    """The python-path folders that may serve code, and why the others may not."""
    from ._files import untrusted_folder, untrusted_message

    trusted, refused = [], []
    for folder in definition.python_path:
        reason = untrusted_folder(folder)
        if reason is None or reason.startswith("it cannot be examined"):
            trusted.append(folder)  # a missing folder serves nothing either way
        else:
            message = untrusted_message(f"python-path folder {folder!r}", reason)
            refused.append(message)
            warn(f"{definition.source.describe()}: backend {definition.name!r}: {message}")
    return trusted, refused


def load_target(definition: BackendDefinition) -> Callable[..., Any]:
    """Import ``module:attr.path``, check it is callable, bind ``options``.

    Raises :class:`BackendLoadError` chained to the original exception; what the
    failed attempt left in ``sys.modules`` of the target's own modules is
    removed, so that the next lookup imports the fixed code afresh.
    """
    target = definition.target
    assert target is not None
    check_requirements(definition)
    module_name, _, attr_path = target.partition(":")
    folders, refused = trusted_folders(definition)
    if folders:
        _install_finder()
    before = set(sys.modules)
    token = _FOLDERS.set(tuple(folders))
    try:
        obj: Any = importlib.import_module(module_name)
    # SystemExit too: a backend module that exits while imported must not end the
    # process that merely looked the backend up.
    except (Exception, SystemExit) as exc:
        _forget(before, module_name, folders)
        note = f" ({'; '.join(refused)})" if refused else ""
        raise _error(definition, f"import of {module_name!r} failed: {_why(exc)}{note}") from exc
    finally:
        _FOLDERS.reset(token)
    for part in attr_path.split(".") if attr_path else ():
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            _forget(before, module_name, folders)
            raise _error(
                definition,
                f"{type(obj).__name__} {getattr(obj, '__name__', obj)!r} has no attribute {part!r}",
            ) from exc
    if not callable(obj):
        _forget(before, module_name, folders)
        raise _error(
            definition, f"{target!r} is {_a(type(obj).__name__)}, which is not callable"
        ) from TypeError(f"{type(obj).__name__} object is not callable")
    if definition.options:
        import functools

        bound = functools.partial(obj, **definition.options)
        functools.update_wrapper(bound, obj)
        return bound
    return obj  # type: ignore[no-any-return]


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiouAEIOU" else f"a {noun}"


def _forget(before: set[str], module_name: str, folders: Sequence[str]) -> None:
    """Drop the modules a failed load added: the target's own, and those of its folders."""
    import os

    importlib.invalidate_caches()
    roots = tuple(os.path.join(folder, "") for folder in folders)
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if (
            name == module_name
            or name.startswith(module_name + ".")
            or module_name.startswith(name + ".")
            or (roots and origin.startswith(roots))
        ):
            sys.modules.pop(name, None)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _error(definition: BackendDefinition, reason: str) -> BackendLoadError:
    return BackendLoadError(definition.name, definition.target, definition.source, reason)
