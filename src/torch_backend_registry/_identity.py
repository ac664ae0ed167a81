"""What decides what a name runs, as plain facts: the one identity behind the fingerprint,
the lock file and the ranks' comparison.

Pure: an index in, facts out. The facts leave out where a checkout lies
(absolute paths, line numbers) and keep what decides what runs, for a chain
of every backend it may reach too.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._definition import BackendDefinition
    from ._merge import Index

    Facts = dict[str, Any]


def own_facts(definition: BackendDefinition, torch_version: str | None) -> Facts:
    """The facts of one definition alone (a chain's members by name only), each where it
    has one."""
    source = definition.source
    if source.kind == "torch" and (definition.target or "torch.").startswith("torch."):
        return pytorch_facts(torch_version)  # PyTorch's own: its release says what it runs
    written: Facts = {
        # A manifest's backend runs alike whether the project's search or TORCH_BACKENDS_PATH
        # found the file: a launched job that names the project's manifest is not a drift.
        "kind": "manifest" if source.kind in ("env", "project") else source.kind,
        "target": definition.target,
        "chain": list(definition.chain or ()),
        "by-device": by_device(definition),
        "verify": list(definition.verify or ()),
        "select": [definition.select, definition.min_speedup]
        if definition.select != "first"
        else None,
        "options": _plain(definition.options),
        "requires": sorted(set(definition.requires)),
        # As written: an absolute folder is the same folder from every checkout, and a
        # relative one the same place in each.
        "python-path": list(definition.written_path),
    }
    facts = {key: value for key, value in written.items() if value}
    if source.distribution is not None:
        facts["distribution"] = source.distribution
        facts["version"] = source.version or ""
    if source.kind == "torch":  # a plugin's registration in PyTorch's registry
        facts["torch"] = pytorch_facts(torch_version)["torch"]
    elif definition.compiler_fn is not None:
        described = callable_facts(definition.compiler_fn)
        if described != definition.target:  # a partial, a callable object: what it holds
            facts["callable"] = described
    return facts


def pytorch_facts(torch_version: str | None) -> Facts:
    """The facts of one of PyTorch's own backends, known whether or not its registry was read:
    the release without its local label (2.13.0 of 2.13.0+cu128), since the CPU and the CUDA
    build of one release run the same Python code for every backend name."""
    return {"kind": "torch", "torch": (torch_version or "").split("+", 1)[0]}


def by_device(definition: BackendDefinition) -> dict[str, Any]:
    """A ``by-device`` table as written: each device's backend, or a table of it and the
    torch.compile settings it gives that device."""
    settings = definition.device_settings
    return {
        device: {"backend": name, **_plain(settings[device])} if device in settings else name
        for device, name in definition.by_device or ()
    }


def reach(index: Index, definition: BackendDefinition) -> dict[str, BackendDefinition | None]:
    """Every backend a chain (or ``by-device`` table) may run, through others inside it, by
    name (``None`` for a name that resolves to nothing)."""
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


def project_facts(index: Index, torch_version: str | None) -> Facts:
    """As :func:`registry_facts`, of the names the manifests declare (their own, and
    ``TORCH_BACKENDS_PATH``'s) and every name they reach (chain members, by-device entries,
    the default): a plugin or a PyTorch backend no manifest names is not among them. A name
    reached that resolves to nothing here is ``{"kind": "missing"}``."""
    declared = [d for d in index.winners() if d.source.kind in ("env", "project")]
    todo = [name for d in declared for name in (d.name, *d.aliases)]
    todo += [index.default.name] if index.default is not None else []
    backends: Facts = {}
    aliases: dict[str, str] = {}
    while todo:
        name = todo.pop()
        definition = index.get(name)
        if definition is not None and definition.name != name:
            aliases[name], name = definition.name, definition.name
        if name in backends:
            continue
        if definition is not None:
            backends[name] = own_facts(definition, torch_version)
            todo.extend(definition.members)
        elif index.could_be_pytorch(name):
            backends[name] = pytorch_facts(torch_version)
        else:
            backends[name] = {"kind": "missing"}
    return _facts(index, dict(sorted(backends.items())), dict(sorted(aliases.items())))


def registry_facts(index: Index, torch_version: str | None) -> Facts:
    """``{"backends": {name: own facts}, "aliases": {alias: name}}`` for every usable name,
    and the ``"default"`` where one is set."""
    resolved = {key: d for key in sorted(index.by_key) if (d := index.get(key)) is not None}
    backends = {k: own_facts(d, torch_version) for k, d in resolved.items() if k == d.name}
    return _facts(index, backends, {k: d.name for k, d in resolved.items() if k != d.name})


def _facts(index: Index, backends: Facts, aliases: dict[str, str]) -> Facts:
    facts: Facts = {"backends": backends, "aliases": aliases}
    if index.default is not None:
        facts["default"] = index.default.name
    return facts


def callable_facts(fn: Any, depth: int = 0) -> Any:
    """What a registered callable runs, as plain facts that two processes running the same
    code agree on: a function's ``module:qualname``; a ``functools.partial``'s function and
    the arguments it binds; a callable object's class and its attributes. Never an address
    (``repr`` of an object holds one)."""
    import functools
    import inspect

    from ._definition import target_of

    if depth > 8:  # objects that hold themselves, or each other
        return "..."
    if isinstance(fn, functools.partial):
        return {
            "partial": callable_facts(fn.func, depth + 1),
            "args": [_held(a, depth) for a in fn.args],
            "keywords": {str(k): _held(v, depth) for k, v in sorted(fn.keywords.items())},
        }
    named = inspect.isfunction(fn) or inspect.isbuiltin(fn) or isinstance(fn, type)
    target = target_of(fn)
    if named and target is not None:  # its name says what it runs
        return target
    cls = type(fn)
    # What registering set on it (its tags, as PyTorch sets them) is not what it runs.
    state = {k: v for k, v in getattr(fn, "__dict__", {}).items() if k != "_tags"}
    return {
        "instance of": f"{cls.__module__}:{cls.__qualname__}",
        "state": {
            str(k): _held(v, depth) for k, v in sorted(state.items(), key=lambda i: str(i[0]))
        },
    }


def _held(value: Any, depth: int) -> Any:
    """A value a callable holds, as plain facts: data as it is, a callable as what it runs,
    anything else by its kind."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_held(v, depth + 1) for v in value][:100]
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda i: str(i[0]))[:100]
        return {str(k): _held(v, depth + 1) for k, v in items}
    if callable(value):
        return callable_facts(value, depth + 1)
    return {"object of": f"{type(value).__module__}:{type(value).__qualname__}"}


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
