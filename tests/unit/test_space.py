"""Disk space accounting (hard links counted once) and what the guard frees when the disk is short of room."""

from __future__ import annotations

import os
import time
from pathlib import Path

from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest
from globald.snapshot.space import DiskGuard
from globald.store import space
from globald.store.names import db_dir, snapshots_dir, tables_dir

MB = 1 << 20


def _file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def _snapshot(state: Path, sid: str, offsets: dict[int, int], links: list[Path], own: int) -> Path:
    snap = snapshots_dir(state, "t") / sid
    (snap / "db").mkdir(parents=True)
    for f in links:
        os.link(f, snap / "db" / f.name)
    if own:
        _file(snap / "db" / "own.sst", own)
    manifests.write(snap, Manifest(table="t", topic="topic", id=sid, offsets=offsets, created=time.time(),
                                   daemon_state="RUNNING", table_state="RUNNING", records=1))
    return snap


def test_hard_links_count_once_and_leftovers_apart(tmp_path: Path) -> None:
    live = _file(db_dir(tmp_path, "t") / "000001.sst", 2 * MB)
    _snapshot(tmp_path, "1000000000000001", {0: 5}, [live], own=MB)
    _file(snapshots_dir(tmp_path, "t") / ".trash-1" / "db" / "x.sst", MB)
    _file(tables_dir(tmp_path) / ".import-t" / "db" / "y.sst", MB)
    s = space.measure(tmp_path, "t")
    assert 2 * MB <= s.live < 2 * MB + 64 * 1024
    assert MB <= s.snapshots < MB + 64 * 1024  # the hard link to the live file costs nothing
    assert 2 * MB <= s.leftovers < 2 * MB + 64 * 1024
    assert s.by_snapshot["1000000000000001"] == s.snapshots


def test_guard_frees_all_but_current_and_held_when_the_disk_refused(tmp_path: Path) -> None:
    live = _file(db_dir(tmp_path, "t") / "000001.sst", MB)
    ids = [f"100000000000000{i}" for i in range(1, 5)]
    for i, sid in enumerate(ids):
        _snapshot(tmp_path, sid, {0: i}, [live], own=MB)
    root = snapshots_dir(tmp_path, "t")
    _file(root / ".trash-x" / "db" / "a.sst", MB)
    _file(root / ".tmp-CURRENT.123.tmp", 10)
    fresh_build = _file(root / ".build-r1" / "db" / "b.sst", MB).parent.parent
    guard = DiskGuard(tmp_path)
    doomed = guard.doomed("t", root, ids, held={ids[1]}, current=ids[3], refused=True)
    assert doomed == [ids[0], ids[2]]
    assert not (root / ".trash-x").exists() and not (root / ".tmp-CURRENT.123.tmp").exists()
    assert fresh_build.exists()  # an exact build may still be writing it
    assert "t" in guard.notes and "free" in guard.notes["t"]


def test_superseded_snapshots_go_and_current_holding_dropped_files_is_republished(tmp_path: Path) -> None:
    pile = _file(db_dir(tmp_path, "t") / "000001.sst", 4 * MB)
    old = _snapshot(tmp_path, "1000000000000001", {0: 7}, [pile], own=0)
    root = snapshots_dir(tmp_path, "t")
    guard = DiskGuard(tmp_path)
    assert guard.doomed("t", root, [old.name], held=set(), current=old.name, refused=False) == []
    assert not guard.republish("t", old.name)  # CURRENT shares every file with the live store
    pile.unlink()  # the merge after a bulk load rewrote the table
    _file(db_dir(tmp_path, "t") / "000002.sst", 3 * MB)
    guard.doomed("t", root, [old.name], held=set(), current=old.name, refused=False)
    assert guard.republish("t", old.name)
    new = _snapshot(tmp_path, "1000000000000002", {0: 7}, [db_dir(tmp_path, "t") / "000002.sst"], own=0)
    assert guard.doomed("t", root, [old.name, new.name], held=set(), current=new.name, refused=False) == [old.name]
    assert guard.doomed("t", root, [old.name, new.name], held={old.name}, current=new.name, refused=False) == []


def test_an_exact_build_needs_its_base_and_twice_the_records_it_reads(tmp_path: Path) -> None:
    from globald.snapshot.space import build_need

    _file(db_dir(tmp_path, "t") / "000001.sst", 3 * MB)
    base = _snapshot(tmp_path, "1000000000000001", {0: 100, 1: 50}, [], own=MB)
    m = manifests.read(base, "t")
    need = build_need(tmp_path, "t", {0: 150, 1: 60}, m, base, newest_records=0)  # 1 record: 1 MB each
    assert need.records == 60 and MB <= need.base < MB + 64 * 1024
    assert need.total == need.base + 2 * 60 * need.record_bytes
    assert "60 records" in need.describe()
    without = build_need(tmp_path, "t", {0: 150, 1: 60}, None, None, newest_records=0)
    assert 3 * MB <= without.total < 3 * MB + 64 * 1024  # the live store's size: read from the log start


def test_room_for_an_exact_build_comes_from_unheld_snapshots_oldest_first(tmp_path: Path) -> None:
    live = _file(db_dir(tmp_path, "t") / "000001.sst", MB)
    ids = [f"100000000000000{i}" for i in range(1, 6)]
    for i, sid in enumerate(ids):
        _snapshot(tmp_path, sid, {0: i}, [live], own=0 if i == 1 else MB)
    root = snapshots_dir(tmp_path, "t")
    _file(root / ".trash-x" / "db" / "a.sst", MB // 2)
    guard = DiskGuard(tmp_path)
    # ids[0] is the base, ids[4] CURRENT; ids[1] holds only its manifest, so two more are needed after it.
    freed, doomed = guard.room_for_build("t", root, 2 * MB, ids, keep={ids[0], ids[4]})
    assert doomed == [ids[1], ids[2], ids[3]]
    assert freed >= 2 * MB and not (root / ".trash-x").exists()
