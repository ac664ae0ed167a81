"""``doctor``: which backends work here, and how fast; a progress line, a table or JSON."""

from __future__ import annotations

import contextlib
import sys
import threading

from .._errors import ManifestError
from .._registry import DEFAULT_EXCLUDE_TAGS
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
    from .._doctor.parent import release, run, start
    from .._sources.pytorch import dynamo_imported

    registry = registry_for()
    options = Options(**{f: getattr(args, f) for f in Options._fields})  # argparse checked them
    try:
        # The probes' server imports PyTorch meanwhile, as this process does to list every
        # backend or resolve a name no manifest declares.
        server = start(registry, options)
        try:
            with waiting("importing PyTorch", not dynamo_imported()):
                names = args.names or registry.list_backends(
                    () if args.all else DEFAULT_EXCLUDE_TAGS
                )
                for name in names:  # an unknown name fails here, as explain says it
                    with contextlib.suppress(ManifestError):  # declared: a verdict of its own
                        registry.backend_info(name)
        except BaseException:  # no run will end this use of the server
            release(server)
            raise
        shown = _progress(len(names)) if sys.stderr.isatty() else contextlib.nullcontext()
        with shown as on_progress, _terminated_as_exit():
            verdicts = run(registry, names, options, on_progress, server)
    except ModelError as exc:
        error(str(exc))
        return EXIT_USAGE
    if args.json:
        print_json([v.as_json() for v in verdicts])
    else:
        _print_verdicts(verdicts, args.bench, sys.stdout.isatty())
    failed = any(not v.ok and _fails(registry, v, set(args.names)) for v in verdicts)
    return EXIT_PROBLEMS if failed else EXIT_OK


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, ``kill``) as an exit, so that doctor kills its probes,
    which run in process groups of their own, instead of leaving them running."""
    import signal

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    with contextlib.ExitStack() as restore:
        with contextlib.suppress(ValueError):  # not the main thread: the caller handles signals
            previous = signal.signal(signal.SIGTERM, terminated)
            if previous is not None:  # None: not a handler Python can put back
                restore.callback(signal.signal, signal.SIGTERM, previous)
        yield


def _fails(registry: Registry, verdict: Verdict, named: set[str]) -> bool:
    """Whether a verdict fails the run: any failure; ``unavailable`` only for a name asked
    for or a backend a manifest declares (PyTorch's GPU backends are not there on a CPU)."""
    if verdict.status != "unavailable" or verdict.name in named:
        return True
    return registry.backend_info(verdict.name).source.kind in ("env", "project")


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Progress]:
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
            line = f"{PROG}: {finished}/{total} done; probing {what}"
            width = terminal_width(sys.stderr) or 80
            sys.stderr.write("\r\033[K" + printable(line)[: width - 1])
            sys.stderr.flush()

    try:
        yield update
    finally:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _print_verdicts(verdicts: Sequence[Verdict], bench: bool, terminal: bool) -> None:
    """A table sorted by result and speed; with ``bench``, a bar for each speed-up, the
    spread of the timed rounds, and a rank where the speeds can be told apart."""
    timing = ("COMPILE", "PER CALL", "SPEED-UP", "SPREAD", "RANK") if bench else ()
    table = [("NAME", "STATUS", "LEVEL", "SECONDS", *timing, "REASON")]
    fastest = max((v.speedup or 0.0 for v in verdicts), default=0.0)
    ranks = _ranks(verdicts) if bench else {}
    for v in verdicts:
        status = v.status
        name = v.name + (f" -> {v.member}" if v.member else "")
        row = [name, status, v.level_name, f"{v.seconds:.1f}"]
        if bench:
            row += [
                _duration(v.compile_seconds),
                _duration(v.per_call_seconds),
                _speedup(v.speedup, fastest, terminal),
                "" if v.spread is None else f"±{v.spread * 50:.0f}%",
                ranks.get(v.name, ""),
            ]
        table.append((*row, v.reason))
    print_rows(table, shrinkable=(0,), spill_last=True)
    # Where no rank is shown (a run without --bench, which a bench verdict answered), none
    # is missing.
    wide = [v.name for v in verdicts if bench and v.spread is not None and v.spread > WIDE]
    if wide:
        print(
            f"(the timed rounds of {', '.join(wide)} spread too wide to rank: the machine"
            " was busy; run again with nothing else running)"
        )


#: A spread (the middle half of the timed rounds over their median) past which a speed
#: is not ranked.
WIDE = 0.5


def _ranks(verdicts: Sequence[Verdict]) -> dict[str, str]:
    """Each timed backend's rank by speed-up, fastest first. Backends whose speeds lie
    within each other's spread share a rank; one spread too wide is not ranked."""
    timed = sorted(
        (v for v in verdicts if v.speedup and v.spread is not None and v.spread <= WIDE),
        key=lambda v: -(v.speedup or 0.0),
    )
    ranks: dict[str, str] = {}
    rank, floor = 0, float("inf")
    for number, v in enumerate(timed, start=1):
        speedup, half = v.speedup or 0.0, (v.spread or 0.0) / 2
        if speedup * (1 + half) < floor:  # clearly slower than the fastest of the rank above
            rank, floor = number, speedup * (1 - half)
        ranks[v.name] = str(rank)
    return ranks


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def _speedup(speedup: float | None, fastest: float, terminal: bool) -> str:
    if speedup is None:
        return ""
    text = f"{speedup:.2f}x"
    if terminal and fastest > 0:
        text = f"{text:>6} " + "█" * max(1, round(20 * speedup / fastest))
    return text
