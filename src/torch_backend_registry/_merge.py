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
- a plugin policy (allow and deny lists of distributions) leaves entry points out;
  when several distributions declare one name, the first on ``sys.path`` (then
  by name) wins unless a manifest picks one with ``distribution = "..."``;
- a chain may not name itself, directly or through other chains, and may nest
  at most :data:`MAX_CHAIN_DEPTH` chains deep; a member that does not exist is
  skipped when it runs, and reported by ``check``.
"""

from __future__ import annotations

from ._definition import BackendDefinition, Discovery, distribution_key
from ._errors import ManifestError, UnknownBackendError
from ._files import table_prefix, toml_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._definition import DefaultDeclaration

#: How many chains may stand inside one another. A chain calls its members in
#: turn, each a Python call deeper; far beyond any real fallback order.
MAX_CHAIN_DEPTH = 64


class Index:
    """Every name and alias, each with its candidate definitions, highest first."""

    __slots__ = (
        "_chain_problems",
        "_suggestable",
        "by_key",
        "conflicts",
        "default",
        "excluded",
        "problems",
        "refused",
        "warnings",
    )

    def __init__(self, found: Discovery) -> None:
        self.by_key: dict[str, list[BackendDefinition]] = {}
        self.default: DefaultDeclaration | None = found.default
        self.problems = list(found.problems)
        self.warnings = found.warnings
        #: The definitions the merge itself refused (PyTorch's names), also in ``problems``.
        self.refused: list[ManifestError] = []
        #: Names two distributions declare, without a manifest saying which; in ``warnings``.
        self.conflicts: dict[str, ManifestError] = {}
        #: Entry-point names the plugin policy left out, with why.
        self.excluded: dict[str, str] = {}
        # Derived once, on first need: the index never changes after merge().
        self._suggestable: list[str] | None = None
        self._chain_problems: dict[str, ManifestError] | None = None

    # ------------------------------------------------------------------ resolving

    def resolve(self, key: str) -> BackendDefinition:
        """The definition ``key`` resolves to.

        Raises :class:`UnknownBackendError` (no such name, or disabled) or the
        definition's own :class:`ManifestError` when it is broken.
        """
        definition = self._follow(key)
        if definition is None:
            raise self.unknown(key, note=self.excluded.get(key, ""))
        if definition.problem is not None:
            raise definition.problem
        if not definition.enabled:
            raise self.unknown(key, note=f"disabled by {definition.source.describe()}")
        return definition

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

    def unknown(self, name: str, note: str = "") -> UnknownBackendError:
        import difflib

        if not note and self.problems:
            # The name may live in a manifest that could not be read.
            count = len(self.problems)
            note = f"{count} manifest problem{'s' if count > 1 else ''} found"
        if self._suggestable is None:  # once per index, not once per miss
            self._suggestable = [key for key in self.by_key if self.get(key) is not None]
        suggestions = difflib.get_close_matches(name, self._suggestable, n=3, cutoff=0.6)
        return UnknownBackendError(name, suggestions, note=note)

    # ----------------------------------------------------------------- validating

    def unknown_members(self) -> dict[str, ManifestError]:
        """Each chain that names a backend that does not exist (here), by name.

        Not fatal: a portable chain skips a member missing on one machine when it
        runs, but ``check`` reports the name, which is often a typo.
        """
        problems: dict[str, ManifestError] = {}
        for definition in self.winners():
            unknown = [m for m in dict.fromkeys(definition.chain or ()) if self.get(m) is None]
            if unknown:
                names = ", ".join(map(repr, unknown))
                every = len(unknown) == len(set(definition.chain or ()))
                problems[definition.name] = chain_error(
                    definition,
                    f"chain {definition.name!r} names {names}, which"
                    f" {'is' if len(unknown) == 1 else 'are'} no usable backend"
                    + ("; no member can ever be used" if every else "")
                    + "; fix the name or remove it",
                )
        return problems

    def chain_problems(self) -> dict[str, ManifestError]:
        """Each chain that names itself or nests too deeply, by name: it cannot be used.

        Linear in the size of the chain graph, whatever its shape or depth.
        """
        if self._chain_problems is None:
            self._chain_problems = self._find_chain_problems()
        return self._chain_problems

    def _find_chain_problems(self) -> dict[str, ManifestError]:
        problems: dict[str, ManifestError] = {}
        chains = {d.name: d for d in self.winners() if d.chain is not None}
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
                    f"chain {name!r} nests {levels} chains deep, more than {MAX_CHAIN_DEPTH};"
                    " name the backends it ends in directly",
                )
        return problems

    def _chain_members(
        self, definition: BackendDefinition, chains: dict[str, BackendDefinition]
    ) -> list[str]:
        members = []
        for member in dict.fromkeys(definition.chain or ()):  # repeats walk once
            resolved = self.get(member)
            if resolved is not None and resolved.chain is not None and resolved.name in chains:
                members.append(resolved.name)
        return members

    def default_problem(self) -> ManifestError | None:
        """Why the manifest ``default`` cannot be used, where it names no backend."""
        default = self.default
        if default is None:
            return None
        try:
            self.resolve(default.name)
        except UnknownBackendError as exc:
            return ManifestError(str(exc), path=default.path, line=default.line, key=default.key)
        except ManifestError:
            return None  # the backend's own problem is reported already
        return None


def merge(discoveries: Sequence[Discovery]) -> Index:
    """Fold ``discoveries`` (highest precedence first) into an :class:`Index`."""
    found = Discovery()
    for discovery in discoveries:
        found.add(discovery)
    index = Index(found)
    by_key = index.by_key
    # PyTorch's own backends are loaded in its registry, which refuses a second
    # definition of their names: torch.compile keeps running PyTorch's. So that
    # this registry gives the same answer, a definition (or alias) of such a
    # name from any other source is refused where it is made.
    pytorch = {d.name for d in found.definitions if d.source.kind == "torch"}
    refused = index.refused
    # The names the pick-and-conflict pass must visit: picks and entry points.
    special: set[str] = set()
    policy = found.allow is not None or found.deny is not None
    for definition in found.definitions:
        if definition.distribution is not None:
            special.add(definition.name)
        if definition.source.kind == "entry-point":
            special.add(definition.name)
            why = _excluded(definition, found) if policy else None
            if why is not None:
                index.excluded.setdefault(definition.name, why)
                continue
        name = definition.name
        if pytorch and definition.source.kind != "torch":
            if name in pytorch:
                refused.append(_pytorch_owns(definition))
                continue
            clashing = [a for a in definition.aliases if a in pytorch]
            if clashing:
                refused.append(_pytorch_owns(definition, clashing))
        if name in by_key:
            by_key[name].append(definition)
        else:
            by_key[name] = [definition]
        if definition.enabled:
            for alias in definition.aliases:
                if alias not in pytorch or definition.source.kind == "torch":
                    by_key.setdefault(alias, []).append(definition)
    index.problems.extend(refused)
    _resolve_picks(index, special)
    return index


def _excluded(definition: BackendDefinition, found: Discovery) -> str | None:
    """Why the plugin policy leaves this entry point out, or ``None``."""
    name = definition.source.distribution or ""
    key = distribution_key(name)
    if found.deny is not None and key in found.deny.names:
        return f"distribution {name!r} is denied by {found.deny.where}"
    if found.allow is not None and key not in found.allow.names:
        return f"distribution {name!r} is not allowed by {found.allow.where}"
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
            wanted = distribution_key(top.distribution)
            match = next(
                (p for p in points if distribution_key(p.source.distribution or "") == wanted),
                None,
            )
            candidates[0] = _picked(top, match, points)
            continue
        owners = {distribution_key(p.source.distribution or "") for p in points}
        if len(owners) > 1 and top.source.kind == "entry-point":
            index.conflicts[key] = _conflict(key, points)
    index.warnings = [*index.warnings, *index.conflicts.values()]


def _picked(
    pick: BackendDefinition, match: BackendDefinition | None, points: list[BackendDefinition]
) -> BackendDefinition:
    source = pick.source
    if match is None:
        declared = ", ".join(_owner(p) for p in points) or "no installed distribution"
        prefix = table_prefix(source.path) if source.path is not None else ()
        return BackendDefinition(
            pick.name,
            source,
            distribution=pick.distribution,
            problem=ManifestError(
                f"no installed distribution {pick.distribution!r} declares the entry point"
                f" {pick.name!r} (declared by: {declared})",
                path=source.path,
                line=source.line,
                key=toml_key((*prefix, "backends", pick.name, "distribution")),
            ),
        )
    from ._definition import Source

    return BackendDefinition(
        pick.name,
        Source(
            source.kind,
            path=source.path,
            line=source.line,
            distribution=match.source.distribution,
            version=match.source.version,
        ),
        target=match.target,
        tags=pick.tags,
        description=pick.description,
        aliases=pick.aliases,
        requires=pick.requires,
        options=pick.options,
        python_path=pick.python_path,
        distribution=pick.distribution,
    )


def _owner(point: BackendDefinition) -> str:
    version = f" {point.source.version}" if point.source.version else ""
    return f"{point.source.distribution!r}{version}"


def _conflict(name: str, points: list[BackendDefinition]) -> ManifestError:
    owners = " and ".join(_owner(p) for p in points)
    return ManifestError(
        f"entry point {name!r} is declared by {owners}: {_owner(points[0])} is used, the first"
        ' on sys.path, then by name; say which with `distribution = "..."` in a'
        f" [backends.{name}] table of a manifest",
        path=None,
    )


def _pytorch_owns(definition: BackendDefinition, aliases: Sequence[str] = ()) -> ManifestError:
    source = definition.source
    prefix = table_prefix(source.path) if source.path is not None else ()
    key = (*prefix, "backends", definition.name)
    where = "" if source.path is not None else f"{source.describe()}: "
    if aliases:
        names = ", ".join(map(repr, aliases))
        message = (
            f"{where}alias {names} of {definition.name!r} names one of PyTorch's own"
            " backends, which torch.compile keeps using; it is left out: remove it"
        )
        key = (*key, "aliases")
    elif not definition.enabled:
        message = (
            f"{where}{definition.name!r} is one of PyTorch's own backends and cannot be"
            " disabled: torch.compile keeps using it; remove this entry"
        )
    else:
        message = (
            f"{where}{definition.name!r} is one of PyTorch's own backends, which"
            " torch.compile keeps using; this definition is left out: rename it"
        )
    return ManifestError(message, path=source.path, line=source.line, key=toml_key(key))


def chain_error(definition: BackendDefinition, message: str) -> ManifestError:
    source = definition.source
    prefix = table_prefix(source.path) if source.path is not None else ()
    return ManifestError(
        message,
        path=source.path,
        line=source.line,
        key=toml_key((*prefix, "backends", definition.name, "chain")),
    )


def _loop_error(definition: BackendDefinition, loop: list[str], name: str) -> ManifestError:
    start = loop.index(name)
    trail = " -> ".join([*loop[start:-1], *loop[:start], name])
    return chain_error(definition, f"chain {name!r} names itself ({trail}); remove the loop")
