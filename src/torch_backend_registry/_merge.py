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
- the plugin policy leaves entry points out, and picks among distributions that
  declare one name (:mod:`._plugins`);
- a chain (or a ``by-device`` table: both run other backends, their members)
  may not name itself, directly or through others, and may nest only so deep; a
  member that does not exist is skipped when it runs (:mod:`._members`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

from ._definition import BackendDefinition, BackendInfo, Discovery, Problem
from ._errors import ManifestError, UnknownBackendError, closest, did_you_mean
from ._members import chain_problems, unknown_members
from ._plugins import excluded, resolve_picks, rules_naming_nothing


class Index:
    """Every name and alias, each with its candidate definitions, highest first."""

    def __init__(self, found: Discovery, pytorch: Collection[str], torch_read: bool) -> None:
        self.by_key: dict[str, list[BackendDefinition]] = {}
        self.default = found.default
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

    def resolve(self, key: str) -> BackendDefinition:
        """The definition ``key`` resolves to; :class:`UnknownBackendError` for no such name
        (or a disabled one), the definition's own :class:`ManifestError` for a broken one."""
        definition = self._follow(key)
        if definition is not None and definition.problem is not None:
            raise ManifestError.of(definition.problem)
        if definition is not None and definition.enabled:
            return definition
        if (left_out := self.left_out(key)) is not None:  # declared: no other name was meant
            raise UnknownBackendError(key, note=left_out, left_out=True)
        errors = sum(p.severity == "error" for p in self.problems)
        # The name may live in a manifest that could not be read.
        note = f"{errors} manifest problem{'s' if errors > 1 else ''} found" if errors else ""
        if not note and self.could_be_pytorch(key):
            # PyTorch is not installed, or the registry's sources leave it out.
            note = "one of PyTorch's own backends, and PyTorch's registry is not read here"
        suggestions = closest(key, [k for k in self.known if k != key], n=3)
        raise UnknownBackendError(key, suggestions, note=note)

    def info(self, key: str) -> BackendInfo:
        """What ``key`` resolves to, with the definitions of that name it shadows (of an
        alias: the lower definitions of the alias's own name, which it hides)."""
        definition = self.resolve(key)
        name = definition.name
        shadowed = [d for d in self.by_key[name] if d.name == name and d is not definition]
        if key != name:  # an alias: the definitions of its own name it hides follow
            shadowed += [d for d in self.by_key.get(key, ()) if d.name == key]
        return BackendInfo(definition, tuple(shadowed), None if key == name else key)

    def _follow(self, key: str) -> BackendDefinition | None:
        """The definition ``key`` names, following aliases; ``None`` for no such name."""
        # An alias: whatever its canonical name resolves to. Each step reaches a definition
        # earlier in precedence order (it came first under that key), so the walk ends.
        while candidates := self.by_key.get(key):
            if candidates[0].name == key:
                return candidates[0]
            key = candidates[0].name
        return None

    def get(self, key: str) -> BackendDefinition | None:
        definition = self._follow(key)
        return definition if definition is not None and definition.usable else None

    def winners(self, *, broken: bool = False) -> list[BackendDefinition]:
        """The usable definition of every name (not alias); ``broken=True`` adds the enabled
        ones that cannot be used (each has its ``problem``)."""
        return [
            candidates[0]
            for key, candidates in self.by_key.items()
            if candidates[0].name == key
            and (candidates[0].usable or (broken and candidates[0].enabled))
        ]

    def could_be_pytorch(self, name: str) -> bool:
        return not self.torch_read and name in self.pytorch

    @functools.cached_property
    def known(self) -> list[str]:
        """Every name that resolves, PyTorch's among them (read or not): what a
        misspelt name may have meant."""
        known = [key for key in self.by_key if self.get(key) is not None]
        if not self.torch_read:
            known += sorted(self.pytorch - set(known))
        return known

    def left_out(self, name: str) -> str | None:
        """Why a declared name resolves to no backend: disabled where, or left out by the
        plugin policy (``None``: not declared here, or not left out)."""
        definition = self._follow(name)
        if definition is not None and not definition.enabled:
            return f"disabled by {definition.source.describe()}"
        excluded = self.excluded.get(name)
        return excluded[0][1] if excluded else None

    unknown_members = unknown_members
    # Derived once, on first need: the index never changes after merge().
    #: Each chain that names itself or nests too deeply, by name: it cannot be used.
    chain_problems = functools.cached_property(chain_problems)

    def default_problem(self) -> Problem | None:
        """Why the manifest ``default`` cannot be used, where it names no backend."""
        if (default := self.default) is None or self.could_be_pytorch(default.name):
            return None
        try:
            self.resolve(default.name)
        except UnknownBackendError as exc:
            message = f"{exc.brief.rstrip('.')}; name a backend that exists here"
            return Problem(message, path=default.path, line=default.line, key=default.key)
        except ManifestError:
            pass  # the backend's own problem is reported already
        return None


def merge(
    discoveries: Sequence[Discovery],
    pytorch: Collection[str] = frozenset(),
    *,
    torch_read: bool = False,
    plugins_read: bool = True,
) -> Index:
    """Fold ``discoveries`` (highest precedence first) into an :class:`Index`; ``pytorch``
    are the names PyTorch's own backends take, ``torch_read`` and ``plugins_read`` say
    whether PyTorch's registry and the installed entry points are among the discoveries."""
    found = Discovery()
    for discovery in discoveries:
        found.add(discovery)
    index = Index(found, pytorch, torch_read)
    for definition in found.definitions:
        kind = definition.source.kind
        name = definition.name
        # An entry point, or a plugin's own registration in PyTorch's registry: without
        # allow and deny lists, every one counts.
        plugin = kind == "entry-point" or (kind == "torch" and definition.source.distribution)
        if plugin and found.rules and (why := excluded(definition, found.rules, index)):
            index.excluded.setdefault(name, []).append((definition, why))
            continue
        if kind != "torch":  # see the module's rules: PyTorch's registry refuses its names
            if name in index.pytorch:
                index.problems.append(_pytorch_owns(definition))
                continue
            if clashing := [a for a in definition.aliases if a in index.pytorch]:
                index.problems.append(_pytorch_owns(definition, clashing))
        index.by_key.setdefault(name, []).append(definition)
        if definition.enabled:
            for alias in definition.aliases:
                if alias not in index.pytorch or kind == "torch":
                    index.by_key.setdefault(alias, []).append(definition)
    resolve_picks(index, found.definitions)
    if plugins_read and found.rules:
        index.problems.extend(rules_naming_nothing(found))
    index.problems.extend(_hiding(index, plugins_read))
    return index


def _hiding(index: Index, plugins_read: bool) -> list[Problem]:
    """What hides more, or less, than its manifest likely means (warnings): an alias from a
    higher source hides a lower backend of its very name (the precedence says so), and
    ``enabled = false`` for a name nothing lower defines hides nothing (likely a typo)."""
    aliases, disabled = [], []
    for key, found in index.by_key.items():
        top = found[0]
        if top.source.path is None:
            continue
        if top.name != key:
            if (lower := next((d for d in found[1:] if d.name == key), None)) is not None:
                aliases.append(
                    top.located(
                        f"alias {key!r} of {top.name!r} hides backend {key!r} of"
                        f" {lower.source.describe()}, which ranks lower: {key!r} now runs"
                        f" {top.name!r}; rename the alias if that is not meant",
                        "aliases",
                        severity="warning",
                    )
                )
        # An entry point the policy left out is hidden, and so may be one not read.
        elif plugins_read and not top.enabled and len(found) == 1 and key not in index.excluded:
            hint = did_you_mean(key, index.known, "remove the entry", cutoff=0.75)
            disabled.append(
                top.located(
                    f"{key!r} is disabled, but no lower source defines it: nothing is hidden;"
                    f" {hint}",
                    "enabled",
                    severity="warning",
                )
            )
    return aliases + disabled


def _pytorch_owns(definition: BackendDefinition, aliases: Sequence[str] = ()) -> Problem:
    source = definition.source
    if source.kind == "entry-point":  # not the user's to rename: say what is
        dist = source.distribution
        deny = f" (deny the plugin with [plugins] deny = [{dist!r}] to silence this)"
        return Problem(
            f"{source.describe()} declares the entry point {definition.name!r}, one of"
            " PyTorch's own backends, which torch.compile keeps using: it is left out"
            + (deny if dist else ""),
            severity="warning",
        )
    where = "" if source.path is not None else f"{source.describe()}: "
    if aliases:
        return definition.located(
            f"{where}alias {', '.join(map(repr, aliases))} of {definition.name!r} names one of"
            " PyTorch's own backends, which torch.compile keeps using; it is left out: remove it",
            "aliases",
        )
    if not definition.enabled:
        said = " and cannot be disabled: torch.compile keeps using it; remove this entry"
    else:
        said = ", which torch.compile keeps using; this definition is left out: rename it"
    return definition.located(f"{where}{definition.name!r} is one of PyTorch's own backends{said}")
