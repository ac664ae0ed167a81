"""``doctor``: which backends work here, and how fast; a progress line, a table or JSON."""

from __future__ import annotations

import contextlib
import sys
import threading

from .._doctor.options import PROJECT
from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    PROG,
    error,
    print_json,
    print_rows,
    printable,
    registry_for,
    terminal_width,
    waiting,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace as Arguments
    from collections.abc import Iterator, Sequence

    from .._doctor.processes import Progress
    from .._doctor.verdicts import Verdict
    from .._registry import Registry


def run_doctor(args: Arguments) -> int:
    from .._doctor.options import ModelError, Options
    from .._doctor.run import run
    from .._doctor.verdicts import recommend, recommended_line
    from .._sources.pytorch import dynamo_imported

    registry = registry_for()
    options = Options(**{f: getattr(args, f) for f in Options._fields})  # argparse checked them
    shown = _progress() if sys.stderr.isatty() else contextlib.nullcontext()
    try:
        with waiting("importing PyTorch", not dynamo_imported()):
            names = args.names or (registry.list_backends(()) if args.all else None)
            with shown as on_progress:
                verdicts = run(registry, names, options, on_progress)
    except ModelError as exc:
        error(str(exc))
        return EXIT_USAGE
    builtin = options.model is None
    recommended = [recommend(verdicts, options.device, builtin)] if options.bench else []
    if args.json:
        print_json({"verdicts": [v.as_json() for v in verdicts], "recommended": recommended})
    else:
        _print_verdicts(verdicts, args.bench, sys.stdout.isatty())
        for recommendation in recommended:
            print(recommended_line(recommendation))
    failed = any(_fails(registry, v, set(args.names)) for v in verdicts)
    return EXIT_PROBLEMS if failed else EXIT_OK


def _fails(registry: Registry, verdict: Verdict, named: set[str]) -> bool:
    """Whether a verdict fails the run: one not ``ok``, but for a backend probed only as what
    another runs (that one's verdict decides) and, for ``unavailable``, but for one neither
    named nor declared by a manifest (PyTorch's GPU backends are not there on a CPU)."""
    if verdict.ok or verdict.via is not None:
        return False
    if verdict.status != "unavailable" or verdict.name in named:
        return True
    return registry.backend_info(verdict.name).source.kind in PROJECT


@contextlib.contextmanager
def _progress() -> Iterator[Progress]:
    """One line on the terminal's stderr while it is entered: how many are done, and each
    probe running (its level and time)."""
    from .._doctor.verdicts import level_name

    lock = threading.Lock()
    running: dict[str, tuple[int, float]] = {}
    finished = 0

    def update(name: str, level: int, seconds: float, done: bool) -> None:
        nonlocal finished
        with lock:
            if done:
                running.pop(name, None)
                finished += 1
            else:
                running[name] = (level, seconds)
            what = ", ".join(f"{n} {level_name(lv)} {s:.0f}s" for n, (lv, s) in running.items())
            line = f"{PROG}: {finished} done; probing {what}"
            width = terminal_width(sys.stderr) or 80
            sys.stderr.write("\r\033[K" + printable(line)[: width - 1])
            sys.stderr.flush()

    try:
        yield update
    finally:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _print_verdicts(verdicts: Sequence[Verdict], bench: bool, terminal: bool) -> None:
    """A table, best first; with ``bench``, each speed-up against the one eager baseline
    (blank where the timings spread too wide to rank), with a bar on a terminal."""
    timing = ("COMPILE", "PER CALL", "SPEED-UP", "SPREAD") if bench else ()
    table = [("NAME", "STATUS", "LEVEL", "SECONDS", *timing, "REASON")]
    fastest = max((v.speedup or 0.0 for v in verdicts), default=0.0)
    for v in verdicts:
        row = [v.name + (f" -> {v.member}" if v.member else ""), v.status, v.level_name]
        row.append(f"{v.seconds:.1f}")
        if bench:
            speedup = "" if v.speedup is None else f"{v.speedup:.2f}x"
            if v.speedup is not None and terminal and fastest > 0:
                speedup = f"{speedup:>6} " + "█" * max(1, round(20 * v.speedup / fastest))
            spread = "" if v.spread is None else f"±{v.spread * 50:.0f}%"
            row += [_duration(v.compile_seconds), _duration(v.per_call_seconds), speedup, spread]
        table.append((*row, v.reason))
    print_rows(table, shrinkable=(0,), spill_last=True)
    reached = [v for v in verdicts if v.via is not None]
    if reached:
        roots = ", ".join(dict.fromkeys(v.via or "" for v in reached))
        names = ", ".join(v.name for v in reached)
        print(f"({names}: probed as members of {roots}, whose verdicts decide the exit status)")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"
