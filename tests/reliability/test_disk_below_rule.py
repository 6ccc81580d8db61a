"""A table that served before a restart serves after it, on a disk below the sizing rule (issue 33, item 2).

On a tmpfs of 1.4 x the live store, the merge after a bulk load (a compaction rewriting the whole table) cannot
fit. Before the compaction gate (``globald.store.compaction_gate``) it was started all the same, failed with "No
space left on device", and RocksDB kept that failure: every snapshot's checkpoint failed with it ("no current
snapshot" for readers), and after a clean restart the compaction RocksDB started at open failed the same way
before the store could serve (RESTORING for good). Now compactions wait for room: the table serves, publishes
and restarts on that disk, `get`, `dump` and a Spark join equal the fold, and once the disk grows to the rule it
compacts, publishes and fits the rule.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.oracle import Table
from globald.store.codec import encode_value
from globald.store.compaction_gate import largest_compaction, shape
from globald.store.names import db_dir
from globald.store.options import StoreOptions
from globald.store.space import MB, minimum_state_dir
from globald.store.table_store import TableStore
from tests.ci import require_module
from tests.harness import Broker, DaemonProcess, globald, oracle_at, random_records
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.reliability.checks import read_store
from tests.reliability.disk import resize, tmpfs
from tests.reliability.ledger import FaultRow
from tests.reliability.test_disk_space import RECORDS, VALUE_SIZE, equals_oracle, running_at, settled_live
from tests.support.spark_local import TEST_JVM_OPTIONS, stop_with_jvm

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]

WB_MB = 4
BELOW_RULE = 1.4  # x the live store: the rule asks 2 x live + 2 write buffers
PAUSED = "compactions paused"
RESUMED = "room for compactions again"


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_module("pyspark", "spark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("globald-disk-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local"))).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_with_jvm(session)  # session.stop() alone leaves its JVM to the end of the worker (issue 40)


def reads_equal_the_fold(broker: Broker, d: DaemonProcess, t: str, spark: Any) -> None:
    """`get`, `dump` and a Spark join answer what the fold at CURRENT's offsets holds."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from globald.spark import GlobalTableView

    cur = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t), timeout=90)
    expected: Table = oracle_at(broker, t, cur["offsets"])
    dumped = {k: v for k, (v, _) in d.dump("tbl").items()}
    assert dumped == expected, f"dump: {len(dumped)} keys, fold {len(expected)}"
    present = sorted(expected)[:: max(1, len(expected) // 40)]
    probes = present + [b"key-absent-%d" % i for i in range(3)]
    for key in probes:
        r = globald("get", "--config", str(d.config), "--table", "tbl", "--json", key.decode())
        doc = json.loads(r.stdout)
        assert doc["found"] == (key in expected), (key, r.stdout, r.stderr)
        if key in expected:
            assert base64.b64decode(doc["value_base64"]) == expected[key], key
    view = GlobalTableView(spark, d.config, "tbl")
    try:
        desc = view.refresh()
        assert desc["offsets"] == cur["offsets"], (desc, cur)
        schema = StructType([StructField("id", LongType()), StructField("k", StringType())])
        frame = spark.createDataFrame([(i, k.decode()) for i, k in enumerate(probes)], schema).repartition(3)
        rows = view.join(frame, "k", value_col="v", timestamp_col="ts").collect()
        assert len(rows) == len(probes)
        for r in rows:
            want = expected.get(r["k"].encode())
            assert (bytes(r["v"]) if r["v"] is not None else None) == want, r["k"]
    finally:
        view.close()


def update(broker: Broker, d: DaemonProcess, t: str, seed: int) -> dict[int, int]:
    broker.admin.produce(t, random_records(2_000, keys=RECORDS * 50, seed=seed, value_size=VALUE_SIZE))
    ends = broker.admin.end_offsets(t)
    running_at(d, ends, timeout=90)
    wait_snapshot_at(d, "tbl", ends, timeout=90)  # published after the update: a flush, no compaction
    return ends


@pytest.mark.kafka
@pytest.mark.long  # two restores, three restarts of the reads and a Spark session: minutes on a loaded machine
@pytest.mark.timeout(1500)  # the waits inside bound each step; this only stops a hang
def test_a_table_serves_publishes_and_restarts_below_the_rule_then_compacts(
        broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path, spark: Any,
        fault: Callable[[str, str], FaultRow]) -> None:
    row = fault(f"state_dir at {BELOW_RULE} x the live store (below the rule): bulk restore, updates, clean "
                "restart; then the disk grown to the rule",
                "RUNNING and published before and after the restart, get/dump/Spark == fold; compacts and fits the "
                "rule once room returns")
    t = topic()
    broker.admin.produce(t, random_records(RECORDS, keys=RECORDS * 50, seed=3301, tombstones=0.0,
                                           value_size=VALUE_SIZE))
    ends = broker.admin.end_offsets(t)
    roomy = daemon({"tbl": t}, state_dir=tmp_path / "roomy", store={"write_buffer_mb": WB_MB})
    running_at(roomy, ends, timeout=180)
    live = settled_live(roomy)
    assert roomy.stop() == 0
    size_mb = int(BELOW_RULE * live / MB)
    with tmpfs(tmp_path / "disk", size_mb) as disk:
        d = daemon({"tbl": t}, state_dir=disk / "state", store={"write_buffer_mb": WB_MB},
                   snapshots={"interval_ms": 1000, "retain": 3})
        row.injected += 1
        running_at(d, ends, timeout=240)
        # The fault landed: the disk cannot hold the table's next compaction (the disk guard's line, status and log).
        d.wait_for(lambda s: bool(s["disk"]["tables"]["tbl"]["short"]), timeout=60, what="the disk short of room")
        assert "disk: table tbl needs" in d.log.read_text(), d.tail()
        equals_oracle(broker, d, t, ends, row)
        reads_equal_the_fold(broker, d, t, spark)
        ends = update(broker, d, t, seed=3302)
        assert RESUMED not in d.log.read_text(), d.tail()  # still short: nothing above came from a compaction

        paused = d.log.read_text().count(PAUSED)
        assert d.stop() == 0, d.tail()
        d.start()
        running_at(d, ends, timeout=120)
        for seed in range(3303, 3308):  # published: each a flush into L0, which would start a compaction by now
            ends = update(broker, d, t, seed=seed)
        # Opened with compactions off (the restart that used to stay RESTORING), saying so.
        assert d.log.read_text().count(PAUSED) > paused, d.tail()
        equals_oracle(broker, d, t, ends, row)
        reads_equal_the_fold(broker, d, t, spark)

        # Every publish so far went through (before the gate, the compaction the updates started failed on this
        # disk, and every checkpoint after it with "No space left on device").
        assert "snapshot publish failed" not in d.log.read_text(), d.tail()

        # Room returns: the disk grows to the rule. The pile is compacted away, CURRENT republished off it.
        rule = minimum_state_dir(live, WB_MB)
        resize(disk, -(-rule // MB))
        d.wait_for(lambda s: RESUMED in d.log.read_text(), timeout=60, what="compactions resumed")
        ends = update(broker, d, t, seed=3314)

        def within_rule(doc: dict[str, Any]) -> bool:
            fig = doc["disk"]["tables"]["tbl"]
            return fig["live_bytes"] + fig["snapshot_bytes"] + fig["leftover_bytes"] <= rule and \
                fig["live_bytes"] < 1.2 * live and not fig["short"]

        d.wait_for(within_rule, timeout=120, what=f"the table within the rule ({rule / MB:.1f} MB)")
        ends = update(broker, d, t, seed=3315)
        equals_oracle(broker, d, t, ends, row)
        reads_equal_the_fold(broker, d, t, spark)
        assert d.stop() == 0, d.tail()


def write(store: TableStore, rnd: random.Random, n: int, offset: int, fold: dict[bytes, bytes]) -> int:
    """``n`` records of random bytes on random keys, with their offsets in the same batch; the next offset."""
    records = [(b"key-%09d" % rnd.randrange(10**9), rnd.randbytes(VALUE_SIZE)) for _ in range(n)]

    def batch() -> Any:
        b = store.new_batch()
        for i, (key, value) in enumerate(records):
            b.put(key, encode_value(offset + i, value))
        store.put_offsets(b, {0: offset + n})
        return b

    store.write(batch(), rebuild=batch)
    fold.update(records)
    return offset + n


def test_a_store_below_the_rule_opens_publishes_and_compacts_once_room_returns(tmp_path: Path) -> None:
    """The store alone, without Kafka: a bulk load's pile (in L0, as a restore leaves it) moved to a tmpfs at 1.4 x
    its size. Before the compaction gate, the compaction RocksDB started at open filled the disk and failed, and
    every checkpoint and write after it failed with it ("No space left on device")."""
    rnd = random.Random(3310)
    options = StoreOptions(write_buffer_mb=WB_MB)
    fold: dict[bytes, bytes] = {}
    build = tmp_path / "build"
    store = TableStore.open(build, "tbl", "t", options).store
    store.begin_bulk_load()
    offset = 0
    while offset < RECORDS:
        offset = write(store, rnd, 5_000, offset, fold)
    store.end_bulk_load()
    assert store.files_per_level()[0] >= 4, store.files_per_level()  # the pile a compaction would merge
    store.close()
    pile = sum(p.stat().st_size for p in db_dir(build, "tbl").glob("*.sst"))
    with tmpfs(tmp_path / "disk", int(BELOW_RULE * pile / MB)) as disk:
        shutil.copytree(build / "tables", disk / "tables")
        (disk / "snapshots").mkdir()
        store = TableStore.open(disk, "tbl", "t", options).store
        try:
            assert not store.compactions_on and store.offsets() == {0: offset}
            for n in range(5):  # snapshots of new writes, each needing room for its flush only
                offset = write(store, rnd, 2_000, offset, fold)
                snap = disk / "snapshots" / f"{n:03d}"
                store.checkpoint(snap)
                assert read_store(snap) == ({0: offset}, fold)
                shutil.rmtree(snap)
            store.close()
            store = TableStore.open(disk, "tbl", "t", options).store  # the restart that stayed RESTORING
            assert store.offsets() == {0: offset}
            resize(disk, -(-minimum_state_dir(pile, WB_MB) // MB))  # room returns
            deadline = time.monotonic() + 120
            while store.files_per_level()[0] >= 4 or not store.compactions_on:
                assert time.monotonic() < deadline, (store.files_per_level(), store.compactions_on)
                store.offsets()  # where the owner thread looks at the room (once a second)
                time.sleep(0.2)
            store.checkpoint(disk / "snapshots" / "after")
        finally:
            store.close()
        assert read_store(disk / "snapshots" / "after") == ({0: offset}, fold)


def test_the_room_a_compaction_needs_is_the_whole_pile_or_a_slice() -> None:
    """``largest_compaction``: a pile in L0 over a one-level table rewrites it all; a table in levels, a slice (the
    gate pauses compactions only when that much is not free)."""
    def f(level: int, lo: bytes, hi: bytes, size: int) -> dict[str, Any]:
        return {"level": level, "start_key": lo, "end_key": hi, "size": size}

    assert largest_compaction([f(0, b"a", b"z", 10), f(0, b"b", b"y", 10)]) == 20
    assert largest_compaction([f(0, b"a", b"z", 1), f(6, b"a", b"m", 30), f(6, b"n", b"z", 30)]) == 61
    levels = [f(0, b"c", b"d", 1), f(5, b"a", b"f", 4), f(5, b"g", b"z", 4),
              f(6, b"a", b"e", 10), f(6, b"f", b"k", 10), f(6, b"l", b"z", 10)]
    assert largest_compaction(levels) == 24  # an L5 file and the two L6 files it overlaps, not the 39 of it all
    assert shape(0) == (8, 2) and shape(60 * MB) == (8, 2) and shape(1 << 30) == (128, 32)
    assert shape(10 << 30) == (256, 64)  # RocksDB's defaults for a large table
