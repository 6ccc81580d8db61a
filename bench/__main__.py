"""``python -m bench``: run the benchmarks on an embedded broker and write bench/results/bench-<size>.{json,md,png}.

    python -m bench                        # 1M records, every benchmark, 3 interleaved repetitions
    python -m bench --records 10000000     # 10M (peak RSS at 10M keys); about half an hour on 2 cores
    python -m bench --benches restore,oor --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka

from bench import data, disk, disk_history, freshness, memory, optional, recovery, report, restore, whole_process
from bench.env import BenchEnv
from bench.pipelines import PIPELINES
from globald.embedded.tansu import TansuMissingError

# oor rewrites the topic, disk adds records to it: they come last.
BENCHES = ("restore", "whole", "rss", "snapshots", "freshness", "spark", "resume", "oor", "disk")
RESULTS = Path(__file__).resolve().parent / "results"


def size_name(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="records in the topic (default 1M)")
    p.add_argument("--benches", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    p.add_argument("--pipelines", default=",".join(PIPELINES), help="restore pipelines to compare")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (median reported)")
    p.add_argument("--batch", type=int, default=10_000, help="consume(n) size, for globald and the baselines")
    p.add_argument("--rates", default="1000,20000", help="freshness produce rates, records/s")
    p.add_argument("--freshness-seconds", type=float, default=10.0)
    p.add_argument("--spark-lookups", type=int, default=300_000, help="Spark lookups (90%% hits)")
    p.add_argument("--spark-keys", type=int, default=100_000, help="keys in the Spark lookup table")
    p.add_argument("--out", type=Path, default=RESULTS, help="where results go (default bench/results)")
    p.add_argument("--scratch", type=Path, default=None, help="parent of the scratch directory (default $TMPDIR)")
    p.add_argument("--verbose", action="store_true", help="globald's own INFO logs")
    a = p.parse_args(argv)
    a.benches = [b for b in a.benches.split(",") if b]
    unknown = set(a.benches) - set(BENCHES)
    a.pipelines = [x for x in a.pipelines.split(",") if x]
    unknown |= set(a.pipelines) - set(PIPELINES)
    if unknown:
        p.error(f"unknown benchmark or pipeline: {', '.join(sorted(unknown))}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("globald.librdkafka").setLevel(logging.ERROR)
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", flush=True)

    r: dict[str, Any] = {}
    # A SIGTERM must still stop the broker's JVMs and remove the scratch directory (the finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    env = BenchEnv.start(a.scratch)
    try:
        progress(f"broker up at {env.kafka.bootstrap}; producing {a.records:,} records")
        ds = data.create(env.admin, "bench", a.records)
        progress(f"produced {ds.produced:,} in {ds.produce_seconds:.1f}s; {ds.in_log:,} records in the log")
        r["meta"] = {
            "records": a.records, "produced": ds.produced, "in_log": ds.in_log,
            "offsets": {str(p): list(o) for p, o in ds.offsets.items()},
            "produce_seconds": round(ds.produce_seconds, 2),
            "data": f"{data.KEY_SIZE}-byte keys, {data.VALUE_SIZE}-byte values, "
                    f"{1 - data.NEW_KEY_SHARE:.0%} overwrites of which {data.TOMBSTONE_SHARE:.0%} of all records "
                    "are tombstones, 3-partition compacted topic",
            "command": " ".join(["python -m bench", shlex.join(argv if argv is not None else sys.argv[1:])]).strip(),
            "host": f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})",
            "broker": "Apache Kafka 0.9.0.1 (embedded)",
            "librdkafka": confluent_kafka.libversion()[0],
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load_start": [round(x, 2) for x in os.getloadavg()],
            "benches": a.benches,
        }
        stopped_state = None
        for bench in a.benches:
            progress(f"--- {bench}")
            if bench == "restore":
                r["restore"] = restore.compare(env, ds, a.pipelines, a.repeats, a.batch, progress)
            elif bench == "whole":
                r["whole"] = whole_process.compare(env, ds, a.repeats, a.batch, progress)
            elif bench == "rss":
                r["rss"] = memory.peak_rss(env, ds, progress)
            elif bench == "snapshots":
                r["snapshots"] = optional.snapshot_publish(env, ds, progress)
            elif bench == "freshness":
                rates = [int(x) for x in a.rates.split(",") if x]
                r["freshness"] = freshness.freshness(env, rates, a.freshness_seconds, progress)
            elif bench == "spark":
                r["spark"] = optional.spark_lookups(env, a.spark_lookups, a.spark_keys, progress)
            elif bench == "resume":
                r["resume"], stopped_state = recovery.resume(env, ds, a.repeats, progress)
            elif bench == "oor":
                if stopped_state is None:
                    _, stopped_state = recovery.resume(env, ds, 1, progress)
                r["oor"] = recovery.out_of_range(env, ds, stopped_state, a.repeats, progress)
            elif bench == "disk":
                r["disk"] = disk.disk_use(env, ds, progress)
                try:  # issue 45's disk goals: a versioned table, on Tansu (records with timestamps)
                    r["disk"]["history"] = disk_history.churn_versioned(env.fresh_dir("disk-history"), progress)
                except TansuMissingError as e:
                    progress(f"disk history: not measured: {e}")
        r["meta"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
        r["meta"]["seconds"] = round(time.monotonic() - started, 1)
        paths = report.write(r, a.out, f"bench-{size_name(a.records)}")
    finally:
        env.stop()
    for t in r["targets"]:
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "NOT MET")
        progress(f"target {t['target']:<45} {t['goal']:<36} {t['measured']:<14} {verdict} {t['note']}")
    progress("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
