"""globald's as-of join against Spark's own, per core (issue 45: "Against Spark's own as-of join, on the same data
... globald must be faster per core, at 1M and at 10M stream rows, and must not shuffle the stream side").

The same data on both sides: a history of ``--keys`` keys x ``--versions`` versions (``bench.as_of_join._entries``'s:
key i's version v at ``BASE_TS + v * STEP_MS + i % 1000``) and a stream of ``--rows`` rows of random keys and times
(``bench.as_of_join.stream``), arriving in ``--partitions`` partitions as a stream does. Each side gets the history as
it naturally has it:

- globald: the snapshot's as-of file, mapped by the executor; the join is ``view.join(stream, "k", as_of="ms")``'s
  mapInArrow body (``bench.as_of_join.as_of_join_fn``). The file is written by the bench from the stored history
  entries, not taken from a running daemon's snapshot (as ``bench.as_of_join --spark``'s, the latest-value figure's
  method), so its build is not timed; the join is.
- Spark: the history as a DataFrame of records (key, timestamp, value), cached and counted before timing, joined by
  Spark 4.3's SQL ``LEFT ASOF JOIN ... MATCH_CONDITION (s.ms >= h.ts)`` (``spark.sql.join.asofJoin.enabled``, off
  by default; it plans a ``SortMergeAsOfJoin``).

Both run on ``local[1]`` (one task thread), written to the ``noop`` sink, alternating, ``--rounds`` times; the best
of each is reported, in wall time and in CPU time of this process tree (the JVM with its GC and JIT threads, and the
Python workers). Each plan's Exchanges are printed: the stream side's key is ``k``, the history's ``hk``. Before
timing, both answers on the first ``--sample`` stream rows are checked against the oracle fold
(``globald.embedded.oracle.as_of``).

    PYTHONPATH=. python -m bench.spark_as_of [--keys 1000000] [--versions 10] [--rows 1000000,10000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.as_of_join import AS_OF_SCHEMA, BASE_TS, STEP_MS, _key, as_of_file, as_of_join_fn, stream
from globald.embedded.oracle import Record, as_of

SPARK_SQL = ("SELECT s.id, s.k, s.ms, h.value, h.ts AS timestamp FROM rows s "
             "LEFT ASOF JOIN history h MATCH_CONDITION (s.ms >= h.ts) ON s.k = h.hk")


def _cpu() -> float:
    """CPU seconds of this process and all its descendants (the JVM, its Python workers)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _timed(run: Callable[[], Any]) -> tuple[float, float]:
    c0, t0 = _cpu(), time.perf_counter()
    run()
    return time.perf_counter() - t0, _cpu() - c0


def _exchanges(df: Any) -> list[str]:
    plan = df._jdf.queryExecution().executedPlan().toString()
    return [line.strip(" +-:") for line in plan.splitlines() if "Exchange" in line]


def _oracle(ks: int, versions: int, value: bytes, rows: list[Any]) -> list[tuple[bytes, int] | None]:
    """The oracle fold's answer for each (k, ms) row, over the records of the row's key (``_entries``'s)."""
    out = []
    for r in rows:
        i = int(bytes(r["k"])[4:])
        recs = [Record(_key(i), value, BASE_TS + v * STEP_MS + i % 1000, 0, i * versions + v) for v in range(versions)]
        out.append(as_of(recs, _key(i), r["ms"]))
    return out


def _check(name: str, got: list[Any], want: list[tuple[bytes, int] | None]) -> None:
    answers = [None if r["value"] is None else (bytes(r["value"]), r["timestamp"]) for r in got]
    bad = [(r["id"], a, w) for r, a, w in zip(got, answers, want, strict=True) if a != w]
    found = sum(w is not None for w in want)
    print(f"  answers of {name} on {len(want):,} rows ({found:,} with a version): "
          + ("= oracle" if not bad else f"{len(bad)} DIFFER, e.g. {bad[:3]}"))
    if bad:
        raise SystemExit(f"{name} disagrees with the oracle fold")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--versions", type=int, default=10)
    p.add_argument("--value-bytes", type=int, default=16)
    p.add_argument("--rows", default="1000000,10000000", help="stream sizes, comma-separated")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the stream and of the history frame")
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sample", type=int, default=2000)
    a = p.parse_args()
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    value = os.urandom(a.value_bytes)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="globald-spark-asof-") as tmp:
        path = Path(tmp) / "asof.arrow"
        build_s = as_of_file(path, a.keys, a.versions, value)
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "4g")
                 .config("spark.sql.join.asofJoin.enabled", "true")
                 .config("spark.sql.shuffle.partitions", str(a.partitions))
                 .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(a.batch)).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        started = time.monotonic()
        history = (spark.range(a.keys * a.versions, numPartitions=a.partitions)
                   .select(F.format_string("key-%08d", F.expr(f"id div {a.versions}")).cast("binary")
                           .alias("hk"),
                           (F.lit(BASE_TS) + F.col("id") % a.versions * STEP_MS
                            + F.expr(f"id div {a.versions}") % 1000).alias("ts"),
                           F.lit(value).alias("value")).cache())
        history.count()
        history.createOrReplaceTempView("history")
        cache_s = time.monotonic() - started
        print(f"{a.keys:,} keys x {a.versions} versions, {a.value_bytes}-byte values; local[1]; stream and history "
              f"frame in {a.partitions} partitions; best of {a.rounds}, alternating; load average "
              f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"  history: globald's as-of file written in {build_s:.1f}s (not timed); Spark's frame cached in "
              f"{cache_s:.1f}s (not timed)")
        globald_fn = as_of_join_fn(str(path))
        sample = stream(spark, a.sample, a.keys, a.versions, a.partitions)
        sample.createOrReplaceTempView("rows")
        want = _oracle(a.keys, a.versions, value, sample.orderBy("id").collect())
        _check("globald", sample.mapInArrow(globald_fn, AS_OF_SCHEMA).orderBy("id").collect(), want)
        _check("Spark ASOF JOIN", spark.sql(SPARK_SQL).orderBy("id").collect(), want)
        for rows in (int(x) for x in a.rows.split(",") if x):
            s = stream(spark, rows, a.keys, a.versions, a.partitions).cache()
            s.count()
            s.createOrReplaceTempView("rows")
            joins = {"globald": s.mapInArrow(globald_fn, AS_OF_SCHEMA), "spark": spark.sql(SPARK_SQL)}
            for name, df in joins.items():
                ex = _exchanges(df)
                stream_side = any(re.search(r"hashpartitioning\(k#", e) for e in ex)
                print(f"  {name} plan: {len(ex)} Exchange(s){': ' + '; '.join(ex) if ex else ''} -> stream side "
                      f"{'SHUFFLED' if stream_side else 'not shuffled'}")
            for df in joins.values():  # a warm-up each: the Python worker, the mapping, code generation
                df.write.format("noop").mode("overwrite").save()
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in joins}
            for _ in range(a.rounds):
                for name, df in joins.items():
                    times[name].append(_timed(df.write.format("noop").mode("overwrite").save))
            s.unpersist()
            best = {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}
            print(f"  {rows:,} stream rows:")
            for name, t in times.items():
                each = ", ".join(f"{w:.1f}s/{c:.1f}s" for w, c in t)
                wall, cpu = best[name]
                print(f"    {name:8s} {rows / wall / 1e3:7.0f}k rows/s wall, {rows / cpu / 1e3:7.0f}k rows/CPU-s"
                      f"  (best; wall/CPU each: {each})")
            print(f"    globald / Spark: {best['spark'][0] / best['globald'][0]:.2f}x wall, "
                  f"{best['spark'][1] / best['globald'][1]:.2f}x CPU (goal > 1); load average "
                  f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
        spark.stop()


if __name__ == "__main__":
    main()
