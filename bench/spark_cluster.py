"""Measurements on a two-host Spark standalone cluster: ``python -m bench.spark_cluster [--keys N]``.

Starts an embedded Kafka 0.9, one sidecar per executor host (the real daemon, each on its own state_dir) and a
standalone cluster (master + two 1-core workers via pyspark's ``bin/spark-class``) whose workers point
``GLOBALD_CONFIG`` at their own host's sidecar; the driver host has none. Reports one JSON document on stdout:

- ``refresh_to_every_executor``: from the driver's ``refresh()`` after a new record until a job over 8 partitions
  has read the new value on both hosts (every sample checks the value and that both sidecars served it), beside
  the same job on an unchanged descriptor (Spark's own scheduling cost) and the ``refresh()`` call alone;
- ``exact_request_ms``: an exact-offset request to each host's sidecar at the topic's end offsets, right after a
  new record and once the host has a snapshot there;
- ``lookups_per_s_per_core``: ``join`` (mapInArrow) and ``lookup_partitions`` over cached keys on the cluster's
  executor cores, divided by those cores, beside a scan of the same keys with no lookup.

Wall-clock figures on a shared machine; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

from bench.spark import request_ms
from bench.spark_harness import (
    TABLE,
    fastest,
    log,
    sidecar_config,
    snapshot_at,
    snapshot_at_end,
    start_sidecar,
    stats,
    stop_all,
    wait,
)
from globald.spark.host import CONFIG_ENV
from globald.store.names import snapshots_dir
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka
from tests.support.spark_cluster import StandaloneCluster, Worker

HOSTS = ("a", "b")
PARTITIONS = 8


def serving_hosts(states: dict[str, Path], snapshot_ids: set[str]) -> set[str]:
    """The hosts whose sidecar published one of ``snapshot_ids``."""
    return {h for h, state in states.items() for sid in snapshot_ids if (snapshots_dir(state, TABLE) / sid).is_dir()}


def measure_refresh(spark: Any, view: Any, admin: TopicAdmin, topic: str, states: dict[str, Path],
                    samples: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    key = f"key-{7:011d}"
    probe = spark.range(0, PARTITIONS, numPartitions=PARTITIONS).select(F.lit(key).alias("k"))
    view.join(probe, "k").collect()  # warm: the executors' Python workers started, handles open
    end_to_end: list[float] = []
    call: list[float] = []
    unchanged: list[float] = []
    one_host = 0
    while len(end_to_end) < samples:
        value = b"refreshed-%d" % (len(end_to_end) + one_host)
        admin.produce(topic, [(key.encode(), value)])
        t = time.perf_counter()
        view.refresh()
        call.append(time.perf_counter() - t)
        rows = view.join(probe, "k", snapshot_col="snap").collect()
        took = time.perf_counter() - t
        if any(bytes(r["value"]) != value for r in rows):
            raise AssertionError(f"an executor read an old value: {rows}")
        if serving_hosts(states, {r["snap"] for r in rows}) != set(states):
            one_host += 1  # every task ran on one executor: this sample says nothing about "every"
            continue
        end_to_end.append(took)
        t = time.perf_counter()
        view.join(probe, "k").collect()
        unchanged.append(time.perf_counter() - t)
    return {"refresh_to_every_executor": stats(end_to_end), "same_job_unchanged_descriptor": stats(unchanged),
            "refresh_call": stats(call), "samples_served_by_one_host_only": one_host}


def measure_exact_requests(admin: TopicAdmin, topic: str, states: dict[str, Path], samples: int) -> dict[str, Any]:
    """Per host: a request for the end offsets right after a new record (the sidecar has yet to consume and commit
    it: answered once committed, or built from a snapshot plus the records in between), and one once the host has
    published a snapshot there (the file protocol's round trip)."""
    fresh: dict[str, list[float]] = {h: [] for h in states}
    caught_up: dict[str, list[float]] = {h: [] for h in states}
    for i in range(samples):
        for h, state in states.items():
            admin.produce(topic, [(b"key-%011d" % i, b"exact-%s-%d" % (h.encode(), i))])
            ends = admin.end_offsets(topic)
            fresh[h].append(request_ms(state, ends) / 1000)
            wait(partial(snapshot_at, state, ends), 60, f"host {h} snapshot")
            caught_up[h].append(request_ms(state, ends) / 1000)
    return {"after_a_new_record": {h: stats(s) for h, s in fresh.items()},
            "host_already_there": {h: stats(s) for h, s in caught_up.items()}}


def measure_lookups(spark: Any, view: Any, keys: int, lookups: int, cores: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = (spark.range(0, lookups, numPartitions=PARTITIONS)
          .select(F.format_string("key-%011d", (F.col("id") * 7919) % keys).alias("k")).cache())
    df.count()
    rdd = df.rdd.map(itemgetter(0)).cache()
    rdd.count()

    def total(frame: Any) -> Any:
        return frame.agg(F.sum(F.length("value"))).collect()

    modes = {
        "join_mapInArrow": lambda: total(view.join(df, "k")),
        "lookup_partitions": lambda: view.lookup_partitions(rdd).map(lambda t: len(t[1] or b"")).sum(),
        "baseline_scan_no_lookup": lambda: df.agg(F.sum(F.length("k"))).collect(),
    }
    log(f"lookups: {', '.join(modes)}")
    rates = {name: round(lookups / seconds / cores) for name, seconds in fastest(modes, rounds=3).items()}
    return {"executor_cores": cores, "lookups": lookups, "table_keys": keys, "lookups_per_s_per_core": rates}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=200_000, help="table size")
    ap.add_argument("--lookups", type=int, default=400_000)
    ap.add_argument("--samples", type=int, default=20, help="refresh and exact-request samples")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="globald-cluster-bench-"))
    kafka = EmbeddedKafka(work / "kafka").start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    procs: list[subprocess.Popen[bytes]] = []
    cluster: StandaloneCluster | None = None
    result: dict[str, Any] = {"hosts": len(HOSTS), "keys": args.keys}
    try:
        topic = "cluster-bench"
        admin.create(topic, partitions=3)
        log(f"producing {args.keys} records")
        rnd = random.Random(1)
        admin.produce(topic, ((b"key-%011d" % i, rnd.randbytes(100)) for i in range(args.keys)))
        states = {h: work / f"state-{h}" for h in HOSTS}
        configs = {h: sidecar_config(work / f"{h}.toml", states[h], kafka.client_settings, topic) for h in HOSTS}
        procs = [start_sidecar(configs[h], work / f"{h}.log") for h in HOSTS]
        # The driver's config: same broker and table, a state_dir no sidecar owns.
        driver = sidecar_config(work / "driver.toml", work / "driver-state", kafka.client_settings, topic)
        cluster = StandaloneCluster(work / "spark", [Worker(h, {CONFIG_ENV: str(configs[h])}) for h in HOSTS])
        log("starting the standalone cluster")
        cluster.start()
        for h in HOSTS:
            wait(partial(snapshot_at_end, admin, topic, states[h]), 600, f"host {h} restore")
        spark = cluster.session("globald-cluster-bench")
        try:
            from globald.spark import GlobalTableView

            view = GlobalTableView(spark, driver, TABLE)
            view.refresh()
            log("refresh to every executor")
            result["refresh"] = measure_refresh(spark, view, admin, topic, states, args.samples)
            log("exact requests")
            result["exact_request_ms"] = measure_exact_requests(admin, topic, states, args.samples)
            result["lookups"] = measure_lookups(spark, view, args.keys, args.lookups, len(HOSTS))
            result["fallbacks"] = view.fallbacks.value
            view.close()
        finally:
            spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        stop_all(procs, admin, kafka)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
