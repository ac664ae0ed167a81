"""A run of doctor: what to probe, and the probes side by side."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import PathFinder

from .._definition import BackendDefinition
from .._errors import BackendRegistryError, ManifestError
from .._identity import reach
from .._registry import Registry
from .._sources.files import refused_folders
from .._sources.finding import find
from .._sources.pytorch import torch_available
from .options import PROJECT, ModelError, Options
from .processes import Progress, import_path, run_probe, start_server
from .verdicts import STATUSES, Verdict, one_line


def run(
    registry: Registry,
    names: Sequence[str] | None,
    options: Options,
    on_progress: Progress | None = None,
) -> list[Verdict]:
    """Probe ``names`` (default: what the project declares, and what that reaches), side by
    side where cores allow; a name and its alias once. An interruption kills every probe of
    this run."""
    options = options.checked()
    if not torch_available():
        raise BackendRegistryError("doctor needs PyTorch to compile with: pip install torch")
    start_server()  # PyTorch imports there while this process finds what to probe
    if isinstance(names, str):  # doctor("inductor"): one name, not eight of one letter
        names = [names]
    via = {} if names is not None else project(registry)
    names = list(dict.fromkeys(names if names is not None else via))
    # Each name -> its definition (unknown names fail here). One a manifest declares but
    # not as something usable has that as its verdict, and the others are probed.
    defined: dict[str, BackendDefinition] = {}
    results: dict[str, Verdict] = {}
    for name in names:
        try:
            defined[name] = registry.backend_info(name).definition
        except ManifestError as exc:
            results[name] = Verdict(name, "import-error", 2, one_line(exc))
        if name in defined and defined[name].source.kind == "runtime":
            raise BackendRegistryError(
                f"backend {name!r} is registered at runtime in this process, which no probe"
                " shares: declare it in a manifest to probe it"
            )
    # Each name -> the first name asked of its backend, which is probed for both.
    first = {name: next(n for n in defined if defined[n] == d) for name, d in defined.items()}
    first.update((name, name) for name in results)
    todo = [name for name in defined if first[name] == name]
    config = {  # how each probe of this run goes, on a pipe: never a command line
        "path": import_path(),
        "environ": dict(os.environ),
        "registry": {  # what the probe builds the registry again from
            "cwd": registry.context.cwd,
            "environ": dict(registry.context.environ),
            "files": registry.context.files,
            "sources": registry.sources,
        },
        "model_path": _find_model(registry, options.model),
        **options._asdict(),
    }
    # Two at once, or one a core pair.
    jobs = options.jobs or max(2, (os.cpu_count() or 1) // 2)
    stop = threading.Event()
    probe = functools.partial(run_probe, config, on_progress or (lambda *_: None), stop)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
        try:
            done = list(pool.map(probe, todo))
        except BaseException:  # a bad model, an interruption: nothing more is started or left
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    results.update(zip(todo, done, strict=True))
    verdicts = [dataclasses.replace(results[first[n]], name=n, via=via.get(n)) for n in names]
    return sorted(verdicts, key=lambda v: (STATUSES.index(v.status), v.name))  # best first


def project(registry: Registry) -> dict[str, str | None]:
    """What doctor probes given no names: each backend the project's manifests declare
    (``None``), then each backend those run, chain members and ``by-device`` entries, to the
    last, with the first backend that reached it."""
    declared = registry.definitions((), with_torch=False, broken=True)
    found: dict[str, str | None] = {d.name: None for d in declared if d.source.kind in PROJECT}
    index = registry.index(with_torch=False)  # PyTorch's names are known without it
    for root in list(found):
        definition = index.get(root)  # None: it cannot be used, and its own verdict says why
        members = reach(index, definition) if definition is not None else {}
        for member, resolved in members.items():
            # One that resolves to nothing here, its chain skips.
            if resolved is not None or index.could_be_pytorch(member):
                found.setdefault(member, root)
    return found


def _find_model(registry: Registry, spec: str | None) -> list[str]:
    """Where the model's module is: ``[]`` on the import path (less the working folder),
    else the python-path folder of a manifest's backends that holds it."""
    if spec is None:
        return []
    module, _, factory = spec.partition(":")
    if not module or not factory:
        raise ModelError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. my_models:make")
    # A manifest's backends search folders; the others (entry points, PyTorch's) none.
    every = [folder for d in registry.definitions((), with_torch=False) for folder in d.search_path]
    refused = refused_folders(dict.fromkeys(every))  # as a lookup of its backend refuses them
    top = module.split(".")[0]
    # Importable on this import path alone, past any finder of this process's?
    with contextlib.suppress(ImportError, ValueError):
        if (sys.modules.get(top) or PathFinder.find_spec(top, import_path())) is not None:
            return []
    for folder in dict.fromkeys(f for f in every if f not in refused):
        if find(module, [folder]) is not None:  # its package first, as import looks
            return [folder]
    why = "".join(f" ({message})" for folder, message in refused.items() if find(top, [folder]))
    raise ModelError(
        f"--model {spec!r}: no module {module!r} on the import path or in a python-path folder{why}"
    )
