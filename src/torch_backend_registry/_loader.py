"""Turning a definition into a callable: the one place that imports backend code.

A target's ``python-path`` folders are searched while it is imported, and once
it is loaded for the rest of the process (see ``_sources.finding``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import pkgutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ._definition import BackendDefinition, target_of
from ._errors import BackendLoadError, ManifestError, closest, did_you_mean, warn
from ._sources.finding import keep, locate, searching
from ._sources.pytorch import inductor, torch_version


def check_requirements(definition: BackendDefinition, missing: Sequence[str]) -> None:
    """Raise :class:`BackendLoadError` where ``missing`` names ``requires`` modules of
    ``definition`` that cannot be found."""
    if missing:
        said = f"requires {', '.join(map(repr, missing))}, which cannot be found; install it"
        cause = ModuleNotFoundError(f"No module named {missing[0]!r}")
        raise _error(definition, said, "requires") from cause


def load_target(definition: BackendDefinition) -> Callable[..., Any]:
    """Import ``module:attr.path``, check it is callable, bind ``options``. Raises
    :class:`BackendLoadError` chained to the original exception, having removed from
    ``sys.modules`` the target's own modules, so that the next lookup imports the fixed code."""
    target = definition.target
    assert target is not None
    module_name, _, attr_path = target.partition(":")
    located = locate(definition, module_name)
    check_requirements(definition, located.missing)
    for message in located.refused.values():
        warn(f"{definition.source.describe()}: backend {definition.name!r}: {message}")
    if located.shadowed is not None:
        mine, theirs = located.shadowed
        raise _error(
            definition,
            f"module {module_name.split('.')[0]!r} beside the manifest ({mine}) is shadowed by"
            f" {theirs}, which is imported first wherever the manifest's folder is not the"
            " script's or working folder; rename yours",
        )
    before = set(sys.modules)
    try:
        with searching(located.folders):
            obj: Any = importlib.import_module(module_name)
    # SystemExit and the like too: a backend module that exits while imported must not end
    # the process that merely looked the backend up. Only an interruption goes through.
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        _forget(before, module_name, located.folders)
        note = f" ({'; '.join(located.refused.values())})" if located.refused else ""
        hint = _close_module(exc, module_name, located.folders)
        said = f"import of {module_name!r} failed: {_why(exc)}{hint}{note}"
        raise _error(definition, said) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            _forget(before, module_name, located.folders)
            what = f"{type(obj).__name__} {getattr(obj, '__name__', obj)!r}"
            said = f"{what} has no attribute {part!r}{_did_you_mean(part, dir(obj))}"
            raise _error(definition, said) from exc
    if not callable(obj):
        _forget(before, module_name, located.folders)
        kind = type(obj).__name__
        article = "an" if kind[:1] in "aeiouAEIOU" else "a"
        said = f"{target!r} is {article} {kind}, which is not callable"
        raise _error(definition, said) from TypeError(f"{kind} object is not callable")
    keep(located.folders)
    if definition.options:
        # Said where it is written: at its key, in the manifest.
        if wrong := refusal(accepted_options(obj), definition.options, target, manifest=True):
            key, message = wrong
            raise ManifestError.of(definition.located(message, "options", key))
        return functools.update_wrapper(functools.partial(obj, **definition.options), obj)
    return obj  # type: ignore[no-any-return]


def cannot_compile(fn: Any, given: Iterable[str] = ()) -> str | None:
    """Why ``fn`` cannot be called as ``fn(graph_module, example_inputs, **given)``, as
    torch.compile calls a backend (``None``: it can, or its signature cannot be read)."""
    if (read := _parameters(fn)) is None:
        return None
    parameters, positional = read
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters):
        # What it needs beyond the graph and its inputs, which nothing would give it.
        missing = [
            p.name
            for p in parameters
            if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p not in positional[:2]
            and p.name not in given
        ]
        if not missing:
            return None
        return (
            f"needs {', '.join(map(repr, missing))}, which torch.compile does not give and no"
            f" option sets; set it in the manifest: options = {{ {missing[0]} = ... }}"
        )
    said = (
        f"takes {len(positional) or 'no'} positional argument{'s' * (len(positional) != 1)},"
        " but torch.compile calls a backend with two: (graph_module, example_inputs)"
    )
    if all(p.default is not p.empty or p.kind is p.VAR_KEYWORD for p in parameters):
        said += (
            "; it looks like a factory that returns the compiler: name what it returns"
            " instead (in a module of yours, compiler = factory(...), and target that)"
        )
    return said


def _parameters(fn: Any) -> tuple[list[inspect.Parameter], list[inspect.Parameter]] | None:
    """``fn``'s parameters, and the positional ones among them; ``None`` where they cannot be
    read. A wrapper's own: functools.wraps points at the wrapped function, whose parameters
    may be fewer than the wrapper takes."""
    try:
        parameters = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return parameters, [p for p in parameters if p.kind in kinds]


def refusal(
    accepted: Sequence[str] | None, keys: Iterable[str], target: str, *, manifest: bool
) -> tuple[str, str] | None:
    """The first of ``keys`` not ``accepted`` (``None``: any is), and the sentence that
    refuses them: with the parameter each was likely meant for, else what ``target`` takes
    (for a ``manifest`` option of a compiler taking one ``options`` table, how to write it
    there); ``None`` where every key is accepted."""
    if accepted is None or not (keys := [key for key in keys if key not in accepted]):
        return None
    quoted = [repr(key) for key in keys]
    names = " and ".join([", ".join(quoted[:-1]), quoted[-1]] if quoted[1:] else quoted)
    if len(keys) == 1:
        said = f"option {names} is not a parameter of {target}"
    else:
        said = f"options {names} are not parameters of {target}"
    meant = [(key, close[0]) for key in keys if (close := closest(key, accepted))]
    if meant and len(keys) == 1:
        return keys[0], f"{said}; did you mean {meant[0][1]!r}?"
    if meant:
        guesses = ", ".join(f"{close!r} for {key!r}" for key, close in meant)
        said = f"{said}; did you mean {guesses}?"
        if len(meant) < len(keys):
            said += f" It takes {', '.join(map(repr, accepted))}"
    elif manifest and "options" in accepted:  # written for torch.compile(options={...})
        table = f"options = {{ options = {{ {keys[0]} = ... }} }}"
        said += f"; it takes its options as one table: {table}"
    else:
        said += f"; it takes {', '.join(map(repr, accepted)) or 'none'}"
    return keys[0], said


def accepted_options(fn: Any) -> list[str] | None:
    """The keyword arguments ``fn`` takes besides the graph and its example inputs, in the
    order of its signature; ``None`` for any (``**kwargs`` that go nowhere known, or a
    signature that cannot be read)."""
    accepted: list[str] = []
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        if fn is inductor():
            # PyTorch's inductor takes **kwargs and passes them to compile_fx when it compiles.
            from torch._inductor.compile_fx import compile_fx

            fn = compile_fx
        if (read := _parameters(fn)) is None:
            return None
        parameters, positional = read
        accepted.extend(
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p not in positional[:2]  # the graph module and its example inputs
            and p.name not in accepted
        )
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return accepted
        fn = getattr(fn, "__wrapped__", None)  # its **kwargs go on to what it wraps
    return None


def call_options(fn: Any, name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``fn`` from what torch.compile passed to backend ``name``:
    its ``options`` table unpacked (unless ``fn`` takes ``options`` itself) and ``mode``; a
    :class:`TypeError`, worded as for a manifest's option, for one ``fn`` does not take."""
    passed = dict(given)
    options = passed.pop("options", None)
    accepted = accepted_options(fn)
    if options is not None and accepted is not None and "options" not in accepted:
        passed.update(options)
    elif options is not None:
        passed["options"] = options
    if refused := refusal(accepted, passed, target_of(fn) or f"backend {name!r}", manifest=False):
        raise TypeError(refused[1])
    return passed


def _forget(before: set[str], module_name: str, folders: Sequence[str]) -> None:
    """Drop the modules a failed load added: the target's own, and those of its folders."""
    importlib.invalidate_caches()
    roots = tuple(os.path.join(folder, "") for folder in folders)
    for name in set(sys.modules) - before:
        origin = getattr(getattr(sys.modules.get(name), "__spec__", None), "origin", None) or ""
        # The target's module, one inside it, a package above it, or one of its folders'.
        if (
            f"{name}.".startswith(f"{module_name}.")
            or module_name.startswith(f"{name}.")
            or (roots and origin.startswith(roots))
        ):
            sys.modules.pop(name, None)


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    public = [c for c in candidates if not c.startswith("_") or name.startswith("_")]
    # A typo's letter or two, not a likeness: 'our_compile' is no misspelling of 'sre_compile'.
    return did_you_mean(name, public, before="; ", cutoff=0.85)


def _close_module(exc: BaseException, module_name: str, folders: Sequence[str]) -> str:
    """Where the target's own module (not one it imports) is missing: the closest module
    at the same level (``mycompilers`` beside the manifest for ``mycompiler``)."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    # Another error, or a module the target imports (the target's module is not below it):
    # installing that module is the fix.
    if not isinstance(missing, str) or not f"{module_name}.".startswith(f"{missing}."):
        return ""
    parent, _, leaf = missing.rpartition(".")
    if parent:
        places = list(getattr(sys.modules.get(parent), "__path__", None) or [])
    else:
        places = [*sys.path, *folders]
    try:
        names = [m.name for m in pkgutil.iter_modules(places)]
    except Exception:  # an unreadable folder on the path: no hint, that is all
        return ""
    return _did_you_mean(leaf, names) or ("" if parent else _one_below(leaf, folders))


def _one_below(name: str, folders: Sequence[str]) -> str:
    """A module ``name`` one folder below the manifest's (``src/pkg``, as a src layout puts
    it): the python-path entry that would find it."""
    for folder in folders[-1:]:  # the manifest's own, searched last
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                inside = os.path.join(entry.path, name)
                if entry.is_dir() and (os.path.isdir(inside) or os.path.isfile(inside + ".py")):
                    return (
                        f"; {entry.name}/{name} is beside the manifest: python-path ="
                        f' ["{entry.name}"] would find it'
                    )
    return ""


def _why(exc: BaseException) -> str:
    """The exception, and where it says ``undefined symbol`` (a compiled extension built
    against another PyTorch's C++ library), what that means."""
    said = f"{type(exc).__name__}: {exc}"
    if "undefined symbol" not in str(exc):
        return said
    here = f" ({version})" if (version := torch_version()) else ""
    return (
        f"{said}; it was built for another PyTorch than the one installed here{here}:"
        " install the build of it made for this one"
    )


def _error(definition: BackendDefinition, reason: str, key: str = "target") -> BackendLoadError:
    # Where check says it too: the line and key of what failed (a chain has no target).
    where = "" if definition.source.path is None else str(definition.located("", key))
    return BackendLoadError(definition.name, definition.target, definition.source, reason, where)
