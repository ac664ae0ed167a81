"""The ``torch-backends`` command: parses arguments, runs the command they name, says its errors."""

from __future__ import annotations

import contextlib
import os
import pkgutil
import sys
from argparse import Namespace as Arguments
from collections.abc import Sequence
from typing import Any

from .._errors import BackendRegistryError, ManifestWarning, UnknownBackendError
from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    PROG,
    CommandError,
    UsageError,
    error,
    printable,
)


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    from .arguments import parse

    for name in ("stdout", "stderr"):
        # A closed standard stream (``>&-``) is None to Python, and print() writes nowhere
        # then: so does the command.
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - the process's own
        # A description may hold characters the terminal's encoding lacks (a C locale,
        # PYTHONIOENCODING=ascii): print them escaped rather than fail.
        with contextlib.suppress(AttributeError):  # a stream that is no io.TextIOWrapper
            getattr(sys, name).reconfigure(errors="backslashreplace")
    args = parse(argv)
    show = warnings.showwarning
    caught: list[str] = []

    def said(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, ManifestWarning):
            caught.append(str(message))
        else:  # what an imported backend warns of keeps Python's form, as it happens
            show(message, category, *args, **kw)

    with warnings.catch_warnings():
        # This library's own warnings are the command's to say, each once; others keep
        # Python's filters.
        warnings.simplefilter("default", ManifestWarning)
        warnings.showwarning = said
        code, failure = _run(args)
    for message in caught:
        # The error below says the same thing; one line is enough.
        if failure is None or not message.startswith(failure):
            print(f"{PROG}: warning: {printable(message)}", file=sys.stderr)
    if failure is not None:
        error(failure)
    return code


def _run(args: Arguments) -> tuple[int, str | None]:
    # A command's module is imported when it runs: a listing imports no tool's.
    handler = pkgutil.resolve_name(f"{__name__}.{args.module}:run_{args.command}")
    try:
        code = handler(args)
        sys.stdout.flush()  # a full disk is this command's error, not the interpreter's
        return code, None
    except UsageError as exc:
        return EXIT_USAGE, str(exc)
    except BrokenPipeError:
        # `torch-backends list | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK, None
    except KeyboardInterrupt:
        return 130, None
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        if isinstance(exc, UnknownBackendError):
            from .._sources.pytorch import pytorch_names

            if getattr(args, "no_torch", False) and exc.name in pytorch_names():
                return EXIT_PROBLEMS, (
                    f"unknown backend {exc.name!r} with --no-torch: it is one of PyTorch's own"
                    " backends, which --no-torch leaves out; run it without --no-torch"
                )
            hint = "" if exc.left_out else f" '{PROG} list --all' shows every name."
            return EXIT_PROBLEMS, exc.brief + hint
        if isinstance(exc, (BackendRegistryError, CommandError)):
            return EXIT_PROBLEMS, str(exc)
        if isinstance(exc, OSError) and exc.strerror:
            # A folder it may not write, a full disk, a working folder removed: the system's
            # own words, about the file it names.
            where = f"{exc.filename}: " if exc.filename is not None else ""
            return EXIT_PROBLEMS, f"{where}{exc.strerror}"
        return EXIT_PROBLEMS, f"{type(exc).__name__}: {exc} (run with --debug for a traceback)"
