"""Benchmarks of optional parts: snapshot publishing (``globald.snapshot``) and Spark lookups (``globald.spark``).

Each imports its package lazily and reports ``{"available": false, "reason": ...}`` when it is not installed,
so the rest of the suite runs without them. Spark runs in local mode against the real daemon (its sidecar),
reading the snapshots that daemon publishes; each lookup mode is compared with a plain broadcast dict.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import data
from bench.data import Dataset
from bench.env import BenchEnv
from bench.freshness import snapshot_visibility
from bench.pipelines import RunningGlobald
from bench.restore import TABLE
from globald import statusfile
from tests.harness import DaemonProcess, write_config


def _unavailable(e: Exception, progress: Callable[[str], None]) -> dict[str, Any]:
    progress(f"not available: {type(e).__name__}: {e}")
    return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def snapshot_publish(env: BenchEnv, ds: Dataset, seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """Publish times of the full table restored by the restore benchmark, under a light steady load."""
    g = RunningGlobald(env.config(env.fresh_dir("snapshots") / "state", {TABLE: ds.topic}))
    try:
        vis = snapshot_visibility(g)
    except Exception as e:
        return _unavailable(e, progress)
    if vis is None:
        return _unavailable(ImportError("globald.snapshot is not installed"), progress)
    g.start()
    restore = g.wait()
    deadline = time.monotonic() + seconds
    rnd = 0
    while time.monotonic() < deadline:  # ~1k records/s in small bursts: each interval has something to publish
        env.admin.produce(ds.topic, data.records(100, seed=10_000 + rnd))
        rnd += 1
        time.sleep(0.1)
    vis.close()
    g.stop()
    times = vis.publish_ms
    result = {
        "available": True,
        "restore_seconds": round(restore, 3),
        "publishes": len(times),
        "publish_ms_p50": round(statistics.median(times), 2) if times else None,
        "publish_ms_max": round(max(times), 2) if times else None,
        "interval_ms": g.config.snapshots.interval_ms,
    }
    progress(f"snapshots: {len(times)} publishes of the {ds.produced:,}-record table, "
             f"p50 {result['publish_ms_p50']} ms, max {result['publish_ms_max']} ms")
    return result


def _timed(fn: Callable[[], int], n: int) -> dict[str, Any]:
    """Best of two runs (the first also warms the Python workers), as lookups per second."""
    seconds = []
    found = 0
    for _ in range(2):
        t = time.monotonic()
        found = fn()
        seconds.append(time.monotonic() - t)
    best = min(seconds)
    return {"seconds": round(best, 3), "lookups_per_second": round(n / best), "found": found}


def spark_lookups(env: BenchEnv, ds: Dataset, lookups: int, progress: Callable[[str], None]) -> dict[str, Any]:
    try:
        sql = importlib.import_module("pyspark.sql")
        F = importlib.import_module("pyspark.sql.functions")
        open_snapshot = importlib.import_module("globald.snapshot").open_snapshot
        GlobalTableView = importlib.import_module("globald.spark").GlobalTableView
    except (ImportError, AttributeError) as e:
        return _unavailable(e, progress)
    topic = "bench-spark"
    n = min(ds.produced, lookups)
    env.admin.create(topic, partitions=3, compact=True)
    env.admin.produce(topic, data.records(n, seed=5))
    workdir = env.fresh_dir("spark")
    state = workdir / "state"
    config = write_config(workdir / "globald.toml", state, {**env.settings, "log_level": 3}, {TABLE: topic},
                          http={"enabled": False})
    daemon = DaemonProcess(config, workdir / "daemon.log").start()
    spark = None
    try:
        deadline = time.monotonic() + 300
        while not ((doc := statusfile.read_live(state)) and doc.get("pid") == daemon.pid
                   and doc.get("state") == "RUNNING"
                   and (doc["tables"][TABLE].get("snapshot") or {}).get("current")):
            if time.monotonic() > deadline or not daemon.alive():
                raise RuntimeError(f"daemon has no snapshot; log:\n{daemon.tail()}")
            time.sleep(0.1)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's packages
        spark = (sql.SparkSession.builder.master("local[2]").appName("globald-bench")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        keys = [b"key-%012d" % i for i in range(n)]  # the data set has about n/2 keys: half the lookups hit
        df = spark.createDataFrame([(k,) for k in keys], "key binary").repartition(2).cache()
        df.count()
        view = GlobalTableView(spark, str(config), TABLE)
        view.refresh()
        udf = view.udf()
        modes: dict[str, Callable[[], int]] = {
            "join (Arrow)": lambda: view.join(df, "key").agg(F.count("value")).first()[0],
            "pandas UDF": lambda: df.select(udf("key").alias("r")).agg(F.count("r.value")).first()[0],
            "mapPartitions": lambda: view.lookup_partitions(df.rdd.map(lambda r: r[0]))
            .filter(lambda t: t[1] is not None).count(),
        }
        bview = GlobalTableView(spark, str(config), TABLE, mode="broadcast")
        bview.refresh()
        modes["join, small-table broadcast mode"] = lambda: bview.join(df, "key").agg(F.count("value")).first()[0]
        with open_snapshot(state, TABLE) as snap:
            table = {k: v for k, (v, _) in snap.to_dict().items()}
        bc = spark.sparkContext.broadcast(table)
        modes["broadcast dict (baseline)"] = lambda: df.rdd.map(lambda r: bc.value.get(r[0])) \
            .filter(lambda v: v is not None).count()
        results: dict[str, Any] = {}
        for name, fn in modes.items():
            results[name] = _timed(fn, n)
            progress(f"spark {name:<34} {results[name]['lookups_per_second']:>10,} lookups/s "
                     f"({results[name]['found']:,} of {n:,} found)")
        base = results["broadcast dict (baseline)"]["lookups_per_second"]
        for r in results.values():
            r["vs_broadcast_dict"] = round(r["lookups_per_second"] / base, 3) if base else None
        return {"available": True, "lookups": n, "table_keys": len(table), "modes": results}
    finally:
        if spark is not None:
            spark.stop()
        if daemon.alive():
            daemon.stop()
