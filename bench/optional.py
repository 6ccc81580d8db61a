"""Benchmarks of the snapshot and Spark packages, delegated to their own measurements (``globald.spark.bench``).

Both run against the real daemon (``globald run``, its own process) on this benchmark's broker: snapshot publish
times, reader opens and exact requests on the full restored table; Spark lookups per core in each lookup mode
against a broadcast dict, and refresh latency. The packages are imported lazily: without them the section says
"not available" and the rest of the suite runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from bench import data
from bench.data import Dataset
from bench.env import BenchEnv
from bench.restore import TABLE


def _measurements(progress: Callable[[str], None]) -> tuple[Any, dict[str, Any] | None]:
    try:
        return importlib.import_module("globald.spark.bench"), None
    except ImportError as e:
        progress(f"not available: {type(e).__name__}: {e}")
        return None, {"available": False, "reason": f"{type(e).__name__}: {e}"}


def snapshot_publish(env: BenchEnv, ds: Dataset, progress: Callable[[str], None]) -> dict[str, Any]:
    m, unavailable = _measurements(progress)
    if m is None:
        return unavailable or {}
    daemon = env.daemon({TABLE: ds.topic}, "snapshots").start()
    try:
        out = m.measure_daemon(env.admin, ds.topic, daemon.state_dir)
    finally:
        daemon.stop()
    steady = out["steady_publish_after_10k_updates"]
    progress(f"snapshots: first publish (after the restore) {out['first_publish_ms']} ms, after 10k updates "
             f"median {steady['median_ms']} ms; reader open median {out['reader_open']['median_ms']} ms")
    return {"available": True, **out}


def spark_lookups(env: BenchEnv, ds: Dataset, lookups: int, progress: Callable[[str], None]) -> dict[str, Any]:
    m, unavailable = _measurements(progress)
    if m is None:
        return unavailable or {}
    topic = "bench-spark"
    n = min(ds.produced, lookups)
    env.admin.create(topic, partitions=3, compact=True)
    env.admin.produce(topic, data.records(n, seed=5))
    daemon = env.daemon({TABLE: topic}, "spark").start()
    try:
        m.wait(lambda: m.snapshot_at(daemon.state_dir, env.admin.end_offsets(topic)), 600, "spark table snapshot")
        with m.open_snapshot(daemon.state_dir, TABLE) as snap:
            keys = [k for k, _, _ in snap]
        out = m.measure_spark(env.admin, topic, daemon.config, daemon.state_dir, lookups, keys)
    finally:
        daemon.stop()
    rates = out["lookups_per_s_per_core"]
    # Each lookup path against the broadcast dict read the same way (Arrow batches or an RDD of keys).
    for mode, baseline in (("join_mapInArrow", "baseline_dict_mapInArrow"), ("pandas_udf", "baseline_dict_mapInArrow"),
                           ("small_table_join_mapInArrow", "baseline_dict_mapInArrow"),
                           ("mapPartitions", "baseline_dict_mapPartitions")):
        if mode in rates and rates.get(baseline):
            out.setdefault("vs_broadcast_dict", {})[mode] = round(rates[mode] / rates[baseline], 3)
    for mode, rate in rates.items():
        progress(f"spark {mode:<34} {rate:>10,} lookups/s per core")
    return {"available": True, "table_keys": len(keys), **out}
