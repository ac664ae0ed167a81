"""``backends.choices`` on the command line: ``tune`` writes it, ``check`` and ``explain`` read."""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile

from .._definition import Problem
from .._environment import SELECT_VAR, TUNING_VAR
from .._errors import BackendRegistryError, closest
from .._sources.choices import CHOICES_FILE, choices_file, shipped_for
from .common import EXIT_OK, CommandError, UsageError, error, relative, working_folder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace as Arguments
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .._definition import BackendDefinition
    from .._registry import Registry

HEADER = """\
# Written by `torch-backends tune`: the member each select = "fastest" chain runs for each
# graph, and what it was decided under. Do not edit it: tune again, which replaces the
# choices of the same key and keeps the others (those of other kinds of machine). Commit it
# beside the manifest, or bake it into an image; `torch-backends check` reads it.
"""
#: Where the command's processes leave PyTorch's compile caches, in the folder tune gives them.
COMPILE_CACHE_FOLDER = "compile-cache"


def run_tune(args: Arguments) -> int:
    from .._autoload import AUTOLOAD_VAR
    from .._sources import project_manifest

    command = list(args.tune_command)
    if command[:1] == ["--"]:  # the command's own "--", if any, stays
        command = command[1:]
    if not command:
        raise UsageError("tune runs a command: torch-backends tune -- python train.py")
    here = working_folder() or os.curdir
    manifest = project_manifest(here)
    if manifest is None:
        raise CommandError(
            "no project manifest here or above (backends.toml, or pyproject.toml's"
            " [tool.torch-backends]): backends.choices is written beside it"
        )
    target = os.path.join(os.path.dirname(manifest), CHOICES_FILE)
    with tempfile.TemporaryDirectory(prefix="torch-backends-tune-") as folder:
        if args.compile_cache:
            os.mkdir(os.path.join(folder, COMPILE_CACHE_FOLDER))
        environ = {**os.environ, SELECT_VAR: "fresh", AUTOLOAD_VAR: "1", TUNING_VAR: folder}
        try:
            code = subprocess.call(command, env=environ)
        except OSError as exc:
            raise CommandError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
        if code != 0:
            error(f"{command[0]!r} exited with {code}: nothing written")
            return code
        files = sorted(glob.glob(os.path.join(folder, "choice-*.json")))
        made = [choice for choice in map(_loaded, files) if choice is not None]
        if not made:
            raise CommandError(
                f'{command[0]!r} compiled no graph with a select = "fastest" chain: nothing'
                " written (is torch.compile called with such a chain's name?)"
            )
        kept = write_choices(target, made)
        if args.compile_cache:
            _save_compile_cache(folder, args.compile_cache)
    from .._select import timings

    for choice in made:
        print(
            f"chain {choice['chain']!r}: {choice['graph']}: {timings(choice)}; chose"
            f" {choice['member']!r} ({choice['how']})"
        )
    devices: dict[str, list[str]] = {}
    for choice in made:
        devices.setdefault(str(choice.get("device")), []).append(str(choice["member"]))
    for device, members in devices.items():
        counted = ", ".join(f"{m} {members.count(m)}" for m in dict.fromkeys(members))
        graphs = f"{len(members)} graph{'s' * (len(members) != 1)}"
        print(f"tuned for {device}: {graphs}; {counted}")
    print(
        f"wrote {relative(target)}: {len(made)} choice{'s' * (len(made) != 1)} made, {kept} kept",
        file=sys.stderr,
    )
    return EXIT_OK


def _loaded(path: str) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as handle:
        choice = json.load(handle)
        return choice if isinstance(choice, dict) else None
    return None


def write_choices(path: str, made: list[dict[str, Any]]) -> int:
    """Write ``made`` into the choices file at ``path``, replacing those of the same key and
    keeping the others; how many were kept. One tune at a time writes (``flock`` on the
    folder, where the system has it): two at once lose none of each other's."""
    import tomli_w

    from .._sources.cache import write_atomically
    from .._sources.files import SHARED_FILE_MODE

    with _locked(os.path.dirname(path) or os.curdir):
        file = choices_file(path)
        try:
            old = [] if file is None else [table for table, _line in file.every()]
        except BackendRegistryError:  # a file past reading: tune writes it anew
            old = []
        new = {str(choice["key"]): _table(choice) for choice in made}
        kept = [table for table in old if table.get("key") not in new]
        every = sorted(
            [*kept, *new.values()],
            key=lambda t: (
                str(t.get("chain")),
                str(t.get("device")),
                str(t.get("graph")),
                str(t.get("key")),
            ),
        )
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
    """PyTorch's compile caches the command's processes saved, as one file at ``path``: one
    process's as it saved them; several, merged by PyTorch (loaded here, saved again)."""
    from .._sources.cache import write_atomically

    saved = sorted(glob.glob(os.path.join(folder, COMPILE_CACHE_FOLDER, "*.bin")))
    blobs = []
    for name in saved:
        with open(name, "rb") as handle:
            blobs.append(handle.read())
    if not blobs:
        raise CommandError(f"{path}: the command's processes saved no compile cache")
    blob = blobs[0]
    if len(blobs) > 1:
        import torch.compiler

        for each in blobs:
            torch.compiler.load_cache_artifacts(each)
        merged = torch.compiler.save_cache_artifacts()
        blob = merged[0] if merged is not None else max(blobs, key=len)
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, blob, 0o644)


def problems(registry: Registry, manifests: Iterable[str], *, with_torch: bool) -> list[Problem]:
    """What ``check`` says of the choices files beside ``manifests``: a choice that cannot be
    read, of a chain not declared (or that selects no fastest), or naming a member its chain
    does not list, is an error at its line; one whose chain changed since it was tuned
    (known ``with_torch`` only: PyTorch's members are part of a chain), a warning that names
    ``tune``."""
    from .._key import identity

    found: list[Problem] = []
    paths = dict.fromkeys(os.path.join(os.path.dirname(m), CHOICES_FILE) for m in manifests)
    index = registry.index(with_torch=False)
    chains = {d.name: d for d in index.winners() if d.select == "fastest"}
    for path in paths:
        file = choices_file(path)
        if file is None:
            continue
        try:
            every = file.every()
        except BackendRegistryError as exc:
            found.append(getattr(exc, "problem", Problem(str(exc), path=path)))
            continue
        identities: dict[str, str] = {}
        for table, line in every:
            chain, member = table.get("chain"), table.get("member")
            said = _malformed(table)
            if said is None and chain not in chains:
                meant = closest(str(chain), chains)
                guess = f"; did you mean {meant[0]!r}?" if meant else ""
                said = f'chain {chain!r} is no select = "fastest" chain declared here{guess}'
            elif said is None and member not in chains[str(chain)].members:
                listed = chains[str(chain)].members
                meant = closest(str(member), listed)
                guess = (
                    f"; did you mean {meant[0]!r}?" if meant else f" (it lists {', '.join(listed)})"
                )
                said = f"member {member!r} is not in chain {chain!r}{guess}"
            if said is not None:
                found.append(Problem(said, path=path, line=line, key="choice"))
                continue
            definition = chains[str(chain)]
            if not with_torch:
                continue
            with contextlib.suppress(BackendRegistryError):
                now = identities.setdefault(
                    definition.name, identity(definition, registry.backend_info)
                )
                if table.get("identity") != now:
                    found.append(
                        Problem(
                            f"chain {chain!r} or one of its members changed since this choice"
                            " was tuned: it applies to no graph; run 'torch-backends tune --"
                            " COMMAND' again",
                            path=path,
                            line=line,
                            key="choice",
                            severity="warning",
                        )
                    )
    return found


def _malformed(table: Mapping[str, Any]) -> str | None:
    needed = [
        key for key in ("chain", "member", "graph", "key") if not isinstance(table.get(key), str)
    ]
    if not needed:
        return None
    return (
        f"a choice needs {', '.join(needed)} (each a string), as tune writes it; run"
        " 'torch-backends tune -- COMMAND' again rather than edit it"
    )


def shipped(registry: Registry, chain: BackendDefinition, no_torch: bool) -> list[dict[str, Any]]:
    """The choices shipped for ``chain``, each with where it is (``at``) and whether it applies
    here (``applies``; ``None`` where that cannot be known without PyTorch), and if not, why
    (``differs``)."""
    from .._key import applies, identity

    files = shipped_for(chain, registry.context)
    tables = (
        []
        if files is None
        else [(t, at) for t, at in files.every() if t.get("chain") == chain.name]
    )
    now = identity(chain, registry.backend_info) if tables else ""
    found = []
    for table, at in tables:
        differ = None if no_torch else applies(table, now)
        where, _, line = at.rpartition(":")
        applies_here = None if differ is None else not differ
        found.append(
            {
                **table,
                "at": f"{relative(where)}:{line}",
                "applies": applies_here,
                "differs": differ or [],
            }
        )
    return found


def lines(remembered: list[dict[str, Any]], shipped: list[dict[str, Any]]) -> list[str]:
    """``explain``'s lines of a chain's choices: each graph's member, how and when it was
    chosen, and each member's time and spread or why it was not timed."""
    from .._select import said_of, timings

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
