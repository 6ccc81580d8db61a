"""globald.spark with real PySpark, the real daemon and a real broker: an enrichment job sees new values after a
refresh, no batch mixes two snapshots, a rebuild never fails a lookup, content equals the oracle.

Most tests run twice (``session``): on a classic local[2] session and on a Spark Connect session to a real Connect
server the suite starts from pyspark's own jar (``tests.support.spark_connect``), with the same view code."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald.common.errors import SnapshotUnavailableError
from globald.snapshot import manifest as manifests
from globald.snapshot.reader import Snapshot
from globald.snapshot.resolve import Resolution
from globald.spark import GlobalTableView
from globald.spark import executor as spark_executor
from globald.spark.session import ConnectUnsupportedError, functions
from globald.store.layout import offsets_to_json
from globald.store.names import snapshots_dir
from tests import midway
from tests.ci import require_module
from tests.harness import SLOW_FETCH, Broker, DaemonProcess, oracle_at, random_records
from tests.integration.snapshot_helpers import (
    recreate_smaller_while_paused,
    table_on_topic,
    wait_snapshot_at,
)
from tests.support.spark_connect import connect_mode, connect_server, connect_session
from tests.support.spark_local import TEST_JVM_OPTIONS, stop_with_jvm

__all__ = ["connect_server", "connect_session"]  # fixtures, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

Daemon = Callable[..., DaemonProcess]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    require_module("pyspark", "spark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("globald-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "200")
               .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_with_jvm(session)  # session.stop() alone leaves its ~650 MB JVM to the end of the worker (issue 40)


@pytest.fixture(params=["classic", "connect"])
def session(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The classic session, or a Spark Connect one (PySpark's functions switched to Connect's meanwhile)."""
    connect = request.param == "connect"
    s = request.getfixturevalue("connect_session" if connect else "spark")
    with connect_mode(connect):
        yield s


def keys_df(spark: Any, keys: list[bytes | None], binary: bool = False) -> Any:
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    rows = [(i, k if binary or k is None else k.decode()) for i, k in enumerate(keys)]
    schema = StructType([StructField("id", LongType()), StructField("k", BinaryType() if binary else StringType())])
    return spark.createDataFrame(rows, schema).repartition(4)


def as_bytes(k: Any) -> bytes | None:
    return k.encode() if isinstance(k, str) else (bytes(k) if k is not None else None)


def check_rows(rows: list[Any], expected: dict[bytes, bytes]) -> int:
    """Every row's value is the oracle's (None where absent); returns how many keys were found."""
    found = 0
    for r in rows:
        want = expected.get(as_bytes(r["k"])) if r["k"] is not None else None
        assert (bytes(r["value"]) if r["value"] is not None else None) == want, r
        assert (r["timestamp"] is None) == (want is None), r
        found += want is not None
    return found


# Executors map a snapshot that fits memory_index_mb from its one file per host; 0 keeps them on RocksDB multi-gets.
# Over Connect: a call over 15 s on an idle 2-core machine (24.7 s), the long lane (make test-long); make test keeps
# Connect's joins in the small-table and typed tests.
@pytest.mark.parametrize(("session", "memory_index_mb"),
                         [("classic", 256), ("classic", 0), pytest.param("connect", 256, marks=pytest.mark.long)],
                         ids=["classic-mapped", "classic-multi_get", "connect-mapped"],
                         indirect=["session"])
def test_enrichment_job_sees_new_values_after_refresh(session: Any, broker: Broker, topic: Callable[..., str],
                                                      daemon: Daemon, memory_index_mb: int) -> None:
    t = topic()
    broker.admin.produce(t, random_records(3_000, keys=400, seed=61, tombstones=0.1))
    d = daemon({"tbl": t}, snapshots={"interval_ms": 200, "retain": 3})
    wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))
    view = GlobalTableView(session, d.config, "tbl", memory_index_mb=memory_index_mb)
    desc = view.refresh()
    assert {"table", "snapshot", "offsets"} <= set(desc) and desc["table"] == "tbl"
    ends = broker.admin.end_offsets(t)
    assert desc["offsets"] == {str(p): o for p, o in ends.items()} and desc["exact"] is True
    expected = oracle_at(broker, t, desc["offsets"])
    # The handle an executor opens takes the path the budget allows, and answers as the oracle does.
    res = Resolution(desc["snapshot"], ends, True, False)
    h = spark_executor.SnapshotHandle(Snapshot(d.state_dir, "tbl", desc["snapshot"]), res, None, memory_index_mb << 20)
    probe = [*expected, b"absent", None]
    value, _ = h.columns(pa.array(probe, pa.binary()))
    h.close()
    assert h.mapped is (memory_index_mb > 0) and value.to_pylist() == [expected.get(k) for k in probe]

    keys: list[bytes | None] = [b"key-%06d" % i for i in range(450)] + [None, "ключ".encode()]
    rows = view.join(keys_df(session, keys), "k", snapshot_col="snap").collect()
    assert len(rows) == len(keys) and {r["snap"] for r in rows} == {desc["snapshot"]}
    assert check_rows(rows, expected) == sum(1 for k in keys if k in expected)
    binary_rows = view.join(keys_df(session, keys, binary=True), "k").collect()
    check_rows(binary_rows, expected)

    # The pandas UDF (and, on a classic session, mapPartitions) give the same answers.
    udf_rows = keys_df(session, keys).select("k", view.udf()("k").alias("r")).collect()
    for r in udf_rows:
        assert (bytes(r["r"]["value"]) if r["r"]["value"] is not None else None) == expected.get(as_bytes(r["k"]))
    if not view.connect:
        triples = view.lookup_partitions(session.sparkContext.parallelize(keys, 3)).collect()
        assert {k: (bytes(v) if v is not None else None) for k, v, _ in triples if k is not None} == \
            {k: expected.get(k) for k in keys if k is not None}

    # The topic changes; after a refresh the job sees the new values, and only those.
    before = view.join(keys_df(session, keys), "k", snapshot_col="snap")  # built now: keeps this descriptor
    changed = [(b"key-%06d" % i, b"changed-%d" % i) for i in range(0, 400, 3)] + [(b"key-000001", None)]
    broker.admin.produce(t, changed)
    new_desc = view.refresh()
    assert new_desc["offsets"] == {str(p): o for p, o in broker.admin.end_offsets(t).items()}
    assert new_desc["snapshot"] != desc["snapshot"] and new_desc["exact"] is True
    new_expected = oracle_at(broker, t, new_desc["offsets"])
    rows = view.join(keys_df(session, keys), "k", snapshot_col="snap").collect()
    assert {r["snap"] for r in rows} == {new_desc["snapshot"]}
    check_rows(rows, new_expected)
    assert new_expected[b"key-000003"] == b"changed-3" and b"key-000001" not in new_expected
    old_rows = before.collect()
    (old_snap,) = {r["snap"] for r in old_rows}
    if old_snap != desc["snapshot"]:
        # No executor held the first snapshot once the second job ran, so retention may have collected it: the
        # executors then had the daemon build one at exactly the descriptor's offsets (a CI run on 2 cores did).
        built = manifests.read(snapshots_dir(d.state_dir, "tbl") / old_snap, "tbl")
        assert offsets_to_json(built.offsets) == desc["offsets"], (built, desc)
    check_rows(old_rows, expected)
    assert view.fallbacks.value == 0

    # Lineage: each call recorded the descriptor its DataFrame or UDF captured, newest last; a join's DataFrame
    # carries it as a named observation; refresh(offsets=...) with a recorded read reads that version again.
    reads = view.lineage()
    assert [r.kind for r in reads] == ["join", "join", "udf", *([] if view.connect else ["lookup_partitions"]),
                                       "join", "join"]
    assert [r.seq for r in reads] == [desc["seq"]] * (len(reads) - 1) + [new_desc["seq"]]
    first = {int(p): o for p, o in desc["offsets"].items()}
    assert all(r.snapshot == desc["snapshot"] and r.offsets == first and r.table == "tbl" for r in reads[:-1])
    assert reads[-1].snapshot == new_desc["snapshot"] and reads[-1].to_json()["offsets"] == new_desc["offsets"]
    plan = plan_of(before)
    assert f"CollectMetrics {reads[-2].observation}," in plan and desc["snapshot"] in plan, plan
    # ... which also counts the fallbacks: one observation a join, as each is a node run on every row (issue 44.3;
    # an adaptive plan prints its initial and final forms, so each node may be there twice)
    assert plan.count("CollectMetrics") == plan.count(f"CollectMetrics {reads[-2].observation},"), plan
    again = view.refresh(offsets=reads[-2].offsets)
    assert again["offsets"] == desc["offsets"] and again["exact"] is True
    check_rows(view.join(keys_df(session, keys), "k").collect(), expected)
    view.close()


def test_lookup_partitions_on_connect_fails_at_once_naming_the_dataframe_way(
        connect_session: Any, broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    _, d = table_on_topic(broker, topic, daemon, 100, seed=65, keys=20)
    with connect_mode(True):
        view = GlobalTableView(connect_session, d.config, "tbl")
        with pytest.raises(ConnectUnsupportedError) as info:
            view.lookup_partitions(object())
    message = str(info.value)
    assert "\n" not in message and "view.join(" in message and "udf()" in message, message
    assert view.descriptor is None  # failed before doing anything
    view.close()


def start_query(start: Callable[[], Any], attempts: int = 3) -> Any:
    """``start()``, again when Spark's streaming Python worker missed its connect-back: on Connect the server starts
    one Python process per foreachBatch query and gives it a fixed 10 s (PythonWorkerFactory, not configurable) to
    import PySpark and call back, which a loaded 2-core machine can exceed."""
    for attempt in range(attempts):
        try:
            return start()
        except Exception as e:
            if "failed to connect back" not in str(e) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# Over Connect: a call over 15 s on an idle 2-core machine (21.1 s), the long lane (make test-long).
@pytest.mark.parametrize("session", ["classic", pytest.param("connect", marks=pytest.mark.long)], indirect=True)
def test_streaming_batches_never_mix_snapshots(session: Any, broker: Broker, topic: Callable[..., str],
                                               daemon: Daemon, tmp_path: Path) -> None:
    F = functions(session)
    t, d = table_on_topic(broker, topic, daemon, 2_000, seed=71, keys=200)
    view = GlobalTableView(session, d.config, "tbl")
    out = tmp_path / "batches.jsonl"

    # On Connect, foreachBatch runs on the Connect server, in a copy of the view: batches go to a file both see.
    def process(batch_df: Any, batch_id: int) -> None:
        rows = view.join(batch_df, "k", snapshot_col="snap").collect()
        read_batch, read_join = (r.to_json() for r in view.lineage()[-2:])
        assert read_batch["kind"] == "foreach_batch" and read_batch["batch_id"] == batch_id
        record = {"desc": view.descriptor, "reads": [read_batch, read_join], "rows": [
            {"k": r["k"], "value": None if r["value"] is None else bytes(r["value"]).hex(),
             "timestamp": r["timestamp"], "snap": r["snap"]} for r in rows]}
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")

    def seen() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        lines = out.read_text().splitlines() if out.exists() else []
        batches = [json.loads(line) for line in lines if line.endswith("}")]
        for b in batches:  # the batch's lineage: its micro-batch and its join read the descriptor it ran with
            assert [r["kind"] for r in b["reads"]] == ["foreach_batch", "join"], b["reads"]
            assert all((r["snapshot"], r["offsets"]) == (b["desc"]["snapshot"], b["desc"]["offsets"])
                       for r in b["reads"]), b
        return [(b["desc"], [{**r, "value": None if r["value"] is None else bytes.fromhex(r["value"])}
                             for r in b["rows"]]) for b in batches]

    stream = (session.readStream.format("rate").option("rowsPerSecond", 400).load()
              .select(F.format_string("key-%06d", F.col("value") % 220).alias("k")))
    query = start_query(lambda: stream.writeStream.foreachBatch(view.foreach_batch(process))
                        .trigger(processingTime="300 milliseconds").start())
    try:
        for seed in (72, 73, 74):
            deadline = time.monotonic() + 90
            n = len(seen())
            while len(seen()) < n + 2:
                assert time.monotonic() < deadline and query.exception() is None, query.exception()
                time.sleep(0.2)
            broker.admin.produce(t, random_records(300, keys=200, seed=seed, tombstones=0.1))
        deadline = time.monotonic() + 90
        final = {str(p): o for p, o in broker.admin.end_offsets(t).items()}
        while not seen() or seen()[-1][0]["offsets"] != final:
            assert time.monotonic() < deadline and query.exception() is None, query.exception()
            time.sleep(0.2)
    finally:
        query.stop()
    versions: dict[str, tuple[dict[str, int], list[Any]]] = {}
    for desc, rows in seen():
        assert {r["snap"] for r in rows} <= {desc["snapshot"]}, "a batch read two snapshots"
        versions.setdefault(desc["snapshot"], (desc["offsets"], []))[1].extend(rows)
    assert len(versions) >= 3
    for offsets, rows in versions.values():
        check_rows(rows, oracle_at(broker, t, offsets))
    view.close()


def test_rebuild_keeps_job_on_stale_snapshot_with_no_failed_lookup(spark: Any, broker: Broker,
                                                                   topic: Callable[..., str], daemon: Daemon,
                                                                   tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(45_000, keys=45_000, seed=81))
    d = daemon({"tbl": t}, start=False, snapshots={"interval_ms": 200, "retain": 3}, consume_batch_size=500,
               # the identity check that vouches for the old snapshot (wait_vouched) runs at each refresh
               metadata_refresh_ms=500, kafka=SLOW_FETCH)
    # The daemon stops itself a third into the rebuild, so that the job runs on the stale snapshot meanwhile, however
    # fast this machine rebuilds (frozen once the rebuild was seen starting, it could have finished already).
    arm_file = tmp_path / "arm.json"
    midway.arm(d, arm_file)
    d.start()
    wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t), timeout=90)
    view = GlobalTableView(spark, d.config, "tbl", wait_timeout_s=1.0, on_timeout="newest")
    first = view.refresh()
    old = oracle_at(broker, t, first["offsets"])
    probe = sorted(old)[::90][:500]
    df = keys_df(spark, list(probe)).cache()
    batches: list[tuple[dict[str, Any], list[Any]]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def job() -> None:
        step = view.foreach_batch(lambda batch_df, _: batches.append(
            (view.descriptor or {}, view.join(batch_df, "k", snapshot_col="snap").collect())))
        i = 0
        while not stop.is_set():
            try:
                step(df, i)
            except BaseException as e:
                errors.append(e)
                return
            i += 1

    runner = threading.Thread(target=job)
    runner.start()
    try:
        midway.freeze_at_restore(arm_file, "tbl", 0.3)
        recreate_smaller_while_paused(broker, d, t, 30_000, seed=82)
        midway.wait_frozen(d, arm_file)  # the rebuild held while the job runs on
        assert d.proc is not None
        n = len(batches)
        # Each batch waits out wait_timeout_s for the frozen daemon, then runs a Spark job: give it time on a slow
        # machine, but it must get through while the daemon stays frozen.
        held = time.monotonic() + 60
        while len(batches) <= n and not errors and time.monotonic() < held:
            time.sleep(0.1)
        progressed = len(batches) > n
        d.proc.send_signal(signal.SIGCONT)
        assert progressed and not errors, f"the job stalled during the rebuild: {errors}"
        ends = broker.admin.end_offsets(t)
        wait_snapshot_at(d, "tbl", ends, timeout=90)
        want = {str(p): o for p, o in ends.items()}
        deadline = time.monotonic() + 60
        while not batches or batches[-1][0].get("offsets") != want:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.1)
    finally:
        stop.set()
        runner.join(60)
    assert not errors, errors
    stale_batches = [rows for desc, rows in batches if desc.get("stale")]
    assert stale_batches, "no batch ran on the stale snapshot"
    for desc, rows in batches:
        assert {r["snap"] for r in rows} == {desc["snapshot"]}
        if desc["offsets"] == first["offsets"]:
            assert check_rows(rows, old) == len(probe)  # zero failed lookups on the old/stale table
    check_rows(batches[-1][1], oracle_at(broker, t, batches[-1][0]["offsets"]))
    view.close()


def test_small_table_mode_timer_and_policies(session: Any, broker: Broker, topic: Callable[..., str],
                                             daemon: Daemon) -> None:
    t, d = table_on_topic(broker, topic, daemon, 1_000, seed=91, keys=150)
    small = GlobalTableView(session, d.config, "tbl", mode="broadcast")
    desc = small.refresh()
    keys: list[bytes | None] = [b"key-%06d" % i for i in range(160)]
    check_rows(small.join(keys_df(session, keys), "k").collect(), oracle_at(broker, t, desc["offsets"]))

    # The timer moves the view forward by itself.
    small.start_refresh_timer(0.3)
    broker.admin.produce(t, random_records(200, keys=150, seed=92))
    want = {str(p): o for p, o in broker.admin.end_offsets(t).items()}
    deadline = time.monotonic() + 30
    while (small.descriptor or {}).get("offsets") != want:
        assert time.monotonic() < deadline, small.descriptor
        time.sleep(0.1)
    small.stop_refresh_timer()
    check_rows(small.join(keys_df(session, keys), "k").collect(), oracle_at(broker, t, want))

    # Policy "fail": a target the sidecar cannot reach is refused and the previous descriptor stays.
    strict = GlobalTableView(session, d.config, "tbl", wait_timeout_s=5.0)
    good = strict.refresh()
    with pytest.raises(SnapshotUnavailableError) as info:
        strict.refresh(offsets={int(p): o + 100 for p, o in want.items()})
    assert info.value.code == "beyond_end" and strict.descriptor == good

    # Policy "newest" on an executor: it reads the newest snapshot and says so.
    settings = spark_executor.Settings(str(d.config), "tbl", wait_timeout_s=5.0, policy="newest", lease_s=30)
    far = {**good, "offsets": {p: o + 100 for p, o in want.items()}, "snapshot": None}
    plain = spark_executor.Settings(str(d.config), "tbl", wait_timeout_s=5.0)
    kept = spark_executor.handle(plain, good)
    assert spark_executor.handle(plain, {**good, "seq": good["seq"] + 1, "created": 0.0}) is kept  # same content
    h = spark_executor.handle(settings, far)
    assert h is not kept and not h.exact and h.note and "beyond_end" in h.note
    spark_executor.close_all()
    # ... and through Spark: each task that fell back is counted by the join's observation, on both sessions.
    lenient = GlobalTableView(session, d.config, "tbl", wait_timeout_s=5.0, on_timeout="newest")
    lenient._install(far)  # as if the driver's host had no sidecar and asked for offsets no executor reaches
    two = keys_df(session, [b"key-000001", b"key-000002"]).coalesce(1)
    joined = lenient.join(two, "k")
    assert lenient.fallbacks.value == 0 and "__globald_fallback" not in joined.columns
    got = {r["k"]: r["value"] for r in joined.collect()}
    newest = oracle_at(broker, t, good["offsets"])
    assert {k: None if v is None else bytes(v) for k, v in got.items()} == \
        {"key-000001": newest.get(b"key-000001"), "key-000002": newest.get(b"key-000002")}
    assert lenient.fallbacks.value == 1
    lenient.join(two, "k").count()
    assert lenient.fallbacks.value == 2
    lenient.close()
    small.close()
    strict.close()


def plan_of(df: Any) -> str:
    if hasattr(df, "_jdf"):
        return str(df._jdf.queryExecution().executedPlan().toString())
    return str(df._explain_string(extended=False))


@pytest.mark.parametrize("small_join", ["index", "spark"])
def test_small_table_join_equals_the_snapshot(session: Any, broker: Broker, topic: Callable[..., str],
                                              daemon: Daemon, small_join: str) -> None:
    t, d = table_on_topic(broker, topic, daemon, 1_500, seed=95, keys=300)
    small = GlobalTableView(session, d.config, "tbl", mode="broadcast", small_join=small_join)
    desc = small.refresh()
    view = GlobalTableView(session, d.config, "tbl")  # snapshot mode at the same offsets: the reference
    view.refresh(offsets={int(p): o for p, o in desc["offsets"].items()})
    expected = oracle_at(broker, t, desc["offsets"])
    keys: list[bytes | None] = [b"key-%06d" % i for i in range(320)] + [None, "ключ".encode(), b"key-000007"]
    for binary in (False, True):
        frame = keys_df(session, keys, binary=binary)
        joined = small.join(frame, "k", value_col="v", timestamp_col="ts", snapshot_col="snap")
        plan = plan_of(joined)
        if small_join == "spark":  # Spark's own join: no Python on the executors
            assert "BroadcastHashJoin" in plan and not any(p in plan for p in ("MapInArrow", "EvalPython")), plan
        assert joined.columns == ["id", "k", "v", "ts", "snap"]
        rows = {r["id"]: r for r in joined.collect()}
        reference = {r["id"]: r for r in view.join(frame, "k", value_col="v", timestamp_col="ts").collect()}
        assert len(rows) == len(keys) and rows.keys() == reference.keys()
        for i, r in rows.items():
            assert (r["k"], r["v"], r["ts"]) == (reference[i]["k"], reference[i]["v"], reference[i]["ts"])
            assert r["snap"] == desc["snapshot"]
            k = keys[i]
            want = None if k is None else expected.get(k)
            assert (bytes(r["v"]) if r["v"] is not None else None) == want and (r["ts"] is None) == (want is None)
    assert sum(r["v"] is not None for r in rows.values()) == sum(k in expected for k in keys if k is not None)

    # The pandas UDF (and on a classic session mapPartitions) look the shipped content up and answer the same.
    udf_rows = keys_df(session, keys).select("id", small.udf()("k").alias("r")).collect()
    assert {r["id"]: (r["r"]["value"], r["r"]["timestamp"]) for r in udf_rows} == \
        {i: (r["v"], r["ts"]) for i, r in rows.items()}
    if not small.connect:
        triples = small.lookup_partitions(session.sparkContext.parallelize(keys, 3)).collect()
        assert [(bytes(v) if v is not None else None) for _, v, _ in triples] == \
            [None if k is None else expected.get(k) for k in keys]

    # One descriptor per DataFrame: a join built before a refresh keeps answering from its snapshot.
    before = small.join(keys_df(session, keys), "k")
    broker.admin.produce(t, [(b"key-%06d" % i, b"new-%d" % i) for i in range(0, 300, 7)])
    new_desc = small.refresh()
    assert new_desc["snapshot"] != desc["snapshot"]
    check_rows(before.collect(), expected)
    check_rows(small.join(keys_df(session, keys), "k").collect(), oracle_at(broker, t, new_desc["offsets"]))
    small.close()
    view.close()
