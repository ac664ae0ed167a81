"""``backends.choices`` on the command line: ``tune`` writes it, ``check`` and ``explain`` read."""

from __future__ import annotations

import contextlib
import datetime
import functools
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
from argparse import Namespace as Arguments
from collections.abc import Iterable, Mapping
from typing import Any

from .._definition import BackendDefinition, Problem
from .._environment import COMPILE_CACHE_FOLDER, SELECT_VAR, TUNING_VAR
from .._errors import BackendRegistryError, did_you_mean
from .._key import applies, identity
from .._registry import Registry
from .._sources.cache import write_atomically
from .._sources.choices import CHOICES_FILE, read_choices, shipped_for
from .._sources.files import NO_SUCH_FILE, SHARED_FILE_MODE
from .common import EXIT_OK, PROG, CommandError, UsageError, error, relative

HEADER = """\
# Written by `torch-backends tune`: the member each select = "fastest" chain runs for each
# graph, and what it was decided under. Do not edit it: tune again, which replaces the
# choices of the same key and keeps the others (those of other kinds of machine). Commit it
# beside the manifest, or bake it into an image; `torch-backends check` reads it.
"""
#: What ``--compile-cache`` may not name: the files of the project (by name, wherever).
OWN_FILES = frozenset({CHOICES_FILE, "backends.lock", "backends.toml", "pyproject.toml"})


def run_tune(args: Arguments) -> int:
    from .._autoload import AUTOLOAD_VAR, state

    command = list(args.tune_command)
    if command[:1] == ["--"]:  # the command's own "--", if any, stays
        command = command[1:]
    if not command:
        raise UsageError("tune runs a command: torch-backends tune -- python train.py")
    cache = None if args.compile_cache is None else _cache_path(args.compile_cache)
    with tempfile.TemporaryDirectory(prefix="torch-backends-tune-") as folder:
        if cache is not None:
            os.mkdir(os.path.join(folder, COMPILE_CACHE_FOLDER))
        environ = {**os.environ, SELECT_VAR: "fresh", AUTOLOAD_VAR: "1", TUNING_VAR: folder}
        if (autoload := state(environ)).startswith("off"):
            print(f"{PROG}: warning: autoload is {autoload}: a script that never calls install()"
                  " is not tuned", file=sys.stderr)  # fmt: skip
        try:
            code = subprocess.call(command, env=environ)
        except OSError as exc:
            raise CommandError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
        if code != 0:
            how = (
                f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
            )
            error(f"{command[0]!r} {how}: nothing written")
            return 128 - code if code < 0 else code
        records = [_loaded(path) for path in sorted(glob.glob(os.path.join(folder, "*.json")))]
        # The choice of a graph decided twice (two processes), once: the last.
        made = {c["key"]: c for c in records if c is not None and isinstance(c.get("key"), str)}
        if unshippable := [c for c in records if c is not None and "unshippable" in c]:
            print(
                f"{PROG}: warning: {len(unshippable)} graph(s) decided but not shipped:"
                " torch.compile was given values no other process writes alike (the"
                " command's log names them)",
                file=sys.stderr,
            )
        if not made:
            raise CommandError(
                f'{command[0]!r} compiled no graph with a select = "fastest" chain: nothing'
                " written (is torch.compile called with such a chain's name?)"
            )
        if cache is not None:
            _save_compile_cache(folder, cache)
        # Beside the manifest that declares each chain, where its processes look for them.
        beside: dict[str, list[dict[str, Any]]] = {}
        for choice in made.values():
            manifest = str(choice.pop("manifest", None) or os.path.abspath("backends.toml"))
            written = os.path.join(os.path.dirname(manifest), CHOICES_FILE)
            beside.setdefault(written, []).append(choice)
        kept = {path: write_choices(path, choices) for path, choices in beside.items()}
    from .._timing import timings

    devices: dict[str, list[str]] = {}
    for choice in made.values():
        print(
            f"chain {choice['chain']!r}: {choice['graph']}: {timings(choice)}; chose"
            f" {choice['member']!r} ({choice['how']})"
        )
        devices.setdefault(str(choice.get("device")), []).append(str(choice["member"]))
    for device, members in devices.items():
        counted = ", ".join(f"{m} {members.count(m)}" for m in dict.fromkeys(members))
        graphs = f"{len(members)} graph{'s' * (len(members) != 1)}"
        print(f"tuned for {device}: {graphs}; {counted}")
    for path, choices in beside.items():
        made_here = f"{len(choices)} choice{'s' * (len(choices) != 1)} made"
        print(f"wrote {relative(path)}: {made_here}, {kept[path]} kept", file=sys.stderr)
    return EXIT_OK


def _cache_path(given: str) -> str:
    """Where ``--compile-cache`` writes, judged before the command runs: a file of its own,
    in a folder that can be written (made, where it is not there)."""
    path = os.path.abspath(given)
    if os.path.basename(path) in OWN_FILES or path.endswith(".toml"):
        raise UsageError(
            f"--compile-cache {given!r} names a file of the project's own: name another,"
            " e.g. build/compile-cache.bin"
        )
    if os.path.isdir(path):
        raise UsageError(f"--compile-cache {given!r} is a folder: name a file in it")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.access(os.path.dirname(path), os.W_OK):
        raise UsageError(f"--compile-cache {given!r}: its folder cannot be written")
    return path


def _loaded(path: str) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as handle:
        choice = json.load(handle)
        return choice if isinstance(choice, dict) else None
    return None


def write_choices(path: str, made: list[dict[str, Any]]) -> int:
    """Write ``made`` into the choices file at ``path``, replacing those of the same key and
    keeping the others; how many were kept. A file there that cannot be read whole is
    refused, not replaced (its choices would be lost). One tune at a time writes (``flock``
    on the folder, where the system has it): two at once lose none of each other's."""
    import tomli_w

    with _locked(os.path.dirname(path) or os.curdir):
        try:
            old = [table for table, _line in read_choices(path).every]
        except BackendRegistryError as exc:
            if getattr(exc, "message", None) != NO_SUCH_FILE:
                raise CommandError(f"{exc}; fix it or move it away, then tune again") from None
            old = []
        new = {str(choice["key"]): _table(choice) for choice in made}
        kept = [table for table in old if table.get("key") not in new]
        order = ("chain", "device", "graph", "key")
        every = sorted([*kept, *new.values()], key=lambda t: [str(t.get(k)) for k in order])
        text = HEADER + "\n" + tomli_w.dumps({"choice": every})
        write_atomically(path, text.encode("utf-8"), SHARED_FILE_MODE)
    return len(kept)


@contextlib.contextmanager
def _locked(folder: str) -> Any:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows): one tune at a time
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _table(choice: Mapping[str, Any]) -> dict[str, Any]:
    """A choice as the file states it (in the order select made it): ``when`` as a date, and
    the tables that are empty left out (TOML has no empty table)."""
    when = datetime.datetime.fromtimestamp(float(choice.get("when") or 0), datetime.timezone.utc)
    table = {key: value for key, value in choice.items() if value not in (None, {})}
    return {**table, "when": when.replace(microsecond=0)}


def _save_compile_cache(folder: str, path: str) -> None:
    """PyTorch's compile caches the command's processes saved, at ``path``: those of the
    process that saved the most (PyTorch merges none: a process that loaded some saves
    nothing again), which under torchrun is rank 0's, the one that compiled every member.
    Where none saved any, a warning: nothing was compiled that PyTorch caches."""
    saved = glob.glob(os.path.join(folder, COMPILE_CACHE_FOLDER, "*.bin"))
    if not saved:
        print(
            f"{PROG}: warning: {relative(path)}: not written: the command's processes saved no"
            " compile cache (nothing inductor or AOTAutograd caches was compiled)",
            file=sys.stderr,
        )
        return
    with open(max(saved, key=os.path.getsize), "rb") as handle:
        write_atomically(path, handle.read(), 0o644)


def problems(registry: Registry, manifests: Iterable[str], *, with_torch: bool) -> list[Problem]:
    """What ``check`` says of the choices files beside ``manifests``: one that cannot be read
    or must not be used, a choice that cannot be read, of a chain not declared (or that
    selects no fastest), naming a member its chain does not list, or whose key another choice
    has, is an error at its line; one whose chain changed since it was tuned (known
    ``with_torch`` only: PyTorch's members are part of a chain), a warning naming ``tune``."""
    found: list[Problem] = []
    chains = {
        d.name: d for d in registry.index(with_torch=False).winners() if d.select == "fastest"
    }
    # Each chain's identity worked out once, however many choices name it.
    identity_of = functools.cache(lambda name: identity(chains[name], registry.backend_info))
    for path in dict.fromkeys(os.path.join(os.path.dirname(m), CHOICES_FILE) for m in manifests):
        try:
            every = read_choices(path).every
        except BackendRegistryError as exc:
            if getattr(exc, "message", None) != NO_SUCH_FILE:
                problem = getattr(exc, "problem", None)
                found.append(problem or Problem(str(exc).removeprefix(f"{path}: "), path=path))
            continue
        lines: dict[object, int] = {}
        for table, line in every:
            said = _malformed(table, chains, lines.setdefault(table.get("key"), line), line)
            if said is not None:
                found.append(Problem(said, path=path, line=line, key="choice"))
                continue
            if with_torch and table.get("identity") != identity_of(table["chain"]):
                said = (
                    f"chain {table['chain']!r} or a backend it runs changed since this choice"
                    " was tuned: it applies to no graph; run 'torch-backends tune -- COMMAND'"
                    " again"
                )
                found.append(Problem(said, path=path, line=line, key="choice", severity="warning"))
    return found


def _malformed(
    table: Mapping[str, Any], chains: Mapping[str, BackendDefinition], first: int, line: int
) -> str | None:
    """Why a choice as read cannot be one (``first``: the line its key is first at)."""
    needed = [
        key for key in ("chain", "member", "graph", "key") if not isinstance(table.get(key), str)
    ]
    timed = [table.get(key, {}) for key in ("seconds", "spread")]
    # TOML's numbers, as read, are ints and floats themselves; true and false are bools.
    numbers = all(isinstance(v, dict) for v in timed) and all(
        type(n) in (int, float) for v in timed for n in v.values()
    )
    if needed or not numbers or not isinstance(table.get("skipped", {}), dict):
        what = "skipped as a table" if numbers else "seconds and spread as tables of numbers"
        what = f"{', '.join(needed)} (each a string)" if needed else what
        return f"a choice needs {what}, as tune writes it; tune again rather than edit it"
    chain, member = table["chain"], table["member"]
    if chain not in chains:
        guess = did_you_mean(chain, chains, before="; ")
        return f'chain {chain!r} is no select = "fastest" chain declared here{guess}'
    if member not in (listed := chains[chain].members):
        guess = did_you_mean(member, listed, f" (it lists {', '.join(listed)})", before="; ")
        return f"member {member!r} is not in chain {chain!r}{guess}"
    if first != line:
        return f"the same key as the choice at line {first}, which is the one used"
    return None


def shipped(registry: Registry, chain: BackendDefinition, no_torch: bool) -> list[dict[str, Any]]:
    """The choices shipped for ``chain``, each with where it is (``at``) and whether it applies
    here (``applies``; ``None`` where that cannot be known without PyTorch), and if not, why
    (``differs``)."""
    every = shipped_for(chain, registry.context).every()
    tables = [(t, at) for t, at in every if t.get("chain") == chain.name]
    now = identity(chain, registry.backend_info) if tables else ""
    found = []
    for table, at in tables:
        differ = None if no_torch else applies(table, now)
        where, _, line = at.rpartition(":")
        found.append(
            {
                **table,
                "at": f"{relative(where)}:{line}",
                "applies": None if differ is None else not differ,
                "differs": differ or [],
            }
        )
    return found


def lines(remembered: list[dict[str, Any]], shipped: list[dict[str, Any]]) -> list[str]:
    """``explain``'s lines of a chain's choices: each graph's member, how and when it was
    chosen, and each member's time and spread or why it was not timed."""
    from .._select import said_of
    from .._timing import timings

    out = []
    for choice in remembered:
        out.append(f"    {choice.get('graph')}: {choice.get('member')} ({said_of(choice)})")
        out.append(f"      {timings(choice)}")
    for choice in shipped:
        if choice["applies"] is None:
            here = "whether it applies here is not known without PyTorch"
        else:
            here = (
                "applies here" if choice["applies"] else "not here: " + "; ".join(choice["differs"])
            )
        out.append(
            f"    shipped at {choice['at']}: {choice.get('graph')}: {choice.get('member')} ({here})"
        )
        out.append(f"      {timings(choice)}")
    return out
