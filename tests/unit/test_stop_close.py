"""A daemon's stop closes its stores without the memtable flush that durability does not need (issue 40): the
final commit synced the WAL, so the close cancels RocksDB's background work and leaves the memtables to the WAL,
and the next open finds every write, at its offsets, closed cleanly. A bulk load's close still flushes (RocksDB's
shutdown): its WAL is off, and the flush keeps data and offsets together."""

from __future__ import annotations

from pathlib import Path

from globald.store.codec import encode_value
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.stores import write_records

VALUES = {b"k%05d" % i: b"v%05d" % i for i in range(2_000)}
RECORDS = {k: encode_value(7, v) for k, v in VALUES.items()}


def _wal_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.rglob("*.log"))


def _written(state: Path) -> TableStore:
    store = TableStore.open(state, "tbl", "topic", StoreOptions()).store
    write_records(store, RECORDS, {0: len(RECORDS)})
    assert store.sync() == {0: len(RECORDS)}  # the final commit
    return store


def test_a_stop_leaves_the_memtables_to_the_synced_wal_and_the_next_open_finds_everything_clean(
        tmp_path: Path) -> None:
    _written(tmp_path).close(clean=True, stopping=True)
    assert _wal_bytes(tmp_path) > sum(len(k) + len(v) for k, v in RECORDS.items())  # not flushed: still in the WAL
    reopened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert not reopened.crashed and reopened.wiped_reason is None
    assert reopened.store.offsets() == {0: len(RECORDS)}
    assert {k: reopened.store.get(k) for k in VALUES} == {k: (v, 7) for k, v in VALUES.items()}
    reopened.store.close()


def test_a_close_outside_a_stop_still_flushes(tmp_path: Path) -> None:
    _written(tmp_path).close(clean=True)
    assert _wal_bytes(tmp_path) < sum(len(k) + len(v) for k, v in RECORDS.items())


def test_a_stop_in_a_bulk_load_keeps_what_was_loaded_without_ending_the_load(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store
    store.begin_bulk_load()
    write_records(store, RECORDS, {0: len(RECORDS)})
    store.close(clean=True, stopping=True)  # the final commit left the bulk table out: no end_bulk_load, no sync
    reopened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    # RocksDB's shutdown flushed the memtables, data and offsets together: the restore resumes where it was
    assert not reopened.crashed and reopened.store.offsets() == {0: len(RECORDS)}
    assert {k: reopened.store.get(k) for k in VALUES} == {k: (v, 7) for k, v in VALUES.items()}
    reopened.store.close()
