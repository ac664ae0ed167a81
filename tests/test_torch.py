"""The torch bridge: PyTorch's backends as a source, install(), default, fallback chains.

These tests run real torch.compile on the CPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torch_backend_registry as tbr
from torch_backend_registry import (
    BackendChainError,
    ManifestError,
    Problem,
    Registry,
    UnknownBackendError,
)

from .conftest import PLUGINS, WriteFn, run_forked, run_python

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

MakeModule = Callable[..., str]

COMPILERS = """
CALLS = []

def passthrough(gm, example_inputs, **options):
    CALLS.append(("passthrough", options))
    return gm.forward

def doubling(gm, example_inputs, factor=2):
    CALLS.append(("doubling", factor))
    def run(*args):
        return tuple(out * factor for out in gm(*args))
    return run

def explode(gm, example_inputs):
    CALLS.append(("explode", None))
    raise RuntimeError("no GPU here")
"""


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.compiler.set_default_backend(None)


@pytest.fixture
def uid() -> str:
    """A suffix keeping backend names unique: PyTorch's registry is process-wide."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def compilers(make_module: MakeModule, module_name: str) -> str:
    return make_module(module_name, COMPILERS)


def project(write: WriteFn, body: str) -> Registry:
    path = write("backends.toml", body)
    return Registry(cwd=path.parent, environ={})


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())


def assert_compiles_like_eager(backend: str, x: Any) -> None:
    """torch.compile with ``backend`` gives what the model gives uncompiled."""
    assert torch.allclose(torch.compile(model(), backend=backend)(x), model()(x))


def test_pytorch_backends_are_the_lowest_source(registry: Registry, write: WriteFn) -> None:
    full = project(write, '[backends.eager_mine]\ntarget = "m:mine"\n')
    names = full.list_backends(exclude_tags=())
    assert {"inductor", "aot_eager", *PLUGINS} <= set(names)
    assert "aot_eager" not in full.list_backends()  # tagged debug, as in PyTorch
    inductor = full.backend_info("inductor")
    assert inductor.source.kind == "torch"
    assert inductor.tags == ()
    assert full.lookup_backend("aot_eager") is torch._dynamo.lookup_backend("aot_eager")
    assert full.backend_info("aot_eager").source.module == "torch._dynamo.backends.debugging"


def test_without_torch_the_source_is_empty(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import torch_backend_registry as t\n"
        "r = t.Registry(sources=('torch',))\n"
        "print(r.list_backends(exclude_tags=()))\n"
        "try:\n"
        "    r.lookup_backend('eager')\n"
        "except t.UnknownBackendError as e:\n"
        "    print('unknown')\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.stdout.split() == ["[]", "unknown"]


def test_a_broken_distribution_breaks_pytorchs_registry_not_ours(
    tmp_path: Path, write: WriteFn
) -> None:
    # torch._dynamo reads every entry point itself and fails on this one; the other
    # distributions' backends must still be there. (No manifest here: pydantic reads
    # every entry point for its plugins and fails on this one as well.)
    write("site/garbled-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: garbled\n")
    write("site/garbled-1.0.dist-info/entry_points.txt", "[torch_dynamo_backends]\nno pair\n")
    write("site/sound-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sound\n")
    write("site/sound-1.0.dist-info/entry_points.txt", "[torch_dynamo_backends]\nsound = m:f\n")
    code = (
        "import warnings, torch_backend_registry as t\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    print(t.Registry(sources=('entry-point', 'torch')).list_backends())\n"
        "for w in caught: print(w.message)\n"
    )
    done = run_forked(code, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 0, done.stderr
    names, *warnings = done.stdout.splitlines()
    assert "'sound'" in names
    assert any(
        w.startswith("PyTorch's backends are left out: torch._dynamo failed") for w in warnings
    )
    assert any("distribution 'garbled' cannot be read" in w for w in warnings)


def test_install_without_torch_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import torch_backend_registry as t\n"
        "try:\n"
        "    t.install(t.Registry(sources=('runtime',)))\n"
        "except t.BackendRegistryError as e:\n"
        "    print(e)\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.stdout.startswith("install() needs PyTorch")


def test_install_makes_manifest_backends_compile_without_importing_them(
    write: WriteFn, compilers: str, uid: str
) -> None:
    fast, hidden, alias = f"fast_{uid}", f"exp_{uid}", f"f_{uid}"
    registry = project(
        write,
        f"""
        [backends.{fast}]
        target = "{compilers}:doubling"
        options = {{ factor = 3 }}
        aliases = ["{alias}"]

        [backends.{hidden}]
        target = "{compilers}:passthrough"
        tags = ["experimental"]
        """,
    )
    tbr.install(registry)
    tbr.install(registry)  # idempotent
    assert fast in torch._dynamo.list_backends()
    assert alias in torch._dynamo.list_backends()
    assert hidden not in torch._dynamo.list_backends()  # tags reached PyTorch
    assert hidden in torch._dynamo.list_backends(exclude_tags=())
    compiled = torch.compile(model(), backend=fast)
    assert compilers not in sys.modules  # nothing imported until torch.compile calls it

    x = torch.ones(2, 4)
    assert torch.allclose(compiled(x), model()(x) * 3)
    assert compilers in sys.modules
    assert sys.modules[compilers].CALLS == [("doubling", 3)]

    by_alias = torch.compile(model(), backend=alias)
    assert torch.allclose(by_alias(x), model()(x) * 3)


def test_default_backend_is_applied_on_install(write: WriteFn, compilers: str, uid: str) -> None:
    name = f"default_{uid}"
    registry = project(
        write, f'default = "{name}"\n[backends.{name}]\ntarget = "{compilers}:passthrough"\n'
    )
    tbr.install(registry)
    assert torch.compiler.get_default_backend() == name
    compiled = torch.compile(model())
    compiled(torch.ones(1, 4))
    assert sys.modules[compilers].CALLS == [("passthrough", {})]


def test_default_naming_no_backend_is_not_applied(write: WriteFn, uid: str) -> None:
    registry = project(write, f'default = "missing_{uid}"\n')
    with pytest.warns(UserWarning, match=f"default: not applied: unknown backend 'missing_{uid}'"):
        tbr.install(registry)
    assert torch.compiler.get_default_backend() == "inductor"
    assert any(p.key == "default" for p in registry.problems() if isinstance(p, Problem))


def test_runtime_registrations_after_install_reach_torch(registry: Registry, uid: str) -> None:
    tbr.install(registry)
    name = f"late_{uid}"

    @registry.register_backend(name=name)
    def late(gm: Any, inputs: Any) -> Any:
        return gm.forward

    assert name in torch._dynamo.list_backends()
    assert_compiles_like_eager(name, torch.ones(1, 4))
    registry.unregister_backend(name)  # gone from torch.compile's registry too
    assert name not in torch._dynamo.list_backends()
    with pytest.raises(Exception, match=name):
        torch._dynamo.lookup_backend(name)


def test_backends_added_to_a_manifest_reach_torch_after_refresh(
    write: WriteFn, compilers: str, uid: str
) -> None:
    registry = project(write, f'[backends.first_{uid}]\ntarget = "{compilers}:passthrough"\n')
    tbr.install(registry)
    assert f"second_{uid}" not in torch._dynamo.list_backends()
    write(
        "backends.toml",
        f'[backends.first_{uid}]\ntarget = "{compilers}:passthrough"\n'
        f'[backends.second_{uid}]\ntarget = "{compilers}:passthrough"\n',
    )
    registry.refresh()
    assert f"second_{uid}" in torch._dynamo.list_backends()
    assert_compiles_like_eager(f"second_{uid}", torch.ones(1, 4))
    # A name taken out of the manifest leaves torch.compile's registry with the refresh,
    # not at the first compile that finds it gone.
    write("backends.toml", f'[backends.second_{uid}]\ntarget = "{compilers}:passthrough"\n')
    registry.refresh()
    assert f"first_{uid}" not in torch._dynamo.list_backends()
    assert f"second_{uid}" in torch._dynamo.list_backends()
    with pytest.raises(Exception, match=f"first_{uid}"):
        torch._dynamo.lookup_backend(f"first_{uid}")


def test_a_plugins_name_a_manifest_took_and_gave_back_is_the_plugins_again(
    write: WriteFn, compilers: str
) -> None:
    pytest.importorskip("openvino")
    # A registry that reads no entry points, whose manifest overrides openvino's name.
    path = write("backends.toml", f'[backends.openvino]\ntarget = "{compilers}:passthrough"\n')
    registry = Registry(cwd=path.parent, environ={}, sources=("project",))
    tbr.install(registry)
    assert not torch._dynamo.lookup_backend("openvino").__module__.startswith("openvino")
    write("backends.toml", "")
    registry.refresh()  # the override goes: PyTorch's entry point is what the name is again
    assert "openvino" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("openvino").__module__.startswith("openvino.")


def test_chain_falls_back_past_missing_requirement_and_a_raising_compiler(
    write: WriteFn, compilers: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    chain = f"portable_{uid}"
    registry = project(
        write,
        f"""
        [backends.needs_gpu_{uid}]
        target = "{compilers}:passthrough"
        requires = ["tensorrt_not_installed_{uid}"]

        [backends.explode_{uid}]
        target = "{compilers}:explode"

        [backends.{chain}]
        chain = ["needs_gpu_{uid}", "explode_{uid}", "eager"]
        """,
    )
    tbr.install(registry)
    caplog.set_level(logging.INFO, logger="torch_backend_registry")
    assert_compiles_like_eager(chain, torch.ones(2, 4))
    assert sys.modules[compilers].CALLS == [("explode", None)]
    messages = [r.getMessage() for r in caplog.records if r.name == "torch_backend_registry"]
    assert any(f"skipping 'needs_gpu_{uid}'" in m and "cannot be found" in m for m in messages)
    assert any(f"skipping 'explode_{uid}'" in m and "no GPU here" in m for m in messages)
    assert any("compiled with 'eager'" in m for m in messages)


def test_chain_where_nothing_works_names_every_failure(
    write: WriteFn, compilers: str, uid: str
) -> None:
    chain = f"hopeless_{uid}"
    registry = project(
        write,
        f"""
        [backends.explode_{uid}]
        target = "{compilers}:explode"

        [backends.{chain}]
        chain = ["explode_{uid}", "nowhere_{uid}"]
        """,
    )
    backend = registry.lookup_backend(chain)
    gm = torch.fx.symbolic_trace(model())
    with pytest.raises(BackendChainError) as caught:
        backend(gm, [torch.ones(1, 4)])
    failures = dict(caught.value.failures)
    assert "no GPU here" in failures[f"explode_{uid}"]
    assert failures[f"nowhere_{uid}"] == "not installed here"  # as check and explain say
    assert str(caught.value).startswith(f"no member of fallback chain {chain!r} could compile")


def test_chain_through_torch_compile_reports_every_member(
    write: WriteFn, compilers: str, uid: str
) -> None:
    chain = f"hopeless_tc_{uid}"
    registry = project(
        write,
        f'[backends.x_{uid}]\ntarget = "{compilers}:explode"\n'
        f'[backends.{chain}]\nchain = ["x_{uid}"]\n',
    )
    tbr.install(registry)
    with pytest.raises(Exception, match=rf"x_{uid}'.*no GPU here"):
        torch.compile(model(), backend=chain)(torch.ones(1, 4))


def test_chain_that_names_itself_is_a_manifest_error(write: WriteFn) -> None:
    registry = project(
        write,
        """
        [backends.a]
        chain = ["b", "eager"]

        [backends.b]
        chain = ["c"]

        [backends.c]
        chain = ["a"]
        """,
    )
    with pytest.raises(ManifestError) as caught:
        registry.lookup_backend("a")
    # At the line of each chain key, below its table's header.
    assert (caught.value.line, caught.value.key) == (2, "backends.a.chain")
    assert "a -> b -> c -> a" in str(caught.value)
    assert {p.line for p in registry.problems() if isinstance(p, Problem)} == {2, 5, 8}


def test_compiling_a_declared_name_left_out_for_an_error_says_the_file_and_line(
    write: WriteFn, uid: str
) -> None:
    # PyTorch alone would say "Invalid backend": the manifest says what is wrong, and where.
    registry = project(
        write, f'[backends.typo_{uid}]\nchain = ["eager", "inductor"]\nselct = "fastest"\n'
    )
    with pytest.warns(tbr.ManifestWarning, match="so backend .* is left out"):
        tbr.install(registry)
    with pytest.raises(Exception, match="backend=") as caught:
        torch.compile(model(), backend=f"typo_{uid}")(torch.randn(2, 4))
    said = str(caught.value)
    assert f"backends.toml:3: backends.typo_{uid}.selct: unknown key 'selct'" in said
    assert "did you mean 'select'?" in said


def test_unknown_name_lists_close_torch_names(write: WriteFn) -> None:
    with pytest.raises(UnknownBackendError) as caught:
        project(write, "").lookup_backend("indctor")
    assert "inductor" in caught.value.suggestions


def test_openvino_entry_point_compiles_on_the_cpu(registry: Registry) -> None:
    pytest.importorskip("openvino")
    full = Registry(sources=("entry-point",))
    info = full.backend_info("openvino")
    assert info.source.kind == "entry-point"
    assert info.source.distribution == "openvino"
    assert info.source.version
    x = torch.ones(2, 4)
    compiled = torch.compile(model(), backend=full.lookup_backend("openvino"))
    assert torch.allclose(compiled(x), model()(x), atol=1e-2)


def test_example_session_runs_as_the_readme_shows() -> None:
    # `python examples/compile_session.py` from the root, in a process of its own (its
    # first line imports torch).
    script = Path(__file__).resolve().parent.parent / "examples" / "compile_session.py"
    code = (
        f"import runpy, sys; sys.argv[0] = {str(script)!r}; sys.path[0] = {str(script.parent)!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    done = run_forked(code, script.parent.parent)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "declared here: ['op_counts', 'portable']" in out
    assert "imported yet? False" in out
    assert "[op_counts] 3 ops: linear x2, relu x1" in out
    assert "op_counts matches eager: True" in out
    assert "portable matches eager: True" in out
    assert "skipping 'tensorrt': requires 'torch_tensorrt'" in done.stderr
    if importlib.util.find_spec("openvino") is None:
        assert "auto is unavailable here: openvino is not installed" in out
    else:
        assert "auto matches eager: True" in out
        assert "compiled with 'openvino', forward verified against eager" in done.stderr
        assert "backend 'auto': device cpu: compiling with 'openvino'" in done.stderr
        assert "openvino comes from: distribution 'openvino'" in out


# ------------------------------------------------------------------ locks and forks

PATIENCE = 120  # seconds a subprocess may take; a hang shows as this running out


def test_register_and_refresh_after_install_never_deadlock(tmp_path: Path, write: WriteFn) -> None:
    # register_backend() installs into torch.compile and refresh() re-installs; the
    # two once took the registry's lock and the bridge's in opposite orders.
    write("backends.toml", '[backends.proj]\ntarget = "operator:add"\n')
    code = """
import threading, torch_backend_registry as t
r = t.Registry(environ={}, sources=("runtime", "project"))
t.install(r)
def register():
    for i in range(60):
        r.register_backend(len, name=f"runtime_{i}")
def refresh():
    for i in range(60):
        r.refresh()
threads = [threading.Thread(target=register), threading.Thread(target=refresh)]
for thread in threads: thread.start()
for thread in threads: thread.join()
import torch._dynamo
assert "runtime_59" in torch._dynamo.list_backends(exclude_tags=())
print("done")
"""
    done = run_forked(code, tmp_path)
    assert done.stdout.strip() == "done", done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_a_fork_while_another_thread_discovers_leaves_the_child_working(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.proj]\ntarget = "operator:add"\n')
    code = """
import os, signal, sys, threading, time, torch_backend_registry as t
r = t.Registry(environ={}, sources=("project", "torch"))
lister = threading.Thread(target=r.list_backends)
lister.start()  # holds the registry's lock while it imports torch
while "torch" not in sys.modules:
    time.sleep(0.001)
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a child that hangs is killed, and says so by its status
    import operator
    os._exit(0 if r.lookup_backend("proj") is operator.add else 3)
_, status = os.waitpid(pid, 0)
lister.join()
print(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
        timeout=PATIENCE,
    )  # fmt: skip
    assert done.stdout.strip() == "0", done.stdout + done.stderr


def test_a_plugin_registering_a_manifests_name_late_does_not_turn_the_answer(
    write: WriteFn, compilers: str, uid: str
) -> None:
    name = f"late_{uid}"
    registry = project(write, f'[backends.{name}]\ntarget = "{compilers}:passthrough"\n')
    mine = registry.lookup_backend(name)
    registry.list_backends()

    def plugin(gm: Any, example_inputs: Any) -> Any:
        return gm.forward

    torch._dynamo.register_backend(plugin, name=name)  # a plugin, after the first lookup
    # Whatever is asked first, the manifest's definition stays the answer: a name a
    # plugin put into PyTorch's registry is not one of PyTorch's own.
    assert registry.backend_info(name).source.kind == "project"
    assert registry.lookup_backend(name) is mine
    assert name in registry.list_backends()
    assert not [p for p in registry.problems() if name in p.message]
    assert registry.backend_info(name).shadowed[0].source.kind == "torch"


def test_a_fork_while_another_thread_imports_pytorch_gives_the_child_its_backend(
    tmp_path: Path, write: WriteFn
) -> None:
    # The default registry, which reads PyTorch's registry too; the child needs none of it
    # for a name the project defines, and must not wait on an import no thread finishes:
    # nor when it lists, where PyTorch's backends are left out, and a warning says why.
    write("backends.toml", '[backends.proj]\ntarget = "json:dumps"\n')
    code = """
import os, signal, sys, threading, time
import torch_backend_registry as t
importer = threading.Thread(target=lambda: __import__("torch._dynamo"))
importer.start()
while "torch._dynamo" not in sys.modules:
    time.sleep(0.0005)
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a child that hangs is killed, and says so by its status
    listed = "proj" in t.list_backends()
    os._exit(0 if t.lookup_backend("proj").__name__ == "dumps" and listed else 3)
_, status = os.waitpid(pid, 0)
importer.join()
print(status)
"""
    for _ in range(2):  # the fork lands at another point of the import each time
        assert run_python(code, cwd=tmp_path).stdout == "0\n"


def test_refreshes_keep_memory_flat_and_read_pytorchs_files_once(
    tmp_path: Path, write: WriteFn
) -> None:
    # PyTorch's own names are read from its files, without importing it: once a process
    # while the files stay as read, whatever refresh() and TORCH_BACKENDS_NO_CACHE say.
    write("backends.toml", '[backends.proj]\ntarget = "json:dumps"\n')
    code = """
import gc, importlib.util, os, sys, tracemalloc
import torch_backend_registry as tbr

torch_dir = os.path.dirname(importlib.util.find_spec("torch").origin) + os.sep
opened = []

def hook(event, args):  # PyTorch's files, and the cache's entry of what they hold
    if event == "open" and isinstance(args[0], str):
        if args[0].startswith(torch_dir) or f"{os.sep}pytorch-names{os.sep}" in args[0]:
            opened.append(args[0])

sys.addaudithook(hook)
for environ, times in (({}, 1000), ({"TORCH_BACKENDS_NO_CACHE": "1"}, 100)):
    registry = tbr.Registry(environ=environ, sources=("runtime", "project"))
    for _ in range(100):  # what the first refreshes make once
        registry.refresh()
        registry.list_backends()
    opened.clear()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(times):
        registry.refresh()
        assert registry.list_backends() == ["proj"]
    gc.collect()
    print(tracemalloc.get_traced_memory()[0] - before, len(opened))
    tracemalloc.stop()
"""
    done = run_python(code, cwd=tmp_path)  # torch not imported: a refresh reads no plugin
    (cached, cached_read), (uncached, uncached_read) = (
        map(int, line.split()) for line in done.stdout.splitlines()
    )
    # Bytes over 1,000 refreshes and over 100 (a reading each refresh kept: 7.6 MB, 760 KB).
    assert cached < 100_000, done.stdout
    assert uncached < 100_000, done.stdout
    assert cached_read == uncached_read == 0, done.stdout


def test_the_registry_reads_pytorchs_own_layout_of_torch_2_0_and_2_1(tmp_path: Path) -> None:
    # torch 2.0 and 2.1 (within the declared torch>=2.0) keep the registered functions in
    # _BACKENDS itself, without _COMPILER_FNS; only 2.13 is installed here, so its registry
    # module is put into that layout in a process of its own, with that layout's listing.
    code = """
import torch._dynamo
from torch._dynamo.backends import registry
import torch_backend_registry as tbr

torch._dynamo.list_backends()  # PyTorch's own, loaded
registry._BACKENDS = dict(registry._COMPILER_FNS)
del registry._COMPILER_FNS

def list_backends(exclude_tags=("debug", "experimental")):
    excluded = set(exclude_tags or ())
    return sorted(n for n, fn in registry._BACKENDS.items() if not excluded & set(fn._tags))

registry.list_backends = torch._dynamo.list_backends = list_backends

def late(gm, example_inputs):
    return gm.forward

late._tags = ()
registry._BACKENDS["late_plugin"] = late  # what its register_backend did
reg = tbr.Registry(cwd=".", environ={})
eager = registry._BACKENDS["eager"]
print(reg.backend_info("eager").source.kind, reg.lookup_backend("eager") is eager)
print(reg.backend_info("late_plugin").source.kind, reg.lookup_backend("late_plugin") is late)
print("inductor" in reg.list_backends(), "aot_eager" in reg.list_backends(exclude_tags=()))
"""
    done = run_forked(code, tmp_path)
    assert done.stdout.split() == ["torch", "True", "torch", "True", "True", "True"], done.stderr


def test_a_registry_layout_not_known_here_is_asked_through_its_functions(
    tmp_path: Path,
) -> None:
    # A later PyTorch might keep its functions elsewhere: then the registry asks PyTorch's
    # public list_backends and lookup_backend, and reads no entry point as a function.
    code = """
import torch._dynamo
from torch._dynamo.backends import registry
import torch_backend_registry as tbr

torch._dynamo.list_backends()  # PyTorch's own, loaded
kept = registry.__dict__.pop("_COMPILER_FNS")  # _BACKENDS still holds None for each

def list_backends(exclude_tags=("debug", "experimental")):
    excluded = set(exclude_tags or ())
    return sorted(n for n, fn in kept.items() if not excluded & set(fn._tags))

registry.list_backends = torch._dynamo.list_backends = list_backends
registry.lookup_backend = torch._dynamo.lookup_backend = kept.__getitem__
reg = tbr.Registry(cwd=".", environ={})
print(reg.backend_info("eager").source.kind, reg.lookup_backend("eager") is kept["eager"])
"""
    done = run_forked(code, tmp_path)
    assert done.stdout.split() == ["torch", "True"], done.stderr
