"""What decides what a name runs, as plain facts: the one identity behind the fingerprint,
the lock file, doctor's verdict keys and the verdicts a listing shows.

Pure: an index in, facts out. The facts leave out where a checkout lies
(absolute paths, line numbers) and keep what decides what runs: the source
kind, the target or chain, options, requires, ``python-path`` (relative to
its manifest), a plugin's distribution and version, ``skip-known-failures``,
PyTorch's version for its own backends, and for a chain the same facts of
every backend it may reach.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._definition import BackendDefinition
    from ._merge import Index

    Facts = dict[str, Any]


def own_facts(definition: BackendDefinition, torch_version: str | None) -> Facts:
    """The facts of one definition alone (a chain's members by name only)."""
    source = definition.source
    facts: Facts = {"kind": source.kind}
    if definition.target is not None:
        facts["target"] = definition.target
    if definition.chain is not None:
        facts["chain"] = list(definition.chain)
    if definition.by_device is not None:
        facts["by-device"] = dict(definition.by_device)
    if definition.verify is not None:
        facts["verify"] = list(definition.verify)
    if definition.options:
        facts["options"] = _plain(definition.options)
    if definition.requires:
        facts["requires"] = sorted(set(definition.requires))
    if definition.python_path and source.path is not None:
        facts["python-path"] = [_where(p, source.path) for p in definition.python_path]
    if source.distribution is not None:
        facts["distribution"] = source.distribution
        facts["version"] = source.version or ""
    if definition.skip_known_failures:
        facts["skip-known-failures"] = True
    if source.kind == "torch":
        facts["torch"] = torch_version or ""
    return facts


def reach(index: Index, definition: BackendDefinition) -> dict[str, BackendDefinition | None]:
    """Every backend a chain (or ``by-device`` table) may run, by name (``None`` for a name
    that resolves to nothing), through others inside it; linear in their graph. Empty for a
    backend that runs no other."""
    found: dict[str, BackendDefinition | None] = {}
    todo = list(definition.members)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        member = found[name] = index.get(name)
        if member is not None:
            todo.extend(member.members)
    return dict(sorted(found.items()))


def identity(index: Index, definition: BackendDefinition, torch_version: str | None) -> Facts:
    """The facts that decide what ``definition`` runs, its chain's members' included."""
    facts = own_facts(definition, torch_version)
    members = reach(index, definition)
    if members:
        facts["members"] = {
            name: None if member is None else own_facts(member, torch_version)
            for name, member in members.items()
        }
    return facts


def registry_facts(index: Index, torch_version: str | None) -> Facts:
    """``{"backends": {name: facts}, "aliases": {alias: name}}`` for every usable name,
    and ``"default"``, the backend torch.compile uses when given none, where one is set.

    Each backend's own facts: a chain's members stand there under their own names.
    """
    backends: Facts = {}
    aliases: dict[str, str] = {}
    for key in sorted(index.by_key):
        definition = index.get(key)
        if definition is None:
            continue
        if key == definition.name:
            backends[key] = own_facts(definition, torch_version)
        else:
            aliases[key] = definition.name
    facts: Facts = {"backends": backends, "aliases": aliases}
    if index.default is not None:
        facts["default"] = index.default.name
    return facts


def _where(folder: str, manifest: str) -> str:
    """A python-path folder as a checkout anywhere says it: relative to the manifest's
    folder (``../src`` beside a ``conf/`` folder) unless the two share nothing but the
    root (``/opt/lib`` from a checkout in a home folder), as it is."""
    here = os.path.dirname(os.path.realpath(manifest))
    try:
        shared = os.path.commonpath([folder, here])
    except ValueError:  # other drives
        return folder
    if shared == os.path.dirname(shared):  # only the root
        return folder
    return os.path.relpath(folder, here)


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
