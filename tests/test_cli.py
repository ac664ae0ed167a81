"""The torch-backends command, driven as a user would: its `main()` on real files (a
subprocess where only a fresh interpreter shows the behaviour)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from torch_backend_registry import Registry, Verdict
from torch_backend_registry._cli.files import pyproject_starter, schema_text, starter

from .conftest import PLUGINS, WriteFn, run_python, torch_backends

run = torch_backends  # the command, as every test here runs it

ROOT = Path(__file__).resolve().parent.parent


PROJECT = """
[backends.fast]
target = "my_pkg.compilers:fast"
description = "Fast one"
aliases = ["f"]

[backends.dbg]
target = "my_pkg.compilers:dbg"
tags = ["debug"]

[backends.trt]
target = "my_pkg.compilers:trt"
requires = ["no_such_module_xyz"]

[backends.portable]
chain = ["trt", "fast"]
"""


def test_help_and_version(tmp_path: Path) -> None:
    done = run("--help", cwd=tmp_path)
    for command in ("list", "explain", "check", "schema", "init"):
        assert command in done.stdout
    version = run("--version", cwd=tmp_path).stdout
    assert version.startswith("torch-backends ")
    assert version.split()[1][0].isdigit()


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("torch-backends")
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0
    assert "usage: torch-backends" in done.stdout


def test_the_shell_completes_commands_and_backend_names(tmp_path: Path, write: WriteFn) -> None:
    pytest.importorskip("argcomplete")  # the completion extra
    write("backends.toml", PROJECT + '[backends.fussy]\ntarget = "no colon"\n')

    def complete(line: str) -> list[str]:
        said = tmp_path / "completions"
        env = {
            **os.environ,
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(said),  # else file descriptor 8
        }
        done = subprocess.run(
            [sys.executable, "-m", "torch_backend_registry"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, "")  # the broken entry says nothing
        return sorted(word.strip() for word in said.read_text().split("\v"))  # a space: done

    assert complete("torch-backends l") == ["list", "lock"]
    assert complete("torch-backends explain f") == ["f", "fast"]  # aliases too
    assert complete("torch-backends doctor --json p") == ["portable"]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert "invalid choice" in run("frobnicate", cwd=tmp_path, check=2).stderr
    assert "required" in run(cwd=tmp_path, check=2).stderr


def test_list_table(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    out = run("list", "--no-torch", cwd=tmp_path).stdout.splitlines()
    assert out[0].split() == ["NAME", "TAGS", "SOURCE", "TARGET"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert "dbg" not in rows  # hidden like list_backends()
    assert "project backends.toml:1" in rows["fast"]
    assert rows["fast"].rstrip().endswith("my_pkg.compilers:fast")
    assert "chain: trt -> fast" in rows["portable"]
    # Columns line up: every row starts its SOURCE cell where the header does.
    column = out[0].index("SOURCE")
    assert all(line[column:].startswith(("project", "entry-point")) for line in out[1:])


def test_list_filters(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)

    def names(*args: str) -> list[str]:
        out = run("list", "--no-torch", *args, cwd=tmp_path).stdout.splitlines()[1:]
        return [name for line in out if (name := line.split()[0]) not in PLUGINS]

    assert names() == ["fast", "portable", "trt"]
    assert names("--all") == ["dbg", "fast", "portable", "trt"]
    assert names("--tag", "debug") == ["dbg"]
    assert names("--exclude-tag", "nothing", "--available") == ["fast", "portable"]


def test_list_json(tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]) -> None:
    write("backends.toml", PROJECT)
    info = make_dist("cli-plugin", "3.1", {"plugged": "cli_plugin:compile"})
    env = {"PYTHONPATH": str(info.parent)}
    rows = json.loads(run("list", "--json", "--all", "--no-torch", cwd=tmp_path, env=env).stdout)
    by_name = {row["name"]: row for row in rows}
    fast = by_name["fast"]
    assert set(fast) == {
        "name",
        "target",
        "chain",
        "by_device",  # a table by device, or null
        "tags",
        "description",
        "aliases",
        "requires",
        "options",
        "verify",  # a chain's level and tolerances, or null
        "select",  # a chain's select and min_speedup, or null
        "default",  # whether it is the manifest's default
        "source",
        "available",
    }
    assert fast["source"] == {
        "kind": "project",
        "path": str(tmp_path / "backends.toml"),
        "line": 1,
        "distribution": None,
        "version": None,
    }
    assert (fast["aliases"], fast["available"], fast["chain"]) == (["f"], True, None)
    assert by_name["trt"]["available"] is False
    assert by_name["portable"]["chain"] == ["trt", "fast"]
    plugged = by_name["plugged"]["source"]
    assert (plugged["kind"], plugged["distribution"], plugged["version"]) == (
        "entry-point",
        "cli-plugin",
        "3.1",
    )


def test_list_no_torch_does_not_import_torch(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    code = (
        "import sys\n"
        "from torch_backend_registry._cli import main\n"
        "main(['list', '--no-torch'])\n"
        "print('torch' in sys.modules, 'my_pkg' in sys.modules, file=sys.stderr)\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.stderr.strip().endswith("False False")


def test_list_includes_torch_backends(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = run("list", cwd=tmp_path).stdout
    assert any(line.split()[:2] == ["inductor", "torch"] for line in out.splitlines())


def test_list_warns_about_broken_manifests_on_stderr(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.ok]\ntarget = "m:f"\n[backends.bad]\ntarget = 1\n')
    done = run("list", "--no-torch", cwd=tmp_path)
    assert "ok" in done.stdout
    assert "bad" not in done.stdout
    assert "torch-backends: warning: " in done.stderr
    assert "backends.toml:4: backends.bad.target: expected a string" in done.stderr
    assert "Traceback" not in done.stderr


def test_explain_shows_winner_then_shadowed(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    write("backends.toml", PROJECT)
    info = make_dist("shadowed-dist", "0.9", {"fast": "shadowed:compile"})
    env_manifest = write("env/extra.toml", '[backends.fast]\ntarget = "env_pkg:fast"\n')
    env = {"PYTHONPATH": str(info.parent), "TORCH_BACKENDS_PATH": str(env_manifest)}
    out = run("explain", "fast", "--no-torch", cwd=tmp_path, env=env).stdout
    winner, _, shadows = out.partition("shadows (lower precedence, not used):")
    assert "env: env/extra.toml:1" in winner
    assert "env_pkg:fast" in winner
    project_at = shadows.index("project: backends.toml:1")
    dist_at = shadows.index("entry-point: distribution 'shadowed-dist' 0.9")
    assert project_at < dist_at


def test_explain_requirements_and_alias(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    out = run("explain", "trt", "--no-torch", cwd=tmp_path).stdout
    assert "no_such_module_xyz (missing)" in out
    assert "available:   no: missing no_such_module_xyz" in out
    assert run("explain", "f", "--no-torch", cwd=tmp_path).stdout.startswith("f (alias of fast:")


def test_a_chain_is_available_when_one_of_its_members_is(tmp_path: Path, write: WriteFn) -> None:
    write(
        "backends.toml",
        PROJECT
        + """
[backends.hopeless]
chain = ["trt", "nowhere", "loop"]
[backends.loop]
chain = ["hopeless"]
[backends.nested]
chain = ["hopeless", "portable"]
""",
    )
    rows = json.loads(run("list", "--json", "--no-torch", cwd=tmp_path).stdout)
    available = {row["name"]: row["available"] for row in rows}
    assert available["portable"] is True  # trt is missing a module, fast is fine
    assert available["hopeless"] is False  # trt missing, nowhere unknown, loop back to itself
    assert available["loop"] is False
    assert available["nested"] is True  # through portable
    out = run("explain", "hopeless", "--no-torch", cwd=tmp_path).stdout
    assert "available:   no: chain 'hopeless' names itself (hopeless -> loop -> hopeless)" in out


def test_explain_unknown_name_exits_1_with_suggestions(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    done = run("explain", "fsat", "--no-torch", cwd=tmp_path, check=1)
    assert done.stdout == ""
    assert done.stderr == (
        "torch-backends: error: unknown backend 'fsat'. Did you mean 'fast'?"
        " 'torch-backends list --all' shows every name.\n"
    )


def test_check_clean_project(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    done = run("check", cwd=tmp_path)
    assert done.stdout == ""
    assert "no problems" in done.stderr


def test_check_reports_every_problem_of_every_file(tmp_path: Path, write: WriteFn) -> None:
    one = write("one.toml", '[backends.a]\ntarget = "nocolon"\ntagz = []\n')
    two = write("two.toml", "[backends.b]\nchain = [\n")
    three = write("three.toml", '[backends.c]\nchain = ["c"]\n')
    done = run("check", one.name, str(two), str(three), "missing.toml", cwd=tmp_path, check=1)
    lines = done.stdout.splitlines()
    assert "missing.toml: error: no such file" in lines
    assert any(line.startswith(f"{one.name}:2: error: backends.a.target: ") for line in lines)
    assert any(
        line.startswith(f"{one.name}:3: error: backends.a.tagz: unknown key 'tagz'")
        for line in lines
    )
    assert any(
        line.startswith(f"{two.name}:2: error: ") and "invalid TOML" in line for line in lines
    )
    # The loop is written in the chain key, on line 2.
    assert any(
        line.startswith(f"{three.name}:2: error: ") and "names itself" in line for line in lines
    )
    assert len(lines) == 5
    assert "5 problem(s)" in done.stderr
    assert "Traceback" not in done.stderr


def test_check_takes_file_names_holding_the_path_separator(tmp_path: Path, write: WriteFn) -> None:
    odd = write(f"a{os.pathsep}b.toml", "[backends.a]\ntarget = 1\n")
    good = write("good.toml", '[backends.g]\ntarget = "m:f"\n')
    done = run("check", odd.name, good.name, cwd=tmp_path, check=1)
    assert done.stdout.splitlines() == [
        f"{odd.name}:2: error: backends.a.target: expected a string, got integer 1"
    ]
    assert "1 problem(s); 1 of 2 backend(s) usable" in done.stderr


def test_check_import_finds_uncallable_and_missing_targets(
    tmp_path: Path, write: WriteFn, make_module: Callable[..., str], module_name: str
) -> None:
    make_module(module_name, "def ok(gm, inputs):\n    return gm\nvalue = 1\n")
    write(
        "backends.toml",
        f'[backends.ok]\ntarget = "{module_name}:ok"\n'
        f'[backends.value]\ntarget = "{module_name}:value"\n'
        '[backends.gone]\ntarget = "gone_module_xyz:f"\n',
    )
    env = {"PYTHONPATH": os.pathsep.join(sys.path)}
    assert run("check", cwd=tmp_path, env=env).returncode == 0  # without --import: fine
    done = run("check", "--import", cwd=tmp_path, env=env, check=1)
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert any(
        # At the line of the key that names it, not of the table's header.
        line.startswith(
            "backends.toml:4: error: backends.value.target: cannot load backend 'value'"
        )
        and "not callable" in line
        for line in lines
    )
    assert any(
        line.startswith("backends.toml:6: error: backends.gone.target: cannot load backend 'gone'")
        for line in lines
    )


def test_check_without_any_manifest(tmp_path: Path) -> None:
    done = run("check", cwd=tmp_path, check=1)
    assert "no manifest found" in done.stderr
    assert "torch-backends init" in done.stderr
    # A TORCH_BACKENDS_PATH of separators alone names no manifest either: not a pass.
    separators = run(
        "check", "--no-torch", cwd=tmp_path, env={"TORCH_BACKENDS_PATH": " : "}, check=1
    )
    assert "no manifest found" in separators.stderr


def test_check_untrusted_manifest_is_a_problem(tmp_path: Path, write: WriteFn) -> None:
    path = write("backends.toml", '[backends.a]\ntarget = "m:f"\n')
    path.chmod(0o666)
    done = run("check", cwd=tmp_path, check=1)
    assert "writable by every user" in done.stdout


def test_schema_matches_the_committed_file(tmp_path: Path) -> None:
    committed = (ROOT / "schemas" / "backends.schema.json").read_text(encoding="utf-8")
    assert schema_text() == committed, (
        "regenerate: torch-backends schema > schemas/backends.schema.json"
    )
    assert run("schema", cwd=tmp_path).stdout == committed


def test_manifests_of_this_project_carry_the_schema_line_and_validate() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import tomli as tomllib  # the parser the package uses, on every Python it supports

    schema = json.loads((ROOT / "schemas" / "backends.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    manifests = [ROOT / "backends.toml", *sorted((ROOT / "examples").rglob("*.toml"))]
    for manifest in manifests:
        text = manifest.read_text(encoding="utf-8")
        first = text.splitlines()[0]
        assert first.startswith("#:schema ")
        assert first.endswith("schemas/backends.schema.json")
        relative = first.split(" ", 1)[1]
        assert (manifest.parent / relative).resolve() == ROOT / "schemas" / "backends.schema.json"
        jsonschema.validate(tomllib.loads(text), schema)


def test_schema_rejects_what_the_model_rejects() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(schema_text())
    for bad in (
        {"backends": {"a": {"target": "nocolon"}}},
        {"backends": {"a": {"target": "m:f", "tag": []}}},
        {"backends": {"9": {"target": "m:f"}}},
        {"schema-version": 2},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_init_writes_a_valid_starter_and_never_overwrites(tmp_path: Path) -> None:
    done = run("init", cwd=tmp_path)
    assert "wrote backends.toml" in done.stdout
    assert (tmp_path / "backends.toml").read_text(encoding="utf-8") == starter()
    assert run("check", cwd=tmp_path).returncode == 0
    # What it says to do first is what check --import then asks for.
    assert "point its target at your compiler function" in done.stdout
    imported = run("check", "--import", "--no-torch", cwd=tmp_path, check=1)
    assert "my_package" in imported.stdout
    (tmp_path / "backends.toml").write_text("# mine\n", encoding="utf-8")
    again = run("init", cwd=tmp_path, check=1)
    assert "already exists; not overwritten" in again.stderr
    assert (tmp_path / "backends.toml").read_text(encoding="utf-8") == "# mine\n"


def test_errors_are_one_line_unless_debug(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.bad]\ntarget = "nocolon"\n')
    done = run("explain", "bad", "--no-torch", cwd=tmp_path, check=1)
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    assert "backends.toml:2: backends.bad.target:" in done.stderr
    debug = run("--debug", "explain", "bad", "--no-torch", cwd=tmp_path, check=1)
    assert "Traceback" in debug.stderr


def on_terminal(
    *args: str,
    cwd: Path,
    columns: int,
    stderr_too: bool = False,
    env: dict[str, str] | None = None,
    code: int = 0,
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run the command with stdout (and stderr) on a pseudo-terminal ``columns`` wide, with
    ``env`` added to the environment; it must exit with ``code``."""
    import pty

    leader, follower = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    environ.update(env or {}, COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-m", "torch_backend_registry", *args],
        stdout=follower,
        stderr=follower if stderr_too else subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=environ,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's other side is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert done.returncode == code, done.stderr
    return b"".join(chunks).decode("utf-8"), done


terminal_only = pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")


@terminal_only
def test_list_fits_the_terminal_and_is_plain_when_piped(tmp_path: Path, write: WriteFn) -> None:
    long_target = "a_rather_long_package_name.with_submodules.compilers:some_compile_function"
    write(
        "backends.toml",
        f'[backends.long_one]\ntarget = "{long_target}"\ndescription = "Says what it is"\n',
    )
    piped = run("list", "--no-torch", cwd=tmp_path).stdout
    assert long_target in piped  # piped: nothing cut...
    assert "DESCRIPTION" not in piped  # ...and the columns scripts know
    narrow, _ = on_terminal("list", "--no-torch", cwd=tmp_path, columns=60)
    lines = narrow.splitlines()
    row = next(line for line in lines if line.startswith("long_one"))
    assert all(len(line) <= 60 for line in lines)
    assert row.endswith("…")
    assert "DESCRIPTION" not in narrow
    wide, _ = on_terminal("list", "--no-torch", cwd=tmp_path, columns=200)
    assert wide.splitlines()[0].split() == ["NAME", "TAGS", "SOURCE", "TARGET", "DESCRIPTION"]
    assert "Says what it is" in wide


@terminal_only
def test_list_on_a_terminal_says_what_it_waits_for(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    screen, _ = on_terminal("list", cwd=tmp_path, columns=120, stderr_too=True)
    assert "torch-backends: loading PyTorch's backends (--no-torch skips them)...\r\x1b[K" in screen
    assert "inductor" in screen
    piped = run("list", cwd=tmp_path)
    assert piped.stderr == ""


def _undescribed(help_text: str) -> list[str]:
    """The argument lines of a --help output that carry no description."""
    lines = help_text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        if not re.match(r"^  [-A-Z]", line):
            continue  # not an argument line
        described = re.search(r"\S  +\S", line.strip())
        follows = i + 1 < len(lines) and lines[i + 1].startswith(" " * 4)
        if not (described or follows):
            bare.append(line)
    return bare


def test_help_explains_every_command_and_argument(tmp_path: Path) -> None:
    main_help = run("--help", cwd=tmp_path).stdout
    assert "examples:\n  torch-backends list --no-torch" in main_help
    assert (
        main_help.rstrip().splitlines()[-1].startswith("Extra manifests: set TORCH_BACKENDS_PATH")
    )
    assert _undescribed(main_help) == []
    for command in ("list", "explain", "check", "schema", "init"):
        assert _undescribed(run(command, "--help", cwd=tmp_path).stdout) == [], command
    assert "skips importing torch" in run("list", "--help", cwd=tmp_path).stdout
    assert "NAME        a backend name or alias" in run("explain", "--help", cwd=tmp_path).stdout
    assert "FILE        manifests to check" in run("check", "--help", cwd=tmp_path).stdout
    assert _undescribed("  NAME\n  --x  does x\n") == ["  NAME"]  # the check itself can fail


def test_global_options_work_before_and_after_the_command(tmp_path: Path) -> None:
    for args in (("--debug", "explain", "nope"), ("explain", "nope", "--debug")):
        done = run(*args, "--no-torch", cwd=tmp_path, check=1)
        assert "Traceback" in done.stderr, args
        assert "UnknownBackendError" in done.stderr
    plain = run("explain", "nope", "--no-torch", cwd=tmp_path, check=1)
    assert "Traceback" not in plain.stderr


def test_check_finds_chains_that_cannot_work(tmp_path: Path, write: WriteFn) -> None:
    write(
        "backends.toml",
        '[backends.ok]\ntarget = "operator:add"\n'
        '[backends.typo]\nchain = ["okk", "ok"]\n'
        '[backends.nothing]\nchain = ["nope1", "nope2"]\n'
        '[backends.portable]\nchain = ["some_plugin", "ok"]\n',
    )
    for extra in ((), ("--import",)):
        done = run("check", "--no-torch", *extra, cwd=tmp_path, check=1)
        assert done.stdout.splitlines() == [
            "backends.toml:4: error: backends.typo.chain: chain 'typo' names 'okk', which is no"
            " usable backend (did you mean 'okk' -> 'ok'?); fix the name or remove it",
            "backends.toml:6: error: backends.nothing.chain: chain 'nothing' names 'nope1',"
            " 'nope2', which are no usable backend; no member can be used here; fix the name or"
            " remove it",
            "backends.toml:8: note: backends.portable.chain: chain 'portable' names 'some_plugin',"
            " which is not installed here; it skips it when it runs",
        ]
        assert done.stderr.startswith("2 problem(s); 3 of 4 backend(s) "), done.stderr
        assert done.stderr.endswith(", 1 note(s); read backends.toml\n"), done.stderr


def test_check_counts_as_usable_only_what_the_registry_can_use_here(
    tmp_path: Path, write: WriteFn
) -> None:
    # A table whose CPU entry is a typo, a chain whose one member can never be used: both
    # were counted usable below the error that says why they cannot be.
    write(
        "backends.toml",
        '[backends.auto]\nby-device = { cpu = "eagr", other = "nope", cuda = "inductor" }\n'
        '[backends.outer]\nchain = ["inner"]\n'
        '[backends.inner]\nchain = ["nope1", "nope2"]\n'
        '[backends.one]\nchain = ["eager"]\nselect = "fastest"\n',
    )
    for extra, imported in (((), ""), (("--import",), "; not imported")):
        done = run("check", "--no-torch", *extra, cwd=tmp_path, check=1)
        assert done.stdout.splitlines() == [
            "backends.toml:2: error: backends.auto.by-device.cpu: by-device 'auto' names 'eagr',"
            " which is no usable backend (did you mean 'eagr' -> 'eager'?); fix the name or"
            " remove it; on other it fails",
            "backends.toml:3: note: backends.outer: unavailable here (no member can be used"
            " (inner: no member can be used (nope1: not installed here; nope2: not installed"
            f" here))){imported}",
            "backends.toml:6: error: backends.inner.chain: chain 'inner' names 'nope1', 'nope2',"
            " which are no usable backend; no member can be used here; fix the name or remove"
            " it",
            # Nothing to choose between: said at the key, and no fault.
            "backends.toml:9: note: backends.one.select: chain 'one' has one member ('eager'):"
            ' select = "fastest" has nothing to choose between',
        ]
        usable = "imported and usable" if extra else "usable"
        assert done.stderr == (
            f"2 problem(s); 1 of 4 backend(s) {usable}, 1 unavailable here, 1 note(s);"
            " read backends.toml\n"
        )


def test_a_chain_member_not_installed_here_is_a_note_not_a_failure(
    tmp_path: Path, write: WriteFn
) -> None:
    # A portable chain names plugins some machines lack: check passes there, and says so.
    write(
        "backends.toml",
        '[backends.ok]\ntarget = "operator:add"\n'
        '[backends.portable]\nchain = ["some_plugin", "other_plugin", "ok", "inductor"]\n',
    )
    done = run("check", "--no-torch", cwd=tmp_path)
    assert done.stdout == (
        "backends.toml:4: note: backends.portable.chain: chain 'portable' names 'some_plugin',"
        " 'other_plugin', which are not installed here; it skips them when it runs\n"
    )
    assert done.stderr == "no problems; 2 of 2 backend(s) usable, 1 note(s); read backends.toml\n"


def test_check_import_counts_what_it_checked(tmp_path: Path, write: WriteFn) -> None:
    good = "".join(f'[backends.good{i}]\ntarget = "operator:add"\n' for i in range(2))
    bad = "".join(f'[backends.bad{i}]\ntarget = "tbr_missing_{i}:f"\n' for i in range(3))
    write("backends.toml", good + bad)
    done = run("check", "--import", "--no-torch", cwd=tmp_path, check=1)
    assert (
        done.stderr == "3 problem(s); 2 of 5 backend(s) imported and usable; read backends.toml\n"
    )
    assert (
        run("check", "--no-torch", cwd=tmp_path).stderr
        == "no problems; 5 of 5 backend(s) usable; read backends.toml\n"
    )


def test_what_a_backend_prints_as_it_is_imported_stays_out_of_the_report(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "mods/tbr_chatty_import.py",
        "print('loading kernels')\ndef fn(gm, inputs):\n    return gm\n",
    )
    write(
        "backends.toml",
        'python-path = ["mods"]\n[backends.chatty]\ntarget = "tbr_chatty_import:fn"\n'
        '[backends.gone]\ntarget = "tbr_chatty_missing:fn"\n',
    )
    done = run("check", "--import", "--no-torch", cwd=tmp_path, check=1)
    assert done.stdout.startswith(
        "backends.toml:5: error: backends.gone.target: cannot load backend"
    )
    assert "loading kernels" not in done.stdout
    assert "loading kernels" in done.stderr


def test_a_registry_in_a_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError, match="no such folder"):
        Registry(cwd=tmp_path / "not" / "there")


def test_what_init_writes_is_in_the_first_list(tmp_path: Path) -> None:
    run("init", cwd=tmp_path)
    listed = run("list", "--no-torch", cwd=tmp_path).stdout
    assert "my_backend" in listed
    explained = run("explain", "my_backend", "--no-torch", cwd=tmp_path).stdout
    assert "description: My compiler" in explained


def test_init_never_hides_a_pyproject_table_and_can_write_one(
    tmp_path: Path, write: WriteFn
) -> None:
    write("pyproject.toml", '[project]\nname = "demo"\n')
    done = run("init", "--pyproject", cwd=tmp_path)
    assert "added [tool.torch-backends] to pyproject.toml" in done.stdout
    text = (tmp_path / "pyproject.toml").read_text(encoding="utf-8")
    assert text.startswith('[project]\nname = "demo"\n\n')
    assert text.endswith(pyproject_starter())
    assert "my_backend" in run("list", "--no-torch", cwd=tmp_path).stdout
    # Now a backends.toml would silently win over that table: init refuses.
    again = run("init", cwd=tmp_path, check=1)
    assert "pyproject.toml: already has a [tool.torch-backends] table" in again.stderr
    assert not (tmp_path / "backends.toml").exists()
    assert run("init", "--pyproject", cwd=tmp_path, check=1).returncode == 1
    assert (tmp_path / "pyproject.toml").read_text(encoding="utf-8") == text


def test_init_pyproject_leaves_a_file_it_cannot_extend_untouched(
    tmp_path: Path, write: WriteFn
) -> None:
    path = write("pyproject.toml", "tool = { other = 1 }\n")  # [tool.x] cannot follow
    done = run("init", "--pyproject", cwd=tmp_path, check=1)
    assert "invalid TOML" in done.stderr
    assert path.read_text(encoding="utf-8") == "tool = { other = 1 }\n"
    assert (
        "pyproject.toml: no such file; run"
        in run("init", "--pyproject", cwd=tmp_path / "..", check=1).stderr
    )


def test_shell_completion_offers_commands_and_backend_names(tmp_path: Path, write: WriteFn) -> None:
    pytest.importorskip("argcomplete")
    write("backends.toml", PROJECT)

    def complete(line: str) -> list[str]:
        out = tmp_path / "completions"
        environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
        environ.update(
            _ARGCOMPLETE="1",
            _ARGCOMPLETE_IFS="\n",
            COMP_LINE=line,
            COMP_POINT=str(len(line)),
            _ARGCOMPLETE_STDOUT_FILENAME=str(out),
        )
        subprocess.run(
            [sys.executable, "-m", "torch_backend_registry"],
            cwd=tmp_path, env=environ, check=True, capture_output=True,
        )  # fmt: skip
        return sorted(out.read_text().split())

    assert {"list", "explain", "check"} <= set(complete("torch-backends "))
    assert complete("torch-backends explain f") == ["f", "fast"]
    assert "--no-torch" in complete("torch-backends list --no")


def test_doctor_without_torch_says_so_once(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from torch_backend_registry._cli import main\n"
        "sys.exit(main(['doctor']))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "torch-backends: error: doctor needs PyTorch to compile with: pip install torch"
    ]


@terminal_only
def test_doctors_progress_fits_the_terminal_and_is_gone_before_the_table(
    tmp_path: Path, write: WriteFn
) -> None:
    pytest.importorskip("torch")  # doctor compiles
    long_name = "a_backend_with_a_very_long_name_" * 3
    missing = "a_module_nobody_has.with_a_long_name"
    write("tbr_progress_fakes.py", "def fine(gm, example_inputs):\n    return gm.forward\n")
    write(
        "backends.toml",
        f'python-path = ["."]\n[backends.{long_name}]\ntarget = "tbr_progress_fakes:fine"\n'
        f'[backends.needs]\ntarget = "tbr_progress_fakes:fine"\nrequires = ["{missing}"]\n',
    )
    shown, _ = on_terminal(
        *("doctor", long_name, "needs", "--level", "forward"),
        cwd=tmp_path,
        columns=60,
        stderr_too=True,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
        code=1,  # one backend is unavailable
    )
    *progress, table = shown.split("\r\033[K")
    assert all(len(line) < 60 for line in progress)
    probing = [line for line in progress if "probing" in line]
    assert probing, shown  # a line while probing...
    assert probing[0].startswith("torch-backends: 0 done; probing ")
    assert any("probing a_backend_with" in line for line in probing)
    header, row, unavailable, *reason = table.splitlines()  # ...gone before the table
    assert header.startswith("NAME ")
    # A name too long is cut, so that every row's status shows; a reason too long for the
    # line goes whole below its row: nothing of what says what is wrong is cut.
    assert row.startswith("a_backend_with_a")
    assert row.split()[1:] == ["ok", "forward", row.split()[-1]]
    assert unavailable.split()[:3] == ["needs", "unavailable", "requirements"]
    assert len(unavailable.split()) == 4  # its seconds, and no cut reason on the line
    assert reason
    assert all(line.startswith("    ") and len(line) <= 60 for line in reason)
    assert missing in " ".join(line.strip() for line in reason)


def test_doctor_says_how_each_chain_ran(capsys: pytest.CaptureFixture[str]) -> None:
    from torch_backend_registry._cli.doctor import _print_verdicts

    chain = Verdict("portable", "ok", 3, "", 2.6, "openvino", select="fastest", verify="forward")
    broken = Verdict(
        "strict", "compile-error", 3, "no member compiled", 1.0, select="first", verify="none"
    )
    _print_verdicts([chain, Verdict("inductor", "ok", 4, seconds=1.2), broken])
    assert capsys.readouterr().out.splitlines() == [
        "NAME                  STATUS         LEVEL     SECONDS  REASON",
        "portable -> openvino  ok             forward   2.6      select fastest, verify forward",
        "inductor              ok             backward  1.2",
        "strict                compile-error  forward   1.0      select first, verify none;"
        " no member compiled",
    ]


# ------------------------------------------------------------------ on this repository


def _openvino_notes() -> list[str]:
    """What check says of this repository's manifest where the openvino plugin is missing."""
    import importlib.metadata

    if any(
        ep.name == "openvino"
        for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")
    ):
        return []
    return [
        "backends.toml:28: note: backends.portable.chain: chain 'portable' names 'openvino',"
        " which is not installed here; it skips it when it runs",
        "backends.toml:33: note: backends.auto.by-device.cpu: by-device 'auto' names 'openvino',"
        " which is not installed here; on cpu it fails",
    ]


def test_check_passes_on_this_repositorys_own_manifest_without_torch() -> None:
    done = run("check", "--no-torch", cwd=ROOT)
    notes = _openvino_notes()
    assert done.stdout.splitlines() == notes
    # Without openvino the table by device gives the CPU nothing: unavailable here, as its
    # note says.
    said = (
        "4 of 5 backend(s) usable, 1 unavailable here, 2 note(s)"
        if notes
        else "5 of 5 backend(s) usable"
    )
    assert done.stderr == f"no problems; {said}; read backends.toml\n"


def test_check_import_says_an_optional_backend_is_unavailable_here_and_passes() -> None:
    done = run("check", "--import", "--no-torch", cwd=ROOT)
    tensorrt = (
        "backends.toml:21: note: backends.tensorrt: unavailable here (missing torch_tensorrt);"
        " not imported"
    )
    notes = _openvino_notes()
    if not notes:
        assert done.stdout.splitlines() == [tensorrt]
        # What the plugins it imports warn of comes first, in Python's own form.
        assert done.stderr.splitlines()[-1] == (
            "no problems; 4 of 5 backend(s) imported and usable, 1 unavailable here;"
            " read backends.toml"
        )
        assert "torch-backends: warning" not in done.stderr
        return
    # Without openvino the table by device gives the CPU nothing: unavailable here too, as
    # its note says (once: the note stands for its "unavailable here" line).
    assert done.stdout.splitlines() == [tensorrt, *notes]
    assert done.stderr == (
        "no problems; 3 of 5 backend(s) imported and usable, 2 unavailable here, 2 note(s);"
        " read backends.toml\n"
    )


def test_the_readme_s_isolated_registry_has_no_problems() -> None:
    isolated = Registry(cwd=ROOT, environ={}, sources=("project", "entry-point"))
    names = [d.name for d in isolated.definitions(exclude_tags=())]
    # Where the openvino plugin is missing, check notes it (no fault) and lists it not.
    notes = _openvino_notes()
    assert [p.shown(str(ROOT)) for p in isolated.problems()] == notes
    openvino = [] if notes else ["openvino"]
    names = [n for n in names if n == "openvino" or n not in PLUGINS]
    assert names == ["auto", "op_counts", *openvino, "portable", "tensorrt", "trace_shapes"]
    assert isolated.why_unavailable(isolated.backend_info("tensorrt")) == "missing torch_tensorrt"


def test_check_counts_a_chain_that_can_never_work_as_unusable_and_sorts_by_line(
    tmp_path: Path, write: WriteFn
) -> None:
    # README's broken.toml.
    write(
        "broken.toml",
        "[backends.fast]\n"
        'target = "my_pkg.compilers:fast_compile"\n'
        'tag = ["experimental"]\n'
        "\n"
        "[backends.slow]\n"
        'target = "slow_compile"\n'
        "\n"
        "[backends.portable]\n"
        'chain = ["fast", "tensorrt"]\n',
    )
    write("b.toml", '[backends.x]\ntarget = "m:f"\ntagz = 1\n[backends.y]\nchain = ["x"]\n')
    done = run("check", "broken.toml", "b.toml", "--no-torch", cwd=tmp_path, check=1)
    lines = [line.split(": ", 1)[0] for line in done.stdout.splitlines()]
    # Each at the line of the key it names: the chain keys are on b.toml:5 and broken.toml:9.
    assert lines == ["b.toml:3", "b.toml:5", "broken.toml:3", "broken.toml:6", "broken.toml:9"]
    assert done.stderr == "5 problem(s); 0 of 5 backend(s) usable; read broken.toml, b.toml\n"


def test_list_says_when_no_backend_has_a_tag(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", PROJECT)
    done = run("list", "--tag", "nosuchtag", "--no-torch", cwd=tmp_path, check=1)
    assert done.stdout == ""
    assert done.stderr == (
        "torch-backends: error: no backend is tagged 'nosuchtag' (the tags here: debug)\n"
    )


def test_the_starter_says_how_to_check_it_and_what_enabled_hides() -> None:
    for text in (starter(), pyproject_starter()):
        assert "torch-backends check --import" in text
        assert "PyTorch's own\n# names cannot be hidden" in text


def test_a_name_of_pytorchs_is_refused_before_torch_is_imported() -> None:
    out = run_python(
        "import sys, torch_backend_registry as t\n"
        "try:\n"
        "    t.register_backend(len, name='aot_eager_default_partitioner')\n"
        "except t.DuplicateBackendError as e:\n"
        "    print(type(e).__name__, 'torch._dynamo' in sys.modules)\n"
    ).stdout
    assert out == "DuplicateBackendError False\n"


def test_check_import_refuses_an_option_the_compiler_does_not_take(
    tmp_path: Path, write: WriteFn, make_module: Callable[..., str], module_name: str
) -> None:
    make_module(module_name, "def fast(gm, inputs, *, level=1):\n    return gm\n")
    write(
        "backends.toml",
        f'[backends.fast]\ntarget = "{module_name}:fast"\n\noptions = {{ levle = 2 }}\n',
    )
    env = {"PYTHONPATH": os.pathsep.join(sys.path)}
    assert run("check", "--no-torch", cwd=tmp_path, env=env).returncode == 0
    done = run("check", "--import", "--no-torch", cwd=tmp_path, env=env, check=1)
    assert done.stdout == (
        "backends.toml:4: error: backends.fast.options.levle: option 'levle' is not a parameter"
        f" of {module_name}:fast; did you mean 'level'?\n"
    )


# ------------------------------------------------------------------ answers a new user meets


def test_a_module_beside_the_manifest_is_found_from_any_folder(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "mycompilers.py").write_text("def graph_printer(gm, inputs):\n    return gm\n")
    (project / "backends.toml").write_text(
        '[backends.printer]\ntarget = "mycompilers:graph_printer"\n'
        '[backends.typo_module]\ntarget = "mycompiler:graph_printer"\n'
        '[backends.typo_function]\ntarget = "mycompilers:graph_printr"\n'
        '[backends.no_such]\ntarget = "our_compile:graph_printer"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"TORCH_BACKENDS_PATH": str(project / "backends.toml")}
    for cwd in (project, elsewhere):
        done = run("check", "--import", "--no-torch", cwd=cwd, env=env, check=1)
        lines = done.stdout.splitlines()
        assert len(lines) == 3, lines  # the printer is found; the misspellings are not
        assert lines[0].endswith("No module named 'mycompiler'; did you mean 'mycompilers'?")
        assert lines[1].endswith("has no attribute 'graph_printr'; did you mean 'graph_printer'?")
        # A module only somewhat like one that exists ('sre_compile') is no misspelling of it.
        assert lines[2].endswith("No module named 'our_compile'"), lines[2]
        # Named on TORCH_BACKENDS_PATH and found as the project's, it is one manifest read.
        shown = "backends.toml" if cwd == project else str(project / "backends.toml")
        assert done.stderr.endswith(
            f"3 problem(s); 1 of 4 backend(s) imported and usable; read {shown}\n"
        )


def test_pytorchs_name_under_no_torch_says_why_it_is_unknown(tmp_path: Path) -> None:
    done = run("explain", "inductor", "--no-torch", cwd=tmp_path, check=1)
    assert done.stderr == (
        "torch-backends: error: unknown backend 'inductor' with --no-torch: it is one of"
        " PyTorch's own backends, which --no-torch leaves out; run it without --no-torch\n"
    )


def test_close_words_are_proposed_where_a_word_is_wrong(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    info = make_dist("openvino-like", "1.0", {"ov_like": "ov_like_mod:compile"})
    write(
        "backends.toml",
        '[plugins]\ndeny = ["openvino-lik"]\n'
        '[backends.mine]\ntarget = "m:f"\ntags = ["mine"]\n'
        '[backends.careful]\nchain = ["mine"]\nverify = "forwards"\n',
    )
    env = {"PYTHONPATH": str(info.parent)}
    done = run("check", "--no-torch", cwd=tmp_path, env=env, check=1)
    assert done.stdout.splitlines() == [
        "backends.toml:2: warning: plugins.deny: the deny list names 'openvino-lik', which is"
        " no installed distribution declaring a torch_dynamo_backends entry point; did you"
        " mean 'openvino-like'?",
        "backends.toml:8: error: backends.careful.verify: invalid value 'forwards'; did you"
        " mean 'forward'?",
    ]
    tagged = run("list", "--tag", "mien", "--no-torch", cwd=tmp_path, env=env, check=1)
    assert tagged.stderr.endswith("; did you mean 'mine'?\n")


def test_what_a_user_could_not_see_is_shown(tmp_path: Path, write: WriteFn) -> None:
    write(
        "backends.toml",
        'default = "careful"\n'
        '[backends.fast]\ntarget = "m:f"\noptions = { level = 2, when = 1979-05-27 }\n'
        'requires = ["json"]\ndescription = "Fast, for a terminal of any width"\n'
        '[backends.careful]\nchain = ["fast", "eager"]\nverify = "backward"\n',
    )
    explained = run("explain", "careful", "--no-torch", cwd=tmp_path).stdout
    assert (
        "  default:     yes: torch.compile uses it when given none (backends.toml:1)" in explained
    )
    as_json = json.loads(run("explain", "careful", "--json", "--no-torch", cwd=tmp_path).stdout)
    assert as_json["verify"] == {"level": "backward", "rtol": 0.01, "atol": 0.01}
    assert (as_json["default"], as_json["shadowed"]) == (True, [])
    rows = {
        r["name"]: r for r in json.loads(run("list", "--json", "--no-torch", cwd=tmp_path).stdout)
    }
    assert rows["fast"]["options"] == {"level": 2, "when": "1979-05-27"}
    assert rows["fast"]["requires"] == ["json"]
    checked = json.loads(run("check", "--json", "--no-torch", cwd=tmp_path).stdout)
    assert (checked["backends"], checked["usable"], checked["errors"]) == (2, 2, 0)
    assert checked["problems"] == []
    if sys.platform != "win32":  # a terminal of 120 columns shows the description and default
        screen, _ = on_terminal("list", "--no-torch", cwd=tmp_path, columns=120)
        lines = screen.splitlines()
        assert "DESCRIPTION" in lines[0]
        assert all(len(line) <= 120 for line in lines)
        assert "Fast, for a terminal" in screen
        assert lines[-1].startswith("default: careful (what torch.compile uses when given none")


def test_check_json_names_every_problem_with_its_severity(tmp_path: Path, write: WriteFn) -> None:
    write(
        "backends.toml",
        '[backends.a]\ntarget = "nocolon"\n[backends.b]\nby-device = { mlu = "eager" }\n'
        '[backends.c]\nchain = ["not_installed_here", "eager"]\n',
    )
    done = run("check", "--json", "--no-torch", cwd=tmp_path, check=1)
    checked = json.loads(done.stdout)
    assert [(p["line"], p["severity"], p["key"]) for p in checked["problems"]] == [
        (2, "error", "backends.a.target"),
        (4, "warning", "backends.b.by-device.mlu"),  # an extension's device: fine, said once
        (4, "note", "backends.b.by-device"),  # and nothing for a graph on the CPU
        (6, "note", "backends.c.chain"),
    ]
    assert (checked["errors"], checked["warnings"], checked["notes"]) == (1, 1, 2)


# ------------------------------------------------------------------ what an attack found


def test_what_hides_or_disables_a_backend_by_mistake_is_said(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    info = make_dist("tbr-real-plugin", "2.0", {"realplug": "tbr_real_mod:compile"})
    env = {"PYTHONPATH": str(info.parent)}
    write(
        "backends.toml",
        '[backends.realplug]\ndistribution = "tbr-real-plugn"\n'  # a typo: hides the plugin
        '[backends.ov]\ntarget = "m:f"\naliases = ["realplug2"]\n'
        "[backends.fsat]\nenabled = false\n"  # disables nothing
        '[backends.fast]\ntarget = "m:f"\n'
        '[backends.ch]\nchain = ["fats", "eager"]\n',  # two letters swapped
    )
    done = run("check", "--no-torch", cwd=tmp_path, env=env, check=1)
    lines = done.stdout.splitlines()
    assert any(
        "backends.realplug.distribution: no installed distribution 'tbr-real-plugn' declares"
        in line
        and "did you mean 'tbr-real-plugin'?" in line
        for line in lines
    ), lines
    assert any(
        "warning: backends.fsat.enabled: 'fsat' is disabled, but no lower source"
        " defines it: nothing is hidden; did you mean 'fast'?" in line
        for line in lines
    ), lines
    assert any(
        "error: backends.ch.chain:" in line and "(did you mean 'fats' -> 'fast'?)" in line
        for line in lines
    ), lines


def test_an_alias_that_hides_a_lower_backend_is_said_and_explained(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    info = make_dist("tbr-hidden-plugin", "1.0", {"hiddenplug": "tbr_hidden_mod:compile"})
    env = {"PYTHONPATH": str(info.parent)}
    write("backends.toml", '[backends.ov]\ntarget = "m:f"\naliases = ["hiddenplug"]\n')
    checked = run("check", "--no-torch", cwd=tmp_path, env=env)
    assert checked.stdout == (
        "backends.toml:3: warning: backends.ov.aliases: alias 'hiddenplug' of 'ov' hides"
        " backend 'hiddenplug' of distribution 'tbr-hidden-plugin' 1.0, which ranks lower:"
        " 'hiddenplug' now runs 'ov'; rename the alias if that is not meant\n"
    )
    explained = run("explain", "hiddenplug", "--no-torch", cwd=tmp_path, env=env).stdout
    assert "shadows (lower precedence, not used):\n  hiddenplug\n" in explained


def test_explain_of_a_disabled_name_says_what_disables_it_and_what_it_hides(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    info = make_dist("tbr-off-plugin", "1.0", {"offplug": "tbr_off_mod:compile"})
    write("backends.toml", "# off here\n[backends.offplug]\nenabled = false\n")
    env = {"PYTHONPATH": str(info.parent)}
    done = run("explain", "offplug", "--no-torch", cwd=tmp_path, env=env, check=1)
    assert done.stdout.splitlines() == [
        "offplug (no backend here)",
        "  disabled:    by backends.toml:2 (enabled = false)",
        "  hides:       entry-point: distribution 'tbr-off-plugin' 1.0",
    ]
    assert "disabled by" in done.stderr


def test_a_plugins_entry_point_that_cannot_be_a_backend_is_a_warning_not_a_failure(
    tmp_path: Path, write: WriteFn, make_dist: Callable[..., Path]
) -> None:
    info = make_dist(
        "tbr-odd-dist",
        "1.0",
        {"inductor": "odd:compile", "bad name": "odd:compile", "weird": "not a target"},
    )
    write("backends.toml", '[backends.fast]\ntarget = "m:f"\n')
    done = run("check", cwd=tmp_path, env={"PYTHONPATH": str(info.parent)})
    said = done.stdout
    assert (
        "warning: distribution 'tbr-odd-dist' 1.0 declares the entry point 'inductor', one of"
        in said
    )
    assert "[plugins] deny = ['tbr-odd-dist']" in said
    assert "declares the entry point 'bad name', which is no backend name" in said
    assert "declares the entry point 'weird', whose value 'not a target' is no module:attr" in said
    names = run("list", "--all", "--no-torch", cwd=tmp_path, env={"PYTHONPATH": str(info.parent)})
    assert "weird" not in names.stdout
    assert "bad name" not in names.stdout


def test_check_says_what_it_cannot_find_and_what_the_user_likely_meant(
    tmp_path: Path, write: WriteFn
) -> None:
    write("pyproject.toml", '[tool.torch_backends.backends.fast]\ntarget = "m:f"\n')
    missing = run("check", cwd=tmp_path, check=1)
    assert "pyproject.toml has [tool.torch_backends]: did you mean [tool.torch-backends]?" in (
        missing.stderr
    )
    (tmp_path / "pyproject.toml").unlink()
    write(
        "backends.toml",
        'default = "inductr"\npython-path = ["srcc", "./srcc", "lib"]\n'
        '[backends.fast]\ntarget = "m:f"\n',
    )
    done = run("check", "--no-torch", cwd=tmp_path, check=1)
    assert done.stdout.splitlines() == [
        "backends.toml:1: error: default: unknown backend 'inductr'. Did you mean 'inductor'?;"
        " name a backend that exists here",
        f"backends.toml:2: warning: python-path: python-path folder 'srcc' does not exist"
        f" ({tmp_path / 'srcc'}); a target in it would not be found",
        f"backends.toml:2: warning: python-path: python-path folder 'lib' does not exist"
        f" ({tmp_path / 'lib'}); a target in it would not be found",
    ]


def test_check_warns_of_a_compile_cache_that_is_no_file(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", 'compile-cache = "build/compile.bin"\n[backends.fast]\ntarget = "m:f"\n')
    said = run("check", "--no-torch", cwd=tmp_path).stdout
    assert said.splitlines() == [
        "backends.toml:1: warning: compile-cache: compile-cache"
        f" {tmp_path / 'build' / 'compile.bin'} is no file: no compile cache is loaded;"
        " make it with 'torch-backends tune --compile-cache PATH -- COMMAND'"
    ]
    write("build/compile.bin", "")
    assert run("check", "--no-torch", cwd=tmp_path).stdout == ""


def test_lock_pins_no_broken_manifest_and_sees_a_hand_edited_lock(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.fast]\ntarget = "m:f"\n[backends.bad]\ntarget = 1\n')
    refused = run("lock", cwd=tmp_path, check=1)
    assert "not written: the manifests have 1 error(s), the first backends.toml:4:" in (
        refused.stderr
    )
    assert not (tmp_path / "backends.lock").exists()
    write("backends.toml", '[backends.fast]\ntarget = "m:f"\n')
    # An --output that names the manifest (or any file that is no lock) is not replaced.
    mistaken = run("lock", "--output", "backends.toml", cwd=tmp_path, check=1)
    assert mistaken.stderr == (
        "torch-backends: error: backends.toml: exists and is no lock that `torch-backends lock`"
        " wrote: not overwritten; name another file, or remove this one first\n"
    )
    assert (tmp_path / "backends.toml").read_text() == '[backends.fast]\ntarget = "m:f"\n'
    run("lock", cwd=tmp_path)
    run("lock", cwd=tmp_path)  # a lock is written again over the last
    (tmp_path / "empty.lock").write_text("")  # and an empty file holds nothing to lose
    run("lock", "--output", "empty.lock", cwd=tmp_path)
    lock = tmp_path / "backends.lock"
    text = lock.read_text()
    lock.write_text(text.replace('fingerprint = "', 'fingerprint = "0000', 1))
    edited = run("check", "--locked", "--no-torch", cwd=tmp_path, check=1)
    assert "it was edited by hand; run 'torch-backends lock' again" in edited.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_lock_and_init_write_files_their_own_trust_rule_accepts_and_replace_no_special_file(
    tmp_path: Path, write: WriteFn
) -> None:
    write("proj/backends.toml", '[backends.fast]\ntarget = "m:f"\n')
    os.mkfifo(tmp_path / "proj" / "a.fifo")  # a rename over it would make it a plain file
    fifo = run("lock", "--output", "a.fifo", cwd=tmp_path / "proj", check=1)
    assert "a.fifo: exists and is no lock" in fifo.stderr
    assert (tmp_path / "proj" / "a.fifo").is_fifo()
    umask = os.umask(0)  # whatever the umask, nothing written is writable by every user
    try:
        run("lock", cwd=tmp_path / "proj")
        (tmp_path / "new").mkdir(mode=0o755)
        run("init", cwd=tmp_path / "new")
    finally:
        os.umask(umask)
    for written in (tmp_path / "proj" / "backends.lock", tmp_path / "new" / "backends.toml"):
        assert not written.stat().st_mode & 0o002, written
    run("check", "--locked", "--no-torch", cwd=tmp_path / "proj")
    run("check", "--no-torch", cwd=tmp_path / "new")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_system_error_is_one_line_in_the_systems_words(tmp_path: Path) -> None:
    # A full disk (and, alike, a folder it may not write): no exception class, no traceback.
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "torch_backend_registry", "schema"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
    assert (done.returncode, done.stderr) == (1, "torch-backends: error: No space left on device\n")


def test_every_problem_is_counted_when_only_some_are_printed(
    tmp_path: Path, write: WriteFn
) -> None:
    write("many.toml", "".join(f"[backends.b{i}]\ntarget = 'm:f'\ntagz = 1\n" for i in range(150)))
    done = run("check", "many.toml", "--no-torch", cwd=tmp_path, check=1)
    assert done.stdout.splitlines()[-1].endswith("and 50 more problems; fix those above first")
    assert done.stderr.startswith("150 problem(s);")


def test_tag_filters_that_contradict_or_name_nothing_say_so(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.a]\ntarget = "m:f"\ntags = ["gpu"]\n')
    both = run("list", "--tag", "gpu", "--exclude-tag", "gpu", "--no-torch", cwd=tmp_path, check=2)
    assert both.stderr == "torch-backends: error: --tag and --exclude-tag both name 'gpu'\n"
    typo = run("list", "--exclude-tag", "gpuu", "--no-torch", cwd=tmp_path)
    assert "warning: no backend is tagged 'gpuu' (the tags here: gpu); did you mean 'gpu'?" in (
        typo.stderr
    )


def test_check_import_refuses_a_compiler_that_needs_what_nothing_gives(
    tmp_path: Path, write: WriteFn
) -> None:
    write(
        "mm.py",
        "class Stop(BaseException):\n    pass\n"
        "def f3(gm, ex, mode):\n    return gm\n"
        "def kwreq(gm, ex, *, must):\n    return gm\n"
        "def given(gm, ex, *, must):\n    return gm\n",
    )
    write("stops.py", "import mm\nraise mm.Stop('at import')\n")
    write(
        "backends.toml",
        '[backends.a]\ntarget = "mm:f3"\n[backends.c]\ntarget = "mm:kwreq"\n'
        '[backends.ok]\ntarget = "mm:given"\noptions = { must = 1 }\n'
        '[backends.stops]\ntarget = "stops:f"\n',
    )
    done = run("check", "--import", "--no-torch", cwd=tmp_path, check=1)
    lines = done.stdout.splitlines()
    assert "needs 'mode', which torch.compile does not give and no option sets" in lines[0]
    assert "needs 'must', which torch.compile does not give" in lines[1]
    assert "import of 'stops' failed: Stop: at import" in lines[2]
    assert "Traceback" not in done.stderr
    assert done.stderr.endswith(
        "3 problem(s); 1 of 4 backend(s) imported and usable; read backends.toml\n"
    )


def test_check_names_what_it_read_and_a_manifest_above_the_repository(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.unrelated]\ntarget = "m:f"\n')
    (tmp_path / "repo" / ".git").mkdir(parents=True)  # this repository has no manifest here
    done = run("check", "--no-torch", cwd=tmp_path / "repo")
    manifest = str(tmp_path / "backends.toml")
    assert done.stdout.splitlines() == [
        f"{manifest}: warning: this manifest lies above the repository this command runs in"
        f" ({tmp_path / 'repo'}): the project's manifest is the nearest one from here up; if"
        " this repository has one, it is not where it is looked for"
    ]
    assert done.stderr.endswith(f"; read {manifest}\n")
    write("repo/backends.toml", '[backends.mine]\ntarget = "m:f"\n')
    done = run("check", "--no-torch", "--json", cwd=tmp_path / "repo")
    assert json.loads(done.stdout)["manifests"] == [str(tmp_path / "repo" / "backends.toml")]
