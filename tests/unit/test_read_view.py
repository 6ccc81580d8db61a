"""`globald get` and `globald dump` never answer from a half-rebuilt live store (real CLI, real RocksDB, no broker).

A store lacking META_COMPLETE (fresh, or wiped and rebuilding) is built with globald's own TableStore, beside a
snapshot of the table's previous version; the CLI must answer from that snapshot and say so, or refuse with exit 3.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest
from globald.store.codec import encode_value
from globald.store.names import COMPLETE_YES, META_CF, META_COMPLETE, SNAPSHOT_CURRENT, db_dir, snapshots_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.harness import globald, open_store_db, write_config
from tests.stores import write_records

SID = "1700000000000042"
OLD = {b"both": b"old-both", b"gone": b"old-gone", b"other": b"old-other"}  # the version before the wipe
OLD_OFFSETS = {0: 30, 1: 12}
HALF = {b"both": b"new-both", b"fresh": b"new-fresh"}  # what the rebuild has restored so far
HALF_OFFSETS = {0: 2}
EXIT_UNAVAILABLE = 3


def fill(state: Path, values: dict[bytes, bytes], offsets: dict[int, int]) -> TableStore:
    store = TableStore.open(state, "tbl", "topic", StoreOptions()).store
    write_records(store, {k: encode_value(1_700_000_000_000, v) for k, v in values.items()}, offsets)
    return store


def mark_complete(state: Path) -> None:
    """What the engine does once the table is RUNNING; spelled out here so the test states the contract."""
    db = open_store_db(db_dir(state, "tbl"))
    db.get_column_family(META_CF).put(META_COMPLETE, COMPLETE_YES)
    db.close()


def publish_snapshot(state: Path, store: TableStore, offsets: dict[int, int], stale_reason: str | None) -> None:
    base = snapshots_dir(state, "tbl")
    base.mkdir(parents=True, exist_ok=True)
    (base / SID).mkdir()
    store.checkpoint(base / SID / "db")
    manifests.write(base / SID, Manifest(
        table="tbl", topic="topic", id=SID, offsets=offsets, created=time.time() - 5, daemon_state="RUNNING",
        table_state="RUNNING", records=len(OLD), stale=stale_reason is not None, stale_reason=stale_reason))
    (base / SNAPSHOT_CURRENT).write_text(SID + "\n")


@pytest.fixture
def rebuilding(tmp_path: Path) -> Path:
    """A state_dir whose table was complete, published snapshot SID, was wiped and is half rebuilt."""
    state = tmp_path / "state"
    store = fill(state, OLD, OLD_OFFSETS)
    store.close()
    mark_complete(state)
    store = TableStore.open(state, "tbl", "topic", StoreOptions()).store
    publish_snapshot(state, store, OLD_OFFSETS, "table wiped (invalid_offset) and rebuilding: invalid offset 30")
    store.wipe()  # as the engine does: the database is deleted and created again, without the marker
    store.close()
    fill(state, HALF, HALF_OFFSETS).close()
    return state


def config(tmp_path: Path, state: Path, serve_stale: bool = True) -> str:
    return str(write_config(tmp_path / f"g-{serve_stale}.toml", state, {"bootstrap.servers": "127.0.0.1:9"},
                            {"tbl": "topic"}, snapshots={"serve_stale": serve_stale}))


def dumped(stdout: str) -> dict[bytes, bytes]:
    docs = [json.loads(line) for line in stdout.splitlines()]
    return {base64.b64decode(d["key"]): base64.b64decode(d["value"]) for d in docs}


@pytest.fixture
def live_daemon(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process status.json can name as the running daemon (the liveness check wants 'globald' in its argv)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "globald"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_half_rebuilt_store_is_answered_from_the_current_snapshot(rebuilding: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, rebuilding)
    r = globald("get", "--config", cfg, "--table", "tbl", "both")
    assert r.returncode == 0, r.stderr
    assert "old-both" in r.stdout  # the previous version's value, never the half-rebuilt store's
    note = r.stderr.strip()
    assert len(note.splitlines()) == 1 and "rebuilding" in note and SID in note and "p0=30, p1=12" in note, note
    assert "no daemon is running" in note and "invalid_offset" in note  # the snapshot's stale reason says why

    r = globald("get", "--config", cfg, "--table", "tbl", "gone", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["found"] and doc["value"] == "old-gone"
    assert doc["source"] == "snapshot" and doc["rebuilding"] is True and doc["snapshot"] == SID
    assert doc["offsets"] == {"0": 30, "1": 12} and doc["snapshot_stale"] is True and "invalid_offset" in doc["reason"]

    # A key the consistent version lacks is "not found" (exit 1), even though the half-rebuilt store holds it.
    r = globald("get", "--config", cfg, "--table", "tbl", "fresh")
    assert r.returncode == 1 and "not found" in r.stderr and "rebuilding" in r.stderr

    r = globald("dump", "--config", cfg, "--table", "tbl")
    assert r.returncode == 0, r.stderr
    assert dumped(r.stdout) == OLD and "rebuilding" in r.stderr and SID in r.stderr
    r = globald("dump", "--config", cfg, "--table", "tbl", "--json")
    assert r.returncode == 0 and dumped(r.stdout) == OLD  # stdout stays pure JSON lines of records
    meta = json.loads(r.stderr)
    assert meta["source"] == "snapshot" and meta["snapshot"] == SID and meta["offsets"] == {"0": 30, "1": 12}


def test_the_running_daemons_state_and_reason_are_given(rebuilding: Path, tmp_path: Path,
                                                        live_daemon: subprocess.Popen[bytes]) -> None:
    reason = "invalid offset, rebuilding: invalid offset 30 for topic[0]"
    (rebuilding / "status.json").write_text(json.dumps({
        "state": "RESTORING", "pid": live_daemon.pid, "degraded": None,
        "tables": {"tbl": {"state": "RESTORING", "reason": reason, "offsets": {"0": 2}}}}))
    r = globald("get", "--config", config(tmp_path, rebuilding), "--table", "tbl", "both", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["state"] == "RESTORING" and doc["reason"] == f"RESTORING: {reason}" and doc["value"] == "old-both"
    assert f"RESTORING: {reason}" in r.stderr


def test_serve_stale_false_refuses_with_exit_3(rebuilding: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, rebuilding, serve_stale=False)
    for args in (("get", "both"), ("get", "both", "--json"), ("dump",), ("dump", "--json")):
        r = globald(args[0], "--config", cfg, "--table", "tbl", *args[1:])
        assert r.returncode == EXIT_UNAVAILABLE, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (args, r.stdout, r.stderr)
        assert "serve_stale is false" in r.stderr and "rebuilding" in r.stderr


def test_no_snapshot_at_all_refuses_with_exit_3(tmp_path: Path) -> None:
    state = tmp_path / "state"
    fill(state, HALF, HALF_OFFSETS).close()  # a first restore under way: nothing consistent exists yet
    cfg = config(tmp_path, state)
    for args in (("get", "both"), ("dump",)):
        r = globald(args[0], "--config", cfg, "--table", "tbl", *args[1:])
        assert r.returncode == EXIT_UNAVAILABLE and r.stdout == "", (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "no snapshot" in r.stderr, r.stderr
    shutil.rmtree(db_dir(state, "tbl"))  # not even a store (a wipe between deleting and creating it)
    r = globald("get", "--config", cfg, "--table", "tbl", "both")
    assert r.returncode == EXIT_UNAVAILABLE and "no live store" in r.stderr


def test_a_store_being_deleted_is_answered_from_the_snapshot(rebuilding: Path, tmp_path: Path) -> None:
    mark_complete(rebuilding)  # even a complete store: what is left of its files is no consistent version
    ssts = sorted(db_dir(rebuilding, "tbl").glob("*.sst"))
    assert ssts
    ssts[0].unlink()  # a wipe (rmtree) halfway through
    r = globald("get", "--config", config(tmp_path, rebuilding), "--table", "tbl", "both", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"] == "snapshot" and doc["value"] == "old-both" and "cannot be opened" in doc["reason"]


def test_a_complete_store_is_answered_live_and_quietly(rebuilding: Path, tmp_path: Path) -> None:
    mark_complete(rebuilding)  # the rebuild reached the log end
    cfg = config(tmp_path, rebuilding, serve_stale=False)
    r = globald("get", "--config", cfg, "--table", "tbl", "both")
    assert r.returncode == 0 and "new-both" in r.stdout and r.stderr == "", r.stderr
    r = globald("get", "--config", cfg, "--table", "tbl", "fresh", "--json")
    doc = json.loads(r.stdout)
    assert doc["source"] == "live" and doc["rebuilding"] is False and doc["offsets"] == {"0": 2}
    assert doc["snapshot"] is None and doc["value"] == "new-fresh"
    r = globald("dump", "--config", cfg, "--table", "tbl")
    assert r.returncode == 0 and dumped(r.stdout) == HALF and r.stderr == ""
    r = globald("dump", "--config", cfg, "--table", "tbl", "--snapshot", SID, "--json")
    assert r.returncode == 0 and dumped(r.stdout) == OLD
    meta = json.loads(r.stderr)
    assert meta["snapshot"] == SID and meta["rebuilding"] is None and meta["snapshot_stale"] is True


# -- the reader underneath: one consistent view, or an error; never a prefix ---------------------------------------


def big_store(state: Path, n: int = 30_000) -> dict[bytes, bytes]:
    values = {b"k%07d" % i: os.urandom(40) for i in range(n)}
    fill(state, values, {0: n}).close()  # closing flushes: the values are in an SST file
    return values


def test_reader_reports_complete_from_its_own_open(tmp_path: Path) -> None:
    state = tmp_path / "state"
    fill(state, HALF, HALF_OFFSETS).close()
    with StoreReader(db_dir(state, "tbl")) as before:
        mark_complete(state)
        with StoreReader(db_dir(state, "tbl")) as after:
            assert not before.complete and after.complete  # each says what its own view holds


def test_an_open_reader_keeps_its_whole_view_when_the_store_is_wiped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    values = big_store(state)
    with StoreReader(db_dir(state, "tbl")) as r:
        shutil.rmtree(db_dir(state, "tbl"))
        assert {k: v for k, v, _ in r.items()} == values and r.offsets() == {0: len(values)}


def test_a_damaged_block_mid_scan_raises_and_dump_says_it_is_incomplete(tmp_path: Path) -> None:
    state = tmp_path / "state"
    big_store(state)
    mark_complete(state)
    sst = max(db_dir(state, "tbl").glob("*.sst"), key=lambda p: p.stat().st_size)
    with open(sst, "r+b") as f:
        f.seek(sst.stat().st_size // 2)
        f.write(b"\0" * 4096)
    from globald.common.errors import StoreCorruptError

    # A damaged block is corruption (the owner rebuilds such a store), never a disk that may heal.
    with StoreReader(db_dir(state, "tbl")) as r, pytest.raises(StoreCorruptError, match="read failed"):
        for _ in r.items():
            pass
    r2 = globald("dump", "--config", config(tmp_path, state), "--table", "tbl")
    assert r2.returncode == 5 and "incomplete after" in r2.stderr and "discard" in r2.stderr, r2.stderr[-500:]
