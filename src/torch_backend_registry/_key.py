"""What decides a chain's choice for a graph, as facts every process writes alike: the portable
key that remembered and shipped choices are found by, and those facts in words.

The same on every checkout path, user, cache folder, rank and device index of one device
model: no path, no address, no device index is in it (dynamo writes a device's index into a
graph's code: it is taken out). Different where anything that changes the answer differs: the
graph's code, its inputs' shapes (symbolic under ``dynamic=True``), strides, dtypes and
``requires_grad``, grad mode, the autocast state, float32 matmul precision, deterministic
algorithms, PyTorch's thread count (CPU), the chain's and each member's identity (versions,
code, options), what torch.compile was given (``mode``, ``options``), PyTorch's version and
the device's model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._definition import BackendDefinition, BackendInfo, canonical
from ._identity import own_facts, portable
from ._sources.finding import find
from ._sources.pytorch import torch_version

#: The facts a key is made of, in the order ``backends.choices`` states them.
DECIDING = (
    "chain", "graph-digest", "grad", "dynamic", "autocast", "matmul-precision",
    "deterministic", "threads", "compile", "identity", "torch", "device",
)  # fmt: skip
#: A device's index as dynamo writes it into a graph's code: ``device(type='cuda', index=1)``
#: and ``'cuda:1'``.
_INDEX = re.compile(r"(device\(type='[^']*'), index=\d+\)|'([A-Za-z_]+):\d+'")


def facts(
    chain: BackendDefinition,
    info: Callable[[str], BackendInfo],
    gm: Any,
    example_inputs: Sequence[Any],
    device: str,
    kwargs: Mapping[str, Any],
    unknown: list[str],
) -> dict[str, Any]:
    """What decides ``chain``'s choice for ``gm`` here (:data:`DECIDING`); what torch.compile
    was given that no process can write alike is named in ``unknown``."""
    import torch

    graph, dynamic = _graph(gm, example_inputs)
    autocast = "off"
    with contextlib.suppress(Exception):  # a device type autocast does not know
        if torch.is_autocast_enabled(device):
            autocast = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    return {
        "chain": chain.name,
        "graph-digest": graph,
        "grad": torch.is_grad_enabled(),
        "dynamic": dynamic,
        "autocast": autocast,
        "matmul-precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "threads": torch.get_num_threads() if device == "cpu" else 0,
        "compile": canonical(portable(dict(kwargs), unknown)),
        "identity": identity(chain, info),
        "torch": torch_version() or "",
        "device": device_model(device),
    }


def applies(table: Mapping[str, Any], identity_here: str) -> list[str]:
    """What differs between the machine a choice was decided on and this one (PyTorch's
    version, the device's model, the thread count on the CPU) or the chain then and now, in
    words; nothing where it applies here to graphs like its own."""
    import torch

    device = str(table.get("device", "cpu")).split(" ", 1)[0]
    here = {
        "torch": torch_version() or "",
        "device": device_model(device),
        "threads": torch.get_num_threads() if device == "cpu" else 0,
        "identity": identity_here,
    }
    return differences(here, table, tuple(here))


def key(decided: Mapping[str, Any]) -> str:
    """The digest of what decides a choice: the key it is remembered and shipped by."""
    return _digest({name: decided.get(name) for name in DECIDING})


def identity(chain: BackendDefinition, info: Callable[[str], BackendInfo]) -> str:
    """The digest of the chain's own facts and those of every backend it may run, through the
    chains inside it, with the code of those a manifest declares (a plugin's: its version
    says which code it is; PyTorch's: its release, a fact of the key of its own)."""
    return _digest([own_facts(chain, None), *members(chain, info).items()])


def members(chain: BackendDefinition, info: Callable[[str], BackendInfo]) -> dict[str, Any]:
    """The identity of every backend ``chain`` may run, its members and theirs, by name."""
    said: dict[str, Any] = {}
    todo = list(chain.members)
    while todo:
        member = todo.pop(0)
        if member in said:
            continue
        try:
            definition = info(member).definition
        except Exception:  # a member not here: it is skipped, said so
            said[member] = "not here"
            continue
        said[member] = facts = own_facts(definition, None)
        if definition.target is not None and definition.source.kind in ("env", "project"):
            facts["code"] = code_digest(definition.target.partition(":")[0], definition.search_path)
        todo.extend(definition.members)
    return said


def in_words(member: Any) -> str:
    """A member's identity (of :func:`members`) as ``backends.choices`` says it."""
    if not isinstance(member, dict):
        return str(member)
    if member.get("kind") == "torch":
        return "PyTorch's own"
    if "distribution" in member:
        return f"{member['distribution']} {member.get('version', '')}".strip()
    code = f" (code {member['code']})" if member.get("code") else ""
    return f"{member.get('target') or 'chain'}{code}"


def differences(
    mine: Mapping[str, Any], theirs: Mapping[str, Any], names: Sequence[str] = DECIDING
) -> list[str]:
    """What differs between the facts that decided a choice (``theirs``) and those here
    (``mine``), of ``names``, in words: ``threads 2 -> 1``, or which digest differs."""
    said = []
    for name in names:
        was, now = theirs.get(name), mine.get(name)
        if was == now:
            continue
        # A digest's value says nothing to a reader: what it is of does.
        words = {
            "graph-digest": "another graph (its code, or its inputs' shapes, strides or types)",
            "identity": "the chain or a member changed since",
            "compile": f"torch.compile was given {now}, not {was}",
        }
        said.append(words.get(name, f"{name} {_shown(was)} -> {_shown(now)}"))
    return said


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _graph(gm: Any, example_inputs: Sequence[Any]) -> tuple[str, bool]:
    """The digest of a graph as a choice is keyed by: its code (without device indices or
    comments) and, for each input, shape, strides, dtype, device type and
    ``requires_grad``, as dynamo recorded them where it did (under ``dynamic=True`` the sizes
    are symbols: one choice for every size); and whether any size is a symbol."""
    import torch

    code = str(getattr(gm, "code", type(gm).__name__))
    lines = [line for line in code.splitlines() if not line.strip().startswith("#")]
    code = _INDEX.sub(lambda m: f"{m[1]})" if m[1] else f"'{m[2]}'", "\n".join(lines))
    inputs: list[Any] = []
    dynamic = False
    for value in recorded(gm, example_inputs):
        if isinstance(value, torch.Tensor):
            sizes = [*value.shape, *(value.stride() if value.layout == torch.strided else ())]
            dynamic = dynamic or any(isinstance(size, torch.SymInt) for size in sizes)
            strides = str(value.stride()) if value.layout == torch.strided else None
            kind = [str(tuple(value.shape)), strides, str(value.dtype), value.device.type]
            inputs.append([*kind, value.requires_grad])
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            dynamic = True
            inputs.append(type(value).__name__)
        else:
            inputs.append(canonical(portable(value)))
    return _digest([code, inputs]), dynamic


def recorded(gm: Any, example_inputs: Sequence[Any]) -> list[Any]:
    """The graph's inputs as dynamo recorded them on its placeholders (fake tensors, symbolic
    sizes), else the example inputs themselves."""
    nodes = getattr(getattr(gm, "graph", None), "nodes", ())
    found = [n.meta.get("example_value", n.meta.get("val")) for n in nodes if n.op == "placeholder"]
    if len(found) == len(example_inputs) and all(v is not None for v in found):
        return found
    return list(example_inputs)


def words(gm: Any, example_inputs: Sequence[Any]) -> str:
    """A graph in a few words: how many operations, its inputs' shapes, whether it is
    compiled for training, and whether its shapes are static."""
    import torch

    nodes = getattr(getattr(gm, "graph", None), "nodes", ())
    operations = sum(node.op in ("call_function", "call_method", "call_module") for node in nodes)
    values = recorded(gm, example_inputs)
    shapes = [tuple(v.shape) for v in values if isinstance(v, torch.Tensor)]
    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
    sizes = [size for shape in shapes for size in shape]
    dynamic = any(isinstance(v, symbolic) for v in [*values, *sizes])
    more = ", ..." if len(shapes) > 3 else ""
    mode = "training" if torch.is_grad_enabled() else "inference"
    return (
        f"graph of {operations} operations on {', '.join(map(str, shapes[:3]))}{more}"
        f" ({mode}, {'dynamic' if dynamic else 'static'} shapes)"
    )


@functools.cache  # one process runs on one machine
def device_model(device: str) -> str:
    """Which model of device ``device`` names here, in words: a CPU's architecture, instruction
    set and model name; an accelerator's own name."""
    import platform

    import torch

    if device != "cpu":
        with contextlib.suppress(Exception):
            return f"{device} {getattr(torch, device).get_device_name()}"
        return device
    name = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        name = next(
            (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), name
        )
    capability = torch.backends.cpu.get_cpu_capability()
    return " ".join(part for part in ("cpu", platform.machine(), capability, name) if part)


def code_digest(module: str, folders: Sequence[str] = ()) -> str | None:
    """A digest of the code of a project's own module, by content (the same in every checkout):
    its file and every module of the project it imports, to the last, as the standard
    library's ``modulefinder`` follows them through the folders the module is found in (a
    module installed, or of the standard library, changes by being installed again: its
    release says which); ``None`` where it is not found."""
    import modulefinder
    import sysconfig

    origin = getattr(find(module, folders, files=True), "origin", None)
    paths = sysconfig.get_paths()
    installed = tuple(os.path.join(paths[k], "") for k in ("stdlib", "purelib", "platlib"))
    if not isinstance(origin, str) or not origin.endswith(".py") or origin.startswith(installed):
        return None
    root = os.path.dirname(origin)  # the folder its top-level package lies in
    for _level in range(module.count(".") + origin.endswith("__init__.py")):
        root = os.path.dirname(root)
    finder = modulefinder.ModuleFinder(path=[*folders, root])
    with contextlib.suppress(Exception):  # a file that does not parse: what was found so far
        finder.import_hook(module)
    files = (getattr(imported, "__file__", None) for imported in finder.modules.values())
    found = {file for file in files if file} | {origin}
    digest = hashlib.sha256()
    for path in sorted(found, key=lambda path: (os.path.relpath(path, root), path)):
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            digest.update(os.path.relpath(path, root).encode() + b"\0" + handle.read() + b"\0")
    return digest.hexdigest()[:16]


def _digest(facts: object) -> str:
    return hashlib.sha256(canonical(facts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
