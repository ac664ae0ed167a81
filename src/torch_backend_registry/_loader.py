"""Turning a definition into a callable: the one place that imports backend code."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading

from ._errors import BackendLoadError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar

    from ._definition import BackendDefinition

_PATH_LOCK = threading.Lock()


def missing_requirements(definition: BackendDefinition) -> list[str]:
    """The ``requires`` modules that cannot be found; none of them is imported."""
    return [module for module in definition.requires if not _findable(module)]


def _findable(module: str) -> bool:
    if module in sys.modules:
        return True
    top, _, _rest = module.partition(".")
    # find_spec("a.b") imports "a"; when "a" is not imported yet, finding "a"
    # is as far as we can go without running its code.
    if top != module and top not in sys.modules:
        module = top
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_requirements(definition: BackendDefinition) -> None:
    """Raise :class:`BackendLoadError` if a ``requires`` module cannot be found."""
    missing = missing_requirements(definition)
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise _error(definition, f"requires {names}, which cannot be found; install it") from (
            ModuleNotFoundError(f"No module named {missing[0]!r}")
        )


def load_target(definition: BackendDefinition) -> Callable[..., Any]:
    """Import ``module:attr.path``, check it is callable, bind ``options``.

    Raises :class:`BackendLoadError` chained to the original exception.
    """
    target = definition.target
    assert target is not None
    check_requirements(definition)
    module_name, _, attr_path = target.partition(":")
    try:
        with _on_sys_path(definition._python_path):
            obj: Any = importlib.import_module(module_name)
    # SystemExit too: a backend module that exits while imported must not end the
    # process that merely looked the backend up.
    except (Exception, SystemExit) as exc:
        raise _error(definition, f"import of {module_name!r} failed: {_why(exc)}") from exc
    for part in attr_path.split(".") if attr_path else ():
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise _error(
                definition,
                f"{type(obj).__name__} {getattr(obj, '__name__', obj)!r} has no attribute {part!r}",
            ) from exc
    if not callable(obj):
        raise _error(
            definition, f"{target!r} is a {type(obj).__name__}, not callable"
        ) from TypeError(f"{type(obj).__name__} object is not callable")
    if definition.options:
        bound = functools.partial(obj, **definition.options)
        functools.update_wrapper(bound, obj)
        return bound
    return obj  # type: ignore[no-any-return]


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _error(definition: BackendDefinition, reason: str) -> BackendLoadError:
    return BackendLoadError(definition.name, definition.target, definition.source, reason)


class _on_sys_path:
    """Put a manifest's ``python-path`` folders on ``sys.path`` for one import only.

    sys.path is process-wide and imports may run in several threads at once: a
    folder stays while any import that needs it runs, counted under a lock that
    is never held during an import itself (a slow import must not stall others).
    """

    _users: ClassVar[dict[str, int]] = {}

    def __init__(self, folders: tuple[str, ...]) -> None:
        self._folders = folders

    def __enter__(self) -> None:
        if not self._folders:
            return
        with _PATH_LOCK:
            added = [f for f in self._folders if not self._users.get(f)]
            for folder in self._folders:
                self._users[folder] = self._users.get(folder, 0) + 1
            sys.path[:0] = added

    def __exit__(self, *exc: object) -> None:
        if not self._folders:
            return
        with _PATH_LOCK:
            for folder in self._folders:
                self._users[folder] -= 1
                if not self._users[folder]:
                    del self._users[folder]
                    # The target may have put its own copy in front; remove one, ours.
                    if folder in sys.path:
                        sys.path.remove(folder)
