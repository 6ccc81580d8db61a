"""Typed lookups per core (issue 24): the columnar file against what a user writes instead, Avro and Protobuf.

    python -m bench.typed                                  # 100k keys, 300k lookups (90 % hits), best of 5
    python -m bench.typed --keys 1000000 --rounds 3

Pure Python in one process, so every figure is per core; no Spark and no broker (the Spark join adds its own
per-query cost to both sides alike). For each format, in the same run, rounds interleaved:
- typed: the snapshot decoded once into the columnar file (``globald.typed.columnar``), mapped read-only; each
  batch of keys (10,000, Spark's default Arrow batch) is looked up in it, giving the decoded struct column.
- what a user writes instead: a broadcast dict of raw bytes and a pandas UDF (or mapInArrow) body that looks each
  key up and decodes each value: ``fastavro.schemaless_reader`` after stripping the 5-byte header, or the protobuf
  runtime's ``FromString`` and a hand-written dict of its fields (faster than ``json_format.MessageToDict``). Its
  records become the same Arrow struct (``pa.array``), the cheapest way to the same output; and, as a pandas UDF
  returning a struct must, a pandas DataFrame.
Also: the one-off decode of the snapshot into the columnar file, and the file's bytes per key. The records, schemas
and the user's decode are the Spark benchmark's (``bench.spark_typed_join``), which measures the same comparison in
Spark (``python -m bench.spark --benches typed``); a real executor's workers' memory, before and after the
columnar file, is ``python -m bench.spark --benches executor-memory``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from bench.spark_typed_join import Format, lookups_of
from globald.typed.columnar import ColumnarTable, build_table, write_columnar


def batches(keys: list[bytes], size: int) -> list[pa.Array]:
    return [pa.array(keys[i:i + size], pa.binary()) for i in range(0, len(keys), size)]


def run(fmt: Format, lookups: list[bytes], batch: int, rounds: int, work: Path) -> dict[str, Any]:
    started = time.perf_counter()
    table = build_table(fmt.items, fmt.decoder, {"table": fmt.name})
    path = work / f"{fmt.name}.arrow"
    write_columnar(path, table)
    decode_s = time.perf_counter() - started
    index = ColumnarTable.open(path, fmt.decoder.fingerprint)
    raw = {k: v for k, v, _ in fmt.items}  # the broadcast dict
    arrow_type = fmt.decoder.arrow_type
    key_batches = batches(lookups, batch)
    py_batches = [b.to_pylist() for b in key_batches]  # what the UDF's pd.Series holds, made outside the timing

    def typed_side() -> int:
        return sum(len(index.lookup(b).values) for b in key_batches)

    def user_arrow() -> int:
        total = 0
        for keys in py_batches:
            rows = [None if (v := raw.get(k)) is None else fmt.user(v) for k in keys]
            total += len(pa.array(rows, arrow_type))
        return total

    def user_pandas() -> int:
        total = 0
        for keys in py_batches:
            rows = [None if (v := raw.get(k)) is None else fmt.user(v) for k in keys]
            total += len(pd.DataFrame.from_records([r or {} for r in rows]))
        return total

    sides = {"typed": typed_side, "user_to_arrow": user_arrow, "user_to_pandas": user_pandas}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides)[r % 3:] + list(sides)[:r % 3]  # rotate: no side always runs first (cold caches)
        for name in order:
            t0 = time.perf_counter()
            assert sides[name]() == len(lookups)
            times[name].append(time.perf_counter() - t0)
    best = {name: min(ts) for name, ts in times.items()}
    size = path.stat().st_size
    return {
        "format": fmt.name, "keys": len(fmt.items), "lookups": len(lookups), "batch": batch, "rounds": rounds,
        "decode_once_s": round(decode_s, 3), "file_bytes_per_key": round(size / len(fmt.items), 1),
        "raw_value_bytes_per_key": round(statistics.mean(len(v) for _, v, _ in fmt.items), 1),
        "lookups_per_s": {name: round(len(lookups) / t) for name, t in best.items()},
        "typed_vs_user_to_arrow": round(best["user_to_arrow"] / best["typed"], 2),
        "typed_vs_user_to_pandas": round(best["user_to_pandas"] / best["typed"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.typed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--lookups", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=10_000, help="keys per lookup batch (Spark's Arrow batch)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--formats", default="avro,protobuf")
    a = p.parse_args(argv)
    lookups = lookups_of(a.keys, a.lookups)
    print(f"# load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)", flush=True)
    with tempfile.TemporaryDirectory(prefix="globald-bench-typed-") as tmp:
        for name in a.formats.split(","):
            work = Path(tmp) / name
            work.mkdir()
            print(json.dumps(run(Format(name, work, a.keys), lookups, a.batch, a.rounds, work)), flush=True)
    print(f"# load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
