"""Merging what the sources found into one index: winners, shadows, aliases, chains, the default.

Pure: plain data in, an :class:`Index` out; no locks, no I/O.
Precedence is the order of the discoveries given, highest first (the registry
gives them in the order of ``SOURCE_KINDS``); within one, the order of its
definitions.

The rules, in one place:

- a name resolves to its highest definition; the others are *shadowed*;
- ``enabled = false`` hides a name, also from lower sources;
- an alias is another name for a backend: it resolves to whatever its canonical
  name resolves to, unless a higher source defines the alias name itself;
- the first ``default`` by precedence is the default;
- a name (or alias) of one of PyTorch's own backends cannot be defined or
  disabled by another source: PyTorch's registry refuses it, so this one does too;
- the plugin policy leaves entry points out: a distribution counts when the
  highest allow list (if any) names it and the highest rule naming it is not a
  deny; so deny lists combine, and only an explicit allow re-admits;
- when several distributions declare one name, the first on ``sys.path`` (then
  by name) wins unless a manifest picks one with ``distribution = "..."``;
- a chain (or a ``by-device`` table: both run other backends, their members)
  may not name itself, directly or through others, and may nest at most
  :data:`MAX_CHAIN_DEPTH` deep; a member that does not exist is skipped when it
  runs, and reported by ``check`` (an error when it looks like a typo, or when no
  member exists).
"""

from __future__ import annotations

from ._definition import BackendDefinition, BackendInfo, Discovery, Problem
from ._definition import distribution_key as _dist_key
from ._errors import ManifestError, UnknownBackendError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from ._definition import DefaultDeclaration, PluginRule, Severity

#: How many chains may stand inside one another. A chain calls its members in
#: turn, each a Python call deeper; far beyond any real fallback order.
MAX_CHAIN_DEPTH = 64


class Index:
    """Every name and alias, each with its candidate definitions, highest first."""

    __slots__ = (
        "_chain_problems",
        "_suggestable",
        "admitted",
        "by_key",
        "conflicts",
        "default",
        "excluded",
        "problems",
        "pytorch",
        "torch_read",
    )

    def __init__(self, found: Discovery, pytorch: Collection[str], torch_read: bool) -> None:
        self.by_key: dict[str, list[BackendDefinition]] = {}
        self.default: DefaultDeclaration | None = found.default
        #: Every problem found, in precedence order: the sources', then the merge's own.
        self.problems: list[Problem] = list(found.problems)
        #: The names PyTorch's own backends take, and whether PyTorch's registry was read.
        self.pytorch = frozenset(pytorch)
        self.torch_read = torch_read
        #: Names two distributions declare, without a manifest saying which (warnings).
        self.conflicts: dict[str, Problem] = {}
        #: Entry points the plugin policy left out, by name: each with why.
        self.excluded: dict[str, list[tuple[BackendDefinition, str]]] = {}
        #: Entry points admitted by an allow list over a lower deny, by name: which rule decided.
        self.admitted: dict[str, str] = {}
        # Derived once, on first need: the index never changes after merge().
        self._suggestable: list[str] | None = None
        self._chain_problems: dict[str, Problem] | None = None

    # ------------------------------------------------------------------ resolving

    def resolve(self, key: str) -> BackendDefinition:
        """The definition ``key`` resolves to.

        Raises :class:`UnknownBackendError` (no such name, or disabled) or the
        definition's own :class:`ManifestError` when it is broken.
        """
        definition = self._follow(key)
        if definition is None:
            excluded = self.excluded.get(key)
            raise self.unknown(key, note=excluded[0][1] if excluded else "")
        if definition.problem is not None:
            raise ManifestError.of(definition.problem)
        if not definition.enabled:
            raise self.unknown(key, note=f"disabled by {definition.source.describe()}")
        return definition

    def info(self, key: str) -> BackendInfo:
        """What ``key`` resolves to, with the definitions of that name it shadows (of an
        alias: the lower definitions of the alias's own name, which it hides)."""
        definition = self.resolve(key)
        if key == definition.name:
            return BackendInfo(definition, self.shadowed(definition), None)
        hidden = tuple(d for d in self.by_key.get(key, ()) if d.name == key)
        return BackendInfo(definition, self.shadowed(definition) + hidden, key)

    def _follow(self, key: str) -> BackendDefinition | None:
        """The definition ``key`` names, following aliases; ``None`` for no such name."""
        seen = {key}
        name = key
        while True:
            candidates = self.by_key.get(name)
            if not candidates:
                return None
            top = candidates[0]
            if top.name == name:
                return top
            # An alias: whatever its canonical name resolves to.
            name = top.name
            if name in seen:  # aliases that name each other across sources
                return None
            seen.add(name)

    def get(self, key: str) -> BackendDefinition | None:
        """The usable definition ``key`` resolves to, or ``None``."""
        definition = self._follow(key)
        return definition if definition is not None and definition.usable else None

    def shadowed(self, definition: BackendDefinition) -> tuple[BackendDefinition, ...]:
        """The definitions of ``definition``'s name below it, highest first."""
        lower = self.by_key.get(definition.name, ())
        return tuple(d for d in lower if d.name == definition.name and d is not definition)

    def winners(self, *, broken: bool = False) -> list[BackendDefinition]:
        """The usable definition of every name (not alias), in no particular order.

        ``broken=True`` adds the enabled ones that cannot be used (each has its ``problem``).
        """
        return [
            candidates[0]
            for key, candidates in self.by_key.items()
            if candidates[0].name == key
            and (candidates[0].usable or (broken and candidates[0].enabled))
        ]

    def could_be_pytorch(self, name: str) -> bool:
        """Whether ``name`` is one of PyTorch's, which this index did not read."""
        return not self.torch_read and name in self.pytorch

    def unknown(self, name: str, note: str = "") -> UnknownBackendError:
        import difflib

        errors = sum(p.severity == "error" for p in self.problems)
        if not note and errors:
            # The name may live in a manifest that could not be read.
            note = f"{errors} manifest problem{'s' if errors > 1 else ''} found"
        if self._suggestable is None:  # once per index, not once per miss
            self._suggestable = [key for key in self.by_key if self.get(key) is not None]
            if not self.torch_read:  # PyTorch's names are names, read or not
                self._suggestable += sorted(self.pytorch - set(self._suggestable))
        suggestions = difflib.get_close_matches(name, self._suggestable, n=3, cutoff=0.6)
        return UnknownBackendError(name, suggestions, note=note)

    # ----------------------------------------------------------------- validating

    def missing_members(self, definition: BackendDefinition) -> list[str]:
        """The members of a chain (or table) that exist nowhere here, each once. A name
        that may be one of PyTorch's is not missing when PyTorch's registry was not read."""
        members = dict.fromkeys(definition.members)
        return [m for m in members if self.get(m) is None and not self.could_be_pytorch(m)]

    def why_missing(self, name: str) -> str:
        """Why a member resolves to no usable backend: disabled where, left out by the
        plugin policy, or not installed here."""
        definition = self._follow(name)
        if definition is not None and not definition.enabled:
            return f"disabled by {definition.source.describe()}"
        excluded = self.excluded.get(name)
        return excluded[0][1] if excluded else "not installed here"

    def all_members_missing(self, definition: BackendDefinition) -> bool:
        """Whether no member of a chain (or table) exists here: it can never be used."""
        return len(self.missing_members(definition)) == len(set(definition.members))

    def unknown_members(self) -> dict[str, Problem]:
        """Each chain that names a backend that does not exist (here), by name.

        A portable chain names backends some machines lack (a plugin not installed
        here) and skips them when it runs: that is a ``note``. A name close to one
        that exists is likely a typo, and a chain none of whose members exists can
        never be used: those are errors. A member that may be one of PyTorch's is not
        reported when PyTorch's registry was not read.
        """

        known = [key for key in self.by_key if self.get(key) is not None]
        if not self.torch_read:
            known += sorted(self.pytorch)
        problems: dict[str, Problem] = {}
        for definition in self.winners():
            unknown = self.missing_members(definition)
            if not unknown:
                continue
            names = ", ".join(map(repr, unknown))
            said = f"{_what(definition)} {definition.name!r} names {names}, which"
            typos = {m: _typo_of(m, known) for m in unknown}
            meant = [f"{m!r} -> {close[0]!r}" for m, close in typos.items() if close]
            if self.all_members_missing(definition):
                are = "is" if len(unknown) == 1 else "are"
                guess = f" (did you mean {', '.join(meant)}?)" if meant else ""
                problems[definition.name] = chain_error(
                    definition,
                    f"{said} {are} no usable backend{guess}; no member can ever be used;"
                    " fix the name or remove it",
                    member=unknown[0],
                )
                continue
            if meant:
                problems[definition.name] = chain_error(
                    definition,
                    f"{said} {'is' if len(unknown) == 1 else 'are'} no usable backend"
                    f" (did you mean {', '.join(meant)}?); fix the name or remove it",
                    member=next(m for m, close in typos.items() if close),
                )
                continue
            are = "is" if len(unknown) == 1 else "are"
            if definition.by_device is None:
                happens = f"it skips {'it' if len(unknown) == 1 else 'them'} when it runs"
            else:
                devices = [device for device, name in definition.by_device if name in unknown]
                happens = f"on {', '.join(devices)} it fails"
            whys = {m: self.why_missing(m) for m in unknown}
            if set(whys.values()) == {"not installed here"}:
                said = f"{said} {are} not installed here"
            else:  # disabled, or left out by the plugin policy: each says why
                listed = ", ".join(f"{m!r} ({why})" for m, why in whys.items())
                said = f"{_what(definition)} {definition.name!r} names {listed}"
            problems[definition.name] = chain_error(
                definition, f"{said}; {happens}", severity="note", member=unknown[0]
            )
        return problems

    def chain_problems(self) -> dict[str, Problem]:
        """Each chain that names itself or nests too deeply, by name: it cannot be used.

        Linear in the size of the chain graph, whatever its shape or depth.
        """
        if self._chain_problems is None:
            self._chain_problems = self._find_chain_problems()
        return self._chain_problems

    def _find_chain_problems(self) -> dict[str, Problem]:
        problems: dict[str, Problem] = {}
        chains = {d.name: d for d in self.winners() if d.members}
        depth: dict[str, int] = {}
        for start in chains:
            if start in depth:
                continue
            # Iterative depth-first search: grey on the path, a depth once done.
            path: list[str] = [start]
            on_path = {start}
            iterators = [iter(self._chain_members(chains[start], chains))]
            while iterators:
                member = next(iterators[-1], None)
                if member is None:
                    done = path.pop()
                    on_path.discard(done)
                    iterators.pop()
                    below = [depth.get(m, 0) for m in self._chain_members(chains[done], chains)]
                    depth[done] = 1 + max(below, default=0)
                    continue
                if member in on_path:
                    loop = [*path[path.index(member) :], member]
                    for name in set(loop):
                        problems.setdefault(name, _loop_error(chains[name], loop, name))
                    continue
                if member in depth:
                    continue
                path.append(member)
                on_path.add(member)
                iterators.append(iter(self._chain_members(chains[member], chains)))
        for name, levels in depth.items():
            if levels > MAX_CHAIN_DEPTH and name not in problems:
                problems[name] = chain_error(
                    chains[name],
                    f"{_what(chains[name])} {name!r} nests {levels} chains deep, more than"
                    f" {MAX_CHAIN_DEPTH};"
                    " name the backends it ends in directly",
                )
        return problems

    def _chain_members(
        self, definition: BackendDefinition, chains: dict[str, BackendDefinition]
    ) -> list[str]:
        members = []
        for member in definition.members:  # repeats walk once
            resolved = self.get(member)
            if resolved is not None and resolved.members and resolved.name in chains:
                members.append(resolved.name)
        return members

    def default_problem(self) -> Problem | None:
        """Why the manifest ``default`` cannot be used, where it names no backend."""
        default = self.default
        if default is None or self.could_be_pytorch(default.name):
            return None
        try:
            self.resolve(default.name)
        except UnknownBackendError as exc:
            message = f"{exc.brief.rstrip('.')}; name a backend that exists here"
            return Problem(message, path=default.path, line=default.line, key=default.key)
        except ManifestError:
            return None  # the backend's own problem is reported already
        return None


def merge(
    discoveries: Sequence[Discovery],
    pytorch: Collection[str] = frozenset(),
    *,
    torch_read: bool = False,
    plugins_read: bool = True,
) -> Index:
    """Fold ``discoveries`` (highest precedence first) into an :class:`Index`.

    ``pytorch`` are the names PyTorch's own backends take; ``torch_read`` says
    whether PyTorch's registry is among the discoveries, ``plugins_read``
    whether the installed distributions' entry points are.
    """
    found = Discovery()
    for discovery in discoveries:
        found.add(discovery)
    index = Index(found, pytorch, torch_read)
    by_key = index.by_key
    # PyTorch's own backends are loaded in its registry, which refuses a second
    # definition of their names: torch.compile keeps running PyTorch's. So that
    # this registry gives the same answer, a definition (or alias) of such a
    # name from any other source is refused where it is made.
    reserved = index.pytorch
    refused: list[Problem] = []
    # The names the pick-and-conflict pass must visit: picks and entry points.
    special: set[str] = set()
    for definition in found.definitions:
        kind = definition.source.kind
        name = definition.name
        if definition.distribution is not None:
            special.add(name)
        if kind == "entry-point":
            special.add(name)
            why = _excluded(definition, found.rules, index)
            if why is not None:
                index.excluded.setdefault(name, []).append((definition, why))
                continue
        if kind != "torch":
            if name in reserved:
                refused.append(_pytorch_owns(definition))
                continue
            clashing = [a for a in definition.aliases if a in reserved]
            if clashing:
                refused.append(_pytorch_owns(definition, clashing))
        if name in by_key:
            by_key[name].append(definition)
        else:
            by_key[name] = [definition]
        if definition.enabled:
            for alias in definition.aliases:
                if alias not in reserved or kind == "torch":
                    by_key.setdefault(alias, []).append(definition)
    index.problems.extend(refused)
    _resolve_picks(index, special)
    if plugins_read:
        index.problems.extend(_rules_naming_nothing(found))
    index.problems.extend(_hidden_by_aliases(index))
    index.problems.extend(_disabling_nothing(index, plugins_read))
    return index


def _hidden_by_aliases(index: Index) -> list[Problem]:
    """An alias from a higher source wins over a lower backend of that very name (the
    precedence says so); said, since it hides that backend from listings."""
    said = []
    for key, candidates in index.by_key.items():
        owner = candidates[0]
        if owner.name == key or owner.source.path is None:
            continue
        hidden = [d for d in candidates[1:] if d.name == key]
        if hidden:
            lower = hidden[0]
            said.append(
                owner.located(
                    f"alias {key!r} of {owner.name!r} hides backend {key!r} of"
                    f" {lower.source.describe()}, which ranks lower: {key!r} now runs"
                    f" {owner.name!r}; rename the alias if that is not meant",
                    "aliases",
                    severity="warning",
                )
            )
    return said


def _disabling_nothing(index: Index, plugins_read: bool) -> list[Problem]:
    """``enabled = false`` for a name nothing lower defines hides nothing: likely a typo."""
    import difflib

    said = []
    known = [k for k, c in index.by_key.items() if c[0].usable] + sorted(index.pytorch)
    for key, candidates in index.by_key.items():
        top = candidates[0]
        if top.enabled or top.name != key or top.source.path is None or len(candidates) > 1:
            continue
        if key in index.excluded or not plugins_read:
            continue  # it hides an entry point the policy left out, or plugins were not read
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}?" if close else "remove the entry"
        said.append(
            top.located(
                f"{key!r} is disabled, but no lower source defines it: nothing is hidden; {hint}",
                "enabled",
                severity="warning",
            )
        )
    return said


def _typo_of(name: str, known: Sequence[str]) -> list[str]:
    """The name ``name`` was likely meant to be: one very like it, or one edit away (a letter
    added, dropped, changed, or two swapped: ``fats`` for ``fast``)."""
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    if close:
        return close
    return [k for k in known if len(name) >= 3 and _one_edit(name, k)][:1]


def _one_edit(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
        return len(diff) == 1 or (swapped and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _rules_naming_nothing(found: Discovery) -> list[Problem]:
    """An allow or deny list naming a distribution that declares no backend here (a typo?),
    at the line of its list, with the closest name that does."""
    import difflib

    declaring = sorted(
        {
            _dist_key(d.source.distribution or "")
            for d in found.definitions
            if d.source.kind == "entry-point"
        }
    )
    said = []
    for rule in found.rules:
        for name in sorted(rule.names - set(declaring)):
            close = difflib.get_close_matches(name, declaring, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "check the name"
            if rule.kind == "allow" and declaring and not rule.names & set(declaring):
                hint += (
                    " (as written, it admits no installed plugin: every entry point is left out)"
                )
            where = f"{rule.key}: " if rule.path is None else ""
            said.append(
                Problem(
                    f"{where}the {rule.kind} list names {name!r}, which is no installed"
                    f" distribution declaring a torch_dynamo_backends entry point; {hint}",
                    path=rule.path,
                    line=rule.line,
                    key=rule.key if rule.path is not None else None,
                    severity="warning",
                )
            )
    return said


def _excluded(
    definition: BackendDefinition, rules: Sequence[PluginRule], index: Index
) -> str | None:
    """Why the plugin policy leaves this entry point out, or ``None`` (see the module's rules)."""
    if not rules:
        return None
    name = definition.source.distribution or ""
    key = _dist_key(name)
    allow = next((rule for rule in rules if rule.kind == "allow"), None)
    if allow is not None and key not in allow.names:
        return f"distribution {name!r} is not allowed by {allow.where}"
    deciding = next((rule for rule in rules if key in rule.names), None)
    if deciding is None:
        return None
    if deciding.kind == "deny":
        return f"distribution {name!r} is denied by {deciding.where}"
    lower = [rule.where for rule in rules if rule.kind == "deny" and key in rule.names]
    if lower:
        index.admitted[definition.name] = (
            f"distribution {name!r} is allowed by {deciding.where}, over the deny of"
            f" {', '.join(lower)}"
        )
    return None


def _resolve_picks(index: Index, names: set[str]) -> None:
    """Give each ``distribution = "..."`` pick its entry point; report unpicked conflicts.

    When several distributions declare one name, the first on ``sys.path`` wins
    (then the first by name) unless a manifest picks one.
    """
    for key in sorted(names):
        candidates = index.by_key.get(key)
        if not candidates or candidates[0].name != key:
            continue
        top = candidates[0]
        points = [d for d in candidates if d.source.kind == "entry-point" and d.name == key]
        if top.distribution is not None and top.usable:
            candidates[0] = _picked(top, points, index.excluded.get(key, []))
            continue
        owners = {_dist_key(p.source.distribution or "") for p in points}
        if len(owners) > 1 and top.source.kind == "entry-point":
            index.conflicts[key] = _conflict(key, points)
    index.problems.extend(index.conflicts.values())


def _picked(
    pick: BackendDefinition,
    points: list[BackendDefinition],
    excluded: list[tuple[BackendDefinition, str]],
) -> BackendDefinition:
    source = pick.source
    wanted = _dist_key(pick.distribution or "")
    match = next((p for p in points if _dist_key(p.source.distribution or "") == wanted), None)
    if match is None:
        why = next(
            (why for p, why in excluded if _dist_key(p.source.distribution or "") == wanted), None
        )
        if why is None:
            import difflib

            declared = ", ".join(_owner(p) for p in points) or "no installed distribution"
            why = (
                f"no installed distribution {pick.distribution!r} declares the entry point"
                f" {pick.name!r} (declared by: {declared})"
            )
            owners = [p.source.distribution or "" for p in points]
            close = difflib.get_close_matches(pick.distribution or "", owners, n=1, cutoff=0.6)
            if close:
                why += f"; did you mean {close[0]!r}?"
        else:
            why = f"the entry point {pick.name!r} it picks is left out: {why}"
        problem = pick.located(why, "distribution")
        return BackendDefinition(
            pick.name, source, distribution=pick.distribution, problem=problem, lines=pick.lines
        )
    found = match.source
    return pick._replace(
        source=source._replace(distribution=found.distribution, version=found.version),
        target=match.target,
    )


def _owner(point: BackendDefinition) -> str:
    version = f" {point.source.version}" if point.source.version else ""
    return f"{point.source.distribution!r}{version}"


def _conflict(name: str, points: list[BackendDefinition]) -> Problem:
    owners = " and ".join(_owner(p) for p in points)
    return Problem(
        f"entry point {name!r} is declared by {owners}: {_owner(points[0])} is used, the first"
        ' on sys.path, then by name; say which with `distribution = "..."` in a'
        f" [backends.{name}] table of a manifest",
        severity="warning",
    )


def _pytorch_owns(definition: BackendDefinition, aliases: Sequence[str] = ()) -> Problem:
    if definition.source.kind == "entry-point":  # not the user's to rename: say what is
        dist = definition.source.distribution
        return Problem(
            f"{definition.source.describe()} declares the entry point {definition.name!r},"
            " one of PyTorch's own backends, which torch.compile keeps using: it is left out"
            + (
                f" (deny the plugin with [plugins] deny = [{dist!r}] to silence this)"
                if dist
                else ""
            ),
            severity="warning",
        )
    where = "" if definition.source.path is not None else f"{definition.source.describe()}: "
    if aliases:
        names = ", ".join(map(repr, aliases))
        message = (
            f"{where}alias {names} of {definition.name!r} names one of PyTorch's own"
            " backends, which torch.compile keeps using; it is left out: remove it"
        )
        return definition.located(message, "aliases")
    if not definition.enabled:
        message = (
            f"{where}{definition.name!r} is one of PyTorch's own backends and cannot be"
            " disabled: torch.compile keeps using it; remove this entry"
        )
    else:
        message = (
            f"{where}{definition.name!r} is one of PyTorch's own backends, which"
            " torch.compile keeps using; this definition is left out: rename it"
        )
    return definition.located(message)


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
        devices = [device for device, name in definition.by_device if name == member]
        parts.extend(devices[:1])
    return definition.located(message, *parts, severity=severity)


def _loop_error(definition: BackendDefinition, loop: list[str], name: str) -> Problem:
    start = loop.index(name)
    trail = " -> ".join([*loop[start:-1], *loop[:start], name])
    what = _what(definition)
    return chain_error(definition, f"{what} {name!r} names itself ({trail}); remove the loop")


def _what(definition: BackendDefinition) -> str:
    """What runs other backends: a ``chain`` or a ``by-device`` table (the key it is under)."""
    return "by-device" if definition.by_device is not None else "chain"
