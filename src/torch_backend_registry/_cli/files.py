"""The commands that write or print a file: ``lock``, ``schema`` and ``init``."""

from __future__ import annotations

import functools
import os
import sys
from argparse import Namespace as Arguments

from .common import (
    EXIT_OK,
    NO_MANIFEST,
    CommandError,
    no_manifest,
    registry_for,
    relative,
    status_line,
    working_folder,
)


def run_lock(args: Arguments) -> int:
    from .._lock import digest, lock_facts, summary, write_lock

    if no_manifest():  # a lock of PyTorch's backends alone pins nobody's
        raise CommandError(NO_MANIFEST)
    registry = registry_for(args.no_torch)
    scope = "all" if args.all else "project"
    with status_line("loading PyTorch's backends", not args.no_torch):
        # A lock of what is broken pins it broken.
        if errors := [p for p in registry.problems() if p.severity == "error"]:
            raise CommandError(
                f"not written: the manifests have {len(errors)} error(s), the first"
                f" {errors[0].shown(working_folder())};"
                " fix them ('torch-backends check' shows them)"
            )
        try:
            path = write_lock(registry, args.output, scope=scope)
        except OSError as exc:
            raise CommandError(f"cannot write {args.output or 'the lock'}: {exc.strerror}") from exc
        facts = lock_facts(registry, scope)
    print(f"wrote {relative(path)}: {summary(facts)}; fingerprint {digest(facts)[:16]}; commit it")
    return EXIT_OK


def schema_text() -> str:
    """The JSON Schema as written to ``schemas/backends.schema.json``."""
    import json

    from .._sources.schema import json_schema

    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def run_schema(args: Arguments) -> int:
    sys.stdout.write(schema_text())
    return EXIT_OK


def starter() -> str:
    """The starter manifest ``init`` writes, as this package holds it."""
    from pathlib import Path

    return Path(__file__).with_name("starter.toml").read_text(encoding="utf-8")


def pyproject_starter() -> str:
    """The starter as a ``[tool.torch-backends]`` table, for ``init --pyproject``."""
    body = starter().split("schema-version = 1\n", 1)[1]
    body = body.replace("[backends.", "[tool.torch-backends.backends.")
    return (
        '# Backends for torch.compile(model, backend="NAME"), read by torch-backend-registry.\n'
        "# Check them, and import what they name, with `torch-backends check --import`;\n"
        "# see them with `torch-backends list`.\n"
        "[tool.torch-backends]\nschema-version = 1\n" + body
    )


#: What to do after ``init``: its target is a placeholder, which ``check --import`` refuses.
NEXT_STEP = (
    "point its target at your compiler function (my_package.compilers:my_compiler is a"
    " placeholder), then check it with 'torch-backends check --import'"
)


def run_init(args: Arguments) -> int:
    from .._keys import PYPROJECT_TABLE
    from .._sources import PROJECT_FILES, project_manifest
    from .._sources.files import NO_SUCH_FILE, SHARED_FILE_MODE, parse_toml, read_text

    here = os.getcwd()
    backends, pyproject = (os.path.join(here, name) for name in PROJECT_FILES)
    if os.path.lexists(backends):
        raise CommandError(
            f"{PROJECT_FILES[0]}: already exists; not overwritten (edit it, or remove it first)"
        )
    if os.path.isfile(pyproject) and project_manifest(here) == pyproject:
        # A backends.toml would take precedence and silently replace that table.
        raise CommandError(
            f"{PROJECT_FILES[1]}: already has a [tool.torch-backends] table: edit it there"
            " (a backends.toml here would replace it)"
        )
    if args.pyproject:
        if not os.path.isfile(pyproject):
            what = "is not a regular file" if os.path.lexists(pyproject) else NO_SUCH_FILE
            raise CommandError(
                f"pyproject.toml: {what}; run 'torch-backends init' for a backends.toml instead"
            )
        text = read_text(pyproject)
        separator = (
            "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
        )
        addition = separator + pyproject_starter()
        # Refuses before writing if the table it adds would not parse (the others are theirs).
        parse_toml(pyproject, text + addition, within=PYPROJECT_TABLE)
        with open(pyproject, "a", encoding="utf-8") as handle:
            handle.write(addition)
        print(f"added [tool.torch-backends] to pyproject.toml; {NEXT_STEP}")
        return EXIT_OK
    create = functools.partial(os.open, mode=SHARED_FILE_MODE)
    with open(backends, "x", encoding="utf-8", opener=create) as handle:
        handle.write(starter())
    print(f"wrote {PROJECT_FILES[0]}; {NEXT_STEP}")
    if os.path.isfile(pyproject):
        print("(to keep the backends in pyproject.toml instead: remove it, then run"
              " 'torch-backends init --pyproject')")  # fmt: skip
    return EXIT_OK
