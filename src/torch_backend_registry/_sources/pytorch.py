"""PyTorch's own registry, read as a source: its backends, its names, its version.

Whether torch is installed, its version and its own backends' names are known without
importing it; torch is imported only when its backends are asked for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Collection, Mapping
from typing import Any

from .._definition import BackendDefinition, Discovery, Source, target_of
from .._errors import warn
from .._forksafe import ForkSafeLock, importing_at_fork
from .cache import NO_CACHE, Cache, stamps
from .finding import find

#: What PyTorch's own backends need and are, which their functions do not say:
#: name -> (modules they import when called, description).
_KNOWN: dict[str, tuple[tuple[str, ...], str]] = {
    "inductor": ((), "PyTorch's default compiler, TorchInductor"),
    "cudagraphs": ((), "records the graph as a CUDA graph and replays it"),
    "tvm": (("tvm",), "Apache TVM"),
    "openxla": (("torch_xla",), "PyTorch/XLA through AOTAutograd"),
    "openxla_eval": (("torch_xla",), "PyTorch/XLA, inference only"),
    "onnxrt": (("onnxruntime",), "ONNX Runtime"),
    "eager": ((), "runs the captured graph as it is (for debugging)"),
    "aot_eager": ((), "AOTAutograd tracing, then eager (for debugging)"),
    "aot_eager_default_partitioner": ((), "aot_eager with the default partitioner"),
    "aot_eager_decomp_partition": ((), "aot_eager with decompositions and partitioning"),
    "aot_ts": ((), "AOTAutograd with TorchScript (for debugging)"),
    "ts": ((), "TorchScript (for debugging)"),
}

#: The names PyTorch's own backends take in torch 2.13: the answer only where torch is not
#: installed (or its source cannot be read); else :func:`pytorch_names` reads them.
TORCH_2_13_NAMES = frozenset(
    """
    aot_eager aot_eager_decomp_partition aot_eager_decomp_partition_crossref
    aot_eager_decomp_partition_with_mode aot_eager_default_partitioner aot_ts cudagraphs
    dynamo_accuracy_minifier_backend dynamo_minifier_backend eager eager_debug eager_noexcept
    inductor invoke_subgraph non_leaf_compile_error_TESTING_ONLY openxla openxla_eval
    pre_dispatch_eager relu_accuracy_error_TESTING_ONLY relu_compile_error_TESTING_ONLY
    relu_runtime_error_TESTING_ONLY ts tvm
    """.split()  # noqa: SIM905 - names to read, not a list to edit
)

#: What PyTorch registers its own backends with, as a decorator or a call.
_REGISTERING = {"register_backend", "register_debug_backend", "register_experimental_backend"}


def pytorch_names(cache: Cache = NO_CACHE) -> frozenset[str]:
    """The names PyTorch's own backends take in the PyTorch installed here, which no other
    source may redefine: read from the files that register them, without importing torch,
    remembered in ``cache`` and for the rest of the process while the files stay as read."""
    global _last
    files = _registering_files()
    read = [files, stamps(files)]
    last = _last
    if last is None or last[0] != read:
        # The reading is this package's code: another version of it reads anew.
        names = cache.remembered("pytorch-names", [torch_version(), read], lambda: _read(files))
        # None read: no torch here, or a layout this reading does not know.
        last = _last = (read, names or TORCH_2_13_NAMES)
    return last[1]


#: The last reading of PyTorch's files, with their stamps: one, whatever the number of
#: refreshes and the caches they bring (an upgrade of PyTorch in place replaces it).
_last: tuple[list[object], frozenset[str]] | None = None


def _read(files: list[str]) -> frozenset[str]:
    with _PARSING:  # CPython's parser is not safe to run in two threads at once
        return frozenset(name for path in files for name in _registered_in(path))


_PARSING = ForkSafeLock()


def _registering_files() -> list[str]:
    """The files PyTorch's registry imports to register its own backends, as its
    ``_lazy_import`` does: ``torch/_dynamo/backends/*.py`` and the minifier's backends."""
    if not isinstance(origin := getattr(find("torch"), "origin", None), str):  # its __init__.py
        return []
    import glob

    dynamo = os.path.join(os.path.dirname(origin), "_dynamo")
    files = sorted(glob.glob(os.path.join(glob.escape(dynamo), "backends", "*.py")))
    return [*files, os.path.join(dynamo, "repro", "after_dynamo.py")]


def _registered_in(path: str) -> set[str]:
    """The names the registrations in one file give: the name given (by keyword or second
    argument), else the registered function's own; a name that is not written out as a
    string is not known, and left out rather than guessed."""
    import ast

    try:
        with open(path, "rb") as f:
            source = f.read()
        # A file that names no registering function registers nothing (an alias is
        # imported by its name too): most of dynamo's backend modules are not parsed.
        if not any(name.encode() in source for name in _REGISTERING):
            return set()
        tree = ast.parse(source, path)
    except (OSError, SyntaxError, ValueError):
        return set()

    def called(node: ast.expr) -> str | None:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)

    def keyword(node: ast.Call, name: str) -> ast.expr | None:
        return next((k.value for k in node.keywords if k.arg == name), None)

    def given(node: ast.Call) -> ast.expr | None:
        return node.args[1] if len(node.args) > 1 else keyword(node, "name")

    nodes = list(ast.walk(tree))
    registering = set(_REGISTERING)
    for node in nodes:  # from .registry import register_backend as ...
        if isinstance(node, ast.ImportFrom):
            registering.update(a.asname for a in node.names if a.name in _REGISTERING and a.asname)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Call) and called(node.func) in registering:
            name = given(node)  # a decorator's too: @register_backend(name="x")
            fn = node.args[0] if node.args else keyword(node, "compiler_fn")
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                names.add(name.value)
            elif name is None and isinstance(fn, ast.Name):
                names.add(fn.id)  # register_backend(fn): the function's own name
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for decorator in node.decorator_list:  # giving no name: the function's own
                if isinstance(decorator, ast.Call) and given(decorator) is None:
                    decorator = decorator.func  # @register_backend(tags=...)
                if called(decorator) in registering:
                    names.add(node.name)
    return names


#: The attribute that marks what this library put into PyTorch's registry (the
#: torch bridge's stand-ins): another source's backend, not PyTorch's own.
STAND_IN = "__torch_backend_registry__"


def inductor() -> Any:
    """PyTorch's own ``inductor`` backend function, where torch.compile's backends are loaded."""
    return getattr(sys.modules.get("torch._dynamo.backends.inductor"), "inductor", None)


def torch_available() -> bool:
    return find("torch") is not None


@functools.cache  # one process runs one PyTorch
def torch_version() -> str | None:
    """The installed PyTorch's version, as ``torch.__version__`` gives it, not importing it."""
    if isinstance(version := getattr(sys.modules.get("torch"), "__version__", None), str):
        return version
    import re

    if not isinstance(origin := getattr(find("torch"), "origin", None), str):
        return None
    with contextlib.suppress(OSError):  # else installed as byte code only, or from a zip
        with open(os.path.join(os.path.dirname(origin), "version.py"), encoding="utf-8") as f:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.MULTILINE)
        if found is not None:
            return found.group(1)
    import importlib.metadata  # its metadata says

    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version("torch")
    return None


def dynamo_imported() -> bool:
    """Whether torch.compile's registry is in this process, imported whole (no import; a
    module another thread is still importing is not: reading it could wait on that
    thread's import, for ever in the child of a fork)."""
    module = sys.modules.get("torch._dynamo")
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def registry_readable() -> bool:
    """Whether PyTorch's registry can be read whole now: not while this thread is inside
    ``torch._dynamo``'s own import (code that import runs, autoload's install() among it,
    would read a registry half made, and importing its backends then imports modules not
    yet whole), nor ever in a process forked while another thread imported it (that import
    never ends there: said once). Another thread's import of it is waited for; where it is
    not imported yet, reading imports it whole."""
    if sys.modules.get("torch._dynamo") is None or dynamo_imported():
        return True
    if importing_at_fork("torch._dynamo"):
        warn(
            "PyTorch's backends are left out: this process was forked while another thread"
            " imported torch._dynamo, an import that cannot end in it"
        )
        return False
    import torch._dynamo  # noqa: F401 - another thread's import: this waits for it to end

    return dynamo_imported()  # still not: the import under way is this thread's own


#: Where PyTorch keeps its registry (see :func:`loaded_backends`).
REGISTRY_MODULE = "torch._dynamo.backends.registry"


def loaded_backends(module: Any) -> dict[str, Any] | None:
    """PyTorch's dict of the backends it has loaded, by name, in the registry ``module``:
    ``_COMPILER_FNS`` (``_BACKENDS`` beside it holds entry points), or where there is none
    (torch 2.0 and 2.1, which read no entry points) ``_BACKENDS``, which holds the functions;
    ``None`` in a layout where neither is such a dict."""
    if isinstance(found := getattr(module, "_COMPILER_FNS", None), dict):
        return found
    found = getattr(module, "_BACKENDS", None)
    if isinstance(found, dict) and all(callable(fn) for fn in found.values()):
        return found
    return None


#: Plugins' own registrations (``torch._dynamo.register_backend`` at import) of a name this
#: library's stand-in holds in PyTorch's registry, kept here instead (see ``_torch``): they
#: are still PyTorch's registry's definitions of that name, shadowed by the registry's.
DISPLACED: dict[str, Any] = {}


def registered(entry_points: Collection[str]) -> dict[str, Any] | None:
    """What PyTorch's registry holds now, by name: what it has loaded, less ``entry_points``
    and this library's stand-ins, with the registrations a stand-in displaced; ``None`` while
    ``torch._dynamo`` is not imported. Dict reads: an entry point PyTorch knows of but has not
    loaded (a plugin since upgraded or removed, say) is neither loaded nor looked at."""
    module: Any = sys.modules.get(REGISTRY_MODULE)
    if module is None or not dynamo_imported():
        return None
    # None: a layout not known here, asked by name, each alone.
    if (found := loaded_backends(module)) is None:
        dynamo: Any = sys.modules.get("torch._dynamo")
        found = {}
        with contextlib.suppress(Exception):
            for name in dynamo.list_backends(exclude_tags=()):
                if name not in entry_points:  # looking one up would import its plugin
                    with contextlib.suppress(Exception):
                        found[name] = dynamo.lookup_backend(name)
    return DISPLACED | {
        name: fn
        for name, fn in found.items()
        if name not in entry_points and getattr(fn, STAND_IN, False) is not True
    }


def tags_of(name: str, fn: object) -> tuple[str, ...]:
    """The tags PyTorch's registry holds for backend ``name``: on the function (torch 2.13
    and before, and what this library sets on a registration it keeps aside), else in the
    registry's ``_BACKEND_TAGS`` (torch 2.14)."""
    if (tags := getattr(fn, "_tags", None)) is None:
        table = getattr(sys.modules.get(REGISTRY_MODULE), "_BACKEND_TAGS", None)
        tags = table.get(name, ()) if isinstance(table, dict) else ()
    return tuple(tag for tag in tags if isinstance(tag, str))


def own(fn: object) -> bool:
    """Whether a callable in PyTorch's registry is one of PyTorch's own backends (defined in
    torch) rather than a plugin's registered there."""
    module = getattr(fn, "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def torch_definitions(entry_points: Collection[str]) -> Discovery:
    """What PyTorch's registry holds: its own backends, and what plugins registered there
    with ``torch._dynamo.register_backend`` (not its entry points, not this library's
    stand-ins). Imports ``torch._dynamo``; a broken torch leaves them out with a warning."""
    found = Discovery()
    if not torch_available():
        return found
    try:
        import torch._dynamo as dynamo

        dynamo.list_backends(exclude_tags=())  # PyTorch reads its own backends now
        held = registered(entry_points) or {}
    except Exception as exc:  # a broken torch must not break manifest backends
        warn(f"PyTorch's backends are left out: torch._dynamo failed: {type(exc).__name__}: {exc}")
        return found
    owners: Mapping[str, list[str]] = {}
    if not all(map(own, held.values())):  # a plugin's registration: whose is it?
        from importlib.metadata import packages_distributions

        with contextlib.suppress(Exception):  # an unreadable distribution: none is known
            owners = packages_distributions()
    for name, fn in sorted(held.items()):
        requires, description = _KNOWN.get(name, ((), None))
        module = getattr(fn, "__module__", None)
        # A plugin's own registration is of its distribution: the plugin policy holds for it.
        top = module.split(".")[0] if isinstance(module, str) and not own(fn) else ""
        # For a wrapper object, what it wraps.
        target = target_of(fn) or target_of(
            getattr(fn, "func", None) or getattr(fn, "kwargs", {}).get("fw_compiler")
        )
        found.definitions.append(
            BackendDefinition(
                name,
                Source("torch", module=module, distribution=next(iter(owners.get(top, ())), None)),
                target=target,
                tags=tags_of(name, fn),
                description=description,
                requires=requires,
                compiler_fn=fn,
            )
        )
    return found


def missing_device(name: str) -> str | None:
    """The device one of PyTorch's own backends needs and this machine lacks: cudagraphs
    alone needs one, CUDA."""
    if name != "cudagraphs":
        return None
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA device; none is available here"
