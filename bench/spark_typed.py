"""Typed join in Spark per core (issue 24): ``view.join`` on a typed table against what a PySpark user writes.

    python -m bench.spark_typed                        # 100k keys, 300k lookups (90 % hits), best of 3
    python -m bench.spark_typed --keys 20000 --lookups 60000 --rounds 1

An embedded broker and the real daemon (one per format) mirror 100k Confluent-framed values of 10 fields (the
records of ``bench.typed``: Avro, and Protobuf with a Timestamp); a classic local[1] session (so every figure is
per core) runs, interleaved, for each format:
- typed: ``view.join(df, "k")``, the value a struct column from the snapshot's columnar file;
- user: a broadcast dict of the raw bytes and a ``mapInArrow`` body that looks each key up and decodes each value
  (``fastavro.schemaless_reader`` after the 5-byte header; the protobuf runtime's ``FromString`` and a hand-written
  dict), building the same struct column;
- Spark's floor: a ``mapInArrow`` handing back a struct column decoded beforehand (no lookup, no decode): what
  any way of producing this column pays Spark.
All end in the same aggregate over one field. The first format's modes run three untimed rounds first: the JVM's
first queries of this shape run colder code (without them the first format measured came out ~1.7x slower). The
one-off decode into the columnar file happens in the warm-up (``bench.typed`` reports it). Prints one JSON
document on stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa

from bench.typed import AVRO, TIERS, Format, lookups_of
from globald.embedded.admin import TopicAdmin
from globald.embedded.broker import EmbeddedKafka
from globald.spark.bench import fastest, log, sidecar_config, snapshot_at_end, spark_session, start_sidecar, wait

REPO = Path(__file__).resolve().parents[1]
SECTIONS = {
    "avro": 'format = "avro"\nschema = "{work}/customer.avsc"\nframing = "confluent"\nwriter_schemas = "{work}/ids"\n',
    "protobuf": 'format = "protobuf"\nschema = "{work}/bench.desc"\nmessage = "bench.Customer"\n'
                'framing = "confluent"\n',
}
_CLASSES: dict[bytes, Any] = {}  # per Python worker: the message class of a descriptor set


def avro_user() -> Callable[[bytes], Any]:
    parsed = fastavro.parse_schema(AVRO)
    return lambda v: fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None)


def protobuf_user(desc: bytes) -> Callable[[bytes], Any]:
    """The user's decode, its message class built once per worker from the descriptor set's bytes (message
    classes do not pickle)."""

    def decode(v: bytes) -> Any:
        cls = _CLASSES.get(desc)
        if cls is None:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

            pool = descriptor_pool.DescriptorPool()
            for fd in descriptor_pb2.FileDescriptorSet.FromString(desc).file:
                pool.Add(fd)
            cls = _CLASSES[desc] = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Customer"))
        m = cls.FromString(v[6:])
        return {"id": m.id, "name": m.name, "email": m.email, "city": m.city, "tier": TIERS[m.tier],
                "balance": m.balance, "visits": m.visits, "tags": list(m.tags),
                "updated": m.updated.ToDatetime(dt.UTC), "active": m.active}

    return decode


def modes(spark: Any, config: Path, fmt: Format, user: Callable[[bytes], Any], probe: list[str]) -> tuple[
        dict[str, Callable[[], Any]], Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from globald.spark import GlobalTableView
    from globald.typed.join import spark_type

    df = spark.createDataFrame([(k,) for k in probe], "k string").repartition(4).cache()
    df.count()
    view = GlobalTableView(spark, config, "bench")
    view.refresh()
    kind = spark_type(fmt.decoder)
    target = to_arrow_type(kind, timezone="UTC")
    arrow_type = fmt.decoder.arrow_type
    raw = spark.sparkContext.broadcast({k: v for k, v, _ in fmt.items})

    def user_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        d = raw.value
        for b in batches:
            rows = [None if (v := d.get(k.encode())) is None else user(v) for k in b.column(0).to_pylist()]
            yield pa.RecordBatch.from_arrays([b.column(0), pa.array(rows, arrow_type).cast(target)], ["k", "value"])

    schema = StructType([StructField("k", StringType()), StructField("value", kind)])
    # Spark's floor: the same struct column, decoded beforehand, handed back with no lookup and no decode.
    sample = fmt.decoder.decode(pa.array([v for _, v, _ in fmt.items[:20_000]], pa.binary())).values.cast(target)

    def floor_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            yield pa.RecordBatch.from_arrays([b.column(0), sample.slice(0, b.num_rows)], ["k", "value"])

    def total(frame: Any) -> Any:
        return frame.agg(F.sum(F.col("value.visits")), F.count(F.col("value"))).collect()

    return {"typed_join": lambda: total(view.join(df, "k")),
            "user_dict_decode_mapInArrow": lambda: total(df.mapInArrow(user_batches, schema)),
            "spark_floor_precomputed_struct": lambda: total(df.mapInArrow(floor_batches, schema))}, view


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best reported)")
    ap.add_argument("--formats", default="avro,protobuf", help="measured in this order")
    args = ap.parse_args(argv)
    # Spark's Python workers import this module's functions by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    work = Path(tempfile.mkdtemp(prefix="globald-bench-typed-"))
    kafka = EmbeddedKafka(work / "kafka").start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    procs = []
    result: dict[str, Any] = {"executor_cores": 1, "keys": args.keys, "lookups": args.lookups, "hit_rate": 0.9,
                              "rounds": args.rounds, "fields": len(AVRO["fields"])}
    try:
        spark = spark_session()
        probe = [k.decode() for k in lookups_of(args.keys, args.lookups)]
        formats = args.formats.split(",")
        for name in formats:
            fdir = work / name
            fdir.mkdir()
            fmt = Format(name, fdir, args.keys)
            user = avro_user() if name == "avro" else protobuf_user((fdir / "bench.desc").read_bytes())
            topic = f"bench-typed-{name}"
            admin.create(topic, partitions=3)
            log(f"producing {args.keys} {name} records to {topic}")
            admin.produce(topic, ((k, v) for k, v, _ in fmt.items))
            state = work / f"state-{name}"
            config = sidecar_config(work / f"{name}.toml", state, kafka.client_settings, topic)
            config.write_text(config.read_text() + "[tables.value]\n" + SECTIONS[name].format(work=fdir))
            procs.append(start_sidecar(config, work / f"{name}.log"))
            wait(partial(snapshot_at_end, admin, topic, state), 600, f"{name} table restore")
            runs, view = modes(spark, config, fmt, user, probe)
            if name == formats[0]:  # the JVM's first queries of this shape run colder code: not measured
                log(f"{name}: warming the JVM up")
                fastest(runs, 2)
            log(f"{name}: {len(runs)} modes interleaved, best of {args.rounds} rounds")
            best = fastest(runs, args.rounds)
            view.close()
            rates = {m: round(args.lookups / s) for m, s in best.items()}
            result[name] = {"lookups_per_s_per_core": rates,
                            "typed_vs_user": round(rates["typed_join"] / rates["user_dict_decode_mapInArrow"], 2)}
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
