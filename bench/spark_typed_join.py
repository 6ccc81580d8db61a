"""Typed join per core (issue 24): ``view.join`` on a typed table against what a PySpark user writes instead.

    python -m bench.spark --benches typed                  # 100k keys, 300k lookups (90 % hits), best of 3
    python -m bench.spark --benches typed --spark-keys 20000 --lookups 60000 --rounds 1

An embedded broker and the real daemon (one per format) mirror Confluent-framed values of 10 fields (Avro, and
Protobuf with a ``google.protobuf.Timestamp``: the records and schemas are made here, in code); a classic local[1]
session (so every figure is per core) runs, interleaved, for each format:
- typed: ``view.join(df, "k")``, the value a struct column from the snapshot's columnar file;
- user: a broadcast dict of the raw bytes and a ``mapInArrow`` body that looks each key up and decodes each value
  (``fastavro.schemaless_reader`` after the 5-byte header; the protobuf runtime's ``FromString`` and a hand-written
  dict of its fields), building the same struct column;
- Spark's floor: a ``mapInArrow`` handing back a struct column decoded beforehand (no lookup, no decode): what
  any way of producing this column pays Spark.
All end in the same aggregate over one field. The first format's modes run untimed rounds first: the JVM's first
queries of this shape run colder code (without them the first format measured came out ~1.7x slower). Before any
query, the driver decodes the snapshot into a scratch columnar file, timed (the one-off decode: what the daemon's
decode process, or else the first worker of a host, does once per snapshot), and gives the file's bytes per key.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.spark_harness import TABLE, fastest, log, sidecar_config, snapshot_at_end, start_sidecar, wait
from globald.common.errors import SnapshotNotFoundError
from globald.settings.config import load
from globald.snapshot.reader import OpenOptions, Snapshot
from globald.typed import load_table
from globald.typed.arrow import Decoder
from globald.typed.columnar import build_table, columnar_path, ensure_columnar, write_columnar
from tests.support.admin import TopicAdmin

AVRO: dict[str, Any] = {"type": "record", "name": "Customer", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "email", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["BRONZE", "SILVER", "GOLD"]}},
    {"name": "balance", "type": "double"}, {"name": "visits", "type": "long"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "updated", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "active", "type": "boolean"}]}
FIELDS = len(AVRO["fields"])
CITIES = ("Lima", "Oslo", "Osaka", "Perth", "Quebec", "Tunis")
TIERS = ("BRONZE", "SILVER", "GOLD")
MESSAGE = "bench.Customer"
# The [tables.value] section of each format; {work} is the directory Format wrote the schema files into.
SECTIONS = {
    "avro": 'format = "avro"\nschema = "{work}/customer.avsc"\nframing = "confluent"\nwriter_schemas = "{work}/ids"\n',
    "protobuf": f'format = "protobuf"\nschema = "{{work}}/bench.desc"\nmessage = "{MESSAGE}"\nframing = "confluent"\n',
}
_CLASSES: dict[bytes, Any] = {}  # per process (Python worker): the message class of a descriptor set


def record(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"Customer {i}", "email": f"customer{i}@example.com", "city": CITIES[i % 6],
            "tier": TIERS[i % 3], "balance": i / 7, "visits": i * 3, "tags": ["vip", "eu"][: i % 3],
            "updated": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i), "active": bool(i % 2)}


def key_of(i: int) -> bytes:
    return b"cust-%011d" % i  # 16 bytes


def protobuf_descriptor_set() -> bytes:
    """The Customer message (10 fields, a Timestamp among them) as a serialized descriptor set, built with the
    protobuf runtime alone (what ``protoc --include_imports --descriptor_set_out`` writes; no protoc needed)."""
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
    return descriptor_pb2.FileDescriptorSet(file=[ts, f]).SerializeToString()


def message_class(desc: bytes) -> Any:
    """The Customer message class of a descriptor set, built once per process (message classes do not pickle, so
    Spark's workers build their own from the bytes)."""
    cls = _CLASSES.get(desc)
    if cls is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        pool = descriptor_pool.DescriptorPool()
        for fd in descriptor_pb2.FileDescriptorSet.FromString(desc).file:
            pool.Add(fd)
        cls = _CLASSES[desc] = message_factory.GetMessageClass(pool.FindMessageTypeByName(MESSAGE))
    return cls


def avro_user() -> Callable[[bytes], Any]:
    """The user's decode of one Avro value: from_avro's users strip the header (``substring(value, 6)``)."""
    import fastavro

    parsed = fastavro.parse_schema(AVRO)
    return lambda v: fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None)


def protobuf_user(desc: bytes) -> Callable[[bytes], Any]:
    """The user's decode of one Protobuf value: ``FromString`` after the header and the message index, and a
    hand-written dict of its fields (faster than ``json_format.MessageToDict``)."""

    def decode(v: bytes) -> Any:
        m = message_class(desc).FromString(v[6:])
        return {"id": m.id, "name": m.name, "email": m.email, "city": m.city, "tier": TIERS[m.tier],
                "balance": m.balance, "visits": m.visits, "tags": list(m.tags),
                "updated": m.updated.ToDatetime(dt.UTC), "active": m.active}

    return decode


class Format:
    """One format's schema files (written into ``work``), its Confluent-framed values of ``keys`` records (id 1;
    Protobuf's message index [0]), globald's decoder of them and the user's per-value decode."""

    def __init__(self, name: str, work: Path, keys: int) -> None:
        from globald import typed
        from globald.settings.typed_spec import ValueFormat

        self.name = name
        self.work = work
        header = struct.pack(">bI", 0, 1)
        encode: Callable[[dict[str, Any]], bytes]
        if name == "avro":
            import fastavro

            (work / "customer.avsc").write_text(json.dumps(AVRO))
            (work / "ids").mkdir(exist_ok=True)
            (work / "ids" / "1.avsc").write_text(json.dumps(AVRO))
            parsed = fastavro.parse_schema(AVRO)

            def encode(r: dict[str, Any]) -> bytes:
                buf = io.BytesIO()
                fastavro.schemaless_writer(buf, parsed, r)
                return header + buf.getvalue()

            self.user = avro_user()
            fmt = ValueFormat(format="avro", schema=work / "customer.avsc", framing="confluent",
                              writer_schemas=work / "ids")
        elif name == "protobuf":
            desc = protobuf_descriptor_set()
            (work / "bench.desc").write_bytes(desc)
            cls = message_class(desc)

            def encode(r: dict[str, Any]) -> bytes:
                m = cls(**{k: v for k, v in r.items() if k not in ("updated", "tier")}, tier=TIERS.index(r["tier"]))
                m.updated.FromDatetime(r["updated"])
                return header + b"\0" + m.SerializeToString()

            self.user = protobuf_user(desc)
            fmt = ValueFormat(format="protobuf", schema=work / "bench.desc", message=MESSAGE, framing="confluent")
        else:
            raise ValueError(f"format {name!r}: avro or protobuf")
        self.decoder: Decoder = typed.load(fmt, "bench")
        self.items = [(key_of(i), encode(record(i)), 1_700_000_000_000 + i) for i in range(keys)]

    @property
    def section(self) -> str:
        """The table's ``[tables.value]`` section, pointing at the schema files in ``work``."""
        return "[tables.value]\n" + SECTIONS[self.name].format(work=self.work)


def lookups_of(keys: int, n: int, seed: int = 12) -> list[bytes]:
    """``n`` keys to look up, 90 % of them in a table of ``keys`` (issue 12's setting), the rest absent."""
    import random

    rnd = random.Random(seed)
    return [key_of(rnd.randrange(keys) if rnd.random() < 0.9 else keys + rnd.randrange(keys)) for _ in range(n)]


def produce(admin: TopicAdmin, topic: str, fmt: Format) -> None:
    admin.create(topic, partitions=3)
    log(f"producing {len(fmt.items)} {fmt.name} records to {topic}")
    admin.produce(topic, ((k, v) for k, v, _ in fmt.items))


def mirror(admin: TopicAdmin, kafka: dict[str, str], work: Path, topic: str, section: str | None,
           procs: list[Any]) -> tuple[Path, Path]:
    """``topic`` mirrored by a real daemon (joining ``procs``) as table TABLE, typed by ``section`` (a
    ``[tables.value]`` section) or raw (None); (config, state_dir) once its snapshot is at the topic's end."""
    name = f"{topic}-{'raw' if section is None else 'typed'}"
    state = work / f"state-{name}"
    config = sidecar_config(work / f"{name}.toml", state, kafka, topic)
    if section is not None:
        config.write_text(config.read_text() + section)
    procs.append(start_sidecar(config, work / f"{name}.log"))
    wait(partial(snapshot_at_end, admin, topic, state), 900, f"{name} restore")
    return config, state


def one_off_decode(view: Any, config: Path, state: Path, work: Path) -> dict[str, Any]:
    """The view's snapshot decoded into a columnar file by this process (read from RocksDB, decode, index, write,
    fsync), timed, into a scratch path: the daemon decodes each typed snapshot itself, in a process of its own
    (``globald.ops.decoding``), and timing the real file would race with it. Then the snapshot's own file is made
    or mapped (``ensure_columnar``), so that the workers map it; and the file's bytes per key, by column."""
    decoder = load_table(load(config), TABLE)[1]
    for _ in range(5):  # the snapshot named may have been replaced (same offsets) and collected meanwhile
        view.refresh()
        sid = view.descriptor["snapshot"]
        try:
            snap = Snapshot(state, TABLE, sid, OpenOptions(lease_s=600))  # pinned: retention leaves it alone
        except SnapshotNotFoundError:
            time.sleep(1)
            continue
        try:
            scratch = work / f"columnar-{sid}.arrow"
            started = time.perf_counter()
            write_columnar(scratch, build_table(snap, decoder, {"table": TABLE, "snapshot": sid}))
            took = time.perf_counter() - started
            by_daemon = columnar_path(snap.table_dir / snap.id, decoder).exists()
            table = ensure_columnar(snap, decoder)
        finally:
            snap.close(release=True)
        break
    else:
        raise RuntimeError(f"no snapshot of {view.table.name} stayed long enough to be opened: {state}")
    rows = len(table)
    columns = pa.ipc.open_file(pa.memory_map(str(scratch), "r")).read_all()
    per_column = {c: round(columns.column(c).nbytes / rows, 1) for c in columns.column_names}
    scratch.unlink()
    return {"snapshot": sid, "decode_once_s": round(took, 3), "snapshot_file_decoded_by_daemon": by_daemon,
            "daemon_decode_s": table.meta.get("decode_s") if by_daemon else None,
            "file_mb": round(file_size(table) / 2**20, 1), "file_bytes_per_key": round(file_size(table) / rows, 1),
            "bytes_per_key_by_column": per_column,
            "index_bytes_per_key": round(per_column["hash"] + per_column["slots"], 1)}


def file_size(table: Any) -> int:
    assert table.path is not None
    return int(table.path.stat().st_size)


def modes(spark: Any, config: Path, fmt: Format, probe: list[str]) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The three queries (typed join, the user's dict + decode, Spark's floor) over ``probe``; and the view."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from globald.spark import GlobalTableView
    from globald.typed.join import spark_type

    df = spark.createDataFrame([(k,) for k in probe], "k string").repartition(4).cache()
    df.count()
    view = GlobalTableView(spark, config, TABLE)
    view.refresh()
    kind = spark_type(fmt.decoder)
    target = to_arrow_type(kind, timezone="UTC")
    arrow_type = fmt.decoder.arrow_type
    user = fmt.user
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


def measure_typed(spark: Any, admin: TopicAdmin, kafka: dict[str, str], work: Path, keys: int, lookups: int,
                  rounds: int, formats: list[str], procs: list[Any]) -> dict[str, Any]:
    """Each format in turn on ``spark`` (a classic local[1] session): its one-off decode and file size, then the
    three queries interleaved, best of ``rounds``; the daemons started join ``procs``."""
    out: dict[str, Any] = {"executor_cores": 1, "keys": keys, "lookups": lookups, "hit_rate": 0.9,
                           "rounds": rounds, "fields": FIELDS, "arrow_batch": int(
                               spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))}
    probe = [k.decode() for k in lookups_of(keys, lookups)]
    for name in formats:
        fdir = work / name
        fdir.mkdir()
        fmt = Format(name, fdir, keys)
        topic = f"bench-typed-{name}"
        produce(admin, topic, fmt)
        config, state = mirror(admin, kafka, work, topic, fmt.section, procs)
        runs, view = modes(spark, config, fmt, probe)
        found: dict[str, Any] = one_off_decode(view, config, state, fdir)
        found["raw_value_bytes_per_key"] = round(sum(len(v) for _, v, _ in fmt.items) / keys, 1)
        log(f"{name}: decoded {keys} values into the columnar file in {found['decode_once_s']} s, "
            f"{found['file_bytes_per_key']} B a key")
        if name == formats[0]:  # the JVM's first queries of this shape run colder code: not measured
            log(f"{name}: warming the JVM up")
            fastest(runs, 2)
        log(f"{name}: {len(runs)} modes interleaved, best of {rounds} rounds")
        best = fastest(runs, rounds)
        view.close()
        rates = {m: round(lookups / s) for m, s in best.items()}
        found["lookups_per_s_per_core"] = rates
        found["typed_vs_user"] = round(rates["typed_join"] / rates["user_dict_decode_mapInArrow"], 2)
        found["typed_share_of_floor"] = round(rates["typed_join"] / rates["spark_floor_precomputed_struct"], 2)
        out[name] = found
    return out
