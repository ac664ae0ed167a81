"""A run of doctor: what to probe, and the probe server it shares."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import PathFinder

from .._definition import canonical
from .._errors import BackendRegistryError, ManifestError
from .._forksafe import ForkSafeLock
from .._sources.files import refused_folders
from .._sources.finding import find, installed_stamp, stamp
from .._sources.pytorch import torch_available
from .model import one_line
from .options import ModelError, Options
from .processes import Server
from .verdicts import STATUSES, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._definition import BackendDefinition
    from .._registry import Registry
    from .processes import Progress


def start(registry: Registry, options: Options) -> Server:
    """The probe server for a run of ``options`` on ``registry``, importing PyTorch from now
    on (while this process finds what to probe). One server serves every run of this
    process while its environment, import path and installed packages stay as they were;
    it is the caller's until :func:`run` ends with it."""
    global _WARM
    if not torch_available():
        raise BackendRegistryError("doctor needs PyTorch to compile with: pip install torch")
    _find_model(registry, options.model)
    path = import_path()
    # What PyTorch read of the environment at import is the server's (each probe runs in
    # the environment of its run, see run): another environment needs another server.
    # The registry's own variables are each probe's alone: the server imports PyTorch
    # without autoload (a probe calls install() itself), so it reads none of them.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    read = sorted((k, v) for k, v in environ.items() if not k.startswith(_PER_RUN))
    key = canonical([os.getpid(), read, path, installed_stamp()])
    with _LOCK:
        if _WARM is None or _WARM[0] != key or not _WARM[1].alive():
            try:
                server = Server(path, environ)
            except OSError as exc:  # an environment too large to start a process with, say
                raise BackendRegistryError(f"doctor could not start its probes: {exc}") from exc
            old, _WARM = _WARM, (key, server)
            if old is not None and not old[1].users:
                old[1].close()  # its last run ended: nobody else will
        _WARM[1].users += 1
        return _WARM[1]


#: Variables read only where they are used, so no server of their own: the folders of the
#: XDG standard, and the test pytest runs (which it sets anew for each test).
_PER_RUN = ("XDG_", "PYTEST_CURRENT_TEST")
#: This package's variables (TORCH_BACKENDS_PATH, _AUTOLOAD, ...): never the server's.
_OURS = "TORCH_BACKENDS_"

#: The probe server this process keeps for its next run, under what it was started for.
_WARM: tuple[str, Server] | None = None
_LOCK = ForkSafeLock()


def release(server: Server) -> None:
    """End a use of ``server`` that :func:`start` gave and no :func:`run` ended."""
    with _LOCK:
        server.users -= 1
        if not server.users and (_WARM is None or _WARM[1] is not server):
            server.close()


def _stop() -> None:
    if _WARM is not None:
        _WARM[1].close()


def _forget() -> None:
    """In a forked child: the parent's server is the parent's (closing it would end it)."""
    global _WARM
    _WARM = None


if hasattr(os, "register_at_fork"):  # POSIX: where probes fork
    os.register_at_fork(after_in_child=_forget)
atexit.register(_stop)


def run(
    registry: Registry,
    names: Sequence[str] | None,
    options: Options,
    on_progress: Progress | None = None,
    server: Server | None = None,
) -> list[Verdict]:
    """Probe ``names`` (default: every listed backend), side by side where cores allow; a
    name and its alias once. An interruption kills every probe of this run. ``server``:
    what :func:`start` gave for the same registry and options (this run ends its use)."""
    options = options.checked()
    if isinstance(names, str):  # doctor("inductor"): one name, not eight of one letter
        names = [names]
    on_progress = on_progress or (lambda *_: None)
    server = server or start(registry, options)
    try:
        names = list(dict.fromkeys(names if names is not None else registry.list_backends()))
        # Each name -> its definition (unknown names fail here). One a manifest declares but
        # not as something usable has that as its verdict, and the others are probed.
        defined: dict[str, BackendDefinition] = {}
        results: dict[str, Verdict] = {}
        for name in names:
            try:
                defined[name] = registry.backend_info(name).definition
            except ManifestError as exc:
                results[name] = Verdict(name, "import-error", 2, one_line(exc))
        for name, definition in defined.items():
            if definition.source.kind == "runtime":
                raise BackendRegistryError(
                    f"backend {name!r} is registered at runtime in this process, which no probe"
                    " shares: declare it in a manifest to probe it"
                )
        # Each name -> the first name asked of its backend, which is probed for both.
        first = {name: next(n for n in defined if defined[n] == d) for name, d in defined.items()}
        first.update((name, name) for name in results)
        model_path, _stamp = _find_model(registry, options.model)
        todo = [name for name in defined if first[name] == name]
        broken = server.wait_ready() if todo else None
        if broken is not None:
            for name in todo:  # no probe ran: nothing to remember
                results[name] = Verdict(name, "crashed", 0, f"the probe could not start: {broken}")
        elif todo:
            context = registry.context
            config = {  # how each probe of this run goes
                "workdir": os.getcwd(),
                "process_environ": dict(os.environ),
                "registry": {  # what the probe builds the registry again from
                    "cwd": context.cwd,
                    "environ": dict(context.environ),
                    "files": context.files,
                    "sources": registry.sources,
                },
                "model_path": model_path,
                **options._asdict(),
            }
            # Timing wants the machine alone; otherwise two at once, or one a core pair.
            jobs = options.jobs or (1 if options.bench else max(2, (os.cpu_count() or 1) // 2))
            pool = ThreadPoolExecutor(max_workers=min(jobs, len(todo)))
            try:
                futures = [pool.submit(server.probe, n, config, on_progress, pool) for n in todo]
                for name, future in zip(todo, futures, strict=True):
                    results[name], _code, _missing = future.result()
            except BaseException:  # a bad model, an interruption: nothing more is started or left
                pool.shutdown(wait=False, cancel_futures=True)
                server.kill(owner=pool)  # this run's probes; another run's go on
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        # A verdict for each name asked (an alias's is its backend's), best first.
        verdicts = (dataclasses.replace(results[first[name]], name=name) for name in names)
        return sorted(
            verdicts, key=lambda v: (STATUSES.index(v.status), -(v.speedup or 0.0), v.name)
        )
    finally:
        release(server)


def import_path() -> list[str]:
    """This process's import path, less the working folder ``python -m`` or ``-c`` put first:
    a probe imports what the registry would here, and nothing a folder it runs in offers."""
    path = list(sys.path)
    main = sys.modules.get("__main__")
    if path and getattr(main, "__spec__", None) is not None:  # python -m: path[0] is the cwd
        with contextlib.suppress(OSError):  # no working folder: none to leave out
            if os.path.realpath(path[0]) == os.path.realpath(os.getcwd()):
                path = path[1:]
    return [entry for entry in path if entry]  # "": the working folder, as -c puts it


def _find_model(registry: Registry, spec: str | None) -> tuple[list[str], object]:
    """Where the model's module is (a python-path folder, or ``[]`` for the import path)
    and its file's stamp."""
    if spec is None:
        return [], None
    module, _, factory = spec.partition(":")
    if not module or not factory:
        raise ModelError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. my_models:make")
    every = [
        folder
        for d in registry.definitions((), with_torch=False)
        if d.source.path is not None
        for folder in d.search_path
    ]
    refused = refused_folders(dict.fromkeys(every))  # as a lookup of its backend refuses them
    folders = [folder for folder in every if folder not in refused]
    # As the probe finds it: on its import path (this one's, less the working folder),
    # else in a folder a manifest's backends search (a model beside the manifest included).
    top = module.split(".")[0]
    try:  # on this import path alone, past any finder of this process's
        on_path = (sys.modules.get(top) or PathFinder.find_spec(top, import_path())) is not None
    except (ImportError, ValueError):
        on_path = False
    path = [] if on_path else [f for f in dict.fromkeys(folders) if find(top, [f]) is not None][:1]
    found = find(module, path) if on_path or path else None
    origin = getattr(found, "origin", None)
    if not isinstance(origin, str):  # not found, or no file of its own
        why = [message for folder, message in refused.items() if find(top, [folder])]
        raise ModelError(
            f"--model {spec!r}: no module {module!r} on the import path or in a python-path"
            " folder" + "".join(f" ({message})" for message in why)
        )
    # Built into Python or frozen, [origin] alone: it changes with Python.
    return path, stamp(origin) if os.path.isfile(origin) else [origin]
