"""What decides what a name runs, as plain facts: the one identity behind the fingerprint,
the lock file and the ranks' comparison.

Pure: an index in, facts out. The facts leave out where a checkout lies
(absolute paths, line numbers) and keep what decides what runs, for a chain
of every backend it may reach too.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from ._definition import BackendDefinition, canonical

TYPE_CHECKING = False
if TYPE_CHECKING:  # a key is facts of definitions: no dependency on how they were merged
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
        # Only where it is not the default (a false value is left out below).
        "select": definition.select != "first" and [definition.select, definition.min_speedup],
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
        described = portable(definition.compiler_fn)
        named = described.get("function") or described.get("named")
        if named is None or named != definition.target:  # what a partial, an object holds
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


def project_facts(index: Index, torch_version: str | None) -> Facts:
    """As :func:`registry_facts`, of the names the manifests declare (their own, and
    ``TORCH_BACKENDS_PATH``'s) and every name they reach (chain members, by-device entries,
    the default): a plugin or a PyTorch backend no manifest names is not among them. A name
    reached that resolves to nothing here is ``{"kind": "missing"}``."""
    declared = [d for d in index.winners() if d.source.kind in ("env", "project")]
    names = [name for d in declared for name in (d.name, *d.aliases)]
    names += [index.default.name] if index.default is not None else []
    return _facts(index, names, torch_version, reaching=True)


def registry_facts(index: Index, torch_version: str | None) -> Facts:
    """``{"backends": {name: own facts}, "aliases": {alias: name}}`` for every usable name,
    and the ``"default"`` where one is set."""
    return _facts(index, list(index.by_key), torch_version, reaching=False)


def _facts(index: Index, todo: list[str], torch_version: str | None, reaching: bool) -> Facts:
    """The facts of the names in ``todo`` and of those they reach; ``reaching``: of those
    that resolve to nothing too (else left out)."""
    backends: Facts = {}
    aliases: dict[str, str] = {}
    while todo:
        name = todo.pop()
        definition = index.get(name)
        if definition is None and not reaching:
            continue
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
    facts: Facts = {
        "backends": dict(sorted(backends.items())),
        "aliases": dict(sorted(aliases.items())),
    }
    if index.default is not None:
        facts["default"] = index.default.name
    return facts


def portable(value: Any, unknown: list[str] | None = None, depth: int = 0) -> Any:
    """``value`` as plain facts that every process running the same code writes alike: data as
    it is; a function by its ``module:qualname`` and its code (and what its closure and
    defaults hold); a ``functools.partial`` by its function and arguments; a class, a builtin
    by name; an enum by its member; a dataclass or an object with attributes by its class and
    state; a ``torch.device`` by its type (no index), a tensor by its type, shape and values.
    Never an address, a path or a ``repr`` that holds one. What it cannot write so is
    written by its kind alone and named in ``unknown``."""
    import dataclasses
    import enum
    import functools
    import inspect

    def more(inner: Any) -> Any:
        return portable(inner, unknown, depth + 1)

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 12:  # objects that hold themselves, or each other
        return _unknown("a value nested too deep", unknown)
    if isinstance(value, (list, tuple)):
        return [more(v) for v in value]
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {str(k): more(v) for k, v in sorted(value.items(), key=lambda i: str(i[0]))}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(map(canonical, map(more, value)))}
    if isinstance(value, enum.Enum):
        return {"enum": f"{_name(type(value))}.{value.name}"}
    if isinstance(value, functools.partial):
        return {
            "partial": more(value.func),
            "args": more(value.args),
            "keywords": more(value.keywords),
        }
    if inspect.ismethod(value):
        return {"method": more(value.__func__), "of": more(value.__self__)}
    if inspect.isfunction(value):
        return {
            "function": _name(value),
            "code": _code(value.__code__),
            "closure": more([cell.cell_contents for cell in value.__closure__ or ()]),
            "defaults": more([value.__defaults__, value.__kwdefaults__]),
        }
    if isinstance(value, type) or inspect.isroutine(value):
        return {"named": _name(value)}
    torch = sys.modules.get("torch")  # what is not imported holds no value of its own types
    if torch is not None and isinstance(value, torch.device):
        return {"device": value.type}
    if torch is not None and isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if torch is not None and isinstance(value, (torch.layout, torch.memory_format)):
        return {"torch": str(value)}
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor(value, unknown)
    if isinstance(value, (bytes, bytearray, complex, range)):
        return {type(value).__name__: repr(value)}
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # a NumPy scalar
        return more(value.item())
    # Inductor's custom passes say what they are so.
    if callable(uuid := getattr(value, "uuid", None)):
        return {"object": _name(type(value)), "uuid": more(uuid())}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"object": _name(type(value)), "state": more(fields)}
    if hasattr(value, "__dict__"):
        # What registering set on it (its tags, as PyTorch sets them) is not what it runs.
        state = {k: v for k, v in vars(value).items() if k != "_tags"}
        return {"object": _name(type(value)), "state": more(state)}
    return _unknown(f"a {_name(type(value))}", unknown, {"object of": _name(type(value))})


def _unknown(what: str, unknown: list[str] | None, written: Any = None) -> Any:
    if unknown is not None:
        unknown.append(what)
    return written if written is not None else {"unknown": what}


def _name(thing: Any) -> str:
    return f"{getattr(thing, '__module__', None)}:{getattr(thing, '__qualname__', None)}"


def _code(code: Any) -> str:
    """A digest of what a function's code does: its bytecode, names and constants (code
    inside it by the same digest), never its file or line."""

    def constant(value: Any) -> Any:
        if hasattr(value, "co_code"):
            return _code(value)
        if isinstance(value, (tuple, frozenset)):
            items = [constant(v) for v in value]
            return sorted(items, key=repr) if isinstance(value, frozenset) else items
        return value

    facts = [code.co_code.hex(), code.co_names, code.co_varnames, constant(code.co_consts)]
    return hashlib.sha256(repr(facts).encode("utf-8", "surrogatepass")).hexdigest()[:16]


#: The most elements of a tensor written by its values: past them, by its type and shape.
TENSOR_VALUES = 1 << 20


def _tensor(value: Any, unknown: list[str] | None) -> Any:
    import torch

    facts = {"tensor": str(value.dtype), "shape": list(value.shape)}
    try:  # a layout of its own (sparse, nested, MKL-DNN, a lazy view) is not read so
        if value.numel() > TENSOR_VALUES or value.layout != torch.strided:
            raise ValueError(value.layout)
        data = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
        digest = hashlib.sha256(data.view(-1).view(torch.uint8).numpy().tobytes())
    except Exception:
        return _unknown(f"a tensor of {value.numel()} elements", unknown, facts)
    return {**facts, "values": digest.hexdigest()[:16]}


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
