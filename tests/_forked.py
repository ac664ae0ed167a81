"""Processes forked from a server that imported PyTorch once (multiprocessing's forkserver),
so that a test which needs a process of its own after ``import torch`` does not pay two
seconds of CPU for the import each time.

The server imports torch, torch.distributed and torch._dynamo: what a training script has
imported before it calls this package; and inductor's compiler, which a first compile with
inductor imports (a second of CPU more in each process that compiles with it). So this
package is as ``import torch`` leaves it in any process: its autoload hook loaded (off:
autoload is read at that import, so a test of autoload needs a fresh interpreter), nothing
discovered. A process starts as ``python -c`` would in its folder: that folder is the
working directory, the environment is the one given (nothing of the server's), its
``PYTHONPATH`` leads the import path.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(
    ["torch", "torch.distributed", "torch._dynamo", "torch._inductor.compile_fx"]
)


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
    [done] = side_by_side(code, cwd, [env], args, timeout)
    return done


def side_by_side(
    code: str,
    cwd: Path,
    envs: list[dict[str, str]],
    args: tuple[str, ...] = (),
    timeout: float = 120,
) -> list[tuple[int, str, str]]:
    """Run ``code`` as :func:`python` does in a process for each environment of ``envs``, all
    at once (the ranks of a job); what each ended with, in that order. If any is not done
    within ``timeout`` seconds, every one is killed and the test fails."""
    with tempfile.TemporaryDirectory() as said:
        runs = []
        for n, env in enumerate(envs):
            out, err = Path(said, f"stdout{n}"), Path(said, f"stderr{n}")
            process = CONTEXT.Process(target=_run, args=(code, args, cwd, env, out, err))
            process.start()
            runs.append((process, out, err))
        deadline = time.monotonic() + timeout
        for process, _out, _err in runs:
            process.join(max(0.0, deadline - time.monotonic()))
        if any(process.is_alive() for process, _out, _err in runs):
            for process, _out, _err in runs:
                process.kill()
                process.join()
            raise AssertionError(f"a process did not end within {timeout} s")
        ended = []
        for process, out, err in runs:
            assert process.exitcode is not None
            ended.append(
                (process.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace"))
            )
        return ended


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
