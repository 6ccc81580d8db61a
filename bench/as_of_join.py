"""As-of join lookups per core against the latest-value join's (issue 45: "as-of join >= 0.5x today's latest-value
join per core on 1M keys x 10 versions"), and the executor's mapped files of both, on one core, without Spark.

What it times is the executor's whole per-batch work of each join (``view.join``'s mapInArrow body less Spark's
Arrow transport, the same for both): the latest-value join's ``raw_columns`` on the snapshot's mapped columnar file
(``globald.spark.mapped``) against the as-of join's ``AsOfIndex.at`` on the snapshot's as-of file
(``globald.spark.asof``), both mapped from disk as the workers map them, on the same random keys, in Arrow batches
of ``--batch`` rows; the as-of times are drawn over the versions' span. The history entries are made in their
stored form (``store.history.version_key``) and parsed by the same code that parses a snapshot's; the snapshot's
RocksDB iteration is left out of the build time. Rounds alternate the two joins so that a noisy neighbour favours
neither.

    PYTHONPATH=. python -m bench.as_of_join [--keys 1000000] [--versions 10] [--value-bytes 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from globald.spark.asof import CHUNK, FINGERPRINT, AsOfIndex, table_of
from globald.spark.mapped import raw_columns, raw_decoder
from globald.store.history import VALUE, HistoryMeta, version_key
from globald.typed.columnar import ColumnarTable, build_table, write_columnar
from globald.typed.keys import fingerprint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

BASE_TS = 1_700_000_000_000
STEP_MS = 60_000


def _key(i: int) -> bytes:
    return b"key-%08d" % i


def distinct_value(i: int, versions: int, v: int, width: int) -> bytes:
    """Key i's version v's own value of ``width`` (>= 8) bytes, distinct from every other version's: a table whose
    values never repeat, so that no encoding of repeated values makes its file smaller than the data."""
    return (i * versions + v).to_bytes(8, "big") + b"v" * (width - 8)


def _entries(keys: int, versions: int, value: bytes | int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Each key's versions as the history family stores them: key order, newest first. ``value``: the one value of
    every version, or a width: each version its own value (``distinct_value``)."""
    ks: list[bytes] = []
    vs: list[bytes] = []
    stored = VALUE + value if isinstance(value, bytes) else b""
    for i in range(keys):
        k = _key(i)
        for v in range(versions - 1, -1, -1):
            ks.append(version_key(k, BASE_TS + v * STEP_MS + i % 1000, i * versions + v, 0))
            vs.append(stored or VALUE + distinct_value(i, versions, v, int(value)))
        if len(ks) >= CHUNK:
            yield ks, vs
            ks, vs = [], []
    if ks:
        yield ks, vs


def as_of_file(path: Path, keys: int, versions: int, value: bytes | int) -> float:
    """Write the as-of file of ``keys`` x ``versions`` (``_entries``) at ``path``, as a snapshot's is written; the
    seconds it took (the bench's own making of the stored entries included)."""
    started = time.monotonic()
    marks = HistoryMeta(since=BASE_TS, clock=None, untimed=None)
    write_columnar(path, table_of(_entries(keys, versions, value), {"table": "bench", "snapshot": "s"}, marks))
    return time.monotonic() - started


def stream(spark: SparkSession, rows: int, keys: int, versions: int, partitions: int = 1) -> DataFrame:
    """The stream side, made by Spark: ``rows`` rows (``id``, a binary key ``k`` of the ``keys`` and an as-of time
    ``ms`` over the versions' span, both hashed from ``id``); the first n rows of any size are the same."""
    from pyspark.sql import functions as F

    span = (versions + 1) * STEP_MS
    return (spark.range(rows, numPartitions=partitions)
            .select("id", F.format_string("key-%08d", (F.hash("id") % keys + keys) % keys).cast("binary").alias("k"),
                    (F.lit(BASE_TS - STEP_MS) + (F.hash(F.col("id") + 1) % span + span) % span).alias("ms")))


AS_OF_SCHEMA = "id long, k binary, ms long, value binary, timestamp long, error string"


_MAPPED: dict[str, ColumnarTable] = {}


def mapped(path: str, fp: str) -> ColumnarTable:
    """The file at ``path``, mapped once per worker and kept, as ``view.join``'s workers keep their handles
    (``globald.spark.executor.handle``): a reused worker's later tasks, and its memory between them, hold it."""
    if path not in _MAPPED:
        _MAPPED[path] = ColumnarTable.open(Path(path), fp)
    return _MAPPED[path]


def as_of_join_fn(path: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``view.join(stream, "k", as_of="ms")``'s per-batch body (mapInArrow) over the as-of file at ``path``."""

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index = AsOfIndex.of_table(mapped(path, FINGERPRINT))
        for b in batches:
            v, t, e = index.at(b.column("k"), b.column("ms"))
            yield pa.RecordBatch.from_arrays([*b.columns, v, t, e], names=[*b.schema.names, "value", "timestamp",
                                                                            "error"])
    return join


LATEST_SCHEMA = "id long, k binary, ms long, value binary, timestamp long"


def latest_join_fn(path: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``view.join(stream, "k")``'s per-batch body (mapInArrow) over the latest-value file at ``path``."""
    fp = fingerprint(raw_decoder(), None)

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = mapped(path, fp)
        for b in batches:
            v, t = raw_columns(table, b.column("k"))
            yield pa.RecordBatch.from_arrays([*b.columns, v, t], names=[*b.schema.names, "value", "timestamp"])
    return join


def passthrough_as_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``bench.spark_memory``'s ``imports`` phase of a versioned table: a mapInArrow body of this module, so that its
    workers import what the two joins' workers import (this module: ``globald.spark.asof`` and ``.mapped``), and
    nothing more; nothing looked up."""
    for b in batches:
        yield pa.RecordBatch.from_arrays([b.column(0), pa.nulls(b.num_rows, pa.int64())], ["k", "value"])


def latest_file(path: Path, keys: int, versions: int, value: bytes | int) -> float:
    """Write the latest-value file of the same versions as ``as_of_file`` (each key's newest), as a snapshot's raw
    columnar file is written; the seconds it took."""
    started = time.monotonic()
    items = ((_key(i), value if isinstance(value, bytes) else distinct_value(i, versions, versions - 1, value),
              BASE_TS + (versions - 1) * STEP_MS + i % 1000) for i in range(keys))
    write_columnar(path, build_table(items, raw_decoder(), {"table": "bench", "snapshot": "s"}))
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--versions", type=int, default=10)
    p.add_argument("--value-bytes", type=int, default=16)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--lookups", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--distinct", action="store_true",
                   help="each version its own value (by default every version has the same random value)")
    p.add_argument("--spark", action="store_true", help="also through Spark's mapInArrow (local[1]: one core)")
    a = p.parse_args()
    value: bytes | int = a.value_bytes if a.distinct else os.urandom(a.value_bytes)
    with tempfile.TemporaryDirectory(prefix="globald-asof-bench-") as tmp:
        d = Path(tmp)
        latest_s = latest_file(d / "latest.arrow", a.keys, a.versions, value)
        latest = ColumnarTable.open(d / "latest.arrow", fingerprint(raw_decoder(), None))
        build_s = as_of_file(d / "asof.arrow", a.keys, a.versions, value)
        versioned = AsOfIndex.of_table(ColumnarTable.open(d / "asof.arrow", FINGERPRINT))
        sizes = {name: (d / name).stat().st_size for name in ("latest.arrow", "asof.arrow")}
        rng = random.Random(45)
        ids = [rng.randrange(a.keys) for _ in range(a.lookups)]
        keys = pa.array([_key(i) for i in ids], pa.binary())
        span = (a.versions + 1) * STEP_MS
        times = pa.array(np.array([BASE_TS - STEP_MS + rng.randrange(span) for _ in ids], np.int64))
        batches = [(keys.slice(o, a.batch), times.slice(o, a.batch)) for o in range(0, a.lookups, a.batch)]
        rates: dict[str, list[float]] = {"latest": [], "as_of": []}
        for _ in range(a.rounds):
            for name in rates:
                c0 = time.process_time()
                for k, t in batches:
                    if name == "latest":
                        raw_columns(latest, k)
                    else:
                        versioned.at(k, t)
                cpu = time.process_time() - c0
                rates[name].append(a.lookups / cpu)
        print(f"{a.keys:,} keys x {a.versions} versions, {a.value_bytes}-byte values, batches of {a.batch:,}, "
              f"{a.lookups:,} lookups a round, {a.rounds} rounds (CPU time, one core)")
        print(f"  build: latest-value file {latest_s:.1f}s, as-of file {build_s:.1f}s (this bench making "
              f"{a.keys * a.versions:,} stored entries in Python, then parsing them: about half each)")
        for name, r in rates.items():
            each = ", ".join(f"{x / 1e3:.0f}k" for x in r)
            print(f"  {name:7s} {statistics.median(r) / 1e3:8.0f}k lookups/s (median; {each})")
        print(f"  ratio as-of / latest: {statistics.median(rates['as_of']) / statistics.median(rates['latest']):.2f}"
              " (goal >= 0.5)")
        if a.spark:
            _spark(a, d)
        print(f"  mapped files: latest {sizes['latest.arrow'] / 2**20:.0f} MB, as-of {sizes['asof.arrow'] / 2**20:.0f} "
              f"MB: {sizes['asof.arrow'] / sizes['latest.arrow']:.2f}x (goal <= 2x)")


def _spark(a: argparse.Namespace, d: Path) -> None:
    """Both joins' per-batch bodies in Spark's mapInArrow on local[1], over the same rows (a key and a time each,
    made by Spark): Spark's Arrow transport included, as ``view.join`` pays it. Wall time, alternating."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(a.batch)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = stream(spark, a.lookups, a.keys, a.versions).cache()
    df.count()
    schemas = {"latest": LATEST_SCHEMA, "as_of": AS_OF_SCHEMA}
    fns = {"latest": latest_join_fn(str(d / "latest.arrow")), "as_of": as_of_join_fn(str(d / "asof.arrow"))}
    rates: dict[str, list[float]] = {"latest": [], "as_of": []}
    for name in rates:  # a warm-up each: the Python worker and the mapping
        df.mapInArrow(fns[name], schemas[name]).write.format("noop").mode("overwrite").save()
    for _ in range(a.rounds):
        for name in rates:
            t0 = time.perf_counter()
            df.mapInArrow(fns[name], schemas[name]).write.format("noop").mode("overwrite").save()
            rates[name].append(a.lookups / (time.perf_counter() - t0))
    spark.stop()
    print("  through Spark (local[1], wall):")
    for name, r in rates.items():
        each = ", ".join(f"{x / 1e3:.0f}k" for x in r)
        print(f"  {name:7s} {statistics.median(r) / 1e3:8.0f}k lookups/s (median; {each})")
    print(f"  ratio as-of / latest: {statistics.median(rates['as_of']) / statistics.median(rates['latest']):.2f}"
          " (goal >= 0.5)")


if __name__ == "__main__":
    main()
