"""What chains and tables name, checked: members missing here, likely typos, loops, depth."""

from __future__ import annotations

from ._definition import BackendDefinition, Problem
from ._errors import closest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._definition import Severity
    from ._merge import Index

#: How many chains may stand inside one another. A chain calls its members in
#: turn, each a Python call deeper; far beyond any real fallback order.
MAX_CHAIN_DEPTH = 64


def unknown_members(index: Index) -> dict[str, Problem]:
    """Each chain that names a backend that does not exist (here), by name, and each table
    by device that gives the CPU no backend. A portable chain names backends some machines
    lack (a plugin not installed here) and skips them when it runs: that is a ``note``. A name
    close to one that exists is likely a typo, and a chain none of whose members exists cannot
    be used here: those are errors (the other missing members of a chain with a typo are said
    as skipped). A member that may be one of PyTorch's is not reported when PyTorch's registry
    was not read."""
    problems: dict[str, Problem] = {}
    for definition in index.winners():
        members = dict.fromkeys(definition.members)  # each once
        unknown = [m for m in members if index.get(m) is None and not index.could_be_pytorch(m)]
        what = f"{_what(definition)} {definition.name!r}"
        typos = {m: close for m in unknown if (close := typo_of(m, index.known))}
        dead = len(unknown) == len(members)
        if not unknown:
            problem = _no_cpu(definition)
        elif dead or typos:
            # A typo is the error; the other missing members stay what they are: skipped.
            wrong = list(typos) or unknown
            meant = ", ".join(f"{m!r} -> {close!r}" for m, close in typos.items())
            guess = f" (did you mean {meant}?)" if meant else ""
            here = "; no member can be used here" if dead else ""
            skipped = [m for m in unknown if m not in wrong]
            also = f"; {_happens(definition, skipped, named=True)}" if skipped else ""
            problem = chain_error(
                definition,
                f"{_names(what, wrong)} no usable backend{guess}{here}; fix the name or remove"
                f" it{also}",
                member=wrong[0],
            )
        else:
            whys = {m: index.left_out(m) or "not installed here" for m in unknown}
            if set(whys.values()) != {"not installed here"}:
                # Disabled, or left out by the plugin policy: each says why.
                said = f"{what} names " + ", ".join(f"{m!r} ({why})" for m, why in whys.items())
            else:
                said = f"{_names(what, unknown)} not installed here"
            problem = chain_error(
                definition,
                f"{said}; {_happens(definition, unknown)}",
                severity="note",
                member=unknown[0],
            )
        if problem is not None:
            problems[definition.name] = problem
    return problems


def _no_cpu(definition: BackendDefinition) -> Problem | None:
    """A note for a ``by-device`` table that gives the CPU nothing: fine on a machine whose
    graphs are all on an accelerator, a failure for any graph on the CPU."""
    devices = [device for device, _name in definition.by_device or ()]
    if definition.by_device is None or "cpu" in devices or "other" in devices:
        return None
    return chain_error(
        definition,
        f"by-device {definition.name!r} gives the CPU no backend (it has {', '.join(devices)}),"
        " so a graph on the CPU fails; add 'cpu' or 'other' unless that is meant",
        severity="note",
    )


def _names(what: str, members: Sequence[str]) -> str:
    are = "is" if len(members) == 1 else "are"
    return f"{what} names {', '.join(map(repr, members))}, which {are}"


def _happens(definition: BackendDefinition, missing: Sequence[str], named: bool = False) -> str:
    """What a chain or table does with the ``missing`` members when it runs (``named``:
    saying which, where the sentence has not)."""
    if definition.by_device is None:
        them = ", ".join(map(repr, missing)) if named else "it" if len(missing) == 1 else "them"
        return f"it skips {them} when it runs"
    return f"on {', '.join(d for d, name in definition.by_device if name in missing)} it fails"


def chain_problems(index: Index) -> dict[str, Problem]:
    """Each chain that names itself or nests too deeply, by name: it cannot be used.
    Linear in the size of the chain graph, whatever its shape or depth."""
    chains = {d.name: d for d in index.winners() if d.members}
    # The chains each chain runs, by their own names.
    inner = {
        name: [m.name for m in map(index.get, d.members) if m is not None and m.name in chains]
        for name, d in chains.items()
    }
    problems: dict[str, Problem] = {}
    depth: dict[str, int] = {}
    for start in chains:
        if start in depth:
            continue
        # Iterative depth-first search: on the path, or a depth once done. The path is
        # a dict: in order, and searched in constant time.
        path = {start: None}
        todo = [iter(inner[start])]
        while todo:
            if (member := next(todo[-1], None)) is None:
                done, _ = path.popitem()
                todo.pop()
                depth[done] = 1 + max((depth.get(m, 0) for m in inner[done]), default=0)
            elif member in path:
                names = list(path)
                loop = names[names.index(member) :]
                for i, name in enumerate(loop):  # the loop told from each chain in it
                    trail = " -> ".join([*loop[i:], *loop[:i], name])
                    said = f"{_what(chains[name])} {name!r} names itself ({trail}); remove the loop"
                    problems.setdefault(name, chain_error(chains[name], said))
            elif member not in depth:
                path[member] = None
                todo.append(iter(inner[member]))
    for name, levels in depth.items():
        if levels > MAX_CHAIN_DEPTH and name not in problems:
            problems[name] = chain_error(
                chains[name],
                f"{_what(chains[name])} {name!r} nests {levels} chains deep, more than"
                f" {MAX_CHAIN_DEPTH}; name the backends it ends in directly",
            )
    return problems


def typo_of(name: str, known: Sequence[str]) -> str | None:
    """The name ``name`` was likely meant to be: one very like it, or one edit away (a letter
    added, dropped, changed, or two swapped: ``fats`` for ``fast``)."""
    if close := closest(name, known, cutoff=0.8):
        return close[0]
    return next((k for k in known if len(name) >= 3 and _one_edit(name, k)), None)


def _one_edit(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
        return len(diff) == 1 or (swapped and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def chain_error(
    definition: BackendDefinition,
    message: str,
    severity: Severity = "error",
    member: str | None = None,
) -> Problem:
    """A problem of a chain or table, at its ``chain`` (``by-device``) key; for a table,
    at the device that names ``member`` where one does."""
    parts = [_what(definition)]
    if member is not None and definition.by_device is not None:
        parts += [device for device, name in definition.by_device if name == member][:1]
    return definition.located(message, *parts, severity=severity)


def _what(definition: BackendDefinition) -> str:
    """What runs other backends: a ``chain`` or a ``by-device`` table (the key it is under)."""
    return "by-device" if definition.by_device is not None else "chain"
