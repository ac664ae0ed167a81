"""The error hierarchy: one base class, each subclass keeps its facts as attributes."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence

from ._definition import Problem, Source, location


class BackendRegistryError(Exception):
    """Base class of every error this library raises."""


class _Located(BackendRegistryError):
    """An error of a place in a file: the message starts ``PATH:LINE: KEY: `` so that
    editors and CI logs can jump to it; the same facts are kept as attributes."""

    def __init__(
        self, message: str, *, path: str | None, line: int | None = None, key: str | None = None
    ) -> None:
        self.path = path
        self.line = line
        self.key = key
        self.message = message
        super().__init__(location(path, line, key) + message)


class ManifestError(_Located):
    """A manifest cannot be used as written."""

    @classmethod
    def of(cls, problem: Problem) -> ManifestError:
        """The error that ``problem`` raises where it makes a lookup fail."""
        return cls(problem.message, path=problem.path, line=problem.line, key=problem.key)

    @property
    def problem(self) -> Problem:
        """The same facts as a :class:`Problem` (what discovery collects)."""
        return Problem(self.message, path=self.path, line=self.line, key=self.key)


class UnknownBackendError(BackendRegistryError, LookupError):
    """No backend of that name is registered (or it is disabled)."""

    #: How to see every name, said to whoever reads the message (the CLI says its own).
    HINT = "list_backends(exclude_tags=()) gives every name."

    def __init__(
        self, name: str, suggestions: Sequence[str] = (), *, note: str = "", left_out: bool = False
    ) -> None:
        self.name = name
        self.suggestions = tuple(suggestions)
        self.note = note
        #: The name is declared and left out (``note`` says by what): no list shows it.
        self.left_out = left_out
        super().__init__(self.brief if left_out else self.brief + " " + self.HINT)

    @property
    def brief(self) -> str:
        """The message without the hint: what is unknown, why, and the closest names."""
        note = f" ({self.note})" if self.note else ""
        quoted = " or ".join(map(repr, self.suggestions))
        meant = f" Did you mean {quoted}?" if quoted else ""
        return f"unknown backend {self.name!r}{note}.{meant}"


class BackendLoadError(BackendRegistryError):
    """A backend's target could not be imported or is not callable (the cause chained)."""

    def __init__(
        self, name: str, target: str | None, source: Source, reason: str, where: str = ""
    ) -> None:
        self.name = name
        self.target = target
        self.source = source
        self.reason = reason
        what = f" (target {target!r})" if target else ""
        #: What failed, without where: ``check`` says it at the target's line.
        self.message = f"cannot load backend {name!r}{what}: {reason}"
        # ``where``: ``PATH:LINE: KEY: `` of the target in its manifest; else the source.
        super().__init__((where or f"{source.describe()}: ") + self.message)


class BackendChainError(BackendRegistryError):
    """Every member of a fallback chain was skipped or failed: ``failures`` holds a
    ``(member, reason)`` pair for each, in order."""

    def __init__(self, name: str, failures: Sequence[tuple[str, str]]) -> None:
        self.name = name
        self.failures = tuple(failures)
        details = "; ".join(f"{member!r}: {reason}" for member, reason in self.failures)
        super().__init__(f"no member of fallback chain {name!r} could compile: {details}")


class RefusedArguments(BackendRegistryError, TypeError):
    """What torch.compile was given (``mode=``, ``options=``) cannot reach a backend that
    takes no such argument: the caller's mistake, raised at once, never a chain member to
    skip (chains let it through)."""


class DuplicateBackendError(BackendRegistryError, ValueError):
    """A name was registered twice at runtime (PyTorch refuses the same)."""

    def __init__(self, name: str, existing: Source) -> None:
        self.name = name
        self.existing = existing
        super().__init__(
            f"backend {name!r} is already registered ({existing.describe()}); pick another name"
        )


class LockFileError(_Located):
    """A lock file cannot be read or is not one (``path``, ``line``)."""


class LockDriftError(BackendRegistryError):
    """The registry resolves names differently from its lock file: ``changes`` holds one
    line a difference (added, removed, changed field)."""

    def __init__(self, lock: str, changes: list[str], command: str = "torch-backends lock") -> None:
        self.lock = lock
        self.changes = tuple(changes)
        #: What accepts them: writes this lock again.
        self.command = command
        shown = "; ".join(changes[:5]) + ("; ..." if len(changes) > 5 else "")
        super().__init__(
            f"{lock}: the backends drifted from this lock ({len(changes)} difference"
            f"{'s' if len(changes) != 1 else ''}: {shown}); run 'torch-backends check"
            f" --locked' to see them, '{command}' to accept them"
        )


class InconsistentRegistryError(BackendRegistryError):
    """Ranks resolve backend names differently (or did not all take part in the check):
    ``ranks`` differ from the majority (or never came), on the backend ``names``."""

    def __init__(
        self, message: str, ranks: tuple[int, ...] = (), names: tuple[str, ...] = ()
    ) -> None:
        self.ranks = ranks
        self.names = names
        super().__init__(message)


class ManifestWarning(UserWarning):
    """A manifest, or one of its backends, was left out; the message says why."""


def warn(message: str) -> None:
    """Issue a :class:`ManifestWarning` attributed to the first caller outside this package,
    as ``warnings.warn(skip_file_prefixes=...)`` does from Python 3.12 (before it, found by
    walking out of the package's frames: no fixed ``stacklevel`` serves every depth)."""
    import sys
    import warnings

    if sys.version_info >= (3, 12):
        warnings.warn(message, ManifestWarning, skip_file_prefixes=(_PACKAGE,))
        return
    level, frame = 2, sys._getframe(1)  # 1 is this function
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(message, ManifestWarning, stacklevel=level)


#: This package's folder: its frames are skipped when a warning is attributed.
_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def warn_problem(problem: Problem, kept: Collection[str] = ()) -> None:
    """Warn of ``problem``; the names in ``kept`` (PyTorch's own) resolve whatever a
    manifest says of them."""
    said = str(problem)
    # An error of a backend's table leaves that backend out (the others stay): said, since
    # the message itself says what is wrong and what would be right.
    parts = (problem.key or "").removeprefix("tool.torch-backends.").split(".")
    backend = parts[1] if len(parts) >= 2 and parts[0] == "backends" else None
    if problem.severity == "error" and backend not in (None, *kept) and not problem.whole_file:
        said += f" (so backend {backend!r} is left out)"
    warn(said)


def closest(word: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The names of ``choices`` nearest ``word``, for a "did you mean" (``difflib`` is only
    imported once a message needs it: a listing with no problem never does)."""
    import difflib

    # Compared without case, as a reader does: 'INSPECT' meant 'inspect'. Of two spellings of
    # one name the first is kept (a dict keeps the last one given: the choices go backwards).
    by_lower = {choice.lower(): choice for choice in reversed([*choices])}
    return [by_lower[m] for m in difflib.get_close_matches(word.lower(), by_lower, n, cutoff)]


def did_you_mean(
    word: str, choices: Iterable[str], otherwise: str = "", *, before: str = "", cutoff: float = 0.6
) -> str:
    """``before`` and "did you mean 'NAME'?" for the name of ``choices`` nearest ``word``
    (:func:`closest`), else ``otherwise``."""
    close = closest(word, choices, cutoff=cutoff)
    return f"{before}did you mean {close[0]!r}?" if close else otherwise
