"""globald/store/durable.py: what each helper leaves on disk, and that it fsyncs before it names.

The proof that these fsyncs are the ones a power loss needs is tests/reliability/test_power_loss.py (a real cut of a
real file system); here, the contract of each helper and the order of its system calls.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from globald.store import durable


def names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def test_replace_file_writes_bytes_or_text_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "CURRENT"
    durable.replace_file(target, "0000000000000001\n")
    assert target.read_text() == "0000000000000001\n"
    durable.replace_file(target, b"\x00\xff", durable=False)
    assert target.read_bytes() == b"\x00\xff"
    assert names(tmp_path) == {"CURRENT"}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_replace_file_sets_the_mode_asked_for(tmp_path: Path) -> None:
    durable.replace_file(tmp_path / "f", "x", mode=0o644)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644


def test_a_failed_replace_keeps_the_old_content_and_removes_its_temporary(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()  # a directory in the way: the rename fails
    with pytest.raises(OSError):
        durable.replace_file(tmp_path / "d", "new")
    assert names(tmp_path) == {"d"}
    with pytest.raises(FileNotFoundError):  # no directory to write in
        durable.replace_file(tmp_path / "missing" / "f", "new")


def test_replace_file_fsyncs_the_file_before_the_rename_and_the_directory_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    durable.replace_file(tmp_path / "f", "x")
    assert calls == ["fsync file", "rename", "fsync dir"]
    calls.clear()
    durable.replace_file(tmp_path / "f", "y", durable=False)
    assert calls == ["rename"]


def test_make_dirs_creates_every_level_and_accepts_what_exists(tmp_path: Path) -> None:
    leaf = tmp_path / "a" / "b" / "c"
    durable.make_dirs(leaf)
    assert leaf.is_dir() and stat.S_IMODE(leaf.stat().st_mode) == 0o700
    durable.make_dirs(leaf)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        durable.make_dirs(tmp_path / "file")
    with pytest.raises(OSError):
        durable.make_dirs(tmp_path / "file" / "below")


def test_rename_and_sync_tree(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "db").mkdir(parents=True)
    (src / "db" / "MANIFEST-000005").write_bytes(b"m")
    (src / "manifest.json").write_text("{}")
    durable.sync_tree(src)
    (tmp_path / "out").mkdir()
    durable.rename(src, tmp_path / "out" / "0000000000000001")
    assert (tmp_path / "out" / "0000000000000001" / "db" / "MANIFEST-000005").read_bytes() == b"m"
    with pytest.raises(FileNotFoundError):
        durable.sync_tree(tmp_path / "gone")


def test_remove_tree_renames_to_trash_first_and_clears_an_earlier_leftover(tmp_path: Path) -> None:
    doomed = tmp_path / "0000000000000001"
    (doomed / "db").mkdir(parents=True)
    (doomed / "db" / "000001.sst").write_bytes(b"x")
    leftover = tmp_path / ".trash-0000000000000001"
    (leftover / "db").mkdir(parents=True)
    assert durable.remove_tree(doomed) is True
    assert names(tmp_path) == set()
    assert durable.remove_tree(doomed) is False


def test_sync_tree_leaves_table_files_rocksdb_synced_to_their_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "db").mkdir()
    for name in ("000007.sst", "MANIFEST-000005", "OPTIONS-000009"):
        (tmp_path / "db" / name).write_bytes(b"x")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[1])
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    durable.sync_tree(tmp_path, synced_suffixes=(".sst",))
    assert sorted(synced) == sorted(["MANIFEST-000005", "OPTIONS-000009", "db", tmp_path.name])


def test_clear_leftovers_removes_trash_and_temporaries_only(tmp_path: Path) -> None:
    table = tmp_path / "tbl"
    (table / "db").mkdir(parents=True)
    (table / ".checkpoint").write_text("0\n0\n")
    (table / ".tmp-.checkpoint.abc123.tmp").write_text("0\n")
    (tmp_path / ".trash-tbl" / "db").mkdir(parents=True)
    (tmp_path / ".trash-other").mkdir()
    durable.clear_leftovers(table)
    assert names(table) == {"db", ".checkpoint"}
    assert names(tmp_path) == {"tbl", ".trash-other"}
    durable.clear_leftovers(tmp_path / "missing")
