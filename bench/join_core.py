"""``python -m bench.join_core``: the raw join's lookup alone, outside Spark, against the broadcast dict's, per
Arrow batch size (issue 44.3).

The same work as ``bench.spark``'s ``join_mapInArrow`` and ``baseline_dict_mapInArrow`` do per batch, without Spark:
a 100k-key table of 100-byte values in the mapped file's form (``globald.typed.columnar``, built in memory), and
300k string keys (90 % hits) cut into batches. What the join loses in Spark beyond this is spent around the
lookup (the worker, the columns it returns, the query), not in it. Best of ``--rounds``, lookups/s, one core.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import pyarrow as pa

from globald.spark.batch import binary_keys
from globald.spark.mapped import raw_columns, raw_decoder
from globald.typed.columnar import ColumnarTable, build_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.join_core", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--lookups", type=int, default=300_000)
    p.add_argument("--batches", default="1000,10000,50000")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    rnd = random.Random(1)
    keys = [b"key-%012d" % i for i in range(a.keys)]
    items = [(k, rnd.randbytes(100), 0) for k in keys]
    table = ColumnarTable(build_table(items, raw_decoder(), {"table": "bench"}))
    plain = {k: v for k, v, _ in items}
    probe = pa.array([rnd.choice(keys).decode() if rnd.random() < 0.9 else f"absent-{rnd.randrange(10**9):09d}"
                      for _ in range(a.lookups)], pa.string())

    def join(batch: pa.Array) -> None:
        raw_columns(table, binary_keys(batch))

    def dictionary(batch: pa.Array) -> None:  # as bench.spark's arrow_dict does
        wanted = [k.encode() for k in batch.to_pylist()]
        pa.array([plain.get(k) for k in wanted], pa.binary())

    out: dict[str, dict[str, int]] = {}
    for size in (int(x) for x in a.batches.split(",") if x):
        batches = [probe.slice(i, size) for i in range(0, len(probe), size)]
        best = {"join": float("inf"), "dict": float("inf")}
        for _ in range(a.rounds):
            for name, fn in (("join", join), ("dict", dictionary)):
                started = time.perf_counter()
                for b in batches:
                    fn(b)
                best[name] = min(best[name], time.perf_counter() - started)
        out[str(size)] = {name: round(a.lookups / s) for name, s in best.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
