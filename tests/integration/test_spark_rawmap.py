"""A raw table mapped from one file per snapshot and host (``globald.spark.mapped``, issue 34 item 3), with real
PySpark, the real daemon and a real broker: a join through the file equals the fold (values and record timestamps),
the Python workers of an executor map one file (one inode), a damaged file is never trusted but rebuilt from the
snapshot, and each snapshot version has its own file, which retention removes with its snapshot."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from globald.snapshot.reader import Snapshot
from globald.snapshot.resolve import Resolution
from globald.spark import GlobalTableView
from globald.spark import executor as spark_executor
from globald.spark.mapped import open_raw
from globald.store.names import COLUMNAR_PREFIX, COLUMNAR_SUFFIX, snapshots_dir
from globald.typed.columnar import ROW_BYTES, ColumnarInvalid, ColumnarTable
from tests.harness import Broker, DaemonProcess, random_records
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.integration.test_spark import check_rows, keys_df, spark
from tests.support.oracle import fold_timestamped

__all__ = ["spark"]  # the module's local[2] session fixture, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

Daemon = Callable[..., DaemonProcess]
GLOB = f"{COLUMNAR_PREFIX}*{COLUMNAR_SUFFIX}"


def _table(broker: Broker, topic: Callable[..., str], daemon: Daemon, seed: int, **snapshots: Any
           ) -> tuple[DaemonProcess, str, dict[str, Any]]:
    t = topic()
    broker.admin.produce(t, random_records(3_000, keys=500, seed=seed, tombstones=0.1))
    d = daemon({"tbl": t}, snapshots={"interval_ms": 200, "retain": 3, **snapshots})
    wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))
    return d, t, d.config


def _handle(d: DaemonProcess, sid: str, mb: int = 256) -> spark_executor.SnapshotHandle:
    res = Resolution(sid, {}, True, False)
    return spark_executor.SnapshotHandle(Snapshot(d.state_dir, "tbl", sid), res, None, mb << 20)


def _mappers(path: Path) -> dict[int, tuple[int, int]]:
    """pid -> (device, inode) of every process of this host that maps ``path`` (its /proc/<pid>/maps)."""
    found: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            lines = Path(entry.path, "maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5] == str(path):
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                found[int(entry.name)] = (os.makedev(major, minor), int(fields[4]))
    return found


def test_a_raw_join_maps_one_file_per_host_and_equals_the_fold(spark: Any, broker: Broker,
                                                               topic: Callable[..., str], daemon: Daemon) -> None:
    d, t, config = _table(broker, topic, daemon, seed=71)
    view = GlobalTableView(spark, config, "tbl")
    desc = view.refresh()
    expected = fold_timestamped(broker.settings, t, {int(p): o for p, o in desc["offsets"].items()})
    snap_dir = snapshots_dir(d.state_dir, "tbl") / desc["snapshot"]
    assert not list(snap_dir.glob(GLOB))  # no worker has read the raw table yet: no file

    keys: list[bytes | None] = [b"key-%06d" % i for i in range(550)] + [None, "ключ".encode()]
    rows = view.join(keys_df(spark, keys), "k").collect()  # 4 partitions on local[2]: two workers at once
    assert check_rows(rows, {k: v for k, (v, _) in expected.items()}) == sum(1 for k in keys if k in expected)
    for r in rows:  # each value keeps its record's timestamp (KIP-258)
        k = r["k"].encode() if r["k"] is not None else None
        assert r["timestamp"] == (expected[k][1] if k in expected else None), r

    files = list(snap_dir.glob(GLOB))
    assert len(files) == 1, files
    inode = files[0].stat().st_ino
    # The workers keep their handle (worker reuse): every one that looked keys up maps the same file, not a copy.
    mapping = _mappers(files[0])
    assert len(mapping) >= 2 and set(mapping.values()) == {(files[0].stat().st_dev, inode)}, mapping
    # A second query (the same or new workers) maps that file again: it was written once.
    again = view.join(keys_df(spark, keys, binary=True), "k").collect()
    check_rows(again, {k: v for k, (v, _) in expected.items()})
    assert [f.stat().st_ino for f in snap_dir.glob(GLOB)] == [inode]
    view.close()


def test_a_damaged_mapped_file_is_rebuilt_from_the_snapshot(broker: Broker, topic: Callable[..., str],
                                                            daemon: Daemon) -> None:
    d, t, _ = _table(broker, topic, daemon, seed=72)
    sid = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))["id"]
    expected = fold_timestamped(broker.settings, t, broker.admin.end_offsets(t))
    probe = pa.array([*expected, b"absent", None], pa.binary())
    want = ([expected[k][0] if k in expected else None for k in probe.to_pylist()],
            [expected[k][1] if k in expected else None for k in probe.to_pylist()])

    def lookup() -> tuple[list[Any], list[Any]]:
        h = _handle(d, sid)
        assert h.mapped
        value, ts = h.columns(probe)
        h.close()
        return value.to_pylist(), ts.to_pylist()

    assert lookup() == want
    (path,) = (snapshots_dir(d.state_dir, "tbl") / sid).glob(GLOB)
    good = path.read_bytes()
    fingerprint = ColumnarTable.open(path, _fingerprint(path)).meta["fingerprint"]

    def damaged(data: bytes) -> None:
        path.write_bytes(data)
        with pytest.raises(ColumnarInvalid):
            ColumnarTable.open(path, fingerprint)
        assert lookup() == want  # rebuilt, never trusted
        assert path.read_bytes() != data
        ColumnarTable.open(path, fingerprint)  # whole again

    damaged(good[: len(good) // 2])  # truncated: no footer
    damaged(b"\0" * len(good))  # not an Arrow file
    # A well-formed Arrow file whose key offsets go backwards (the first and last right): only the full validation
    # sees it, and a take of those rows would read before or past their bytes.
    table = pa.ipc.open_file(pa.BufferReader(good)).read_all().combine_chunks()
    keys = table.column("key").chunk(0)
    ends = np.frombuffer(keys.buffers()[1], np.int32)[: len(keys) + 1].copy()
    ends[1] = ends[-1]
    offsets = pa.py_buffer(ends.tobytes())
    bad_keys = pa.Array.from_buffers(pa.binary(), len(keys), [None, offsets, keys.buffers()[2]])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table.set_column(0, "key", bad_keys))
    damaged(sink.getvalue().to_pybytes())


def _fingerprint(path: Path) -> str:
    """The fingerprint a file says it was written under (to open the good one as its readers do)."""
    import json

    meta = pa.ipc.open_file(pa.memory_map(str(path))).schema.metadata
    return str(json.loads(meta[b"globald.columnar"])["fingerprint"])


def test_each_snapshot_has_its_own_file_and_retention_removes_it(broker: Broker, topic: Callable[..., str],
                                                                 daemon: Daemon) -> None:
    d, t, _ = _table(broker, topic, daemon, seed=73, retain=1)
    first = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))["id"]
    h = _handle(d, first)  # maps the file, then releases its lease: retention may take the snapshot
    root = snapshots_dir(d.state_dir, "tbl")
    (old,) = (root / first).glob(GLOB)
    broker.admin.produce(t, [(b"key-000001", b"newer"), (b"key-new", b"v")])
    ends = broker.admin.end_offsets(t)
    second = wait_snapshot_at(d, "tbl", ends)["id"]
    assert second != first
    h2 = _handle(d, second)
    (new,) = (root / second).glob(GLOB)
    assert new != old  # its own file
    value, _ = h2.columns(pa.array([b"key-000001", b"key-new"], pa.binary()))
    assert value.to_pylist() == [b"newer", b"v"]
    # The older version's file goes with its snapshot (retain = 1); this worker's mapping of it still answers.
    deadline = time.monotonic() + 60
    while (root / first).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (root / first).exists() and not old.exists(), f"snapshot {first} kept; log:\n{d.tail()}"
    old_value, _ = h.columns(pa.array([b"key-new"], pa.binary()))
    assert old_value.to_pylist() == [None]
    h.close()
    h2.close()


def test_a_raw_snapshot_over_the_budget_is_read_by_multi_gets_and_writes_no_file(
        broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    d, t, _ = _table(broker, topic, daemon, seed=74)
    sid = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))["id"]
    expected = fold_timestamped(broker.settings, t, broker.admin.end_offsets(t))
    probe = pa.array([*expected, b"absent"], pa.binary())
    # 0: never mapped, read by multi-gets.
    h = spark_executor.SnapshotHandle(Snapshot(d.state_dir, "tbl", sid), Resolution(sid, {}, True, False), None, 0)
    value, ts = h.columns(probe)
    h.close()
    assert not h.mapped
    assert value.to_pylist() == [expected[k][0] if k in expected else None for k in probe.to_pylist()]
    assert ts.to_pylist() == [expected[k][1] if k in expected else None for k in probe.to_pylist()]
    # The exact count while the file is written: one byte under the keys, values and ROW_BYTES a row, no file.
    exact = sum(len(k) + len(v) + ROW_BYTES for k, (v, _) in expected.items())
    with Snapshot(d.state_dir, "tbl", sid) as snap:
        assert open_raw(snap, exact - 1) is None
        assert not list((snapshots_dir(d.state_dir, "tbl") / sid).glob(GLOB))
        table = open_raw(snap, exact)
        assert table is not None and len(table) == len(expected)
    assert len(list((snapshots_dir(d.state_dir, "tbl") / sid).glob(GLOB))) == 1
