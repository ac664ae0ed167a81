"""Processes forked from a server that imported PyTorch once (multiprocessing's forkserver),
so that a test which needs a process of its own after ``import torch`` does not pay two
seconds of CPU for the import each time.

The server imports torch, torch.distributed and torch._dynamo: what a training script has
imported before it calls this package. So this package is as ``import torch`` leaves it in
any process: its autoload hook loaded (off: autoload is read at that import, so a test of
autoload needs a fresh interpreter), nothing discovered. A process starts as ``python -c``
would in its folder: that folder is the working directory, the environment is the one given
(nothing of the server's), its ``PYTHONPATH`` leads the import path.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import traceback
from pathlib import Path

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])


def start(folder: Path, env: dict[str, str]) -> None:
    """In a forked process: begin as ``python`` would in ``folder`` with ``env``."""
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def python(
    code: str, cwd: Path, env: dict[str, str], args: tuple[str, ...] = (), timeout: float = 120
) -> tuple[int, str, str]:
    """Run ``code`` as ``python -c CODE ARGS`` in ``cwd`` with ``env``; its exit code, stdout
    and stderr. A process not done within ``timeout`` seconds is killed and fails the test."""
    with tempfile.TemporaryDirectory() as said:
        out, err = Path(said, "stdout"), Path(said, "stderr")
        process = CONTEXT.Process(target=_run, args=(code, args, cwd, env, out, err))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise AssertionError(f"the process did not end within {timeout} s")
        assert process.exitcode is not None
        return process.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace")


def _run(
    code: str, args: tuple[str, ...], cwd: Path, env: dict[str, str], out: Path, err: Path
) -> None:
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    start(cwd, env)
    sys.path.insert(0, "")  # as -c puts it: the working folder
    sys.argv = ["-c", *args]
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
