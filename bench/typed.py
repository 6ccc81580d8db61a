"""Typed lookups per core (issue 24): the columnar file against what a user writes instead, Avro and Protobuf.

    python -m bench.typed                                  # 100k keys, 300k lookups (90 % hits), best of 5
    python -m bench.typed --keys 1000000 --rounds 3
    python -m bench.typed --memory --keys 1000000          # 4 Python workers' RSS and PSS, before and after

Pure Python in one process, so every figure is per core; no Spark and no broker (the Spark join adds its own
per-query cost to both sides alike). For each format, in the same run, rounds interleaved:
- typed: the snapshot decoded once into the columnar file (``globald.typed.columnar``), mapped read-only; each
  batch of keys (10,000, Spark's default Arrow batch) is looked up in it, giving the decoded struct column.
- what a user writes instead: a broadcast dict of raw bytes and a pandas UDF (or mapInArrow) body that looks each
  key up and decodes each value: ``fastavro.schemaless_reader`` after stripping the 5-byte header, or the protobuf
  runtime's ``FromString`` and a hand-written dict of its fields (faster than ``json_format.MessageToDict``). Its
  records become the same Arrow struct (``pa.array``), the cheapest way to the same output; and, as a pandas UDF
  returning a struct must, a pandas DataFrame.
Also: the one-off decode of the snapshot into the columnar file, and the file's bytes per key. ``--memory``: four
worker processes (an executor with 4 Python workers) look every key up once, each either from its own in-memory
index (``globald.spark.memindex``, what workers do today) or from the one mapped columnar file; the sum of their
RSS (which counts a shared page in every process) and of their PSS (which divides it among them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pandas as pd
import pyarrow as pa

from globald import typed
from globald.typed.arrow import Decoder
from globald.typed.columnar import ColumnarTable, build_table, write_columnar
from globald.typed.spec import ValueFormat

AVRO = {"type": "record", "name": "Customer", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "email", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["BRONZE", "SILVER", "GOLD"]}},
    {"name": "balance", "type": "double"}, {"name": "visits", "type": "long"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "updated", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "active", "type": "boolean"}]}
CITIES = ("Lima", "Oslo", "Osaka", "Perth", "Quebec", "Tunis")
TIERS = ("BRONZE", "SILVER", "GOLD")


def record(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"Customer {i}", "email": f"customer{i}@example.com", "city": CITIES[i % 6],
            "tier": TIERS[i % 3], "balance": i / 7, "visits": i * 3, "tags": ["vip", "eu"][: i % 3],
            "updated": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i), "active": bool(i % 2)}


def protobuf_descriptor_set(path: Path) -> None:
    """The Customer message (10 fields, a Timestamp among them) as a descriptor set, built with the runtime alone."""
    from google.protobuf import descriptor_pb2, timestamp_pb2

    f = descriptor_pb2.FileDescriptorProto(name="bench.proto", package="bench", syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    enum = f.enum_type.add(name="Tier")
    for n, name in enumerate(TIERS):
        enum.value.add(name=name, number=n)
    m = f.message_type.add(name="Customer")
    T = descriptor_pb2.FieldDescriptorProto
    for n, (name, kind, extra) in enumerate([
            ("id", T.TYPE_INT64, {}), ("name", T.TYPE_STRING, {}), ("email", T.TYPE_STRING, {}),
            ("city", T.TYPE_STRING, {}), ("tier", T.TYPE_ENUM, {"type_name": ".bench.Tier"}),
            ("balance", T.TYPE_DOUBLE, {}), ("visits", T.TYPE_INT64, {}),
            ("tags", T.TYPE_STRING, {"label": T.LABEL_REPEATED}),
            ("updated", T.TYPE_MESSAGE, {"type_name": ".google.protobuf.Timestamp"}),
            ("active", T.TYPE_BOOL, {})], start=1):
        m.field.add(name=name, number=n, type=kind, label=extra.pop("label", T.LABEL_OPTIONAL), **extra)
    ts = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(ts)
    path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[ts, f]).SerializeToString())


class Format:
    """One format's encoded snapshot, its globald decoder and the user's per-value decode."""

    def __init__(self, name: str, work: Path, keys: int) -> None:
        self.name = name
        if name == "avro":
            schema = work / "customer.avsc"
            schema.write_text(json.dumps(AVRO))
            (work / "ids").mkdir()
            (work / "ids" / "1.avsc").write_text(json.dumps(AVRO))
            parsed = fastavro.parse_schema(AVRO)

            def encode(r: dict[str, Any]) -> bytes:
                buf = io.BytesIO()
                fastavro.schemaless_writer(buf, parsed, r)
                return struct.pack(">bI", 0, 1) + buf.getvalue()

            def user(v: bytes) -> Any:  # from_avro's users strip the header: substring(value, 6)
                return fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None)

            fmt = ValueFormat(format="avro", schema=schema, framing="confluent", writer_schemas=work / "ids")
        else:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

            desc = work / "bench.desc"
            protobuf_descriptor_set(desc)
            pool = descriptor_pool.DescriptorPool()
            for fd in descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes()).file:
                pool.Add(fd)
            cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Customer"))

            def encode(r: dict[str, Any]) -> bytes:
                m = cls(**{k: v for k, v in r.items() if k not in ("updated", "tier")}, tier=TIERS.index(r["tier"]))
                m.updated.FromDatetime(r["updated"])
                return struct.pack(">bI", 0, 1) + b"\0" + m.SerializeToString()

            def user(v: bytes) -> Any:
                m = cls.FromString(v[6:])
                return {"id": m.id, "name": m.name, "email": m.email, "city": m.city, "tier": TIERS[m.tier],
                        "balance": m.balance, "visits": m.visits, "tags": list(m.tags),
                        "updated": m.updated.ToDatetime(dt.UTC), "active": m.active}

            fmt = ValueFormat(format="protobuf", schema=desc, message="bench.Customer", framing="confluent")
        self.decoder: Decoder = typed.load(fmt, "bench")
        self.user: Callable[[bytes], Any] = user
        self.items = [(b"cust-%011d" % i, encode(record(i)), 1_700_000_000_000 + i) for i in range(keys)]


def lookups_of(keys: int, n: int, seed: int = 12) -> list[bytes]:
    rnd = random.Random(seed)  # 90 % hits, as issue 12's setting
    return [b"cust-%011d" % (rnd.randrange(keys) if rnd.random() < 0.9 else keys + rnd.randrange(keys))
            for _ in range(n)]


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


def memory_of_this_process() -> dict[str, int]:
    """RSS and PSS in bytes, from /proc/self/smaps_rollup (Linux)."""
    found: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            found[name.lower()] = int(rest.split()[0]) * 1024
    return found


def worker(mode: str, path: Path) -> None:
    """One Python worker: every key of the file looked up once, from its own index or from the mapped file."""
    import gc

    if mode == "imports":  # the interpreter, pyarrow, pandas, numpy: what every worker holds anyway
        from globald.spark import memindex  # noqa: F401
        print(json.dumps({"mode": mode, "found": 0, **memory_of_this_process()}), flush=True)
        return
    table = ColumnarTable.open(path, typed.load(None, "bench").fingerprint)
    keys = table.keys
    if mode == "memindex":
        from globald.spark.memindex import MemoryIndex

        items = zip(keys.to_pylist(), table.values.to_pylist(), table.timestamps.to_pylist(), strict=True)
        index = MemoryIndex.load(items, 1 << 40)
        assert index is not None
        del table, items
        gc.collect()
        found = sum(len(index.lookup(keys.slice(i, 10_000))[0]) for i in range(0, len(keys), 10_000))
    else:
        found = sum(table.lookup(keys.slice(i, 10_000)).found for i in range(0, len(keys), 10_000))
    print(json.dumps({"mode": mode, "found": found, **memory_of_this_process()}), flush=True)
    time.sleep(3)  # the others measure while this one still holds its memory


def memory(keys: int, workers: int) -> None:
    with tempfile.TemporaryDirectory(prefix="globald-bench-typed-") as tmp:
        path = Path(tmp) / "raw.arrow"
        rnd = random.Random(5)
        items = [(b"cust-%011d" % i, rnd.randbytes(100), 1_700_000_000_000 + i) for i in range(keys)]
        write_columnar(path, build_table(items, typed.load(None, "bench"), {"table": "memory"}))
        del items
        for mode in ("imports", "memindex", "columnar"):
            procs = [subprocess.Popen([sys.executable, "-m", "bench.typed", "--worker", mode, str(path)],
                                      stdout=subprocess.PIPE, text=True) for _ in range(workers)]
            docs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
            print(json.dumps({"mode": mode, "workers": workers, "keys": keys, "file_mb": round(
                path.stat().st_size / 2**20, 1), "rss_mb_sum": round(sum(d["rss"] for d in docs) / 2**20),
                "pss_mb_sum": round(sum(d["pss"] for d in docs) / 2**20)}), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.typed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--lookups", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=10_000, help="keys per lookup batch (Spark's Arrow batch)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--formats", default="avro,protobuf")
    p.add_argument("--memory", action="store_true", help="measure 4 workers' memory instead (raw 100-byte values)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--worker", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker[0], Path(a.worker[1]))
        return 0
    if a.memory:
        memory(a.keys, a.workers)
        return 0
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
