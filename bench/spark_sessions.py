"""Spark lookups on a classic and a Spark Connect session in one run: ``python -m bench.spark_sessions``.

Issue 23's figures: every lookup mode of ``bench.spark.measure_lookups`` (snapshot mode and both small-table
joins, each against the broadcast dict a user writes instead) first on a classic local[1] session, then on a Spark
Connect session to a local[1] Connect server started from pyspark's own jar (``tests.support.spark_connect``), on
the same table, sidecar and broker. local[1] on both, so every figure is per executor core. Prints one JSON document
and a Markdown table of both side by side; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from bench import spark as spark_bench
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka
from tests.support.spark_connect import ConnectServer, connect_mode

TOPIC = "bench-spark-sessions"


def table(rates: dict[str, Any]) -> str:
    """Markdown: each mode's lookups/s and ratio to its baseline, classic beside Connect."""
    lines = ["| mode | classic: lookups/s | vs baseline | Connect: lookups/s | vs baseline |", "|---|---|---|---|---|"]
    classic, connect = rates["classic"], rates["connect"]
    for mode, rate in classic["lookups_per_s_per_core"].items():
        other = connect["lookups_per_s_per_core"].get(mode)
        lines.append(f"| {mode} | {rate:,} | {classic['vs_broadcast_dict'].get(mode, '')} | "
                     f"{'' if other is None else f'{other:,}'} | {connect['vs_broadcast_dict'].get(mode, '')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spark-keys", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=300_000)
    ap.add_argument("--hit-rate", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="globald-bench-sessions-"))
    kafka = EmbeddedKafka(work / "kafka").start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    procs = []
    result: dict[str, Any] = {"lookups": args.lookups, "table_keys": args.spark_keys, "hit_rate": args.hit_rate,
                              "executor_cores": 1, "arrow_batch": spark_bench.DEFAULT_ARROW_BATCH}
    try:
        admin.create(TOPIC, partitions=3)
        keys = [b"key-%012d" % i for i in range(args.spark_keys)]  # 16 bytes
        rnd = random.Random(1)
        admin.produce(TOPIC, ((k, rnd.randbytes(100)) for k in keys))
        state = work / "state"
        config = spark_bench.sidecar_config(work / "spark.toml", state, kafka.client_settings, TOPIC)
        procs.append(spark_bench.start_sidecar(config, work / "sidecar.log"))
        spark_bench.wait(partial(spark_bench.snapshot_at_end, admin, TOPIC, state), 600, "table restore")
        probe = spark_bench.probe_keys(keys, args.lookups, args.hit_rate)
        spark_bench.log("classic session (local[1])")
        classic = spark_bench.spark_session()
        result["classic"] = spark_bench.measure_lookups(classic, config, probe, args.rounds)
        classic.stop()
        spark_bench.log("Spark Connect server (local[1])")
        server = ConnectServer.start(work / "connect", master="local[1]", conf={
            "spark.sql.execution.arrow.maxRecordsPerBatch": str(spark_bench.DEFAULT_ARROW_BATCH),
            "spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false"},
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        try:
            with connect_mode(True):
                result["connect"] = spark_bench.measure_lookups(server.session(), config, probe, args.rounds)
        finally:
            server.stop()
    finally:
        spark_bench.stop_all(procs, admin, kafka)
    print(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
