"""The warm start: a cache keyed by content that is right every time, or not used at all."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import importlib
import importlib.metadata
import importlib.util
import math
import os
import pickle
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_backend_registry import Registry
from torch_backend_registry._sources.cache import Cache, cache_folder
from torch_backend_registry._sources.manifest import read_manifest

from .conftest import NOBODY, PLUGINS, WriteFn

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.toml"))


def cache_root() -> Path:
    return Path(os.environ["XDG_CACHE_HOME"]) / "torch-backend-registry"


def cache_files() -> list[Path]:
    root = cache_root()
    # An entry is a file in the folder of its kind; locks lie beside those folders.
    return sorted(p for p in root.glob("*/*") if p.is_file()) if root.exists() else []


def listing(folder: Path) -> list[str]:
    reg = Registry(cwd=folder, environ={}, sources=("project", "entry-point"))
    return [n for n in reg.list_backends(exclude_tags=()) if n not in PLUGINS]


def described(result: object) -> object:
    if result is None:
        return None
    return (
        [repr(d) for d in result.definitions],  # type: ignore[attr-defined]
        [str(p) for p in result.problems],  # type: ignore[attr-defined]
        repr(result.default),  # type: ignore[attr-defined]
        repr(result.rules),  # type: ignore[attr-defined]
    )


def the_cache() -> Cache:
    return Cache(cache_folder(os.environ))


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_a_cached_reading_is_the_reading(path: Path) -> None:
    cold = read_manifest(str(path), "env", the_cache())
    warm = read_manifest(str(path), "env", the_cache())  # from the cache now
    assert described(warm) == described(cold) == described(read_manifest(str(path), "env"))


def test_every_value_survives_the_cache(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        'default = "a"\n[plugins]\ndeny = ["x-y"]\n[backends.a]\ntarget = "m:f"\n'
        "options = { when = 1979-05-27T07:32:00-08:00, day = 1979-05-27, at = 07:32:00,"
        ' inf = inf, nan = nan, t = { nested = [1, "two", { three = 3.5 }] },'
        ' "@" = "BackendDefinition", "{}" = [["k", "v"]], datetime = "not a date",'
        " list = [[1, 2], []], empty = {} }\n"
        'aliases = ["b"]\ntags = ["t"]\nrequires = ["json"]\ndescription = "d"\n'
        '[backends.c]\nchain = ["a"]\n'
        "[backends.d]\nenabled = false\n[backends.e]\ntarget = 1\n",
    )
    cold = read_manifest(str(path), "project", the_cache())
    warm = read_manifest(str(path), "project", the_cache())
    assert cold is not None
    assert warm is not None
    assert cache_files()  # it was cached, and read back
    assert described(warm) == described(cold)
    assert warm.definitions == cold.definitions  # nan compares equal to itself here
    options = dict(warm.definitions[0].options)
    assert options["t"] == {"nested": [1, "two", {"three": 3.5}]}
    assert options["@"] == "BackendDefinition"
    assert options["{}"] == [["k", "v"]]
    assert options["datetime"] == "not a date"
    assert options["list"] == [[1, 2], []]
    assert options["empty"] == {}
    assert type(options["when"]).__name__ == "datetime"
    assert warm.definitions[0].aliases == ("b",)  # tuples stay tuples
    assert (warm.rules, warm.default) == (cold.rules, cold.default)


def test_an_edit_in_the_same_second_of_the_same_size_is_seen(
    tmp_path: Path, write: WriteFn
) -> None:
    path = write("backends.toml", '[backends.aaa]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["aaa"]
    stamp = path.stat()
    path.write_text('[backends.bbb]\ntarget = "m:f"\n')  # same size
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # same time stamps
    assert listing(tmp_path) == ["bbb"]


def test_installing_and_removing_a_distribution_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    assert listing(tmp_path) == []
    info = site / "tbr_cached-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tbr-cached\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\ncached = m:f\n")
    importlib.invalidate_caches()
    assert listing(tmp_path) == ["cached"]
    upgraded = info.rename(site / "tbr_cached-2.0.dist-info")
    (upgraded / "METADATA").write_text("Metadata-Version: 2.1\nName: tbr-cached\nVersion: 2.0\n")
    importlib.invalidate_caches()
    reg = Registry(cwd=tmp_path, environ={}, sources=("entry-point",))
    assert reg.backend_info("cached").source.version == "2.0"
    for child in upgraded.iterdir():
        child.unlink()
    upgraded.rmdir()
    importlib.invalidate_caches()
    assert listing(tmp_path) == []


def test_an_edit_of_an_unzipped_eggs_entry_points_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    egg = tmp_path / "tbr_egged-1.0-py3.11.egg"
    (egg / "EGG-INFO").mkdir(parents=True)
    (egg / "EGG-INFO" / "PKG-INFO").write_text(
        "Metadata-Version: 1.1\nName: tbr-egged\nVersion: 1.0\n"
    )
    points = egg / "EGG-INFO" / "entry_points.txt"
    points.write_text("[torch_dynamo_backends]\nfirst = m:f\n")
    monkeypatch.syspath_prepend(str(egg))  # as easy_install put an .egg on sys.path
    importlib.invalidate_caches()
    assert "first" in listing(tmp_path)
    points.write_text("[torch_dynamo_backends]\nsecond = m:f\n")
    os.utime(points, ns=(1, 1))  # another time: as an edit leaves it
    importlib.invalidate_caches()
    assert "second" in listing(tmp_path)


def test_refresh_reads_entry_points_for_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyTorch's own test patches importlib.metadata.entry_points and rediscovers.
    reg = Registry(cwd=tmp_path, environ={}, sources=("entry-point",))
    assert "patched" not in reg.list_backends(exclude_tags=())
    point = importlib.metadata.EntryPoint("patched", "m:f", "torch_dynamo_backends")
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda **kwargs: importlib.metadata.EntryPoints([point])
    )
    reg.refresh()
    assert reg.list_backends(exclude_tags=()) == ["patched"]


def _garbage(entry: bytes, number: int) -> bytes:
    """A corrupt version of a cache entry, a different kind for each ``number``."""
    kinds = [
        b"\x00\xff not an entry",
        b"",
        entry[: len(entry) // 2],  # torn: a write that never finished
        entry[:-1] + bytes([entry[-1] ^ 1]),  # one bit changed after it was written
        # Changed after it was written into a value that still reads, its check left as it
        # was (zlib's last four bytes): only the check tells.
        zlib.compress(zlib.decompress(entry).replace(b"good", b"gooe"))[:-4] + entry[-4:],
        zlib.compress(pickle.dumps(["a", "value", "of", "another", "shape"])),
        b"[]",
        b'{"found": 3}',
        b'{"found": {"@": "Discovery"}}',
        b'{"found": {"@": "NoSuchClass", "x": 1}}',
        b"[" * 100_000,  # deeper than the parser goes
    ]
    return kinds[number % len(kinds)]


@pytest.mark.parametrize("number", range(11))
def test_a_corrupt_cache_is_ignored_and_rebuilt(
    tmp_path: Path, write: WriteFn, number: int
) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["good"]
    files = cache_files()
    # The manifest's, the entry points' and, where PyTorch is installed and its names were not
    # read earlier in this process (they are then remembered for it), PyTorch's names.
    kinds = {f.parent.name for f in files}
    assert {"manifest", "entry-points"} <= kinds <= {"manifest", "entry-points", "pytorch-names"}
    for file in files:
        file.write_bytes(_garbage(file.read_bytes(), number))
    assert listing(tmp_path) == ["good"]
    assert listing(tmp_path) == ["good"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_no_flipped_byte_changes_a_listing(
    tmp_path_factory: pytest.TempPathFactory, position: int, flip: int
) -> None:
    folder = tmp_path_factory.mktemp("flip")
    (folder / "backends.toml").write_text('[backends.good]\ntarget = "m:f"\ntags = ["t"]\n')
    assert listing(folder) == ["good"]
    for entry in cache_files():
        blob = bytearray(entry.read_bytes())
        blob[position % len(blob)] ^= flip
        entry.write_bytes(bytes(blob))
    assert listing(folder) == ["good"]


def _unpacked(entry: Path) -> bytes:
    """The pickle an entry holds."""
    return zlib.decompress(entry.read_bytes())


def _plant(entry: Path, pickled: bytes, mode: int = 0o600) -> None:
    """Write an entry as its owner's cache would, with ``mode``."""
    entry.unlink()
    entry.write_bytes(zlib.compress(pickled))
    entry.chmod(mode)


def test_an_untrusted_cache_is_not_read(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["good"]
    [entry] = [f for f in cache_files() if f.parent.name == "manifest"]
    # A name of the same length, so the value still reads.
    planted = _unpacked(entry).replace(b"good", b"fake")
    _plant(entry, planted)
    assert listing(tmp_path) == ["fake"]  # a trusted entry is believed as it is...
    _plant(entry, planted, 0o666)
    assert listing(tmp_path) == ["good"]  # ...one anybody could have written is not,
    _plant(entry, planted)
    entry.parent.chmod(0o777)
    assert listing(tmp_path) == ["good"]  # ...nor one in a folder anybody can write to,
    entry.parent.chmod(0o700)
    _plant(entry, planted)
    os.chown(entry, NOBODY, NOBODY)
    assert listing(tmp_path) == ["good"]  # ...nor one another user owns.


class _Planted:
    """An object whose pickle runs a command when it is read."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    ("where", "mode"),
    [("entry", 0o620), ("entry", 0o602), ("folder", 0o750), ("folder", 0o705), ("root", 0o755)],
)
def test_a_pickle_planted_where_others_can_reach_is_never_run(
    tmp_path: Path, write: WriteFn, where: str, mode: int
) -> None:
    # Entries are plain pickles, read only from this user's own private folder: one that
    # another user could have put there, or changed, is never read.
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["good"]
    marker = tmp_path / "ran"
    for entry in cache_files():
        _plant(entry, pickle.dumps(_Planted(marker)))
        {"entry": entry, "folder": entry.parent, "root": cache_root()}[where].chmod(mode)
    assert listing(tmp_path) == ["good"]
    assert not marker.exists()
    # Where only this user can reach it, the same entry is read (and runs).
    cache_root().chmod(0o700)
    for entry in cache_files():
        entry.parent.chmod(0o700)
        _plant(entry, pickle.dumps(_Planted(marker)))
    with contextlib.suppress(Exception):
        listing(tmp_path)
    assert marker.exists()


def test_a_cache_that_cannot_be_written_or_is_off_leaves_no_trace(
    tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))  # under a file: not creatable
    assert listing(tmp_path) == ["good"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    off = Registry(cwd=tmp_path, environ={"TORCH_BACKENDS_NO_CACHE": "1"}, sources=("project",))
    assert off.list_backends() == ["good"]
    assert not (tmp_path / "cache").exists()


def test_the_cache_folder_and_files_are_the_owners_only(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    listing(tmp_path)
    root = cache_root()
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    assert {oct(f.parent.stat().st_mode & 0o777) for f in cache_files()} == {"0o700"}
    assert {oct(f.stat().st_mode & 0o777) for f in cache_files()} == {"0o600"}


def _list_in_a_subprocess(folder: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    code = "import torch_backend_registry._cli as c, sys; sys.exit(c.main(['list', '--no-torch']))"
    base = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env={**base, **environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_cache_folder_someone_else_made_is_not_used(tmp_path: Path, write: WriteFn) -> None:
    # A shared XDG_CACHE_HOME (world-writable, sticky): another user was there first.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "torch-backend-registry"
    (theirs / "manifest").mkdir(parents=True)
    for folder in (theirs, theirs / "manifest"):
        folder.chmod(0o777)
        os.chown(folder, NOBODY, NOBODY)
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    done = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=str(shared))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[4:5] == ["good"]
    assert list((theirs / "manifest").iterdir()) == []  # nothing of ours written there


def test_nothing_is_made_in_another_users_cache_home(tmp_path: Path, write: WriteFn) -> None:
    # `sudo torch-backends list` with the user's HOME: what root made in their cache folder
    # would be root's, and would keep the user's own cache off until root removed it.
    home = tmp_path / "user-cache"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    done = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=str(home / "deeper"))
    assert done.returncode == 0, done.stderr
    done = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=str(home))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[4:5] == ["good"]
    assert list(home.iterdir()) == []


def test_a_fifo_at_an_entrys_name_does_not_block(tmp_path: Path, write: WriteFn) -> None:
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    cache = tmp_path / "cache"
    first = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=str(cache))
    assert first.returncode == 0, first.stderr
    entries = [p for p in cache.glob("*/*/*") if p.is_file()]
    assert entries
    for entry in entries:
        entry.unlink()
        os.mkfifo(entry, 0o600)
    again = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=str(cache))
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_a_folder_at_an_entrys_name_leaves_no_file_open(tmp_path: Path, write: WriteFn) -> None:
    # A long-lived process reads the cache at every refresh: a folder where an entry
    # belongs is no entry, and must not cost it a file descriptor each time.
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    registry = Registry(cwd=tmp_path / "proj", environ={}, sources=("project",))
    assert registry.list_backends() == ["good"]
    entries = cache_files()
    assert entries
    for entry in entries:
        entry.unlink()
        entry.mkdir(mode=0o700)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        registry.refresh()
        assert registry.list_backends() == ["good"]
    assert len(os.listdir("/proc/self/fd")) - before < 5


@pytest.mark.parametrize(
    "environ",
    [{"XDG_CACHE_HOME": "relative/cache"}, {"XDG_CACHE_HOME": "", "HOME": ""}],
    ids=["relative XDG_CACHE_HOME", "no HOME"],
)
def test_no_cache_folder_appears_in_the_project(
    tmp_path: Path, write: WriteFn, environ: dict[str, str]
) -> None:
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    done = _list_in_a_subprocess(tmp_path / "proj", **environ)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["backends.toml"]


def test_a_warm_listing_says_what_a_cold_one_says(tmp_path: Path, write: WriteFn) -> None:
    write(
        "proj/backends.toml",
        textwrap.dedent(
            """
            [backends.warm]
            target = "m:f"
            description = "x"
            [backends.broken]
            target = 1
            """
        ),
    )
    cache = str(tmp_path / "cache")
    cold = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=cache)
    warm = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=cache)
    assert (warm.stdout, warm.stderr) == (cold.stdout, cold.stderr)
    assert "warm" in warm.stdout
    assert "backends.broken.target" in warm.stderr  # the problem is said warm too


def test_an_entry_moved_to_another_keys_name_is_no_entry(tmp_path: Path, write: WriteFn) -> None:
    write("one/backends.toml", '[backends.one]\ntarget = "m:f"\n')
    write("two/backends.toml", '[backends.two]\ntarget = "m:f"\n')
    assert listing(tmp_path / "one") == ["one"]
    assert listing(tmp_path / "two") == ["two"]
    entries = {b"one" in _unpacked(e): e for e in cache_files() if e.parent.name == "manifest"}
    one, two = entries[True], entries[False]
    one.replace(two)  # the reading of "one" now under the name of "two"'s key
    assert listing(tmp_path / "two") == ["two"]


def test_a_distribution_folder_in_capitals_is_seen_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    assert listing(tmp_path) == []
    info = site / "Plug-1.0.DIST-INFO"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Plug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\nplugged = m:f\n")
    importlib.invalidate_caches()
    assert listing(tmp_path) == ["plugged"]


def _shape(value: object) -> object:
    """A value with the type of every part beside it: what a round trip must keep."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [_shape(v) for v in value])
    if isinstance(value, dict) or type(value).__name__ == "mappingproxy":
        return (type(value).__name__, sorted((k, _shape(v)) for k, v in value.items()))  # type: ignore[attr-defined]
    return (type(value).__name__, repr(value))


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True)
_DEVICES = st.sampled_from(["cpu", "cuda", "xpu", "mps", "other"])
_SCALARS = st.one_of(st.integers(-5, 5), st.booleans(), st.text(max_size=4), st.floats())
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_NAMES, inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def _manifests(draw: st.DrawFn) -> str:
    """A manifest of every kind of backend, with values of every TOML kind."""
    import tomli_w

    backends: dict[str, object] = {}
    for name in draw(st.lists(_NAMES, min_size=1, max_size=4, unique=True)):
        kind = draw(st.sampled_from(["target", "chain", "by-device", "disabled"]))
        entry: dict[str, object] = {
            "tags": draw(st.lists(_NAMES, max_size=2)),
            "aliases": [f"{name}_alias"] if draw(st.booleans()) else [],
            "requires": draw(st.lists(_NAMES, max_size=2)),
        }
        if kind == "target":
            entry["target"] = f"{draw(_NAMES)}:{draw(_NAMES)}"
            entry["options"] = draw(st.dictionaries(_NAMES, _VALUES, max_size=3))
        elif kind == "chain":
            entry["chain"] = draw(st.lists(_NAMES, min_size=1, max_size=3))
            entry["verify"] = draw(st.sampled_from(["none", "forward", "backward"]))
        elif kind == "by-device":
            entry["by-device"] = draw(st.dictionaries(_DEVICES, _NAMES, min_size=1, max_size=3))
        else:
            entry = {"enabled": False}
        backends[name] = entry
    return tomli_w.dumps({"python-path": ["src", "/opt/kernels"], "backends": backends})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_manifests())
def test_a_warm_reading_gives_back_equal_values_of_the_same_types(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / f"m{abs(hash(text))}.toml"
    path.write_text(text, encoding="utf-8")
    cache = the_cache()
    cold = read_manifest(str(path), "env", cache)
    warm = read_manifest(str(path), "env", cache)
    assert cold is not None
    assert warm is not None
    assert warm.definitions == cold.definitions
    for was, now in zip(cold.definitions, warm.definitions, strict=True):
        assert hash(now) == hash(was)  # hashable, from the second run on too
        for field in (f.name for f in dataclasses.fields(was)):
            assert _shape(getattr(now, field)) == _shape(getattr(was, field)), field


def _same(a: Any, b: Any) -> bool:
    """Equal as TOML values are: of one kind, nan equal to itself, tables by their keys."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):  # nan is nan; -0.0 is not 0.0 (TOML writes them apart)
        return (math.isnan(a) and math.isnan(b)) or str(a) == str(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


_TOML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_infinity=True, allow_nan=True, width=16)
    | st.sampled_from(["", "a", "1", "true", "t", "s", "2000-01-01"])
    | st.dates(datetime.date(2000, 1, 1), datetime.date(2000, 1, 3)),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["t", "a", "s", "1", "date"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(a=_TOML_VALUES, b=_TOML_VALUES)
def test_a_key_is_the_same_exactly_when_the_values_are(a: object, b: object) -> None:
    # What the cache, the lock and doctor's verdicts are keyed by.
    from torch_backend_registry._definition import canonical

    assert (canonical(a) == canonical(b)) == _same(a, b)
    assert canonical(a) == canonical(copy.deepcopy(a))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (datetime.date(2000, 1, 1), "2000-01-01"),
        (datetime.time(12, 0), "12:00:00"),
        ({"a": 1}, [["a", 1]]),
        ({"t": [["a", 1]]}, {"a": 1}),
        ({"a": [1]}, [1]),
        (frozenset({"a"}), ["a"]),
        (1, 1.0),
        (1, True),
        (0.0, -0.0),
        ([], {}),
        (None, "null"),
        ("1", 1),
    ],
)
def test_values_of_two_kinds_never_share_a_key(one: object, other: object) -> None:
    from torch_backend_registry._definition import canonical

    assert canonical(one) != canonical(other)
    assert canonical(float("nan")) == canonical(float("nan"))


def test_another_version_of_this_package_reads_everything_again(
    tmp_path: Path, write: WriteFn
) -> None:
    # What is remembered was read by this package's code, PyTorch's own names included
    # (which no manifest may redefine): another version must read each of them anew.
    write("proj/backends.toml", '[backends.good]\ntarget = "m:f"\n')
    cache = tmp_path / "cache"
    upgrade = (
        "import sys, torch_backend_registry._sources.cache as cache, torch_backend_registry._cli"
        " as cli; cache.code_key = lambda: 'the next version';"
        " sys.exit(cli.main(['list', '--no-torch']))"
    )

    def kinds() -> list[str]:
        return sorted(p.parent.name for p in cache.glob("*/*/*") if p.is_file())

    first = _list_in_a_subprocess(tmp_path / "proj", XDG_CACHE_HOME=str(cache))
    assert first.returncode == 0, first.stderr
    once = kinds()
    assert {"manifest", "entry-points"} <= set(once)
    if importlib.util.find_spec("torch") is not None:
        assert "pytorch-names" in once
    again = subprocess.run(
        [sys.executable, "-c", upgrade],
        cwd=tmp_path / "proj",
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "good" in again.stdout
    assert kinds() == sorted(once * 2)  # a second entry of every kind, none taken from the first


def test_the_cache_keeps_a_bounded_number_of_entries(tmp_path: Path, write: WriteFn) -> None:
    # Each edit of a manifest writes a new entry: a cache that only grows would fill a disk,
    # whether one long process writes them all or many processes do.
    from torch_backend_registry._sources.cache import MOST_ENTRIES

    folder = cache_root() / "manifest"
    long_lived = the_cache()
    for i in range(3 * MOST_ENTRIES):
        long_lived.put("manifest", ["an edit long gone", i], {"found": None})
        if i % 100 == 0:
            assert len(list(folder.iterdir())) <= MOST_ENTRIES
    assert len(list(folder.iterdir())) <= MOST_ENTRIES
    for i in range(MOST_ENTRIES // 2):  # left by others, past the bound
        (folder / f"{i:064x}.pickle").write_bytes(b"torn")
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["good"]  # another reader trims as it writes its first entry
    assert len(list(folder.iterdir())) <= MOST_ENTRIES
    assert listing(tmp_path) == ["good"]
