"""``check``: the manifests validated (``--import``: and imported, ``--locked``: and compared
with backends.lock); each problem on its file's line, with its severity."""

from __future__ import annotations

import contextlib
import os
import sys
from argparse import Namespace as Arguments
from collections.abc import Sequence
from pathlib import Path

from .._definition import BackendDefinition, Problem
from .._errors import BackendRegistryError, LockDriftError, LockFileError, ManifestWarning
from .._registry import Registry
from .._sources import PROJECT_FILES, near_table, project_manifest, replaced_table
from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    NO_MANIFEST,
    CommandError,
    error,
    no_manifest,
    print_json,
    printable,
    registry_for,
    relative,
    status_line,
    working_folder,
)


def run_check(args: Arguments) -> int:
    import warnings

    if args.locked and args.files:
        raise CommandError(
            "--locked compares the backends found here (the project's manifest,"
            " TORCH_BACKENDS_PATH, plugins) with backends.lock: give it no files"
        )
    # Every problem is printed below as a line of its own; no need to warn too.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ManifestWarning)
        if not args.files and no_manifest():
            error(NO_MANIFEST + _near_table_here())
            if args.json:  # a script reading the output gets an answer it can parse
                problem = {"severity": "error", "message": NO_MANIFEST, "path": None}
                print_json({"problems": [problem], "backends": 0, "errors": 1})
            return EXIT_PROBLEMS
        # The given files, or the discovered manifests; entry points and PyTorch's backends
        # are read too: chains name them, and PyTorch's names cannot be redefined. Absolute,
        # as --json gives every path; the lines printed show them relative to here.
        registry = registry_for(args.no_torch, [os.path.abspath(f) for f in args.files])
        with status_line("loading PyTorch's backends (--no-torch skips them)", not args.no_torch):
            problems = registry.problems()
        return _report(registry, problems, args)


def _drift(registry: Registry, problems: list[Problem]) -> str | None:
    """Add each difference from the lock install() holds to (backends.lock, or the one
    TORCH_BACKENDS_LOCKED names) to ``problems``; where there is none, say which matched."""
    from .._lock import check_locked, lock_from_environment, lock_path

    named = lock_from_environment(registry)
    path = named or lock_path(registry)
    try:
        matched = check_locked(registry, path, from_environment=named is not None)
    except LockFileError as exc:
        problems.append(Problem(exc.message, path=exc.path, line=exc.line))
        return None
    except LockDriftError as exc:
        accept = f"; run '{exc.command}' to accept it"
        problems.extend(Problem(change + accept, path=path) for change in exc.changes)
        return None
    return f"{relative(path)} matched (fingerprint {matched})"


def _near_table_here() -> str:
    """Where a pyproject.toml here or above holds what looks like a misspelt table, say so."""
    here = working_folder()
    for folder in (Path(here), *Path(here).parents) if here else ():
        candidate = os.path.join(folder, PROJECT_FILES[1])
        if near := near_table(candidate):  # None where there is none, or no such file
            return f" ({relative(candidate)} has {near}: did you mean [tool.torch-backends]?)"
    return ""


def _misplaced(here: str | None, read: list[str]) -> list[Problem]:
    """The project's manifest where it misleads: a backends.toml that replaces a
    pyproject.toml's table; or one found above the repository the command runs in (the folder
    holding ``.git``), which belongs to something else: likely the project's own is not where
    it is looked for. That one is said as a warning."""
    if here is None or (project := project_manifest(here)) is None:
        return []
    said = [] if (replaced := replaced_table(project)) is None else [replaced]
    if project not in read:
        return said
    folders = (Path(here), *Path(here).parents)
    repository = next((f for f in folders if os.path.lexists(f / ".git")), None)
    if repository is None or Path(project).is_relative_to(repository):
        return said  # in no repository, or in this one
    message = (
        f"this manifest lies above the repository this command runs in ({repository}): the"
        " project's manifest is the nearest one from here up; if this repository has one,"
        " it is not where it is looked for"
    )
    return [*said, Problem(message, path=project, severity="warning")]


def _report(registry: Registry, problems: list[Problem], args: Arguments) -> int:
    """Add what the registry cannot know (where the project's manifest lies, drift from the
    lock, python-path folders, with ``--import`` what fails to import); print each problem and
    note (each backend unavailable here too) by file and line, then a summary. Only problems
    fail."""
    from .._api import manifests_read
    from .._autoload import enabled, state
    from .choices import problems as choices_problems

    read = manifests_read(registry)
    problems = [*problems, *_misplaced(registry.context.cwd, read)]
    problems += choices_problems(registry, read, with_torch=not args.no_torch)
    matched = _drift(registry, problems) if args.locked else None
    # The manifests' backends; entry points and PyTorch's only resolve chain members.
    every = registry.definitions((), with_torch=False, broken=True)
    checked = [d for d in every if d.source.kind in ("env", "project")]
    problems = [*problems, *_folder_problems(checked), *_nothing_to_select(checked)]
    usable = [d for d in checked if d.usable]
    # A note is worth printing and no fault: a chain member not installed here.
    notes = [p for p in problems if p.severity == "note"]
    problems = [p for p in problems if p.severity != "note"]
    # What the registry cannot use here, by its own rule: a chain or table none of whose
    # members it can use (for a table, none for the CPU), one that loops, and with --import
    # a target whose requirements are missing. A note says why, where no error does.
    unavailable: list[Problem] = []
    index = registry.index()
    said = {**index.unknown_members(), **index.chain_problems}
    for d in list(usable):
        if (d.members or args.import_targets) and (why := registry.why_unavailable(d)) is not None:
            usable.remove(d)
            if d.name not in said or said[d.name].severity != "error":
                note = f"unavailable here ({why})" + "; not imported" * args.import_targets
                unavailable.append(said.get(d.name) or d.located(note, severity="note"))
    if args.import_targets:
        imports = _Imports(registry, {d.name for d in checked})
        for d in list(usable):
            problems.extend(imports.check(d))
            if imports.found.get(d.name) is not None:
                usable.remove(d)
    shown = sorted(
        dict.fromkeys([*problems, *notes, *unavailable]), key=lambda p: (p.path or "", p.line or 0)
    )
    errors = [p for p in problems if p.severity == "error"]
    # One line may stand for more problems of its file than are worth printing.
    counted = sum(1 + p.also for p in errors)
    warnings = len(problems) - len(errors)
    code = EXIT_PROBLEMS if errors else EXIT_OK
    if args.json:
        keys = ("path", "line", "key", "severity", "message")
        print_json(
            {
                "problems": [{key: getattr(p, key) for key in keys} for p in shown],
                "backends": len(checked),
                "usable": len(usable),
                "unavailable": len(unavailable),
                "errors": counted,
                "warnings": warnings,
                "notes": len(notes),
                "imported": args.import_targets,
                "lock": matched,
                "manifests": read,
                "autoload": enabled(),
            }
        )
        return code
    here = working_folder()
    for line in shown:
        print(printable(line.shown(here)))
    what = "imported and usable" if args.import_targets else "usable"
    summary = f"{len(usable)} of {len(checked)} backend(s) {what}"
    counts = {"unavailable here": len(unavailable), "warning(s)": warnings, "note(s)": len(notes)}
    summary += "".join(f", {count} {noun}" for noun, count in counts.items() if count)
    if matched:
        summary += f"; {matched}"
    if enabled():  # why these are torch.compile names in processes nobody changed
        summary += f"; autoload {state()}"
    summary += f"; read {', '.join(map(relative, read)) or 'no manifest'}"
    verdict = f"{counted} problem(s)" if errors else "no problems"
    print(f"{verdict}; {summary}", file=sys.stderr)
    return code


def _nothing_to_select(checked: Sequence[BackendDefinition]) -> list[Problem]:
    """A note at the ``select`` of a chain of one member that selects the fastest."""
    return [
        d.located(
            f'chain {d.name!r} has one member ({d.chain[0]!r}): select = "fastest" has'
            " nothing to choose between",
            "select",
            severity="note",
        )
        for d in checked
        if d.chain and d.select == "fastest" and len(set(d.chain)) == 1
    ]


def _folder_problems(checked: Sequence[BackendDefinition]) -> list[Problem]:
    """A python-path folder that is none (likely a typo) or that the trust rule refuses
    serves no code, and a compile cache that is no file loads nothing: a warning, once a
    file."""
    from .._sources.files import refused_folders

    said: list[Problem] = []
    # Each manifest's folders judged once: its backends share its python-path.
    for d in {d.source.path: d for d in checked if d.source.path is not None}.values():
        if d.compile_cache is not None and not os.path.isfile(d.compile_cache):
            message = (
                f"compile-cache {d.compile_cache} is no file: no compile cache is loaded; make"
                " it with 'torch-backends tune --compile-cache PATH -- COMMAND'"
            )
            said.append(_manifest_warning(d, message, "compile-cache"))
        for written, folder in zip(d.written_path, d.python_path, strict=True):
            if not os.path.isdir(folder):
                what = "is not a folder" if os.path.lexists(folder) else "does not exist"
                message = f"python-path folder {written!r} {what} ({folder})"
            elif refused := refused_folders([folder]):
                message = refused[folder]
            else:
                continue
            message += "; a target in it would not be found"
            said.append(_manifest_warning(d, message, "python-path"))
    return said


def _manifest_warning(d: BackendDefinition, message: str, key: str) -> Problem:
    """A warning at ``key`` of the manifest that declares ``d``, outside any backend's table."""
    from .._keys import table_prefix, toml_key

    path = d.source.path or ""
    where = toml_key((*table_prefix(path), key))
    return Problem(message, path=path, line=d.line_of(key), key=where, severity="warning")


class _Imports:
    """What ``check --import`` imports, each backend once: a target itself; a chain's members
    (usable where one is); a table's (usable where the one it gives the CPU is)."""

    def __init__(self, registry: Registry, declared: set[str]) -> None:
        self.registry = registry
        self.index = registry.index()
        #: The backends the checked manifests declare: each is reported at its own table.
        self.declared = declared
        #: Why each backend looked at cannot be used here (``None``: it can): an error where
        #: it was imported and broke, a note where it is unavailable (not imported).
        self.found: dict[str, Problem | None] = {}

    def check(self, d: BackendDefinition) -> list[Problem]:
        fatal = self._judge(d.name)
        if not d.members:
            return [] if fatal is None else [fatal]
        problems = []
        what = "chain" if d.by_device is None else "by-device"
        then = "uses the next member" if d.by_device is None else "fails on that device"
        for member in d.members:
            said = self.found.get(member)
            own = (known := self.index.get(member)) is not None and known.name in self.declared
            if said is None or said.severity != "error" or own:
                continue  # it loads; or is unavailable here (noted); or has its own report
            message = f"{what} member {member!r}: {said.message}"
            if fatal is None:  # the chain or table still runs: only a warning
                message += f"; {d.name!r} {then}"
            problems.append(d.located(message, what, severity="error" if fatal else "warning"))
        return problems + self._settings(d)

    def _settings(self, d: BackendDefinition) -> list[Problem]:
        """A device's table whose backend cannot take its ``mode`` or ``options``: said at
        the device's line, as the compile would refuse them."""
        from .._chain import member_compiler
        from .._errors import RefusedArguments

        problems = []
        for device, settings in d.device_settings.items():
            member = dict(d.by_device or ())[device]
            if self.found.get(member) is not None:
                continue  # it cannot be used here: said already
            try:
                compiler = self.registry.lookup_backend(member)
                definition = self.registry.backend_info(member).definition
                member_compiler(d.name, definition, compiler, settings)
            except RefusedArguments as exc:
                said = str(exc).removeprefix(f"backend {d.name!r}: ")
                problems.append(d.located(said, "by-device", device))
            except BackendRegistryError:
                continue  # a member that cannot be looked up is reported as a member
        return problems

    def _judge(self, name: str) -> Problem | None:
        if name not in self.found:
            self.found[name] = None  # a loop is reported already: do not walk it again
            # None: unknown here (noted), or one of PyTorch's not read (--no-torch).
            if (definition := self.index.get(name)) is not None:
                self.found[name] = self._verdict(definition)
        return self.found[name]

    def _verdict(self, definition: BackendDefinition) -> Problem | None:
        if (why := self.registry.why_unavailable(definition)) is not None:
            return Problem(f"unavailable here ({why})", severity="note")
        if not definition.members:
            return self._load(definition)
        # Every member is judged (imported), to be reported at its own line. The chain runs
        # here where one member can be used and imports; a table, where the one it gives the
        # CPU does (every machine has one).
        judged = {m: self._judge(m) for m in definition.members}

        def runs(member: str) -> bool:
            if self.index.get(member) is None:  # unknown, unless one of PyTorch's not read
                return self.index.could_be_pytorch(member)
            return judged[member] is None  # one unavailable here is judged so: a note

        table = dict(definition.by_device or ())
        run = [table.get("cpu") or table.get("other") or ""] if table else definition.members
        return None if any(map(runs, run)) else Problem("no member it would run here can be used")

    def _load(self, d: BackendDefinition) -> Problem | None:
        """Look ``d`` up; its failure as a problem at its ``target``, like the manifest's own."""
        from .._errors import ManifestError
        from .._loader import cannot_compile

        try:
            # What a backend prints as it is imported must not mix with this report.
            with contextlib.redirect_stdout(sys.stderr):
                fn = self.registry.lookup_backend(d.name)
        except ManifestError as exc:  # where it is written: an option's own line
            return exc.problem
        except BackendRegistryError as exc:  # a load error's message, without where it is
            message = getattr(exc, "message", str(exc))
        else:
            if (why := cannot_compile(fn)) is None:
                return None
            message = f"backend {d.name!r} (target {d.target!r}) {why}"
        return Problem(message) if d.source.path is None else d.located(message, "target")
