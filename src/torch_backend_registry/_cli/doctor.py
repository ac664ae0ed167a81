"""``doctor``: which backends work here; a progress line, a table or JSON."""

from __future__ import annotations

import threading
from argparse import Namespace as Arguments
from collections.abc import Callable, Sequence

from .._doctor.options import PROJECT, ModelError, Options
from .._doctor.processes import Progress
from .._doctor.verdicts import LEVELS, Verdict
from .._registry import Registry
from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    UsageError,
    print_json,
    print_rows,
    registry_for,
    status_line,
)


def run_doctor(args: Arguments) -> int:
    from .._doctor.run import run
    from .._sources.pytorch import dynamo_imported

    if args.bench:  # a toy model cannot say which backend a real model should use
        raise UsageError(
            "--bench is retired: doctor no longer times backends; 'torch-backends tune --"
            " COMMAND' times a select = \"fastest\" chain's members on your own graphs"
        )
    try:  # argparse took the numbers; which values doctor can use, Options says
        options = Options(**{f: getattr(args, f) for f in Options._fields}).checked()
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
    registry = registry_for()
    try:
        with status_line("importing PyTorch", not dynamo_imported()), status_line() as say:
            names = args.names or (registry.list_backends(()) if args.all else None)
            verdicts = run(registry, names, options, _progress(say))
    except ModelError as exc:  # found before any backend is blamed
        raise UsageError(str(exc)) from None
    if args.json:
        print_json({"verdicts": [v.as_json() for v in verdicts]})
    else:
        _print_verdicts(verdicts)
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


def _progress(say: Callable[[str], None]) -> Progress:
    """The run's progress, said with ``say`` (a status line's): how many probes are done,
    and each probe running (its level and time)."""
    lock = threading.Lock()
    running: dict[str, tuple[int, float]] = {}
    finished: set[str] = set()

    def update(name: str, level: int, seconds: float, done: bool) -> None:
        with lock:
            if done:
                running.pop(name, None)
                finished.add(name)
            else:
                running[name] = (level, seconds)
            what = ", ".join(f"{n} {LEVELS[v]} {s:.0f}s" for n, (v, s) in running.items())
            say(f"{len(finished)} done; probing {what}")

    return update


def _print_verdicts(verdicts: Sequence[Verdict]) -> None:
    """A table, best first; a chain's row says the member it compiled with, and how it ran."""
    table = [("NAME", "STATUS", "LEVEL", "SECONDS", "REASON")]
    for v in verdicts:
        how = f"select {v.select}, verify {v.verify}" if v.select else ""
        reason = "; ".join(filter(None, (how, v.reason)))
        name = v.name + (f" -> {v.member}" if v.member else "")
        table.append((name, v.status, v.level_name, f"{v.seconds:.1f}", reason))
    print_rows(table, shrinkable=(0,), spill_last=True)
    if reached := [v for v in verdicts if v.via is not None]:
        roots = ", ".join(dict.fromkeys(v.via or "" for v in reached))
        names = ", ".join(v.name for v in reached)
        print(f"({names}: probed as members of {roots}, whose verdicts decide the exit status)")
