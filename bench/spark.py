"""Measurements for snapshots and the Spark integration: ``python -m bench.spark [--keys N]``.

Runs an embedded Kafka 0.9 broker and the real daemon, then reports (as one JSON document on stdout): snapshot
publish time for an N-key table, reader open time, exact-request latency, refresh latency (driver call to
executors reading the new snapshot) and lookups/s per executor core in each lookup mode, against a plain
broadcast dict in the same Spark session (local[1], so every figure is per core). Figures are wall-clock and
noisy on a shared machine; nothing here is a pass/fail test.

``--benches`` picks among ``publish``, ``spark`` (the default run), ``typed`` (the typed join against a user's
dict + per-value decode, per core, with the one-off decode and the columnar file's bytes per key:
``bench.spark_typed_join``) and ``executor-memory`` (the Python workers of a local[4] executor before and after
the columnar file: ``bench.spark_memory``); ``--typed`` and ``--executor-memory`` add those two.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd  # module level: Spark resolves the dict pandas UDF's type hints in this module

from bench.spark_harness import (
    DEFAULT_ARROW_BATCH,
    TABLE,
    fastest,
    log,
    records,
    sidecar_config,
    snapshot_at,
    snapshot_at_end,
    spark_session,
    start_sidecar,
    stats,
    stop_all,
    wait,
)
from bench.spark_memory import AS_OF_PHASES, PHASES
from globald.snapshot import exact_requests, open_snapshot
from globald.snapshot.reader import Snapshot, current_id
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka


def measure_daemon(admin: TopicAdmin, topic: str, state: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ends = admin.end_offsets(topic)
    started = time.monotonic()
    snap = wait(lambda: snapshot_at(state, ends), 900, "restore")
    out["restore_and_first_snapshot_s"] = round(time.monotonic() - started, 2)
    out["first_publish_ms"] = snap["last_publish_ms"]  # includes flushing the restore's memtables
    steady = []
    for seed in range(5):
        admin.produce(topic, records(10_000, 10**9, 1000 + seed))
        ends = admin.end_offsets(topic)
        steady.append(wait(partial(snapshot_at, state, ends), 120, "publish")["last_publish_ms"] / 1000)
    out["steady_publish_after_10k_updates"] = stats(steady)
    with open_snapshot(state, TABLE) as s:
        out["snapshot_records_estimate"] = s.manifest.records
    opens = []
    for _ in range(100):
        t = time.perf_counter()
        s = open_snapshot(state, TABLE)
        opens.append(time.perf_counter() - t)
        s.close()
    out["reader_open"] = stats(opens)
    live = admin.end_offsets(topic)
    out["exact_request_at_live_ms"] = request_ms(state, live)
    # Behind the live table, between two snapshots: built from the older one plus the records in between.
    admin.produce(topic, records(10_000, 10**9, 2000))
    target = admin.end_offsets(topic)
    admin.produce(topic, records(10_000, 10**9, 2001))
    wait(lambda: snapshot_at(state, admin.end_offsets(topic)), 120, "publish")
    out["exact_request_behind_live_ms"] = request_ms(state, target)
    # With no snapshot at or below the target left: rebuilt from the log start.
    out["exact_request_from_log_start_ms"] = request_ms(state, {p: o // 2 for p, o in target.items()})
    return out


def request_ms(state: Path, target: dict[int, int]) -> float:
    t = time.perf_counter()
    resp = exact_requests.request(state, TABLE, target, timeout=600)
    took = round((time.perf_counter() - t) * 1000, 1)
    if not resp.ok:
        raise RuntimeError(f"request at {target}: {resp}")
    return took


# Each lookup path and the broadcast dict read the same way, which it is measured against.
BASELINES = {"join_mapInArrow": "baseline_dict_mapInArrow", "pandas_udf": "baseline_dict_pandas_udf",
             "join_mapInArrow_worker_index": "baseline_dict_mapInArrow",
             "join_mapInArrow_multi_get": "baseline_dict_mapInArrow",
             "pandas_udf_multi_get": "baseline_dict_pandas_udf",
             "small_table_join": "baseline_dict_mapInArrow",
             "small_table_spark_join": "baseline_dict_mapInArrow",
             "small_table_pandas_udf": "baseline_dict_pandas_udf",
             "mapPartitions": "baseline_dict_mapPartitions"}
ARROW_BATCHES = (1_000, 10_000, 50_000)


def memory_index_load_ms(state: Path, view: Any, repeats: int = 3) -> float:
    """What a Python worker pays once per descriptor to open the view's snapshot: map its file (the first call
    writes it, the best of ``repeats`` only maps)."""
    from globald.snapshot.resolve import Resolution
    from globald.spark.executor import SnapshotHandle

    desc = view.descriptor
    took = []
    for _ in range(repeats):
        t = time.perf_counter()
        h = SnapshotHandle(Snapshot(state, TABLE, desc["snapshot"]), Resolution(desc["snapshot"], {}, True, False),
                           None, view.settings.memory_index_mb << 20)
        took.append(time.perf_counter() - t)
        assert h.mapped
        h.close()
    return round(min(took) * 1000, 1)


def probe_keys(table_keys: list[bytes], lookups: int, hit_rate: float, seed: int = 7) -> list[str]:
    """``lookups`` keys, a ``hit_rate`` share of them drawn from the table, the rest absent (same 16 bytes)."""
    rnd = random.Random(seed)
    return [rnd.choice(table_keys).decode() if rnd.random() < hit_rate else f"absent-{rnd.randrange(10**9):09d}"
            for _ in range(lookups)]


def lookup_modes(spark: Any, config: Path, probe: list[str]) -> tuple[dict[str, Callable[[], Any]], list[Any]]:
    """Every lookup path of the view on ``spark`` (a classic or a Connect session) and the broadcast dict a user
    writes instead, each a query that looks all of ``probe`` up; and the views, to close."""
    import pyarrow as pa

    from globald.spark import GlobalTableView
    from globald.spark.session import Carried, functions, is_connect

    F = functions(spark)
    connect = is_connect(spark)
    df = spark.createDataFrame([(k,) for k in probe], "k string").repartition(4).cache()
    df.count()
    view = GlobalTableView(spark, config, TABLE)
    # The same view with the in-memory index off: what tables larger than memory_index_mb get (RocksDB multi-gets).
    on_disk = GlobalTableView(spark, config, TABLE, memory_index_mb=0)
    small = GlobalTableView(spark, config, TABLE, mode="broadcast")  # content shipped to the workers' index
    native = GlobalTableView(spark, config, TABLE, mode="broadcast", small_join="spark")  # Spark's own join
    views = [view, on_disk, small, native]
    for v in views:
        v.refresh()
    with open_snapshot(view.config.state_dir, TABLE) as snap:
        plain = {k: v for k, v, _ in snap}
    # The baselines are what a Spark user writes instead: a dict of key -> value, broadcast (in the function's
    # closure on Connect, which has no broadcast variables) and looked up.
    plain_bc = Carried(plain) if connect else spark.sparkContext.broadcast(plain)

    def arrow_dict(batches: Any) -> Any:
        d = plain_bc.value
        for b in batches:
            keys = [k.encode() for k in b.column(0).to_pylist()]
            yield pa.RecordBatch.from_arrays([b.column(0), pa.array([d.get(k) for k in keys], pa.binary())],
                                             ["k", "value"])

    def pandas_dict(keys: pd.Series) -> pd.Series:
        d = plain_bc.value
        return pd.Series([d.get(k.encode()) for k in keys], dtype=object)

    dict_udf = F.pandas_udf(pandas_dict, "binary")

    def total(frame: Any) -> Any:
        return frame.agg(F.sum(F.length("value"))).collect()

    def by_udf(v: Any) -> Any:
        return total(df.select(v.udf()("k").getField("value").alias("value")))

    # The second anchor (issue 44): Spark's own broadcast hash join, in the JVM, of the table as a cached DataFrame.
    table_df = spark.createDataFrame(list(plain.items()), "k string, value binary").cache()
    table_df.count()
    modes: dict[str, Callable[[], Any]] = {
        "join_mapInArrow": lambda: total(view.join(df, "k")),
        "pandas_udf": lambda: by_udf(view),
        "join_mapInArrow_multi_get": lambda: total(on_disk.join(df, "k")),
        "pandas_udf_multi_get": lambda: by_udf(on_disk),
        "small_table_join": lambda: total(small.join(df, "k")),
        "small_table_spark_join": lambda: total(native.join(df, "k")),
        "small_table_pandas_udf": lambda: by_udf(small),
        "baseline_dict_mapInArrow": lambda: total(df.mapInArrow(arrow_dict, "k string, value binary")),
        "baseline_dict_pandas_udf": lambda: total(df.select(dict_udf("k").alias("value"))),
        "baseline_jvm_broadcast_join": lambda: total(df.join(F.broadcast(table_df), "k", "left")),
    }
    if not connect:  # RDDs: classic sessions only
        from bench.spark_memindex_join import memory_index_join

        # The raw join before issue 34 (an index in every worker), against the mapped file: the same run, per core.
        modes["join_mapInArrow_worker_index"] = lambda: total(memory_index_join(view, df, "k"))
        rdd = spark.sparkContext.parallelize(probe, 4).cache()
        rdd.count()
        modes["mapPartitions"] = lambda: view.lookup_partitions(rdd).map(lambda t: len(t[1] or b"")).sum()
        modes["baseline_dict_mapPartitions"] = lambda: rdd.map(lambda k: len(plain_bc.value.get(k.encode()) or
                                                                               b"")).sum()
        modes["baseline_no_lookup_mapPartitions"] = lambda: rdd.map(len).sum()
    return modes, views


def measure_lookups(spark: Any, config: Path, probe: list[str], rounds: int) -> dict[str, Any]:
    """Lookups per second of each mode on ``spark`` and each one's ratio to its broadcast-dict baseline."""
    modes, views = lookup_modes(spark, config, probe)
    log(f"spark: {len(modes)} modes interleaved, best of {rounds} rounds")
    best = fastest(modes, rounds)
    for v in views:
        v.close()
    rates = {name: round(len(probe) / s) for name, s in best.items()}
    jvm = rates.get("baseline_jvm_broadcast_join")
    return {"lookups_per_s_per_core": rates,
            "vs_broadcast_dict": {m: round(rates[m] / rates[b], 3) for m, b in BASELINES.items() if m in rates},
            "baseline_of": {m: b for m, b in BASELINES.items() if m in rates},
            # the same lookups against Spark's own broadcast hash join of the table (a cached DataFrame)
            "vs_jvm_broadcast_join": {m: round(rates[m] / jvm, 3) for m in ("join_mapInArrow", "small_table_join")
                                      if m in rates and jvm}}


def measure_spark(admin: TopicAdmin, topic: str, config: Path, state: Path, lookups: int,
                  table_keys: list[bytes], hit_rate: float = 0.9, rounds: int = 5) -> dict[str, Any]:
    """The lookup modes on a classic local[1] session (``measure_lookups``), the join against its baseline at
    several Arrow batch sizes, and refresh latency."""
    from globald.spark import GlobalTableView

    spark = spark_session()
    out: dict[str, Any] = {"executor_cores": 1, "lookups": lookups, "hit_rate": hit_rate,
                           "table_keys": len(table_keys), "arrow_batch": DEFAULT_ARROW_BATCH}
    probe = probe_keys(table_keys, lookups, hit_rate)
    view = GlobalTableView(spark, config, TABLE)
    view.refresh()
    out["memory_index_load_ms"] = memory_index_load_ms(state, view)
    out.update(measure_lookups(spark, config, probe, rounds))
    # spark.sql.execution.arrow.maxRecordsPerBatch: the join and its baseline at each size, interleaved.
    modes, views = lookup_modes(spark, config, probe)
    by_batch: dict[str, dict[str, int]] = {}
    for size in ARROW_BATCHES:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(size))
        log(f"spark: arrow batch {size}")
        got = fastest({name: modes[name] for name in ("join_mapInArrow", "join_mapInArrow_worker_index",
                                                      "baseline_dict_mapInArrow", "baseline_jvm_broadcast_join")
                       if name in modes},
                      max(2, rounds // 2))
        by_batch[str(size)] = {name: round(lookups / s) for name, s in got.items()}
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(DEFAULT_ARROW_BATCH))
    out["join_by_arrow_batch"] = by_batch
    # Issue 44.3's two goals at each size: join >= 1.5x the dict, and ahead of the JVM's broadcast hash join.
    out["join_ratios_by_arrow_batch"] = {
        size: {"vs_broadcast_dict": round(got["join_mapInArrow"] / got["baseline_dict_mapInArrow"], 3),
               "vs_jvm_broadcast_join": round(got["join_mapInArrow"] / got["baseline_jvm_broadcast_join"], 3)}
        for size, got in by_batch.items()}
    for v in views:
        v.close()

    # Refresh latency: the driver call until an executor task has read the new value from the new snapshot.
    key = probe[0]
    one = spark.createDataFrame([(key,)], "k string")
    refresh_only, end_to_end = [], []
    for i in range(5):
        value = b"refreshed-%d" % i
        admin.produce(topic, [(key.encode(), value)])
        t = time.perf_counter()
        view.refresh()
        refresh_only.append(time.perf_counter() - t)
        got = view.join(one, "k").collect()[0]["value"]
        end_to_end.append(time.perf_counter() - t)
        assert bytes(got) == value, (got, value)
    out["refresh_call"] = stats(refresh_only)
    out["refresh_to_executors_reading"] = stats(end_to_end)
    view.close()
    spark.stop()
    return out


BENCHES = ("publish", "spark", "typed", "executor-memory")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000,
                    help="table size for the publish and executor-memory measurements")
    ap.add_argument("--spark-keys", type=int, default=100_000, help="table size for the Spark and typed measurements")
    ap.add_argument("--lookups", type=int, default=300_000)
    ap.add_argument("--hit-rate", type=float, default=0.9, help="share of lookups whose key is in the table")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per Spark mode (best reported)")
    ap.add_argument("--benches", default="publish,spark", help=f"comma-separated, among {', '.join(BENCHES)}")
    ap.add_argument("--typed", action="store_true", help="add the typed join (benches: typed)")
    ap.add_argument("--typed-rounds", type=int, default=3, help="interleaved rounds of the typed join's modes")
    ap.add_argument("--formats", default="avro,protobuf", help="the typed join's formats, measured in this order")
    ap.add_argument("--executor-memory", action="store_true", help="add the executor's workers' memory")
    ap.add_argument("--memory-phases", default=",".join(PHASES),
                    help="the executor-memory phases to run, among " + ", ".join(PHASES) + " (with --as-of: "
                         + ", ".join(AS_OF_PHASES) + ", all by default)")
    ap.add_argument("--as-of", action="store_true",
                    help="executor-memory on a versioned table instead (--keys x --versions, distinct values, no "
                         "broker): the latest-value join against the as-of join (issue 45)")
    ap.add_argument("--versions", type=int, default=10, help="versions a key, with --as-of")
    ap.add_argument("--before-tree", default=None,
                    help="a checkout of globald from before issue 34, whose workers make the 'before' phase")
    args = ap.parse_args(argv)
    benches = [b for b in args.benches.split(",") if b]
    benches += [b for b, on in (("typed", args.typed), ("executor-memory", args.executor_memory))
                if on and b not in benches]
    unknown = set(benches) - set(BENCHES)
    if unknown:
        ap.error(f"--benches: unknown {sorted(unknown)}; choose among {', '.join(BENCHES)}")
    if args.as_of:
        return _as_of_memory(ap, args, benches)
    work = Path(tempfile.mkdtemp(prefix="globald-bench-"))
    kafka = EmbeddedKafka(work / "kafka").start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    result: dict[str, Any] = {"benches": benches, "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                              "cores": os.cpu_count()}
    if {"publish", "executor-memory"} & set(benches):
        result["keys"] = args.keys
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, n in (("publish", args.keys), ("spark", args.spark_keys)):
            if name not in benches:
                continue
            topic = f"bench-{name}"
            admin.create(topic, partitions=3)
            log(f"producing {n} records to {topic}")
            keys = [b"key-%012d" % i for i in range(n)]  # 16 bytes
            rnd = random.Random(1)
            admin.produce(topic, ((k, rnd.randbytes(100)) for k in keys))
            state = work / f"state-{name}"
            config = sidecar_config(work / f"{name}.toml", state, kafka.client_settings, topic)
            procs.append(start_sidecar(config, work / f"{name}.log"))
            if name == "publish":
                result["daemon"] = measure_daemon(admin, topic, state)
            else:
                wait(partial(snapshot_at_end, admin, topic, state), 600, "spark table restore")
                result["spark"] = measure_spark(admin, topic, config, state, args.lookups, keys, args.hit_rate,
                                                args.rounds)
                assert current_id(state, TABLE)
        if "typed" in benches:  # imported here: the typed extra (fastavro, protobuf) is needed only for it
            from bench.spark_typed_join import measure_typed

            spark = spark_session()
            result["typed"] = measure_typed(spark, admin, kafka.client_settings, work, args.spark_keys,
                                            args.lookups, args.typed_rounds, args.formats.split(","), procs)
            spark.stop()
        if "executor-memory" in benches:
            from bench.spark_memory import measure_executor_memory

            result["executor_memory"] = measure_executor_memory(
                admin, kafka.client_settings, work, args.keys, procs, tuple(args.memory_phases.split(",")),
                args.before_tree)
    finally:
        stop_all(procs, admin, kafka)
        shutil.rmtree(work, ignore_errors=True)  # the broker's log and the state_dirs: gigabytes at 1M keys
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0


def _as_of_memory(ap: argparse.ArgumentParser, args: argparse.Namespace, benches: list[str]) -> int:
    """``--as-of``: the executor-memory bench on a versioned table (``bench.spark_memory.measure_as_of_memory``)."""
    from bench.spark_memory import measure_as_of_memory

    if benches != ["executor-memory"]:
        ap.error("--as-of measures only --benches executor-memory")
    phases = AS_OF_PHASES if args.memory_phases == ",".join(PHASES) else tuple(args.memory_phases.split(","))
    if set(phases) - set(AS_OF_PHASES):
        ap.error(f"--memory-phases with --as-of: among {', '.join(AS_OF_PHASES)}")
    work = Path(tempfile.mkdtemp(prefix="globald-bench-"))
    result: dict[str, Any] = {"benches": benches, "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                              "cores": os.cpu_count()}
    try:
        result["executor_memory_as_of"] = measure_as_of_memory(work, args.keys, args.versions, phases=phases)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
