"""What every command shares: its exit codes and errors, the registry it reads, how it prints."""

from __future__ import annotations

import contextlib
import os
import shutil  # argparse's help formatter imports it too
import sys
from collections.abc import Callable, Iterator, Sequence

from .._definition import SOURCE_KINDS, shown_path
from .._registry import Registry

PROG = "torch-backends"


EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A command cannot do what was asked (a file exists, say): one line, exit 1."""


class UsageError(CommandError):
    """What was asked means nothing (options that contradict each other): exit 2."""


def printable(text: str) -> str:
    """``text`` with what a terminal would act on escaped: one line, no control sequences (a
    manifest's description or file name may hold an escape sequence or a bidi override)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error(message: str) -> None:
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)


def working_folder() -> str | None:
    """The working folder, or ``None`` where it was removed."""
    with contextlib.suppress(OSError):
        return os.getcwd()
    return None


def registry_for(no_torch: bool = False, files: Sequence[str] = ()) -> Registry:
    """The registry a command reads: ``files`` instead of the project's manifest and
    TORCH_BACKENDS_PATH's, where any are given."""
    left_out = {"torch": no_torch, "project": bool(files)}
    return Registry(files=files or None, sources=[k for k in SOURCE_KINDS if not left_out.get(k)])


def print_json(value: object) -> None:
    import json

    # ASCII: a description's control or bidi characters reach no terminal raw.
    print(json.dumps(value, indent=2, default=_json_default))


def _json_default(value: object) -> object:
    """TOML's dates and times, and mappings, as JSON can hold them."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "items"):
        return dict(value.items())
    raise TypeError(f"{type(value).__name__} is not JSON")


@contextlib.contextmanager
def status_line(doing: str = "", shown: bool = True) -> Iterator[Callable[[str], None]]:
    """A line on a terminal's stderr (``shown``, and not piped) while it is entered: each
    call of what it yields says it anew, cut to the terminal's width; erased at the end.
    ``doing``: what it says first, while something slow runs ("importing PyTorch...")."""
    shown = shown and sys.stderr.isatty()

    def say(text: str) -> None:
        if shown:
            line = printable(f"{PROG}: {text}")[: shutil.get_terminal_size().columns - 1]
            print("\r\033[K" + line, end="", file=sys.stderr, flush=True)

    try:
        if doing:
            say(f"{doing}...")
        yield say
    finally:
        if shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def print_rows(
    rows: Sequence[tuple[str, ...]],
    *,
    optional_last: bool = False,
    shrinkable: Sequence[int] = (),
    spill_last: bool = False,
) -> None:
    """Aligned columns, the last one as it is. On a terminal, the ``shrinkable`` columns are
    cut (down to :data:`NARROWEST` each) to fit its width, and then each line; the last
    column, if ``optional_last``, only where it still fits; if ``spill_last``, a last cell
    that does not fit goes whole on the lines below its row, indented (the header's is
    cut). Piped, nothing is cut, and an optional last column is left out (the columns
    scripts know)."""
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    limit = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    # A last column that spills is not one the others are cut to make room for.
    widths = _fitted([row[:-1] for row in rows] if spill_last else rows, limit, shrinkable)
    if widths is not None and spill_last:
        widths.append(max(len(row[-1]) for row in rows))
    if widths is None and optional_last:
        rows = [row[:-1] for row in rows]
        widths = _fitted(rows, limit, shrinkable)
    if widths is None:  # piped, or too wide even cut: each column as wide as its cells
        widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    for number, row in enumerate(rows):
        cells = [_cut(cell, width).ljust(width) for cell, width in zip(row, widths, strict=True)]
        line = "  ".join(cells).rstrip()
        if limit is None or len(line) <= limit:
            print(line)
        elif spill_last and number > 0:  # a reason cut would not say what is wrong
            import textwrap

            print(_cut("  ".join(cells[:-1]).rstrip(), limit))
            # Whole words and paths, so that they can be copied.
            for part in textwrap.wrap(
                row[-1], max(limit - 4, NARROWEST), break_long_words=False, break_on_hyphens=False
            ):
                print("    " + part)
        else:
            print(_cut(line, limit))


#: The narrowest a column is cut to, to fit a terminal.
NARROWEST = 20


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _fitted(
    rows: Sequence[tuple[str, ...]], limit: int | None, shrinkable: Sequence[int]
) -> list[int] | None:
    """The widths of ``rows``' columns, those of them ``shrinkable`` cut to fit ``limit``;
    ``None`` piped (no limit), or where even cut to :data:`NARROWEST` they do not fit."""
    if limit is None:
        return None
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    over = sum(widths) + 2 * (len(widths) - 1) - limit
    for column in shrinkable:
        by = min(over, widths[column] - NARROWEST) if column < len(widths) else 0
        if by > 0:
            widths[column] -= by
            over -= by
    return widths if over <= 0 else None


def relative(path: str) -> str:
    return shown_path(path, working_folder())


def no_manifest() -> bool:
    """Whether no manifest is found from here: no project's, none named by the environment."""
    from .._sources import ENV_VAR, project_manifest

    here = working_folder()
    # Entries as the env source reads them: separators and spaces alone name nothing.
    named = any(e.strip() for e in os.environ.get(ENV_VAR, "").split(os.pathsep))
    return (here is None or project_manifest(here) is None) and not named


NO_MANIFEST = (
    "no manifest found: no backends.toml here or above, no [tool.torch-backends] in"
    " pyproject.toml, and TORCH_BACKENDS_PATH is unset; create one with 'torch-backends init'"
)
