"""The documentation tells the truth: every session in README.md and docs/ runs as shown.

Each page is read top to bottom, as a reader follows it, in a fresh folder of its own:

- a code block with a title (```` ```toml title="backends.toml" ````) is a file the page sets
  up: it is written there, under that name (a later block of the same name replaces it);
- a ```` ```console ```` block holds sessions: each ``$ torch-backends ...`` line is run in
  this process (``torch_backend_registry._cli.main``), each ``$ python SCRIPT ...`` line (a
  script the page wrote) in an interpreter of its own, its stdout and stderr compared with
  the lines below it (what the processes a command starts print first). ``VAR=value``
  before the command sets the environment (a shell's with this interpreter's virtual
  environment activated: ``python`` is it), ``&&`` chains
  commands as a shell does and ``; echo $?`` prints the exit code;
- a ```` ```pycon ```` block (or a ``python`` one holding ``>>>``) is a Python session: the
  page's sessions run one after the other in one fresh interpreter started in that folder,
  compared as doctest compares (``...`` stands for any text).

The environment is a plain one: no ``TORCH_BACKENDS_*`` variable but those a session sets, a
cache folder of the page's own, and no third-party plugin, so that pages read the same on
every machine (the plugins installed here are denied, through ``TORCH_BACKENDS_DENY``).
The folder a page runs in is shown as ``/path/to/project``. A page that needs a package says
so (``<!-- test: torch -->``), and is skipped where that package is not installed.

Why a runner of its own: pytest's doctest (``--doctest-glob``) and Sybil's evaluators run a
page's Python in the test process, which has imported what the pages show a fresh
interpreter has not; pytest's doctest writes no file and runs no console session; Sybil's
pytest plugin makes each block a test of its own, which ``--dist=worksteal`` hands to another
worker than the blocks it needs above it. Sybil used as a library, its fence reader feeding
an evaluator of ours for each kind of block, took as many lines as this file's loop, and a
dependency more. What a library answers whole is taken from one: markdown-it-py finds the
blocks, doctest compares, multiprocessing starts the interpreters.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import pytest
from markdown_it import MarkdownIt

from . import _doctest_worker, _forked

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: How the folder a page runs in is shown.
PROJECT = "/path/to/project"
#: Seconds one Python session may take (one that compiles included).
PATIENCE = 300

TITLE = re.compile(r'title="(?P<title>[^"]+)"')
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
#: How a session may call the command.
COMMANDS = (("torch-backends",), ("python", "-m", "torch_backend_registry"))


@dataclass
class Block:
    """A fenced code block of a page: its language, title and text, and where it starts."""

    page: str
    line: int
    language: str
    title: str | None
    text: str


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    needs: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def read_page(path: Path) -> Page:
    """The page's code blocks, in order, and what it needs (``<!-- test: torch -->``)."""
    text = path.read_text(encoding="utf-8")
    page = Page(path, needs=set(re.findall(r"<!-- test: ([a-z]+) -->", text)))
    for token in MarkdownIt("commonmark").parse(text):
        if token.type == "fence" and token.map is not None:
            title = TITLE.search(token.info)
            page.blocks.append(
                Block(
                    page.name,
                    token.map[0] + 2,  # the first line inside the fence, counted from 1
                    token.info.split(" ", 1)[0].strip("{}."),
                    title["title"] if title else None,
                    token.content,
                )
            )
    return page


def is_python_session(block: Block) -> bool:
    return block.language in ("pycon", "python") and block.text.lstrip().startswith(">>>")


def _installed_plugins() -> list[str]:
    """The distributions here that declare torch.compile backends (openvino, say)."""
    found = {
        ep.dist.name
        for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")
        if ep.dist is not None
    }
    return sorted(found)


def plain_environment(cache: Path) -> dict[str, str]:
    """The environment the pages are read in (see the module's docstring)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_BACKENDS_")}
    environ["XDG_CACHE_HOME"] = str(cache)
    # As in a shell with the virtual environment activated: `python` is this interpreter.
    environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), environ.get("PATH", "")])
    # Absolute (``PYTHONPATH=src pytest``): a script runs in the page's folder.
    path = environ.get("PYTHONPATH", "").split(os.pathsep)
    environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in path if p)
    plugins = _installed_plugins()
    if plugins:
        environ["TORCH_BACKENDS_DENY"] = ",".join(plugins)
    return environ


# ------------------------------------------------------------------ console sessions


@dataclass
class Session:
    line: int
    command: str
    expected: str


def sessions(block: Block) -> list[Session]:
    """The ``$ command`` lines of a console block, each with the output shown below it."""
    found: list[Session] = []
    for offset, line in enumerate(block.text.splitlines()):
        if line.startswith("$ "):
            found.append(Session(block.line + offset, line[2:], ""))
        elif found:
            found[-1].expected += line + "\n"
        elif line.strip():
            raise AssertionError(f"{block.page}:{block.line}: output before any '$ ' command")
    return found


@contextlib.contextmanager
def fresh_modules(folder: Path) -> Iterator[None]:
    """Forget, after a command, the modules it imported from the page's folder: a command
    runs in a process of its own, where a module the page rewrites is read anew."""
    before = set(sys.modules)
    try:
        yield
    finally:
        inside = str(folder.resolve()) + os.sep
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if os.path.realpath(origin).startswith(inside):
                del sys.modules[name]
        importlib.invalidate_caches()


def run_command(line: str, environ: dict[str, str], where: str) -> str:
    """What a shell would print for ``line``: the commands it chains, each run in-process
    (a script: in an interpreter of its own)."""
    from torch_backend_registry._cli import main

    echo_code = line.endswith("; echo $?")
    line = line.removesuffix("; echo $?")
    out = io.StringIO()
    code = 0
    for part in line.split(" && "):
        words = shlex.split(part)
        env = dict(environ)
        while words and ASSIGNMENT.match(words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        command = next((c for c in COMMANDS if tuple(words[: len(c)]) == c), None)
        if command is not None:
            with (
                mock.patch.dict(os.environ, env, clear=True),
                fresh_modules(Path.cwd()),
                children_output(out),
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(out),
            ):
                try:
                    code = main(words[len(command) :])
                except SystemExit as exit:  # argparse: --help, --version, a usage error
                    code = exit.code if isinstance(exit.code, int) else 1
        elif words[:1] == ["python"]:
            # A script the page wrote, in an interpreter of its own, as a shell runs it.
            ran = subprocess.run(
                [sys.executable, *words[1:]], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, timeout=PATIENCE,
            )  # fmt: skip
            out.write(ran.stdout)
            code = ran.returncode
        else:
            raise AssertionError(f"{where}: the docs tests run only torch-backends and scripts")
        if code != 0:
            break
    shown = out.getvalue()
    if echo_code:
        shown += f"{code}\n"
    return shown


@contextlib.contextmanager
def children_output(out: io.StringIO) -> Iterator[None]:
    """What the processes a command starts print (``tune``'s command), written to ``out``
    first, as a shell shows it before what the command prints once they end."""
    import tempfile

    with tempfile.TemporaryFile() as caught:
        saved = [os.dup(fd) for fd in (1, 2)]
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            os.dup2(caught.fileno(), fd)
        try:
            yield
        finally:
            for fd, kept in zip((1, 2), saved, strict=True):
                os.dup2(kept, fd)
                os.close(kept)
            caught.seek(0)
            out.seek(0)
            said = out.read()
            out.seek(0)
            out.truncate()
            out.write(caught.read().decode("utf-8", "replace") + said)


def normalised(output: str, folder: Path) -> str:
    for spelling in {str(folder.resolve()), str(folder)}:
        output = output.replace(spelling, PROJECT)
    return output


def matches(expected: str, got: str) -> bool:
    import doctest

    checker = doctest.OutputChecker()
    return checker.check_output(expected, got, doctest.ELLIPSIS)


# ------------------------------------------------------------------- Python sessions


class Interpreter:
    """One page's interpreter (see ``_doctest_worker.py``), running its sessions in turn: for
    a page that needs PyTorch, forked from the server that imported it once."""

    def __init__(self, folder: Path, environ: dict[str, str], *, torch: bool) -> None:
        context = _forked.CONTEXT if torch else multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(
            target=_doctest_worker.serve, args=(theirs, folder, environ), daemon=True
        )
        self.process.start()
        theirs.close()

    def run(self, block: Block) -> str:
        """The doctest report of ``block``: empty where it printed what the page shows."""
        where = f"{block.page}:{block.line}"
        try:
            # doctest counts a block's lines from 0 and reports them one up.
            self.connection.send((block.text, block.page, block.line - 1))
            if not self.connection.poll(PATIENCE):
                raise AssertionError(f"{where}: no answer in {PATIENCE} s")
            report: str = self.connection.recv()
        except (EOFError, ConnectionError):  # it ended, with the pipe's end read or not
            self.process.join(PATIENCE)
            raise AssertionError(
                f"{where}: the interpreter ended ({self.process.exitcode})"
            ) from None
        return report

    def close(self) -> None:
        self.connection.close()  # the interpreter ends when it reads the end
        self.process.join(PATIENCE)
        self.process.kill()


# ------------------------------------------------------------------------- the pages


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_session_of_the_page_prints_what_it_shows(path: Path, tmp_path: Path) -> None:
    page = read_page(path)
    missing = sorted(name for name in page.needs if importlib.util.find_spec(name) is None)
    if missing:
        pytest.skip(f"the page needs {', '.join(missing)}")
    folder = tmp_path / "project"
    folder.mkdir()
    environ = plain_environment(tmp_path / "cache")
    failures: list[str] = []
    interpreter: Interpreter | None = None
    before = os.getcwd()
    os.chdir(folder)
    try:
        for block in page.blocks:
            if block.title is not None:
                target = folder / block.title
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.text, encoding="utf-8")
            elif block.language == "console":
                for session in sessions(block):
                    where = f"{page.name}:{session.line}"
                    got = normalised(run_command(session.command, environ, where), folder)
                    if not matches(session.expected, got):
                        failures.append(
                            f"{where}: $ {session.command}\n--- the page shows\n"
                            f"{session.expected}--- it printed\n{got}"
                        )
            elif is_python_session(block):
                if interpreter is None:
                    interpreter = Interpreter(folder, environ, torch="torch" in page.needs)
                report = interpreter.run(block)
                if report:
                    failures.append(normalised(report, folder))
    finally:
        os.chdir(before)
        if interpreter is not None:
            interpreter.close()
    assert not failures, "\n\n".join(failures)


def test_every_page_is_run_and_every_session_is_one_the_tests_can_run() -> None:
    # A console block without a command, or a Python block that is half a session, would
    # be skipped silently: a claim no test checks.
    for path in PAGES:
        for block in read_page(path).blocks:
            where = f"{block.page}:{block.line}"
            if block.language == "console" and block.title is None:
                assert sessions(block), f"{where}: a console block with no '$ ' command"
            if block.language == "pycon":
                assert is_python_session(block), f"{where}: a pycon block with no '>>>'"


# ------------------------------------------------------- what keeps the docs in step


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_generated_from_the_schema_and_the_parser() -> None:
    hooks = _hooks()
    pages = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")}
    markers = [m for text in pages.values() for m in re.findall(r"<!-- generate: (\S+) -->", text)]
    assert sorted(markers) == ["cli", "layers", "manifest"]
    manifest = hooks.manifest_reference()
    schema = json.loads((ROOT / "schemas" / "backends.schema.json").read_text(encoding="utf-8"))
    tables = {"backends": "`[backends.NAME]`", "plugins": "`[plugins]`"}
    keys = [
        *(tables.get(key, f"`{key}`") for key in schema["properties"]),
        *(f"`{key}`" for key in schema["$defs"]["BackendEntry"]["properties"]),
        *(f"`{key}`" for key in schema["$defs"]["Plugins"]["properties"]),
    ]
    assert [key for key in keys if key not in manifest] == []
    cli = hooks.cli_reference()
    for command in ("list", "explain", "check", "doctor", "lock", "schema", "init"):
        assert f"## `torch-backends {command}`" in cli
    for option in ("--no-torch", "--locked", "--import", "--model", "--pyproject"):
        assert f"`{option}" in cli
    layers = hooks.layers_reference()
    for module in ("_api.py", "_registry.py", "_sources/", "_definition.py"):
        assert f"`{module}`" in layers


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py"))
    read = set(re.findall(r"\bTORCH_BACKENDS_[A-Z_]*[A-Z]\b", source))
    documented = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    assert read, "no variable found: the pattern is wrong"
    assert sorted(v for v in read if f"`{v}`" not in documented) == []


def test_contributing_names_every_module_and_subpackage() -> None:
    # The layout changes as the package grows: its tree in CONTRIBUTING.md must follow.
    package = ROOT / "src" / "torch_backend_registry"
    modules = {p.name for p in package.glob("*.py")} - {"__init__.py"}
    folders = {f"{p.parent.name}/" for p in package.glob("*/__init__.py")}
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert sorted(p for p in modules | folders if p not in contributing) == []


def test_readme_is_short_enough_for_the_package_index() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 8 * 1024
