"""Reading one manifest file into definitions, each problem located at its file, line and key."""

from __future__ import annotations

import os
from dataclasses import replace
from types import MappingProxyType
from typing import NamedTuple

from .._definition import (
    EMPTY,
    BackendDefinition,
    DefaultDeclaration,
    Discovery,
    PluginRule,
    Problem,
    Source,
)
from .._errors import ManifestError, closest, warn
from .._keys import table_prefix, toml_key
from .cache import NO_CACHE
from .files import Untrusted, nested, parse_toml, read_text, table_at

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._definition import SourceKind
    from .cache import Cache
    from .positions import KeyLines
    from .schema import BackendEntry, Manifest

#: The most problems reported for one file; past them, one line says how many more.
#: A generated file can hold a hundred thousand of the same mistake.
MAX_PROBLEMS = 100

#: How deeply an option's value may nest (arrays and tables inside it). Far beyond
#: any real option, and far enough below Python's recursion limit that comparing,
#: hashing, copying or printing the value is always safe.
MAX_VALUE_DEPTH = 100


def read_manifest(path: str, kind: SourceKind, cache: Cache = NO_CACHE) -> Discovery | None:
    """Read and validate one manifest file (through ``cache``); ``None`` for a
    ``pyproject.toml`` without a ``[tool.torch-backends]`` table. The problems of one backend
    are recorded on that backend and in ``problems``; the file's other backends stay usable."""
    try:
        text = read_text(path)  # the trust rule and the limits: judged every time
    except (Untrusted, ManifestError) as exc:
        # Where one table's bytes are what cannot be read (not UTF-8), the file is still lost
        # whole: the warning must not say that only that backend is.
        located = exc.problem.line is not None
        return _lost(exc.problem, "; no backend of this file is used until then" if located else "")
    key = [kind, path, os.path.realpath(path), text]
    return cache.remembered("manifest", key, lambda: _validated(path, kind, text))


def _validated(path: str, kind: SourceKind, text: str) -> Discovery | None:
    """What a manifest's text declares: parsed, validated, every problem located."""
    prefix = table_prefix(path)
    try:
        data, lines = parse_toml(path, text, within=prefix)
    except ManifestError as exc:
        # Located at the table it broke, but what it costs is the whole file: said so.
        return _lost(exc.problem, "; no backend of this file is used until it parses")
    # None: a pyproject.toml's without our table (a backends.toml is the table).
    if (table := table_at(data, prefix)) is None:
        return None
    load_schema()
    return _Validation(Discovery(), path, kind, prefix, lines).run(table)


def _lost(problem: Problem, consequence: str) -> Discovery:
    """What a file lost whole gives: its one problem, with what it costs."""
    said = problem.message + consequence
    return Discovery(problems=[replace(problem, message=said, whole_file=True)])


def load_schema() -> None:
    """Import (and so build) the schema models. pydantic scans every distribution's entry
    points for plugins as the first model is built, and one unreadable ``*.dist-info`` makes
    that raise: then they are built with ``PYDANTIC_DISABLE_PLUGINS`` set for that moment."""
    try:
        from . import schema
    except ImportError:
        raise  # pydantic itself is missing: no switch helps
    except Exception as exc:
        warn(
            "pydantic's plugin scan failed on an installed distribution"
            f" ({type(exc).__name__}: {exc}); manifests are validated without pydantic plugins"
        )
        previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
        try:
            from . import schema  # noqa: F401
        finally:
            if previous is None:
                del os.environ["PYDANTIC_DISABLE_PLUGINS"]
            else:
                os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous


class _Validation(NamedTuple):
    """Validating one parsed document, its problems collected in ``found``."""

    found: Discovery
    path: str
    kind: SourceKind
    prefix: tuple[str, ...]
    lines: KeyLines

    def at(self, *keys: str) -> tuple[int | None, str]:
        """Where the key ``keys`` of the document is: its line, and the key as written."""
        keys = (*self.prefix, *keys)
        return self.lines.line_of(keys), toml_key(keys)

    def problem(self, loc: tuple[str | int, ...], message: str, **facts: Any) -> Problem:
        """A problem at the key ``loc`` of the document (array indexes left out), reported."""
        line, key = self.at(*(str(part) for part in loc if not isinstance(part, int)))
        problem = Problem(message, path=self.path, line=line, key=key, **facts)
        self.found.problems.append(problem)
        return problem

    def run(self, table: object) -> Discovery:
        from pydantic import ValidationError

        from .schema import SCHEMA_VERSION, Manifest, describe, error_loc

        if not isinstance(table, dict):
            self.problem((), "expected a table")
            return self.found
        version = table.get("schema-version", SCHEMA_VERSION)
        if type(version) is int and version > SCHEMA_VERSION:  # true is 1 to Python
            self.problem(
                ("schema-version",),
                f"schema version {version} is newer than this release supports"
                f" ({SCHEMA_VERSION}); upgrade torch-backend-registry or write"
                f" schema-version = {SCHEMA_VERSION}",
            )
            return self.found
        data = dict(table)
        # A [backends] that is no table is validated as written, and has no backend.
        if not isinstance(raw_backends := data.get("backends"), dict):
            raw_backends = {}
        #: Each broken backend's first problem, by its name.
        broken: dict[str, Problem] = {}
        # Only options take any value: every other key's type stops a deep value at its
        # first level. A backend whose options nest too deeply is not validated.
        said = f"values nest more than {MAX_VALUE_DEPTH} levels deep; flatten this value"
        for name, entry in raw_backends.items():
            deep = _too_deep(entry.get("options") if isinstance(entry, dict) else None)
            if deep is not None:
                broken[name] = self.problem(("backends", name, "options", *deep), said)
        if raw_backends:
            data["backends"] = {n: b for n, b in raw_backends.items() if n not in broken}
        try:
            manifest = Manifest.model_validate(data)
        except ValidationError as exc:
            items = exc.errors(include_url=False, include_context=True, include_input=True)
            for number, item in enumerate(items):
                loc = tuple(item["loc"])
                if number < MAX_PROBLEMS:
                    problem = self.problem(error_loc(item), describe(item, loc))
                elif number == MAX_PROBLEMS:
                    more = len(items) - MAX_PROBLEMS
                    said = f"and {more} more problems; fix those above first"
                    problem = self.problem(error_loc(item), said, also=more - 1)
                if len(loc) >= 2 and loc[0] == "backends" and isinstance(loc[1], str):
                    broken.setdefault(loc[1], problem)
            # What is valid: the document without its wrong keys, and its tables but the broken.
            wrong = {item["loc"][0] for item in items if item["loc"]}
            valid = {k: v for k, v in data.items() if k not in wrong}
            valid["backends"] = {n: b for n, b in raw_backends.items() if n not in broken}
            manifest = Manifest.model_validate(valid)
        self._header(manifest)
        self._backends(raw_backends, broken, manifest)
        return self.found

    def _header(self, header: Manifest) -> None:
        for field in ("allow", "deny"):
            names = getattr(header.plugins, field, None)
            if names is not None and (names or field == "allow"):
                line, key = self.at("plugins", field)
                self.found.rules.append(PluginRule(field, frozenset(names), key, self.path, line))
        if header.default is not None:
            line, key = self.at("default")
            self.found.default = DefaultDeclaration(header.default, self.path, line, key)

    def _backends(
        self, raw_backends: dict[str, Any], broken: dict[str, Problem], manifest: Manifest
    ) -> None:
        from .._definition import ATOL, MIN_SPEEDUP, RTOL

        # Relative to the real file: a link to a manifest must not make its code
        # come from the folder the link is in.
        base = os.path.dirname(os.path.realpath(self.path))
        # Each folder once, with how it was first written (check names a folder so).
        written: dict[str, str] = {}
        for folder in manifest.python_path:
            written.setdefault(os.path.normpath(os.path.join(base, folder)), folder)
        python_path, written_path = tuple(written), tuple(written.values())
        cache = manifest.compile_cache
        compile_cache = None if cache is None else os.path.normpath(os.path.join(base, cache))
        # The manifest's own folder is searched last, whatever python-path says: a module
        # beside the manifest is found from any working folder, as a script's is.
        search_path = (*(f for f in python_path if f != base), base)
        seen: dict[str, str] = {}
        for name, raw in raw_backends.items():
            table = (*self.prefix, "backends", name)
            source = Source(self.kind, path=self.path, line=self.lines.line_of(table))
            problem = broken.get(name)
            if problem is None:
                entry = manifest.backends[name]
                problem = self._alias_problem(name, entry, raw_backends, seen)
            if problem is not None:
                aliases = _aliases_of_broken(problem, raw, raw_backends, seen)
                self.found.definitions.append(
                    BackendDefinition(name, source, aliases=aliases, problem=problem)
                )
                continue
            level = entry.verify or ("forward" if entry.select == "fastest" else "none")
            rtol = RTOL if entry.rtol is None else entry.rtol  # doctor's tolerances unless given
            atol = ATOL if entry.atol is None else entry.atol
            # As pairs, ``other`` last: the one asked when no device type matches; a table's
            # torch.compile settings apart, by device.
            by_device = sorted((entry.by_device or {}).items(), key=lambda d: d[0] == "other")
            pairs = [(d, c if isinstance(c, str) else c.backend) for d, c in by_device]
            settings = {
                d: MappingProxyType(c.model_dump(exclude={"backend"}, exclude_defaults=True))
                for d, c in by_device
                if not isinstance(c, str)
            }
            definition = BackendDefinition(
                name,
                source,
                target=entry.target,
                chain=tuple(entry.chain) if entry.chain is not None else None,
                by_device=None if entry.by_device is None else tuple(pairs),
                device_settings=MappingProxyType(settings) if settings else EMPTY,
                tags=tuple(entry.tags),
                description=entry.description,
                aliases=tuple(entry.aliases),
                requires=tuple(entry.requires),
                options=MappingProxyType(entry.options) if entry.options else EMPTY,
                enabled=entry.enabled,
                python_path=python_path,
                search_path=search_path,
                written_path=written_path,
                compile_cache=compile_cache,
                verify=None if level == "none" else (level, rtol, atol),
                select=entry.select,
                min_speedup=entry.min_speedup or MIN_SPEEDUP,
                distribution=entry.distribution,
                lines=MappingProxyType(self._key_lines(table, raw)),
            )
            self.found.definitions.append(definition)
            for device, _choice in by_device:
                self._known_device(name, device)

    def _key_lines(self, table: tuple[str, ...], raw: dict[str, Any]) -> dict[str, int]:
        """The line of each key of a backend's table, and of each key one level inside it
        (an option, a device type), by the key as TOML writes it relative to the table."""
        # And the manifest's python-path, which each of its backends searches, and its
        # compile cache (no key of a backend's table has those names).
        lines = {}
        for key in ("python-path", "compile-cache"):
            if (line := self.lines.line_of((*self.prefix, key), exact=True)) is not None:
                lines[key] = line
        for key, value in raw.items():
            inside = value if isinstance(value, dict) else ()
            for parts in [(key,), *((key, inner) for inner in inside)]:
                if (line := self.lines.line_of((*table, *parts))) is not None:
                    lines[toml_key(parts)] = line
        return lines

    def _known_device(self, name: str, device: str) -> None:
        """A device type PyTorch does not name is likely a typo (``cdua``): a warning, since
        an extension's device (``npu``) is named by the extension."""
        from .schema import DEVICE_TYPES

        if device == "other" or device in DEVICE_TYPES:
            return
        close = {"gpu": ["cuda"]}.get(device) or closest(device, ["other", *DEVICE_TYPES])
        hint = f"; did you mean {close[0]!r}?" if close else ""
        self.problem(
            ("backends", name, "by-device", device),
            f"device type {device!r} is not one PyTorch names, so no graph will be on it{hint}"
            " (an extension's own device type is fine as written)",
            severity="warning",
        )

    def _alias_problem(
        self, name: str, entry: BackendEntry, raw_backends: dict[str, Any], seen: dict[str, str]
    ) -> Problem | None:
        """A name or alias used twice in this file is a problem at the later alias, each
        such alias named."""
        clashes = []
        for alias in entry.aliases:
            if alias in seen or alias in raw_backends:  # its own name is one of raw_backends
                owner = seen.get(alias, alias)
                twice = owner == name and alias != name
                owner_said = "this backend, twice" if twice else f"backend {owner!r}"
                clashes.append(f"alias {alias!r} is already used by {owner_said}")
            seen.setdefault(alias, name)
        if not clashes:
            return None
        return self.problem(
            ("backends", name, "aliases"),
            f"{'; '.join(clashes)} in this file; each name and alias must be unique",
        )


def _aliases_of_broken(
    problem: Problem, raw: object, raw_backends: dict[str, Any], seen: dict[str, str]
) -> tuple[str, ...]:
    """The aliases a broken table declares, where they themselves are right: asked by one,
    the registry says what is wrong with the table, as it does asked by its name."""
    import re

    from .schema import NAME_PATTERN

    declared = raw.get("aliases") if isinstance(raw, dict) else None
    if not isinstance(declared, list) or (problem.key or "").endswith(".aliases"):
        return ()
    if not all(isinstance(a, str) and re.fullmatch(NAME_PATTERN, a) for a in declared):
        return ()
    return tuple(a for a in dict.fromkeys(declared) if a not in raw_backends and a not in seen)


def _too_deep(value: object) -> tuple[str, ...] | None:
    """The key path at which ``value`` nests beyond :data:`MAX_VALUE_DEPTH`, or ``None``."""
    deep = ((item, keys) for item, depth, keys in nested(value) if depth >= MAX_VALUE_DEPTH)
    return next((keys for item, keys in deep if isinstance(item, (dict, list))), None)
