"""Concurrency and faults: first lookups from many threads, refresh() under load, bad imports.

No test here measures time: each one asserts an order of events or an identity that a
broken implementation gets wrong, and a hang shows as the test never passing.
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from torch_backend_registry import BackendLoadError, Registry

from .conftest import WriteFn

MakeModule = Callable[..., str]
# Long enough never to be reached by a passing test; a broken one fails after it.
PATIENCE = 30


def run_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads started together; re-raise the first error."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def main(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def gate(make_module: MakeModule, module_name: str) -> Iterator[Any]:
    """A module holding events that a target's import waits on, shared with the test."""
    name = make_module(
        f"{module_name}_gate",
        """
        import threading
        started = threading.Event()  # set by a target when its import begins
        release = threading.Event()  # set by the test to let that import finish
        imports = []                 # every target module appends its name when imported
        """,
    )
    module = importlib.import_module(name)
    yield module
    module.release.set()  # never leave a thread waiting


@contextlib.contextmanager
def releasing_soon(gate: Any) -> Iterator[None]:
    """Let the first import started wait a moment, so that the other threads pile up on it.

    The moment only makes races likelier; no assertion depends on its length.
    """

    def release() -> None:
        gate.started.wait(PATIENCE)
        time.sleep(0.1)
        gate.release.set()

    releaser = threading.Thread(target=release)
    releaser.start()
    try:
        yield
    finally:
        gate.release.set()
        releaser.join()


def slow_target(gate: Any, body: str = "") -> str:
    return f"""
import {gate.__name__} as gate
gate.imports.append(__name__)
gate.started.set()
gate.release.wait({PATIENCE})
{body}
def compile(gm, inputs, **options):
    return (__name__, options)
"""


def registry_for(write: WriteFn, body: str) -> Registry:
    path = write("backends.toml", body)
    return Registry(cwd=path.parent, environ={}, sources=("runtime", "project"))


def test_first_lookups_from_many_threads_import_each_target_once_and_share_objects(
    write: WriteFn, make_module: MakeModule, module_name: str, gate: Any
) -> None:
    modules = [make_module(f"{module_name}_{i}", slow_target(gate)) for i in range(3)]
    registry = registry_for(
        write,
        f"""
        [backends.plain]
        target = "{modules[0]}:compile"
        aliases = ["p"]
        [backends.bound]
        target = "{modules[1]}:compile"
        options = {{ level = 3 }}
        aliases = ["b"]
        [backends.other]
        target = "{modules[2]}:compile"
        """,
    )
    names = ["plain", "p", "bound", "b", "other"]

    def look_up_all(i: int) -> dict[str, Any]:
        order = random.Random(i).sample(names, len(names))
        return {name: registry.lookup_backend(name) for name in order}

    with releasing_soon(gate):
        results = run_threads(16, look_up_all)
    assert sorted(gate.imports) == sorted(modules)  # each target imported exactly once
    for name in names:
        assert all(r[name] is results[0][name] for r in results), name
    # A name and its alias are one backend: one object, even with bound options.
    assert results[0]["plain"] is results[0]["p"]
    assert results[0]["bound"] is results[0]["b"]
    assert results[0]["bound"]("g", []) == (modules[1], {"level": 3})


def test_a_slow_import_stalls_no_other_name_nor_listing_nor_refresh(
    write: WriteFn, make_module: MakeModule, module_name: str, gate: Any
) -> None:
    slow = make_module(f"{module_name}_slow", slow_target(gate))
    fast = make_module(f"{module_name}_fast", "def compile(gm, inputs):\n    return 'fast'\n")
    registry = registry_for(
        write,
        f'[backends.slow]\ntarget = "{slow}:compile"\n[backends.fast]\ntarget = "{fast}:compile"\n',
    )
    got: dict[str, Any] = {}
    first = threading.Thread(
        target=lambda: got.setdefault("first", registry.lookup_backend("slow"))
    )
    first.start()
    assert gate.started.wait(PATIENCE)
    # A second thread asking for the same name waits for the same import.
    second = threading.Thread(
        target=lambda: got.setdefault("second", registry.lookup_backend("slow"))
    )
    second.start()

    # While the slow import holds its module's lock, everything else goes on.
    assert registry.lookup_backend("fast")("g", []) == "fast"
    assert registry.list_backends() == ["fast", "slow"]
    assert registry.backend_info("slow").target == f"{slow}:compile"
    registry.refresh()
    assert registry.lookup_backend("fast")("g", []) == "fast"
    assert first.is_alive()  # all of that happened before the import was let go

    gate.release.set()
    first.join()
    second.join()
    assert gate.imports == [slow]
    assert got["first"] is got["second"]
    assert got["first"]("g", []) == (slow, {})


def test_a_slow_import_that_fails_fails_every_waiter_and_a_later_lookup_retries(
    write: WriteFn, make_module: MakeModule, module_name: str, gate: Any, tmp_path: Path
) -> None:
    name = make_module(f"{module_name}_flaky", slow_target(gate, 'raise RuntimeError("boom")'))
    fine = make_module(f"{module_name}_fine", "def compile(gm, inputs):\n    return 'fine'\n")
    registry = registry_for(
        write,
        f'[backends.flaky]\ntarget = "{name}:compile"\n'
        f'[backends.fine]\ntarget = "{fine}:compile"\n',
    )

    def look_up(i: int) -> BaseException | None:
        try:
            registry.lookup_backend("flaky")
        except BackendLoadError as exc:
            return exc
        return None

    with releasing_soon(gate):
        errors = run_threads(4, look_up)
    for error in errors:
        assert isinstance(error, BackendLoadError)
        at = f"{tmp_path / 'backends.toml'}:2: backends.flaky.target: "
        assert str(error).startswith(f"{at}cannot load backend")
        assert "RuntimeError: boom" in str(error)
        assert isinstance(error.__cause__, RuntimeError)
    assert name not in sys.modules
    assert registry.lookup_backend("fine")("g", []) == "fine"  # the others are unaffected

    # Fixed on disk (another size, so no stale bytecode), the next lookup imports it again.
    make_module(name, slow_target(gate, "# fixed, nothing raised here any more"))
    assert registry.lookup_backend("flaky")("g", []) == (name, {})


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("raise ImportError('a dependency is missing')", "ImportError: a dependency is missing"),
        ("import sys; sys.exit(3)", "SystemExit: 3"),
        ("compile = 42", "is an int, which is not callable"),
        ("compile = None", "is a NoneType, which is not callable"),
        ("def make():\n    return None\ncompile = make()", "is a NoneType, which is not callable"),
    ],
    ids=["raises", "exits", "an int", "None", "a factory's result"],
)
def test_a_faulty_target_is_a_load_error_and_spares_the_others(
    write: WriteFn, make_module: MakeModule, module_name: str, source: str, reason: str
) -> None:
    make_module(module_name, source)
    registry = registry_for(
        write,
        f'[backends.bad]\ntarget = "{module_name}:compile"\n'
        '[backends.good]\ntarget = "operator:add"\n',
    )
    with pytest.raises(BackendLoadError, match=reason):
        registry.lookup_backend("bad")
    assert registry.lookup_backend("good") is operator.add
    with pytest.raises(BackendLoadError):  # not cached: tried again, failing again
        registry.lookup_backend("bad")


def _replace(path: Path, text: str) -> None:
    # As editors save: a new file moved into place, so a reader sees all of one or the other.
    partial = path.with_suffix(".tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def test_refresh_while_threads_look_up_shows_the_old_or_the_new_state_never_an_error(
    tmp_path: Path, make_module: MakeModule, module_name: str
) -> None:
    one = make_module(f"{module_name}_one", "def f(gm, i):\n    return 1\n")
    two = make_module(f"{module_name}_two", "def f(gm, i):\n    return 2\n")
    old = f'[backends.a]\ntarget = "{one}:f"\n[backends.b]\ntarget = "{one}:f"\n'
    new = old.replace(one, two) + f'[backends.c]\ntarget = "{two}:f"\n'
    manifest = tmp_path / "backends.toml"
    _replace(manifest, old)
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    listings = {("a", "b"), ("a", "b", "c")}
    stop = threading.Event()

    def edit_and_refresh() -> None:
        for text in [new, old] * 30:
            _replace(manifest, text)
            registry.refresh()
        stop.set()

    def look_up(i: int) -> int:
        done = 0
        while not stop.is_set() or done < 50:
            assert registry.lookup_backend(random.choice("ab"))(None, None) in (1, 2)
            assert tuple(registry.list_backends()) in listings
            done += 1
        return done

    editor = threading.Thread(target=edit_and_refresh)
    editor.start()
    counts = run_threads(6, look_up)
    editor.join()
    assert all(count >= 50 for count in counts)
    # After the last edit and refresh, the file on disk is what every lookup sees.
    assert registry.list_backends() == ["a", "b"]
    assert registry.lookup_backend("a")(None, None) == 1


def test_a_manifest_edited_while_running_is_seen_after_refresh_only(
    tmp_path: Path, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, "def one(gm, i):\n    return 1\ndef two(gm, i):\n    return 2\n")
    manifest = tmp_path / "backends.toml"
    _replace(manifest, f'[backends.a]\ntarget = "{module_name}:one"\n')
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    assert registry.lookup_backend("a")(None, None) == 1
    # Same size and, within the second, the same mtime: nothing about the file tells.
    _replace(manifest, f'[backends.a]\ntarget = "{module_name}:two"\n')
    assert registry.lookup_backend("a")(None, None) == 1  # cached until refresh()
    registry.refresh()
    assert registry.lookup_backend("a")(None, None) == 2
