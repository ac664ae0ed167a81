"""The command line's grammar: argparse's parser, every command, option and help text."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from .common import PROG, registry_for

#: Help texts as written: the examples keep their lines.
_FORMAT = argparse.RawDescriptionHelpFormatter

EXAMPLES = f"""\
examples:
  {PROG} list --no-torch              the backends of this project, without PyTorch's
  {PROG} explain inductor             where a name is defined and what it shadows
  {PROG} check --import               validate the manifests and import every target
  {PROG} doctor                       which backends work here
  {PROG} lock && {PROG} check --locked    pin what the project uses; find drift
  {PROG} tune -- python train.py      decide each select chain's member once, and ship it

Extra manifests: set TORCH_BACKENDS_PATH to files or folders ({os.pathsep!r} separated).
"""


class _VersionAction(argparse.Action):
    # importlib.metadata is only worth importing when the version is asked for.
    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from importlib.metadata import version

        print(f"{PROG} {version('torch-backend-registry')}")
        parser.exit()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    completing = "_ARGCOMPLETE" in os.environ  # the shell asks for completions
    # Doctor's options take their defaults from doctor's own module, which a command line
    # that cannot run doctor leaves unimported (no global option takes a value: a command
    # is a word of the line).
    parser = build_parser(doctor=completing or "doctor" in argv)
    if completing:
        with contextlib.suppress(ImportError):  # argcomplete: the ``completion`` extra
            import argcomplete

            argcomplete.autocomplete(parser)  # answers and exits
    return parser.parse_args(argv)


def _complete_names(prefix: str, **kwargs: Any) -> list[str]:
    """Backend names and aliases for completion: the manifests and plugins, not PyTorch's."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        definitions = registry_for(no_torch=True).definitions(())
    return sorted({n for d in definitions for n in (d.name, *d.aliases) if n.startswith(prefix)})


def _switch(parser: argparse.ArgumentParser, flag: str, help: str, **kwargs: Any) -> None:
    parser.add_argument(flag, action="store_true", help=help, **kwargs)


def build_parser(*, doctor: bool = True) -> argparse.ArgumentParser:
    """The whole grammar (``doctor=False``: without doctor's options)."""
    # Global options are accepted before and after the command, as users type them;
    # SUPPRESS keeps a subcommand's absent option from resetting one given before it.
    common = argparse.ArgumentParser(add_help=False, formatter_class=_FORMAT)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the traceback of an error (for bug reports)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Declare, list and check torch.compile backends.",
        epilog=EXAMPLES,
        formatter_class=_FORMAT,
        parents=[common],
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="show the version and exit"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str, module: str) -> argparse.ArgumentParser:
        """``module``: the module of ``_cli`` whose ``run_NAME`` runs the command, imported
        when it runs."""
        parser = commands.add_parser(
            name, help=help, description=help, parents=[common], formatter_class=_FORMAT
        )
        parser.set_defaults(module=module)
        return parser

    lister = command("list", "list backends: NAME, TAGS, SOURCE, TARGET", "show")
    _switch(lister, "--all", "include debug and experimental")
    tags: dict[str, Any] = {"action": "append", "default": [], "metavar": "T"}
    lister.add_argument("--tag", **tags, help="only backends tagged T")
    lister.add_argument("--exclude-tag", **tags, help="leave out tag T")
    _switch(lister, "--available", "only backends whose requirements are met")
    _switch(lister, "--json", "print a JSON array of objects")
    no_torch = "leave out PyTorch's own backends"
    _switch(lister, "--no-torch", no_torch + " (skips importing torch, which takes seconds)")

    explain = command("explain", "where a backend is defined and what it shadows", "show")
    name = explain.add_argument("name", metavar="NAME", help="a backend name or alias")
    name.completer = _complete_names  # type: ignore[attr-defined]  # read by argcomplete
    _switch(explain, "--no-torch", no_torch)
    _switch(explain, "--json", "print one JSON object (as list --json, and more)")

    checker = command("check", "validate manifests (the discovered ones, or those given)", "check")
    checker.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="manifests to check instead of the project's and TORCH_BACKENDS_PATH's",
    )
    _switch(
        checker,
        "--no-torch",
        "skip PyTorch's own backends (then a name of theirs is not checked against them)",
    )
    _switch(
        checker,
        "--locked",
        "also compare what every name resolves to with backends.lock (or the lock"
        " TORCH_BACKENDS_LOCKED names, as install() does); print each drift",
    )
    _switch(
        checker,
        "--import",
        "also import every target, and what chains and tables run, and check that each"
        " can be called as a compiler",
        dest="import_targets",
    )
    _switch(checker, "--json", "print one JSON object: every problem, and counts")

    prober = command("doctor", "probe backends in subprocesses: which work here", "doctor")
    if doctor:
        _doctor_options(prober)

    lock = command(
        "lock",
        "write backends.lock beside the manifest: what the backends the manifests declare,"
        " and every backend they name, resolve to",
        "files",
    )
    lock.add_argument("--output", metavar="PATH", help="write the lock there instead")
    _switch(lock, "--all", "pin every listed backend, plugins' and PyTorch's included")
    _switch(
        lock,
        "--no-torch",
        "leave PyTorch's own backends unread (those the manifests name are pinned by release)",
    )

    tune = command(
        "tune",
        'run a command with every select = "fastest" chain deciding afresh, and write each'
        " choice made to backends.choices beside the project manifest",
        "choices",
    )
    tune.add_argument(
        "--compile-cache",
        metavar="PATH",
        help="also save PyTorch's compile caches of what the command compiled to PATH (load"
        " them with TORCH_BACKENDS_COMPILE_CACHE or a manifest's compile-cache)",
    )
    tune.add_argument(
        "tune_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARG...]",
        help="the command to run: a script, a torchrun job",
    )

    command("schema", "print the JSON Schema of a manifest", "files")
    init = command("init", "write a starter backends.toml here (never overwrites)", "files")
    _switch(init, "--pyproject", "add a [tool.torch-backends] table to pyproject.toml here instead")
    return parser


def _doctor_options(prober: argparse.ArgumentParser) -> None:
    """Doctor's arguments, with the levels and defaults its own module holds."""
    from .._doctor.options import GOALS, Options

    names = prober.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="backends to probe (default: those the project's manifests declare, and what"
        " their chains and by-device tables run)",
    )
    names.completer = _complete_names  # type: ignore[attr-defined]
    _switch(prober, "--all", "probe every listed backend, debug and experimental ones too")
    _switch(prober, "--bench", argparse.SUPPRESS)  # retired: an error that names tune
    prober.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds a backend may take before it is killed (default %(default)g)",
    )
    prober.add_argument(
        "--level",
        choices=GOALS,
        help="how far a backend must get to be ok: forward judges inference backends"
        " (default %(default)s)",
    )
    _switch(prober, "--json", "print a JSON object: the verdicts")
    prober.add_argument(
        "--model",
        metavar="MOD:FACTORY",
        help="probe with FACTORY() -> (module, example inputs) instead of the built-in model",
    )
    prober.add_argument("--device", help="the device to probe on, e.g. cuda (default %(default)s)")
    prober.add_argument(
        "--jobs", type=int, metavar="N", help="backends probed at once (default: half the cores)"
    )
    prober.set_defaults(**Options()._asdict())  # each default as doctor() has it
