"""Measurements for snapshots and the Spark integration: ``python -m globald.spark.bench [--keys N]``.

Runs an embedded Kafka 0.9 broker and the real daemon, then reports (as one JSON document on stdout): snapshot
publish time for an N-key table, reader open time, exact-request latency, refresh latency (driver call to
executors reading the new snapshot) and lookups/s per executor core in each lookup mode, against a plain
broadcast dict in the same Spark session (local[1], so every figure is per core). Figures are wall-clock and
noisy on a shared machine; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from globald.embedded.admin import TopicAdmin
from globald.embedded.broker import EmbeddedKafka
from globald.snapshot import exact_requests, open_snapshot
from globald.snapshot.reader import current_id

TABLE = "bench"

T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_ms": round(statistics.median(s) * 1000, 3), "p95_ms": round(s[int(len(s) * 0.95) - 1] * 1000, 3),
            "max_ms": round(s[-1] * 1000, 3), "n": len(s)}


def records(n: int, keys: int, seed: int, value_size: int = 100) -> list[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    return [(b"key-%011d" % rnd.randrange(keys), rnd.randbytes(value_size)) for _ in range(n)]


def wait(pred: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(what)


def status(state: Path) -> dict[str, Any]:
    try:
        return json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def snapshot_at(state: Path, ends: dict[int, int]) -> dict[str, Any] | None:
    snap = status(state).get("tables", {}).get(TABLE, {}).get("snapshot") or {}
    return snap if snap.get("offsets") == {str(p): o for p, o in ends.items()} and not snap.get("stale") else None


def snapshot_at_end(admin: TopicAdmin, topic: str, state: Path) -> dict[str, Any] | None:
    return snapshot_at(state, admin.end_offsets(topic))


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
    out["exact_request_at_live_ms"] = _request_ms(state, live)
    # Behind the live table, between two snapshots: built from the older one plus the records in between.
    admin.produce(topic, records(10_000, 10**9, 2000))
    target = admin.end_offsets(topic)
    admin.produce(topic, records(10_000, 10**9, 2001))
    wait(lambda: snapshot_at(state, admin.end_offsets(topic)), 120, "publish")
    out["exact_request_behind_live_ms"] = _request_ms(state, target)
    # With no snapshot at or below the target left: rebuilt from the log start.
    out["exact_request_from_log_start_ms"] = _request_ms(state, {p: o // 2 for p, o in target.items()})
    return out


def _request_ms(state: Path, target: dict[int, int]) -> float:
    t = time.perf_counter()
    resp = exact_requests.request(state, TABLE, target, timeout=600)
    took = round((time.perf_counter() - t) * 1000, 1)
    if not resp.ok:
        raise RuntimeError(f"request at {target}: {resp}")
    return took


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[1]").appName("globald-bench").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.memory", "2g").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    fn()  # warm: workers started, handles opened, broadcasts fetched
    return min(_once(fn) for _ in range(repeat))


def _once(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure_spark(admin: TopicAdmin, topic: str, config: Path, state: Path, lookups: int,
                  table_keys: list[bytes]) -> dict[str, Any]:
    import pyarrow as pa
    from pyspark.sql import functions as F

    from globald.spark import GlobalTableView

    spark = spark_session()
    sc = spark.sparkContext
    out: dict[str, Any] = {"executor_cores": 1, "lookups": lookups}
    rnd = random.Random(7)
    probe = [rnd.choice(table_keys).decode() for _ in range(lookups)]
    df = spark.createDataFrame([(k,) for k in probe], "k string").repartition(4).cache()
    df.count()
    rdd = sc.parallelize(probe, 4).cache()
    rdd.count()
    view = GlobalTableView(spark, config, TABLE)
    view.refresh()
    with open_snapshot(state, TABLE) as snap:
        plain = {k: v for k, v, _ in snap}
    plain_bc = sc.broadcast(plain)

    def arrow_dict(batches: Any) -> Any:
        d = plain_bc.value
        for b in batches:
            keys = [k.encode() for k in b.column(0).to_pylist()]
            yield pa.RecordBatch.from_arrays([b.column(0), pa.array([d.get(k) for k in keys], pa.binary())],
                                             ["k", "value"])

    def total(frame: Any) -> Any:
        return frame.agg(F.sum(F.length("value"))).collect()

    modes: dict[str, Callable[[], Any]] = {
        "join_mapInArrow": lambda: total(view.join(df, "k")),
        "pandas_udf": lambda: total(df.select(view.udf()("k").getField("value").alias("value"))),
        "mapPartitions": lambda: view.lookup_partitions(rdd).map(lambda t: len(t[1] or b"")).sum(),
        "baseline_dict_mapInArrow": lambda: total(df.mapInArrow(arrow_dict, "k string, value binary")),
        "baseline_dict_mapPartitions": lambda: rdd.map(lambda k: len(plain_bc.value.get(k.encode()) or b"")).sum(),
        "baseline_no_lookup_mapPartitions": lambda: rdd.map(len).sum(),
    }
    small = GlobalTableView(spark, config, TABLE, mode="broadcast")
    small.refresh()
    modes["small_table_join_mapInArrow"] = lambda: total(small.join(df, "k"))
    rates = {}
    for name, fn in modes.items():
        log(f"spark mode {name}")
        rates[name] = round(lookups / timed(fn))
    out["lookups_per_s_per_core"] = rates

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
    small.close()
    spark.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", type=int, default=1_000_000, help="table size for the publish measurement")
    ap.add_argument("--spark-keys", type=int, default=200_000, help="table size for the Spark measurements")
    ap.add_argument("--lookups", type=int, default=500_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="globald-bench-"))
    kafka = EmbeddedKafka(work / "kafka").start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    result: dict[str, Any] = {"keys": args.keys}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, n in (("publish", args.keys), ("spark", args.spark_keys)):
            topic = f"bench-{name}"
            admin.create(topic, partitions=3)
            log(f"producing {n} records to {topic}")
            keys = [b"key-%011d" % i for i in range(n)]
            rnd = random.Random(1)
            admin.produce(topic, ((k, rnd.randbytes(100)) for k in keys))
            state = work / f"state-{name}"
            config = work / f"{name}.toml"
            kafka_lines = "".join(f'"{k}" = "{v}"\n' for k, v in kafka.client_settings.items())
            config.write_text(f'state_dir = "{state}"\n[http]\nenabled = false\n[kafka]\n{kafka_lines}'
                              f'[[tables]]\nname = "{TABLE}"\ntopic = "{topic}"\n')
            with open(work / f"{name}.log", "ab") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", "globald", "run", "--config", str(config)],
                                              stdout=out, stderr=subprocess.STDOUT))
            if name == "publish":
                result["daemon"] = measure_daemon(admin, topic, state)
            else:
                wait(partial(snapshot_at_end, admin, topic, state), 600, "spark table restore")
                result["spark"] = measure_spark(admin, topic, config, state, args.lookups, keys)
                assert current_id(state, TABLE)
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
        admin.close()
        kafka.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
