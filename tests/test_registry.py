"""The registry: lookup, lazy loading, errors, runtime registration, import cost."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import (
    BackendLoadError,
    DuplicateBackendError,
    ManifestError,
    Registry,
    UnknownBackendError,
)

from .conftest import WriteFn, run_python

MakeModule = Callable[..., str]

COMPILER = """
CALLS = []
def compile(gm, example_inputs, **options):
    CALLS.append(options)
    return ("compiled", gm, options)
not_callable = 42
class Namespace:
    @staticmethod
    def nested(gm, example_inputs):
        return "nested"
"""


def manifest(write: WriteFn, body: str) -> Registry:
    path = write("backends.toml", body)
    return Registry(cwd=path.parent, environ={}, sources=("runtime", "env", "project"))


def test_lookup_imports_on_first_use_once_and_caches(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(write, f'[backends.fast]\ntarget = "{module_name}:compile"\n')
    assert registry.list_backends() == ["fast"]
    assert module_name not in sys.modules  # listing imported nothing
    assert registry.backend_info("fast").target == f"{module_name}:compile"
    assert module_name not in sys.modules  # nor did backend_info
    fn = registry.lookup_backend("fast")
    assert module_name in sys.modules
    assert fn is registry.lookup_backend("fast")
    assert fn("gm", []) == ("compiled", "gm", {})


def test_options_are_bound_as_keyword_arguments(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(
        write,
        f'[backends.fast]\ntarget = "{module_name}:compile"\noptions = {{ fp16 = true, n = 2 }}\n',
    )
    fn = registry.lookup_backend("fast")
    assert fn("gm", []) == ("compiled", "gm", {"fp16": True, "n": 2})
    assert registry.is_registered_backend(fn)


def test_dotted_attribute_path(write: WriteFn, make_module: MakeModule, module_name: str) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(write, f'[backends.n]\ntarget = "{module_name}:Namespace.nested"\n')
    assert registry.lookup_backend("n")(None, []) == "nested"


def test_alias_returns_the_same_backend(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(
        write, f'[backends.fast]\ntarget = "{module_name}:compile"\naliases = ["f"]\n'
    )
    assert registry.lookup_backend("f")("g", []) == ("compiled", "g", {})
    assert registry.backend_info("f").name == "fast"


def test_python_path_is_on_sys_path_only_while_importing(
    write: WriteFn, module_name: str, tmp_path: Path
) -> None:
    write(f"src/{module_name}.py", "def compile(gm, inputs):\n    return 'from src'\n")
    registry = manifest(
        write, f'python-path = ["src"]\n[backends.local]\ntarget = "{module_name}:compile"\n'
    )
    try:
        assert registry.lookup_backend("local")(None, []) == "from src"
        assert str(tmp_path / "src") not in sys.path
    finally:
        sys.modules.pop(module_name, None)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("{m}_missing:compile", "import of '{m}_missing' failed: ModuleNotFoundError"),
        ("{m}:nothing_here", "has no attribute 'nothing_here'"),
        ("{m}:not_callable", "is an int, which is not callable"),
    ],
    ids=["module missing", "attribute missing", "not callable"],
)
def test_load_errors_name_file_line_and_chain_the_cause(
    write: WriteFn, make_module: MakeModule, module_name: str, target: str, reason: str
) -> None:
    make_module(module_name, COMPILER)
    target = target.format(m=module_name)
    registry = manifest(write, f'# first line\n[backends.broken]\ntarget = "{target}"\n')
    with pytest.raises(BackendLoadError) as caught:
        registry.lookup_backend("broken")
    error = caught.value
    assert (error.name, error.target) == ("broken", target)
    assert error.source.line == 2  # where it is declared; the message says its target's line
    at = f"{error.source.path}:3: backends.broken.target: "
    assert str(error).startswith(f"{at}cannot load backend 'broken'")
    assert reason.format(m=module_name) in str(error)
    assert error.__cause__ is not None


def test_load_error_is_not_cached_fixing_the_code_works(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    registry = manifest(write, f'[backends.later]\ntarget = "{module_name}:compile"\n')
    with pytest.raises(BackendLoadError):
        registry.lookup_backend("later")
    make_module(module_name, COMPILER)
    assert registry.lookup_backend("later")("g", [])[0] == "compiled"


def test_unmet_requirement_is_a_load_error_without_importing(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(
        write,
        f'[backends.trt]\ntarget = "{module_name}:compile"\nrequires = ["no_such_mod_xyz"]\n',
    )
    with pytest.raises(BackendLoadError, match="requires 'no_such_mod_xyz', which cannot be found"):
        registry.lookup_backend("trt")
    assert module_name not in sys.modules


def test_met_requirement_is_looked_for_not_imported(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    needed = make_module(module_name + "_dep", "raise RuntimeError('must not be imported')\n")
    registry = manifest(
        write, f'[backends.ok]\ntarget = "{module_name}:compile"\nrequires = ["{needed}"]\n'
    )
    registry.lookup_backend("ok")
    assert needed not in sys.modules


def test_broken_definition_raises_its_manifest_error_others_work(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(
        write,
        f'[backends.bad]\ntarget = "nocolon"\n[backends.good]\ntarget = "{module_name}:compile"\n',
    )
    with pytest.warns(tbr.ManifestWarning, match="backends.bad.target") as caught_warnings:
        assert registry.list_backends() == ["good"]
    [said] = [str(w.message) for w in caught_warnings]
    assert said.endswith("(so backend 'bad' is left out)")
    with pytest.raises(ManifestError) as caught:
        registry.lookup_backend("bad")
    assert (caught.value.line, caught.value.key) == (2, "backends.bad.target")
    assert registry.lookup_backend("good")("g", [])[0] == "compiled"


def test_an_alias_of_a_broken_table_says_what_is_wrong_with_it(write: WriteFn) -> None:
    # Asked by its alias, the table's own error; a wrong alias list names nothing.
    registry = manifest(
        write,
        '[backends.bad]\ntarget = "m:f"\naliases = ["b"]\ntags = "oops"\n'
        '[backends.worse]\ntarget = "m:f"\naliases = ["w", 3]\n',
    )
    with pytest.warns(tbr.ManifestWarning):
        registry.problems()
    for name in ("b", "bad"):
        with pytest.raises(ManifestError) as caught:
            registry.lookup_backend(name)
        assert (caught.value.line, caught.value.key) == (4, "backends.bad.tags")
    with pytest.raises(UnknownBackendError):
        registry.lookup_backend("w")


def test_a_manifest_that_does_not_parse_says_it_loses_every_backend_of_the_file(
    write: WriteFn,
) -> None:
    # Located at the table TOML broke in, but no backend of the file is read: said so,
    # not that one backend is left out.
    text = '[backends.keep]\ntarget = "m:f"\n[backends.twice]\ntarget = "m:f"\n'
    registry = manifest(write, text + '[backends.twice]\ntarget = "m:g"\n')
    with pytest.warns(tbr.ManifestWarning) as caught:
        assert registry.list_backends() == []
    [said] = [str(w.message) for w in caught]
    assert ":5: backends.twice: invalid TOML: Cannot declare" in said
    assert said.endswith("; no backend of this file is used until it parses")
    assert "left out" not in said
    [problem] = registry.problems()
    assert problem.message.endswith("no backend of this file is used until it parses")


def test_unknown_name_suggests_close_names(write: WriteFn) -> None:
    registry = manifest(write, '[backends.fast_compile]\ntarget = "m:f"\n')
    with pytest.raises(UnknownBackendError) as caught:
        registry.lookup_backend("fast_compil")
    assert caught.value.name == "fast_compil"
    assert caught.value.suggestions == ("fast_compile",)
    assert "Did you mean 'fast_compile'?" in str(caught.value)
    assert str(caught.value).endswith("list_backends(exclude_tags=()) gives every name.")
    assert isinstance(caught.value, LookupError)
    # A name in other case is the name meant, written as it is declared.
    with pytest.raises(UnknownBackendError) as caught:
        registry.lookup_backend("FAST_COMPILE")
    assert caught.value.suggestions == ("fast_compile",)


def test_pytorchs_name_outside_the_sources_is_said_so_never_suggested_as_itself(
    tmp_path: Path,
) -> None:
    registry = Registry(cwd=tmp_path, environ={}, sources=("env",))  # PyTorch's not read
    with pytest.raises(UnknownBackendError) as caught:
        registry.lookup_backend("inductor")
    assert caught.value.suggestions == ()  # not "did you mean 'inductor'?"
    assert "one of PyTorch's own backends, and PyTorch's registry is not read here" in str(
        caught.value
    )
    with pytest.raises(UnknownBackendError) as caught:
        registry.lookup_backend("inductr")
    assert caught.value.suggestions == ("inductor",)


def test_callables_pass_through(registry: Registry) -> None:
    def fn(gm: Any, inputs: Any) -> Any:
        return gm

    assert registry.lookup_backend(fn) is fn


@pytest.mark.parametrize("wrong", [None, 42, ["eager"]], ids=["None", "int", "list"])
def test_neither_a_name_nor_a_callable_is_a_type_error(registry: Registry, wrong: Any) -> None:
    with pytest.raises(
        TypeError, match=f"expected a backend name or a callable, got {type(wrong).__name__}"
    ):
        registry.lookup_backend(wrong)


def test_list_backends_excludes_tags_like_pytorch(write: WriteFn) -> None:
    registry = manifest(
        write,
        """
        [backends.plain]
        target = "m:a"
        [backends.dbg]
        target = "m:b"
        tags = ["debug"]
        [backends.exp]
        target = "m:c"
        tags = ["experimental", "gpu"]
        """,
    )
    assert registry.list_backends() == ["plain"]
    assert registry.list_backends(exclude_tags=()) == ["dbg", "exp", "plain"]
    assert registry.list_backends(exclude_tags=None) == ["dbg", "exp", "plain"]
    assert registry.list_backends(exclude_tags=("gpu",)) == ["dbg", "plain"]


def test_reading_leaves_the_garbage_collector_as_it_found_it(write: WriteFn) -> None:
    # Reading pauses the cyclic collector: on after, and still off in a process that
    # turned it off.
    assert manifest(write, '[backends.plain]\ntarget = "m:a"\n').list_backends() == ["plain"]
    assert gc.isenabled()
    gc.disable()
    try:
        manifest(write, '[backends.other]\ntarget = "m:b"\n').list_backends()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_register_backend_bare_called_and_tagged(registry: Registry) -> None:
    @registry.register_backend
    def bare(gm: Any, inputs: Any) -> Any:
        return gm

    @registry.register_backend(name="called", tags=("debug",))
    def other(gm: Any, inputs: Any) -> Any:
        return gm

    assert registry.lookup_backend("bare") is bare
    assert registry.lookup_backend("called") is other
    assert registry.backend_info("called").tags == ("debug",)
    assert other._tags == ("debug",)  # type: ignore[attr-defined]  # as PyTorch sets it
    assert registry.list_backends() == ["bare"]
    assert registry.is_registered_backend(bare)
    assert not registry.is_registered_backend(lambda gm, inputs: gm)


def test_registering_twice_is_a_duplicate_error(registry: Registry) -> None:
    def one(gm: Any, inputs: Any) -> Any:
        return gm

    registry.register_backend(one, name="same")
    with pytest.raises(DuplicateBackendError) as caught:
        registry.register_backend(one, name="same")
    assert caught.value.name == "same"
    assert caught.value.existing.kind == "runtime"


def test_register_rejects_non_callables(registry: Registry) -> None:
    with pytest.raises(TypeError, match="must be callable"):
        registry.register_backend(42, name="x")  # type: ignore[call-overload]


def test_runtime_registration_shadows_a_loaded_manifest_backend(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(write, f'[backends.fast]\ntarget = "{module_name}:compile"\n')
    registry.lookup_backend("fast")

    def replacement(gm: Any, inputs: Any) -> Any:
        return "runtime"

    registry.register_backend(replacement, name="fast")
    assert registry.lookup_backend("fast") is replacement


def test_refresh_rereads_manifests_and_keeps_runtime(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(write, f'[backends.a]\ntarget = "{module_name}:compile"\n')

    @registry.register_backend
    def kept(gm: Any, inputs: Any) -> Any:
        return gm

    assert registry.list_backends() == ["a", "kept"]
    write("backends.toml", f'[backends.b]\ntarget = "{module_name}:compile"\n')
    assert registry.list_backends() == ["a", "kept"]  # discovery is cached
    registry.refresh()
    assert registry.list_backends() == ["b", "kept"]


def test_module_level_api_acts_on_the_default_registry(
    clean_default: Registry, write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    write("backends.toml", f'[backends.proj]\ntarget = "{module_name}:compile"\n')

    @tbr.register_debug_backend
    def dbg(gm: Any, inputs: Any) -> Any:
        return gm

    @tbr.register_experimental_backend(name="exp")
    def experimental(gm: Any, inputs: Any) -> Any:
        return gm

    names = tbr.list_backends(exclude_tags=())
    assert {"proj", "dbg", "exp"} <= set(names)
    assert "dbg" not in tbr.list_backends()
    assert "exp" not in tbr.list_backends()
    assert tbr.backend_info("exp").tags == ("experimental",)
    assert tbr.lookup_backend("dbg") is dbg
    assert tbr.is_registered_backend(tbr.lookup_backend("proj"))


def test_a_loaded_backend_is_served_from_memory_until_refresh(
    tmp_path: Path, write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(write, f'[backends.fast]\ntarget = "{module_name}:compile"\n')
    fn = registry.lookup_backend("fast")
    # Once loaded, neither the manifest nor the module is read again: both may go.
    (tmp_path / "backends.toml").unlink()
    (tmp_path / "site" / f"{module_name}.py").unlink()
    del sys.modules[module_name]
    assert registry.lookup_backend("fast") is fn
    assert module_name not in sys.modules  # served, not imported again
    registry.refresh()
    with pytest.raises(UnknownBackendError):
        registry.lookup_backend("fast")


def test_import_costs_no_torch_pydantic_or_metadata() -> None:
    out = run_python(
        "import sys, torch_backend_registry as t\n"
        "print(sorted(m for m in ('torch', 'pydantic', 'importlib.metadata', 'tomli')"
        " if m in sys.modules))"
    ).stdout.strip()
    assert out == "[]"


def test_version_is_served_lazily() -> None:
    out = run_python("import torch_backend_registry as t; print(t.__version__)").stdout.strip()
    assert out
    assert out[0].isdigit()


def test_listing_and_backend_info_import_no_backend_code(tmp_path: Path, write: WriteFn) -> None:
    write(
        "backends.toml",
        '[backends.a]\ntarget = "tbr_never_imported_a:f"\n[backends.b]\nchain = ["a"]\n',
    )
    out = run_python(
        "import sys, torch_backend_registry as t\n"
        "r = t.Registry(sources=('project', 'entry-point'))\n"
        "r.list_backends(); r.backend_info('a'); r.backend_info('b')\n"
        "print([m for m in sys.modules if m.startswith(('tbr_never', 'openvino'))])",
        cwd=tmp_path,
    ).stdout.strip()
    assert out == "[]"


def test_chain_with_unmet_requirement_is_a_load_error(write: WriteFn) -> None:
    registry = manifest(write, '[backends.c]\nchain = ["x"]\nrequires = ["no_such_mod_xyz"]\n')
    with pytest.raises(BackendLoadError, match="requires 'no_such_mod_xyz'") as caught:
        registry.lookup_backend("c")
    # At the line and key of what is unmet: a chain has no target.
    assert (
        str(caught.value).split(": cannot load")[0].endswith("backends.toml:3: backends.c.requires")
    )


def test_warnings_point_at_the_callers_line(write: WriteFn) -> None:
    registry = manifest(write, "[backends.bad]\ntarget = 1\n")
    with pytest.warns(tbr.ManifestWarning) as caught:
        registry.list_backends()
    assert caught[0].filename == __file__


def test_a_chain_skips_a_member_missing_here(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    pytest.importorskip("torch")  # a chain runs where torch.compile calls it
    make_module(module_name, "def f(gm, inputs):\n    return lambda: 'compiled by f'\n")
    registry = manifest(
        write,
        f'[backends.fast]\ntarget = "{module_name}:f"\n'
        '[backends.portable]\nchain = ["only_on_a_gpu_box", "fast"]\n',
    )
    assert registry.lookup_backend("portable")(None, [])() == "compiled by f"


def test_a_registration_of_another_name_keeps_what_was_loaded(
    write: WriteFn, make_module: MakeModule, module_name: str
) -> None:
    make_module(module_name, COMPILER)
    registry = manifest(
        write, f'[backends.fast]\ntarget = "{module_name}:compile"\noptions = {{ level = 2 }}\n'
    )
    before = registry.lookup_backend("fast")  # options bound: a new object each load
    registry.register_backend(len, name="unrelated")
    assert registry.lookup_backend("fast") is before
    assert registry.is_registered_backend(before)


def test_threads_asking_why_a_chain_is_unavailable_agree(write: WriteFn) -> None:
    for _ in range(20):
        registry = manifest(
            write,
            '[backends.fast]\ntarget = "json:dumps"\n'
            '[backends.portable]\nchain = ["gone", "fast"]\n',
        )
        assert _ask_at_once(registry, registry.backend_info("portable"), 4) == [None] * 4


def test_a_chain_that_reaches_a_loop_it_is_not_told_of_is_unavailable_through_it(
    write: WriteFn,
) -> None:
    # c runs b, and b and a run each other: c is in the loop a -> c -> b -> a too, but the
    # loop is told from a and b; asked about c, the answer ends at b's.
    registry = manifest(
        write,
        '[backends.a]\nchain = ["b", "c"]\n[backends.b]\nchain = ["a"]\n'
        '[backends.c]\nchain = ["b"]\n',
    )
    why = {name: registry.why_unavailable(registry.backend_info(name)) for name in "abc"}
    assert why["a"] == "chain 'a' names itself (a -> b -> a); remove the loop"
    assert why["b"] == "chain 'b' names itself (b -> a -> b); remove the loop"
    assert why["c"] == f"no member can be used (b: {why['b']})"


def _ask_at_once(registry: tbr.Registry, info: tbr.BackendInfo, threads: int) -> list[str | None]:
    import threading

    answers: list[str | None] = []
    start = threading.Barrier(threads)

    def ask() -> None:
        start.wait()
        answers.append(registry.why_unavailable(info))

    running = [threading.Thread(target=ask) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return answers


FAKE_TORCH_BACKEND = """
from .registry import register_backend, register_debug_backend
from .registry import register_backend as registered

@register_backend(name="{named}")
def compiler(gm, example_inputs):
    return gm

@register_debug_backend
def {decorated}(gm, example_inputs):
    return gm

register_backend(compiler_fn=compiler, name="{called}")
registered(compiler, "{called}_positional")

def {called}_own_name(gm, example_inputs):
    return gm

register_backend({called}_own_name)
NAME = "computed"

@register_backend(name=NAME)  # not written out: no name is guessed
def not_its_name(gm, example_inputs):
    return gm
"""


def test_pytorch_names_are_read_from_the_pytorch_installed_here(tmp_path: Path) -> None:
    # A PyTorch of another release, as its files lay out: its backends' names are refused
    # without importing it, and an edit of those files (an upgrade) is seen.
    backends = tmp_path / "site" / "torch" / "_dynamo" / "backends"
    backends.mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text("raise ImportError('not imported')\n")
    (tmp_path / "site" / "torch" / "version.py").write_text("__version__ = '9.1.0'\n")
    registering = "def register_backend(compiler_fn=None, name=None): ...\n"
    (backends / "registry.py").write_text(registering)
    module = backends / "new.py"
    probe = """
import torch_backend_registry as tbr
registry = tbr.Registry(cwd={cwd!r}, environ={{}}, sources=("runtime",))
for name in ("brand_new", "debug_new", "by_call", "by_call_positional", "by_call_own_name",
             "not_its_name", "mine_now", "debug_now", "inductor"):
    try:
        registry.register_backend(lambda gm, inputs: gm, name=name)
        print(name, "registered")
    except tbr.DuplicateBackendError as exc:
        print(name, "refused:", exc.existing.kind)
"""
    env = {"PYTHONPATH": str(tmp_path / "site"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = probe.format(cwd=str(tmp_path))
    said = []
    for named, decorated, called in [
        ("brand_new", "debug_new", "by_call"),
        ("mine_now", "debug_now", "by_call_now"),  # the next release renamed them
    ]:
        source = FAKE_TORCH_BACKEND.format(named=named, decorated=decorated, called=called)
        module.write_text(source)
        for _twice in range(2):  # the second time from what the first remembered
            said.append(run_python(code, env=env).stdout.splitlines())
    first = [
        "brand_new refused: torch",
        "debug_new refused: torch",
        "by_call refused: torch",
        "by_call_positional refused: torch",
        "by_call_own_name refused: torch",
        "not_its_name registered",  # its name was not written out: not guessed
        "mine_now registered",
        "debug_now registered",
        "inductor registered",  # this PyTorch has no inductor
    ]
    assert said[0] == said[1] == first
    renamed = [line.replace("refused: torch", "registered") for line in first[:6]]
    assert (
        said[2]
        == said[3]
        == [
            *renamed,
            "mine_now refused: torch",
            "debug_now refused: torch",
            "inductor registered",
        ]
    )


def test_a_load_error_names_the_pytorch_installed_here_without_its_version_py(
    tmp_path: Path,
) -> None:
    # A PyTorch installed without its sources (byte code only, as slimmed images ship it),
    # not imported here: its version is what its metadata says.
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('not imported')\n")
    info = site / "torch-9.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.1.0\n")
    (tmp_path / "broken_ext.py").write_text(
        "raise ImportError('_C.so: undefined symbol: _ZN3c1017RegisterOperators')\n"
    )
    (tmp_path / "backends.toml").write_text('[backends.ext]\ntarget = "broken_ext:compile"\n')
    code = f"""
import torch_backend_registry as tbr
registry = tbr.Registry(cwd={str(tmp_path)!r}, environ={{}}, sources=("project",))
try:
    registry.lookup_backend("ext")
except tbr.BackendLoadError as exc:
    print(exc)
"""
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    said = run_python(code, env={"PYTHONPATH": path}).stdout
    assert "built for another PyTorch than the one installed here (9.1.0)" in said, said


def test_a_module_beside_the_manifest_that_another_shadows_is_said_alike_in_every_process(
    tmp_path: Path, write: WriteFn
) -> None:
    write("trace.py", "def tracer(gm, example_inputs):\n    return gm.forward\n")
    write("backends.toml", '[backends.mine]\ntarget = "trace:tracer"\n')
    said = "module 'trace' beside the manifest"
    console = Path(sys.executable).with_name("torch-backends")
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    ways = {
        "console script": [str(console), "check", "--import", "--no-torch"],
        "python -m": [
            sys.executable,
            "-m",
            "torch_backend_registry",
            "check",
            "--import",
            "--no-torch",
        ],
        "a script beside it": [sys.executable, str(write("run.py", SCRIPT_LOOKS_UP))],
    }
    for way, command in ways.items():
        done = subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True)
        assert said in done.stdout + done.stderr, (way, done.stdout, done.stderr)
        assert "is shadowed by" in done.stdout + done.stderr, way
        assert "trace.py" in (done.stdout + done.stderr).split("shadowed by")[1], way


SCRIPT_LOOKS_UP = """
import torch_backend_registry as tbr
try:
    tbr.lookup_backend("mine")
except tbr.BackendLoadError as exc:
    print(exc)
"""


def test_a_src_layout_says_which_python_path_finds_it(tmp_path: Path, write: WriteFn) -> None:
    write("src/tbr_src_pkg/__init__.py", "")
    write("src/tbr_src_pkg/comp.py", "def f(gm, example_inputs):\n    return gm.forward\n")
    write("backends.toml", '[backends.mine]\ntarget = "tbr_src_pkg.comp:f"\n')
    registry = Registry(cwd=tmp_path, environ={}, sources=("project",))
    with pytest.raises(BackendLoadError) as caught:
        registry.lookup_backend("mine")
    assert str(caught.value).endswith(
        "No module named 'tbr_src_pkg'; src/tbr_src_pkg is beside the manifest:"
        ' python-path = ["src"] would find it'
    )
