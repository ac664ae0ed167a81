"""The warm start: a cache keyed by content that is right every time, or not used at all."""

from __future__ import annotations

import binascii
import importlib
import marshal
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_backend_registry import Registry
from torch_backend_registry._cache import (
    MAGIC,
    CommandLines,
    command_lines,
    installed_version,
    read_entry,
    write_entry,
)
from torch_backend_registry._cli import main
from torch_backend_registry._manifest import read_manifest

from .conftest import WriteFn

MakeDist = Callable[..., Path]

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.toml"))


def cache_files(tmp_path: Path) -> list[Path]:
    root = Path(os.environ["XDG_CACHE_HOME"]) / "torch-backend-registry"
    return sorted(p for p in root.rglob("*.bin")) if root.exists() else []


def listing(folder: Path) -> list[str]:
    reg = Registry(cwd=folder, environ={}, sources=("project", "entry-point"))
    return [n for n in reg.list_backends(exclude_tags=()) if n != "openvino"]


def described(result: object) -> object:
    if result is None:
        return None
    return (
        [repr(d) for d in result.definitions],  # type: ignore[attr-defined]
        [str(p) for p in result.problems],  # type: ignore[attr-defined]
        repr(result.default),  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_a_cached_reading_is_the_reading(path: Path) -> None:
    cold = read_manifest(str(path), "env")
    warm = read_manifest(str(path), "env")  # from the cache now, where it could be cached
    assert described(warm) == described(cold)


def test_every_value_survives_the_cache(write: WriteFn) -> None:
    path = write(
        "backends.toml",
        'default = "a"\n[plugins]\ndeny = ["x-y"]\n[backends.a]\ntarget = "m:f"\n'
        "options = { when = 1979-05-27T07:32:00-08:00, day = 1979-05-27, at = 07:32:00,"
        ' inf = inf, t = { nested = [1, "two", { three = 3.5 }] } }\n'
        'aliases = ["b"]\ntags = ["t"]\nrequires = ["json"]\ndescription = "d"\n'
        '[backends.c]\nchain = ["a"]\nskip-known-failures = true\n'
        "[backends.d]\nenabled = false\n[backends.e]\ntarget = 1\n",
    )
    cold = read_manifest(str(path), "project")
    warm = read_manifest(str(path), "project")
    assert described(warm) == described(cold)
    assert warm is not None
    assert cold is not None
    assert [dict(d.options) for d in warm.definitions] == [
        dict(d.options) for d in cold.definitions
    ]
    assert (warm.deny, warm.default) == (cold.deny, cold.default)


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


def _garbage(entry: bytes, number: int) -> bytes:
    """A corrupt version of a cache file, a different kind for each ``number``."""
    head = len(MAGIC) + 4

    def sealed(payload: bytes) -> bytes:  # a right header over a wrong payload
        return MAGIC + binascii.crc32(payload).to_bytes(4, "little") + payload

    kinds = [
        b"\x00\xff not an entry",
        b"",
        entry[: len(entry) // 2],  # torn: a write that never finished
        entry[:head] + bytes([entry[head] ^ 1]) + entry[head + 1 :],  # one bit flipped
        b"TBR\x01" + entry[len(MAGIC) :],  # another layout
        sealed(b"\xff\xfe garbage marshal"),
        sealed(marshal.dumps([])),
        sealed(marshal.dumps(((1, 2), {"definitions": 3}))),
        sealed(marshal.dumps(({}, None))),
    ]
    return kinds[number % len(kinds)]


@pytest.mark.parametrize("number", range(9))
def test_a_corrupt_cache_is_ignored_and_rebuilt(
    tmp_path: Path, write: WriteFn, number: int
) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["good"]
    files = cache_files(tmp_path)
    assert len(files) == 2  # the manifest's and the entry points'
    for file in files:
        file.write_bytes(_garbage(file.read_bytes(), number))
    assert listing(tmp_path) == ["good"]
    assert all(read_entry(str(f)) is not None for f in cache_files(tmp_path))


def test_a_definition_of_the_wrong_shape_is_not_believed(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\ntags = ["t"]\n')
    assert listing(tmp_path) == ["good"]
    [entry] = [f for f in cache_files(tmp_path) if "manifests" in f.parts]
    key, entry_table = read_entry(str(entry))
    definitions = entry_table["found"]["definitions"]
    _name, source, target, chain, tags, *rest = definitions[0]
    definitions[0] = ("planted", source, target, chain, list(tags), *rest)
    entry.unlink()
    write_entry(str(entry), (key, entry_table))  # sealed and owned: only its shape is wrong
    assert listing(tmp_path) == ["good"]


@settings(max_examples=60, deadline=None)
@given(position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_no_flipped_byte_changes_a_listing(
    tmp_path_factory: pytest.TempPathFactory, position: int, flip: int
) -> None:
    folder = tmp_path_factory.mktemp("flip")
    (folder / "backends.toml").write_text('[backends.good]\ntarget = "m:f"\ntags = ["t"]\n')
    assert listing(folder) == ["good"]
    [entry] = [f for f in cache_files(folder) if "manifests" in f.parts and _holds(f, folder)]
    blob = bytearray(entry.read_bytes())
    blob[position % len(blob)] ^= flip
    entry.write_bytes(bytes(blob))
    assert listing(folder) == ["good"]


def _holds(entry: Path, folder: Path) -> bool:
    return str(folder) in repr(read_entry(str(entry)))


def test_an_untrusted_cache_is_not_read(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    assert listing(tmp_path) == ["good"]
    [manifest_entry] = [f for f in cache_files(tmp_path) if "manifests" in f.parts]

    def plant(mode: int) -> None:
        key, entry_table = read_entry(str(manifest_entry))
        definitions = entry_table["found"]["definitions"]
        definitions[0] = ("planted", *definitions[0][1:])
        manifest_entry.unlink()
        write_entry(str(manifest_entry), (key, entry_table))
        manifest_entry.chmod(mode)

    plant(0o600)
    assert listing(tmp_path) == ["planted"]  # a trusted entry is believed as it is...
    plant(0o666)
    assert listing(tmp_path) == ["good"]  # ...one anybody could have written is not,
    plant(0o600)
    manifest_entry.parent.chmod(0o777)
    assert listing(tmp_path) == ["good"]  # ...nor one in a folder anybody can write to


def test_a_cache_that_cannot_be_written_or_is_off_leaves_no_trace(
    tmp_path: Path, write: WriteFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))  # under a file: not creatable
    assert listing(tmp_path) == ["good"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_BACKENDS_NO_CACHE", "1")
    assert listing(tmp_path) == ["good"]
    assert not (tmp_path / "cache").exists()


def test_the_cache_folder_and_files_are_the_owners_only(tmp_path: Path, write: WriteFn) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    listing(tmp_path)
    root = Path(os.environ["XDG_CACHE_HOME"]) / "torch-backend-registry"
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    assert {oct(f.stat().st_mode & 0o777) for f in cache_files(tmp_path)} == {"0o600"}


#: What a cold listing needs and a warm one must not import: the validator, the
#: entry-point scanner, the parser; and the grammar and codecs behind them.
COLD_ONLY = (
    "pydantic",
    "importlib.metadata",
    "tomli",
    "argparse",
    "re",
    "json",
    "hashlib",
    "contextlib",
    "importlib.util",
)
LOADED = "print(sorted(m for m in {names!r} if m in sys.modules))"


def test_a_warm_listing_imports_none_of_what_a_cold_one_needs(
    tmp_path: Path, write: WriteFn
) -> None:
    write("backends.toml", '[backends.warm]\ntarget = "m:f"\ndescription = "x"\n')
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_BACKENDS_PATH"}

    def loaded(code: str) -> tuple[list[str], list[str]]:
        out = subprocess.run(
            [sys.executable, "-c", f"import sys\n{code}\n{LOADED.format(names=COLD_ONLY)}"],
            cwd=tmp_path, env=environ, capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
        names: list[str] = eval(out[-1])
        return out[:-1], names

    _, at_start = loaded("")  # what this interpreter imports before any code of ours
    listing = "from torch_backend_registry._cli import main\nmain(['list', '--no-torch'])"
    cold_out, cold = loaded(listing)
    warm_out, warm = loaded(listing)
    assert {"pydantic", "importlib.metadata", "tomli", "argparse"} <= set(cold)
    assert set(warm) <= set(at_start)
    assert warm_out == cold_out
    assert any(line.startswith("warm ") for line in warm_out)
    _, other_words = loaded(listing.replace("'--no-torch'", "'--no-torch', '--all'"))
    assert "argparse" in other_words  # words never seen go to argparse


def test_only_what_argparse_accepted_is_remembered(
    tmp_path: Path,
    write: WriteFn,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    monkeypatch.chdir(tmp_path)
    remembered = command_lines()
    assert remembered is not None
    for words in (["--version"], ["list", "--bogus"], ["list", "-h"], ["explain"]):
        with pytest.raises(SystemExit):
            main(words)
        assert command_lines().get(words) is None  # type: ignore[union-attr]
    assert main(["list", "--no-torch", "--tag", "t"]) == 0
    assert command_lines().get(["list", "--no-torch", "--tag", "t"]) == {  # type: ignore[union-attr]
        "command": "list",
        "all": False,
        "tag": ["t"],
        "exclude_tag": [],
        "available": False,
        "json": False,
        "no_torch": True,
        "version": None,
    }
    capsys.readouterr()


def test_the_newest_command_lines_are_kept(tmp_path: Path) -> None:
    remembered = CommandLines()
    for number in range(CommandLines.LIMIT + 6):
        remembered.put(["explain", f"n{number}"], {"command": "explain", "name": f"n{number}"})
    again = CommandLines()
    assert again.get(["explain", "n5"]) is None
    assert again.get(["explain", "n6"]) == {"command": "explain", "name": "n6"}
    assert again.get(["explain", f"n{CommandLines.LIMIT + 5}"]) is not None


@pytest.mark.parametrize(
    "planted",
    [
        ("not the grammar's key", {("list",): {"command": "list"}}),
        ((), {}),
        [1, 2],
        (0, {("list",): {"not an identifier": 1}}),
    ],
)
def test_a_planted_or_stale_command_line_is_not_believed(
    tmp_path: Path,
    write: WriteFn,
    planted: object,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write("backends.toml", '[backends.good]\ntarget = "m:f"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["list"]) == 0
    first = capsys.readouterr().out
    remembered = CommandLines()
    if isinstance(planted, tuple) and planted and planted[0] == 0:
        planted = (remembered_key(remembered), planted[1])
    write_entry(remembered.file, planted)
    assert main(["list"]) == 0
    assert capsys.readouterr().out == first


def remembered_key(remembered: CommandLines) -> object:
    value = read_entry(remembered.file)
    return None if value is None else value[0]


def test_an_installed_version_is_remembered_until_what_is_installed_changes(
    make_dist: MakeDist,
) -> None:
    info = make_dist("tbr-versioned", "1.0", {})
    assert installed_version("tbr-versioned") == "1.0"
    assert installed_version("tbr-versioned") == "1.0"  # remembered now
    assert installed_version("tbr-not-installed") is None
    upgraded = info.rename(info.parent / "tbr_versioned-2.0.dist-info")
    (upgraded / "METADATA").write_text("Metadata-Version: 2.1\nName: tbr-versioned\nVersion: 2.0\n")
    importlib.invalidate_caches()
    assert installed_version("tbr-versioned") == "2.0"
    for child in upgraded.iterdir():
        child.unlink()
    upgraded.rmdir()
    importlib.invalidate_caches()
    assert installed_version("tbr-versioned") is None
