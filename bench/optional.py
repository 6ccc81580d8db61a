"""Benchmarks of the snapshot and Spark packages, delegated to their own measurements (``bench.spark``).

Both run against the real daemon (``globald run``, its own process) on this benchmark's broker: snapshot publish
times, reader opens and exact requests on the full restored table; Spark lookups per core in each lookup mode
against a broadcast dict, and refresh latency. The packages are imported lazily: without them the section says
"not available" and the rest of the suite runs.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from typing import Any

from bench import data
from bench.data import Dataset
from bench.env import BenchEnv
from bench.restore import TABLE


def _measurements(progress: Callable[[str], None]) -> tuple[Any, dict[str, Any] | None]:
    try:
        return importlib.import_module("bench.spark"), None
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


def spark_lookups(env: BenchEnv, lookups: int, table_keys: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """``lookups`` lookups (90 % hits) against a table of ``table_keys`` distinct 16-byte keys, 100-byte values."""
    m, unavailable = _measurements(progress)
    if m is None:
        return unavailable or {}
    topic = "bench-spark"
    env.admin.create(topic, partitions=3, compact=True)
    rnd = random.Random(5)
    keys = [b"key-%012d" % i for i in range(table_keys)]
    env.admin.produce(topic, ((k, rnd.randbytes(data.VALUE_SIZE)) for k in keys))
    daemon = env.daemon({TABLE: topic}, "spark").start()
    try:
        m.wait(lambda: m.snapshot_at(daemon.state_dir, env.admin.end_offsets(topic)), 600, "spark table snapshot")
        out = m.measure_spark(env.admin, topic, daemon.config, daemon.state_dir, lookups, keys)
    finally:
        daemon.stop()
    for mode, rate in out["lookups_per_s_per_core"].items():
        ratio = out["vs_broadcast_dict"].get(mode)
        progress(f"spark {mode:<34} {rate:>10,} lookups/s per core" + (f"  {ratio}x its baseline" if ratio else ""))
    return {"available": True, **out}
