"""Shared fixtures: real manifests in tmp_path, real dist-info folders on sys.path."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import subprocess
import sys
import textwrap
import traceback
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import Registry
from torch_backend_registry._api import default_registry
from torch_backend_registry._cli import main

NO_TORCH = ("runtime", "env", "project", "entry-point")

# Inductor compiles in the process that asks, not in the pool of workers it starts by
# default (on 2 cores, a fresh interpreter that imports torch: some 3 s of CPU for each
# process of the suite that compiles with inductor, more than its small graphs take to
# compile). What inductor compiles is the same; every process a test starts inherits it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _installed_plugins() -> frozenset[str]:
    import importlib.metadata

    return frozenset(
        ep.name for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")
    )


#: The backend names real plugins installed here declare (openvino's, iree-turbine's):
#: listings show them beside a test's own.
PLUGINS = _installed_plugins()

WriteFn = Callable[..., Path]


def run_python(
    code: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a clean ``sys.modules``); fail if it fails.

    ``env`` adds to this process's environment, less ``TORCH_BACKENDS_PATH``.
    """
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return done


def run_forked(
    code: str, cwd: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> Done:
    """Run ``code`` as ``python -c`` would, in a process of its own that has imported
    PyTorch (torch, torch.distributed, torch._dynamo; see ``_forked.py``) and nothing of
    this package's registry: for what only a new process shows, once torch is imported.
    ``env`` adds to this process's environment, less ``TORCH_BACKENDS_PATH``."""
    from . import _forked

    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    return Done(*_forked.python(code, cwd, {**environ, **(env or {})}, args))


def free_port() -> int:
    """A port of the loopback address no process listens on now (a job's store takes it)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run_ranks(
    code: str, cwd: Path, env: dict[str, str], args: tuple[str, ...] = (), world: int = 2
) -> list[Done]:
    """Run ``code`` in ``world`` processes forked as :func:`run_forked`'s are, side by side, as
    torchrun starts a job's ranks on one machine: each with its ``RANK`` and the job's
    ``WORLD_SIZE``, ``MASTER_ADDR`` (the loopback address) and ``MASTER_PORT`` in ``env``, so
    that ``init_process_group("gloo")`` meets the others; what each rank ended with."""
    from . import _forked

    job = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    envs = [{**environ, **env, **job, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(world)]
    return [Done(*done) for done in _forked.side_by_side(code, cwd, envs, args)]


class Done(NamedTuple):
    """What a run of the command left: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def torch_backends(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    check: int | None = 0,
    fresh: bool = False,
) -> Done:
    """Run ``torch-backends ARGS`` in ``cwd`` as ``python -m torch_backend_registry`` would:
    in this process, through ``main()`` (``fresh``: in an interpreter of its own, for what
    only a new process shows), with ``env`` added to the environment less
    ``TORCH_BACKENDS_PATH``; the modules it imported from outside the installed packages are
    forgotten after it, as they would be with the process."""
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    environ.update(env or {})
    if fresh:
        ran = subprocess.run(
            [sys.executable, "-m", "torch_backend_registry", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=environ,
        )
        done = Done(ran.returncode, ran.stdout, ran.stderr)
    else:
        done = _in_process(list(args), cwd, environ)
    if check is not None:
        assert done.returncode == check, done.stdout + done.stderr
    return done


def _in_process(args: list[str], cwd: Path, environ: dict[str, str]) -> Done:
    main_module = sys.modules["__main__"]
    saved = (dict(os.environ), list(sys.path), set(sys.modules), os.getcwd(), main_module.__spec__)
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        # As `python -m` does: the working folder first, then PYTHONPATH's folders, and
        # __main__ has the spec of the module run (so doctor finds the import path it
        # would, less that folder).
        extra = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [str(cwd), *extra, *sys.path]
        main_module.__spec__ = importlib.util.find_spec("torch_backend_registry.__main__")
        importlib.invalidate_caches()  # files a test just wrote are found
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse: --help, --version, a usage error
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:  # --debug: what Python prints of an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        environ_before, path_before, modules_before, cwd_before, main_module.__spec__ = saved
        os.chdir(cwd_before)
        os.environ.clear()
        os.environ.update(environ_before)
        sys.path[:] = path_before
        # A module of the run's own folders goes; one with no file stays (torch._C._dynamo
        # and the like: taken away, torch could not import them again).
        for name in set(sys.modules) - modules_before:
            file = getattr(sys.modules[name], "__file__", None)
            if isinstance(file, str) and not file.startswith(_INSTALLED):
                del sys.modules[name]
    return Done(code, out.getvalue(), err.getvalue())


#: Where installed packages and this one live: what a run imported from there stays imported.
_INSTALLED = (sys.prefix, sys.base_prefix, str(Path(tbr.__file__).parent))


NOBODY = 65534


def run_as_nobody(code: str) -> str:
    """Run ``code`` in a process of its own that gave up root; the ``result`` it leaves, as
    text.

    Root reads every file: permission tests need a process that cannot. The process is
    forked from the server of ``_forked.py`` (one thread: a fork of this process, which
    pytest-xdist runs threads in, could deadlock).
    """
    from . import _forked

    reader, writer = _forked.CONTEXT.Pipe(duplex=False)
    child = _forked.CONTEXT.Process(target=_as_nobody, args=(code, writer))
    child.start()
    writer.close()
    try:
        result: str = reader.recv()
    except EOFError:
        result = f"child failed: it ended with {child.exitcode} and said nothing"
    child.join()
    return result


def _as_nobody(code: str, said: Connection) -> None:
    # Nobody cannot read what lies below /root (the interpreter's own library, where pyenv
    # installs it): what reading a manifest imports is imported while root still can.
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "m.toml").write_text('[backends.b]\ntarget = "m:f"\n', encoding="utf-8")
        environ = {"TORCH_BACKENDS_PATH": folder, "TORCH_BACKENDS_NO_CACHE": "1"}
        Registry(environ=environ, sources=("env",)).list_backends()
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    scope: dict[str, object] = {}
    try:
        exec(code, scope)
        result = str(scope["result"])
    except BaseException as exc:
        result = f"child failed: {type(exc).__name__}: {exc}"
    said.send(result)


@pytest.fixture(autouse=True)
def _own_cache_folder(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test (and the commands it runs) keeps its cache in a folder of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def write(tmp_path: Path) -> WriteFn:
    """Write a dedented text file under tmp_path and return its path."""

    def _write(relative: str, text: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return _write


@pytest.fixture
def module_name() -> str:
    """A fresh importable module name, so tests never share sys.modules entries."""
    return f"tbr_test_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Write a real module into a folder on sys.path; forget it afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    made: list[str] = []

    def _make(name: str, source: str) -> str:
        (root / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        importlib.invalidate_caches()
        made.append(name)
        return name

    yield _make
    for name in made:
        sys.modules.pop(name, None)


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Install a distribution the way pip leaves it: a real ``*.dist-info`` on sys.path."""
    site = tmp_path / "dists"
    site.mkdir(exist_ok=True)
    monkeypatch.syspath_prepend(str(site))

    def _make(name: str, version: str, entry_points: dict[str, str]) -> Path:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
        )
        lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
        (info / "entry_points.txt").write_text(
            f"[torch_dynamo_backends]\n{lines}", encoding="utf-8"
        )
        importlib.invalidate_caches()
        return info

    return _make


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    """An isolated registry: tmp_path as working directory, an empty environment, manifests only."""
    return Registry(cwd=tmp_path, environ={}, sources=("runtime", "env", "project"))


@pytest.fixture
def clean_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The module-level registry, pointed at tmp_path and emptied before and after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCH_BACKENDS_PATH", raising=False)
    _forget_runtime(default_registry)
    tbr.refresh()
    yield default_registry
    _forget_runtime(default_registry)
    tbr.refresh()


def _forget_runtime(registry: Registry) -> None:
    for definition in registry.definitions(exclude_tags=(), with_torch=False):
        if definition.source.kind == "runtime":
            registry.unregister_backend(definition.name)
