"""Store formats without a broker, on real RocksDB: the plain layout's lazy upgrade, merged reads, newer formats,
the ``migrate`` command and the refusals of ``import-kafka-streams`` that need no broker.

Plain and Kafka Streams stores are built by ``tests.layouts`` from the documented layouts with rocksdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from globald.common.errors import StoreCorruptError, StoreFormatError
from globald.store import checkpoint_file
from globald.store.codec import encode_value
from globald.store.names import (
    FORMAT_MIXED,
    FORMAT_TIMESTAMPED,
    FORMAT_VERSION,
    META_CF,
    META_FORMAT,
    META_UPGRADED,
    VALUES_CF,
    checkpoint_path,
    db_dir,
)
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.statedir import lock_state_dir
from globald.store.table_store import TableStore
from tests.harness import globald, write_config
from tests.layouts import write_kafka_streams_store, write_plain_store
from tests.stores import write_records

Expected = dict[bytes, tuple[bytes, int]]


def _plain_fixture(state_dir: Path, n: int = 3000) -> Expected:
    values = {b"key-%05d" % i: b"value-%d" % i for i in range(n)}
    write_plain_store(db_dir(state_dir, "tbl"), values)
    path = checkpoint_path(state_dir, "tbl")
    checkpoint_file.write(path, {("topic", 0): 100, ("topic", 1): 50})
    return {k: (v, -1) for k, v in values.items()}


def _read_all(path: Path) -> tuple[int | None, list[tuple[bytes, bytes, int]]]:
    with StoreReader(path) as r:
        return r.format_version(), list(r.items())


def _assert_view(path: Path, expected: Expected) -> None:
    _, items = _read_all(path)
    assert [k for k, _, _ in items] == sorted(expected)  # one item per key, in key order
    assert {k: (v, ts) for k, v, ts in items} == expected
    keys = [*sorted(expected)[::97], b"absent"]
    with StoreReader(path) as r:
        assert r.multi_get(keys) == [expected.get(k) for k in keys]
        assert [r.get(k) for k in keys] == [expected.get(k) for k in keys]
        assert {k: (v, ts) for k, v, ts in r.prefix(b"key-001")} == {
            k: v for k, v in expected.items() if k.startswith(b"key-001")}


def _default_family_keys(store: TableStore) -> list[bytes]:
    return list(store.db.keys())


def test_plain_store_is_served_with_timestamp_minus_one_and_upgraded_lazily(tmp_path: Path) -> None:
    expected = _plain_fixture(tmp_path)
    assert _read_all(db_dir(tmp_path, "tbl"))[0] is None  # a plain store carries no format marker
    _assert_view(db_dir(tmp_path, "tbl"), expected)  # readers serve it before any globald opened it

    opened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    store = opened.store
    assert opened.wiped_reason is None and opened.imported == {0: 100, 1: 50}  # offsets the old globald kept
    assert store.upgrading and _read_all(store.path)[0] == FORMAT_MIXED

    # Overwrites and tombstones go to the timestamped layout and take the plain copy with them, in one batch.
    write_records(store, {b"key-00001": encode_value(1234, b"new"), b"key-00002": None,
                          b"key-99999": encode_value(5, b"fresh")}, {0: 103})
    expected.update({b"key-00001": (b"new", 1234), b"key-99999": (b"fresh", 5)})
    del expected[b"key-00002"]
    assert {b"key-00001", b"key-00002"}.isdisjoint(_default_family_keys(store))
    _assert_view(store.path, expected)

    # A read through the live store queues the value; the next slice moves it first.
    assert store.get(b"key-02999") == (b"value-2999", -1)
    assert not store.upgrade_step(0.0)
    assert b"key-02999" not in _default_family_keys(store)
    assert store.db.get_column_family(VALUES_CF).get(b"key-02999") == encode_value(-1, b"value-2999")

    # Slice by slice, every consistent view merges to the same table: read-only opens and snapshots alike.
    steps = 0
    while not store.upgrade_step(0.0):
        steps += 1
        _assert_view(store.path, expected)
        if steps == 2:
            store.checkpoint(tmp_path / "snap")
            _assert_view(tmp_path / "snap", expected)
    assert steps >= 3  # 3000 values move in slices of 512, not all at once
    assert not store.upgrading and _default_family_keys(store) == []
    assert isinstance(store.new_batch(), WriteBatch)  # the plain wrapper is gone from the write path
    fmt, _ = _read_all(store.path)
    assert fmt == FORMAT_TIMESTAMPED  # fully upgraded: an older globald that reads only format 1 keeps it
    assert store.db.get_column_family(META_CF).get(META_UPGRADED)
    _assert_view(store.path, expected)
    _assert_view(tmp_path / "snap", expected)  # the snapshot taken mid-way still reads the same
    assert store.offsets() == {0: 103, 1: 50}
    store.close()

    again = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert not again.store.upgrading and again.imported == {}
    again.store.close()
    _assert_view(db_dir(tmp_path, "tbl"), expected)


def test_upgrade_resumes_after_a_crash(tmp_path: Path) -> None:
    expected = _plain_fixture(tmp_path, n=2000)
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store
    assert not store.upgrade_step(0.0)
    store.close(clean=False)
    reopened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert reopened.crashed and reopened.store.upgrading
    _assert_view(db_dir(tmp_path, "tbl"), expected)
    while not reopened.store.upgrade_step(1.0):
        pass
    reopened.store.close()
    _assert_view(db_dir(tmp_path, "tbl"), expected)


def _bump_format(path: Path, version: int) -> None:
    db = Rdict(str(path), Options(raw_mode=True))
    wb = WriteBatch(raw_mode=True)
    wb.put(META_FORMAT, str(version).encode(), db.get_column_family_handle(META_CF))
    db.write(wb)
    del wb
    db.close()


def test_newer_format_is_refused_by_readers_and_rebuilt_by_the_owner(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store
    write_records(store, {b"k": encode_value(1, b"v")}, {0: 1})
    store.close()
    _bump_format(db_dir(tmp_path, "tbl"), FORMAT_VERSION + 1)  # as a newer globald would leave it

    with pytest.raises(StoreFormatError, match="newer than this globald reads"):
        StoreReader(db_dir(tmp_path, "tbl"))
    with pytest.raises(StoreFormatError):
        TableStore.open(tmp_path, "tbl", "topic", StoreOptions(), wipe_unusable=False)
    opened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert opened.wiped_reason and "newer than this globald reads" in opened.wiped_reason
    assert opened.store.offsets() == {} and opened.store.get(b"k") is None
    opened.store.close()


def test_an_empty_store_never_takes_checkpoint_offsets(tmp_path: Path) -> None:
    # Offsets without the data below them would skip that data for good.
    checkpoint_path(tmp_path, "tbl").parent.mkdir(parents=True)
    checkpoint_file.write(checkpoint_path(tmp_path, "tbl"), {("topic", 0): 42})
    opened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert opened.imported == {} and "holds no data" in opened.import_note
    assert opened.store.offsets() == {}
    opened.store.close()


def test_plain_store_without_offsets_is_rebuilt(tmp_path: Path) -> None:
    # Replaying the topic over it would keep keys whose tombstones compaction has since dropped.
    write_plain_store(db_dir(tmp_path, "tbl"), {b"k": b"v"})
    with pytest.raises(StoreCorruptError, match="no offsets"):
        TableStore.open(tmp_path, "tbl", "topic", StoreOptions(), wipe_unusable=False)
    assert _read_all(db_dir(tmp_path, "tbl"))[1] == [(b"k", b"v", -1)]  # its data left as it was
    opened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert opened.wiped_reason and "no offsets" in opened.wiped_reason
    assert opened.store.get(b"k") is None and not opened.store.upgrading
    opened.store.close()


def _config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "globald.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"},
                        {"tbl": "topic", "other": "topic2"})


def test_migrate_command_imports_and_reports(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    state = tmp_path / "state"
    _plain_fixture(state, n=10)
    r = globald("migrate", "--config", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["tbl"]["imported"] == {"0": 100, "1": 50} and report["tbl"]["format_before"] is None
    assert report["tbl"]["format"] == FORMAT_MIXED and report["tbl"]["upgrading_plain_values"]
    assert "no store yet" in report["other"]["note"] and not (db_dir(state, "other")).exists()  # nothing created

    r = globald("migrate", "--config", str(cfg), "--table", "tbl")
    assert r.returncode == 0, r.stderr
    assert "nothing imported: the store already holds its offsets; offsets p0=100, p1=50" in r.stdout

    lock = lock_state_dir(state)  # as a running daemon holds it
    try:
        r = globald("migrate", "--config", str(cfg))
        assert r.returncode == 4 and "owned by another globald" in r.stderr  # refused
    finally:
        lock.close()


def test_migrate_reports_an_unreadable_store_and_leaves_it(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    state = tmp_path / "state"
    TableStore.open(state, "tbl", "topic", StoreOptions()).store.close()
    _bump_format(db_dir(state, "tbl"), FORMAT_VERSION + 1)
    r = globald("migrate", "--config", str(cfg), "--table", "tbl")
    assert r.returncode == 5 and "newer than this globald reads" in r.stdout  # runtime failure
    with pytest.raises(StoreFormatError):  # still there, untouched
        StoreReader(db_dir(state, "tbl"))


def test_import_kafka_streams_refusals_before_any_change(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    ks = tmp_path / "ks"
    args = ["import-kafka-streams", "--config", str(cfg), "--state-dir", str(ks), "--store", "store",
            "--table", "tbl"]

    r = globald(*args, "--application-id", "../escape")
    assert r.returncode == 2 and "--application-id" in r.stderr
    r = globald(*args, "--application-id", "app")
    assert r.returncode == 4 and "no offsets in" in r.stderr  # refused

    path = write_kafka_streams_store(ks, "app", "store", {b"k": (b"v", 7)}, {("elsewhere", 0): 1})
    r = globald(*args, "--application-id", "app")
    assert r.returncode == 4 and "no offsets of topic topic" in r.stderr and "elsewhere" in r.stderr

    checkpoint_file.write(ks / "app" / "global" / ".checkpoint", {("topic", 0): 1})
    held = Rdict(str(path), Options(raw_mode=True))  # the Kafka Streams application still has its store open
    try:
        r = globald(*args, "--application-id", "app")
        assert r.returncode == 4 and "open in another process" in r.stderr
    finally:
        held.close()
    assert not (tmp_path / "state").exists()  # nothing was created or changed
