"""Typed tables in Spark (issue 24), with real PySpark, the real daemon and a real broker, on a classic and a Spark
Connect session: ``view.join`` adds the value as a struct of the schema's type (or flattened), the error column and
the per-query decode-error count; the Arrow ``udf()`` and small-table mode give the same rows; on_error = "fail"
fails the job naming the key. Every value is compared with fastavro's, or the protobuf runtime's, own decode of
the oracle fold at the descriptor's offsets: Avro under two writer ids, Protobuf with message index [1]."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from globald.common.exitcodes import NOT_FOUND
from globald.spark import GlobalTableView, versions
from globald.spark.session import is_connect
from globald.typed.join import spark_type
from tests.harness import Broker, daemon_factory, globald, oracle_at
from tests.integration.test_spark import keys_df, session, spark
from tests.integration.test_typed import READER, as_json, records, reference
from tests.integration.test_typed_hostile import HOSTILE_KEY, HOSTILE_SCHEMA, avro_read, good_records, hostile_value
from tests.support.oracle import fold_located, fold_timestamped
from tests.support.spark_connect import connect_server, connect_session
from tests.unit import schema_strategies as ss
from tests.unit.test_typed_arrow_valid import avro_case, check, json_case, proto_case
from tests.unit.typed_fixtures import (
    FIXTURES,
    avro_payload,
    confluent,
    customer_v1,
    descriptor_set,
    json_records,
    json_reference,
    json_value,
    keyed_records,
    proto_classes,
    string_key_reference,
    varint,
)

__all__ = ["connect_server", "connect_session", "session", "spark"]  # fixtures, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

INDEX_1 = b"\x02\x02"  # the message-index array [1] (count 1, index 1; zigzag varints): shop.Customer
VALUE = "[tables.value]\n"
SECTIONS = {
    "cust": VALUE + 'format = "avro"\nschema = "schemas/customer_reader.avsc"\nframing = "confluent"\n'
                    'writer_schemas = "schemas/ids"\n',
    "custfail": VALUE + 'format = "avro"\nschema = "schemas/customer_reader.avsc"\nframing = "confluent"\n'
                        'writer_schemas = "schemas/ids"\non_error = "fail"\n',
    "prod": VALUE + 'format = "protobuf"\nschema = "schemas/shop.desc"\nmessage = "shop.Customer"\n'
                    'framing = "confluent"\n',
    "json": VALUE + 'format = "json"\nschema = "schemas/customer.ddl"\n',  # a Spark DDL string
    # An Avro string key, Confluent-framed under writer ids 1 and 2; a Confluent-framed JSON value (a JSON Schema).
    "jkey": '[tables.key]\nformat = "avro"\nschema = "schemas/key.avsc"\nframing = "confluent"\n'
            'writer_schemas = "schemas/keyids"\n' + VALUE + 'format = "json"\nschema = "schemas/customer.schema.json"\n'
            'framing = "confluent"\n',
    "rkey": '[tables.key]\nformat = "json"\nschema = "schemas/customer.ddl"\n',  # a record key: no join
    # An unframed Avro long key with a JSON (DDL) value: joined on an integer column.
    "ikey": '[tables.key]\nformat = "avro"\nschema = "schemas/long.avsc"\n' + VALUE + 'format = "json"\n'
            'schema = "schemas/customer.ddl"\n',
    # Unframed Avro with an array<null>, one value of which claims 3e9 items (test_typed_hostile).
    "hostile": VALUE + 'format = "avro"\nschema = "schemas/hostile.avsc"\n',
    # Every null-typed shape at once, 50 good values and one hostile (issue 40 item 2).
    "nulls": VALUE + 'format = "avro"\nschema = "schemas/nulls.avsc"\n',
}
LONG_KEYS = (-7, 0, 1, 42, 2**40, 2**62)  # zigzag varints of one to nine bytes
NULLS_SCHEMA = {"type": "record", "name": "Nulls", "namespace": "t", "fields": [
    {"name": "id", "type": "long"}, {"name": "nothing", "type": "null"},
    {"name": "empty", "type": {"type": "record", "name": "Empty", "fields": []}},
    {"name": "events", "type": {"type": "array", "items": {"type": "record", "name": "Event", "fields": [
        {"name": "at", "type": "long"}, {"name": "gone", "type": "null"}]}}},
    {"name": "seen", "type": {"type": "map", "values": "null"}},
    {"name": "nested", "type": {"type": "array", "items": {"type": "array", "items": "null"}}},
    {"name": "flags", "type": {"type": "array", "items": "null"}}]}  # last: the hostile value's claim is at the end


def long_key(n: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", n)
    return out.getvalue()


def nulls_write(value: dict[str, Any]) -> bytes:
    """By the avro package, not fastavro (which globald decodes with)."""
    buf = io.BytesIO()
    avro.io.DatumWriter(avro.schema.parse(json.dumps(NULLS_SCHEMA))).write(value, avro.io.BinaryEncoder(buf))
    return buf.getvalue()


def nulls_read(payload: bytes) -> Any:
    """The reference decode: the avro package's."""
    return avro.io.DatumReader(avro.schema.parse(json.dumps(NULLS_SCHEMA))).read(
        avro.io.BinaryDecoder(io.BytesIO(payload)))


def nulls_records() -> list[tuple[bytes, bytes | None]]:
    """50 good values, more list items than rows (pyarrow's cast gave a null child the batch's length), and at
    k-0025 one whose array<null> block claims 3e9 items."""
    good = [(b"k-%04d" % i, nulls_write({
        "id": i, "nothing": None, "empty": {}, "events": [{"at": j, "gone": None} for j in range(i % 4 + 1)],
        "seen": {f"s{j}": None for j in range(i % 3)}, "nested": [[None] * j for j in range(i % 3)],
        "flags": [None] * (i % 4)})) for i in range(50)]
    empty = nulls_write({"id": 666, "nothing": None, "empty": {}, "events": [], "seen": {}, "nested": [],
                        "flags": []})
    return [*good[:25], (HOSTILE_KEY, empty[:-1] + varint(3_000_000_000) + b"\x00"), *good[25:]]


@dataclass
class Typed:
    broker: Broker
    config: Path
    topics: dict[str, str]
    classes: dict[str, Any]


def proto_message(cls: Any, i: int) -> Any:
    m = cls(id=i, name=f"Product {i}", tags=[f"t{j}" for j in range(i % 3)], tier=i % 3, balance=i / 4,
            big=2**63 + i)
    m.scores.update({"a": i, "b": -i} if i % 2 else {})
    if i % 4:
        m.address.city, m.address.zip = "Bergen", f"{5000 + i}"
    for j in range(i % 2):
        m.previous.add(city=f"c{j}")
    if i % 3:
        m.updated.FromDatetime(dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=i * 1_001))
    if i % 5:
        m.email = f"p{i}@example.com"
    return m


def proto_records(cls: Any, n: int, keys: int, seed: int) -> list[tuple[bytes, bytes | None]]:
    rnd = random.Random(seed)
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(n):
        key = f"prod-{rnd.randrange(keys):04d}-ø"  # a UTF-8 string key beyond ASCII
        payload = proto_message(cls, i).SerializeToString()
        roll = rnd.random()
        if roll < 0.05:  # bad: a wrong magic byte, a truncated payload
            value = b"\x01" + confluent(1, payload, INDEX_1)[1:] if roll < 0.025 else confluent(1, payload[:-2],
                                                                                                  INDEX_1)
        else:
            value = confluent(1, payload, INDEX_1)
        out.append((key.encode(), value))
    return out


@pytest.fixture(scope="module")
def typed_tables(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Typed]:
    """One daemon mirroring three typed tables, shared by the classic and the Connect run."""
    tmp = tmp_path_factory.mktemp("typed-spark")
    shutil.copytree(FIXTURES, tmp / "schemas")
    classes = proto_classes(descriptor_set(tmp / "schemas"))
    topics = {name: f"typed-{name}-{time.time_ns()}" for name in SECTIONS}
    for t in topics.values():
        broker.admin.create(t, partitions=3, compact=True)
    broker.admin.produce(topics["cust"], records(900, keys=300, seed=24))
    broker.admin.produce(topics["prod"], proto_records(classes["shop.Customer"], 600, keys=200, seed=25))
    broker.admin.produce(topics["json"], json_records(700, keys=250, seed=26))
    broker.admin.produce(topics["jkey"], keyed_records(800, keys=200, seed=27))
    broker.admin.produce(topics["rkey"], [(b'{"id": 1}', b"one")])
    (tmp / "schemas" / "long.avsc").write_text('"long"')
    (tmp / "schemas" / "hostile.avsc").write_text(json.dumps(HOSTILE_SCHEMA))
    good = good_records(300)
    broker.admin.produce(topics["hostile"], [*good[:150], (HOSTILE_KEY, hostile_value()), *good[150:]])
    (tmp / "schemas" / "nulls.avsc").write_text(json.dumps(NULLS_SCHEMA))
    broker.admin.produce(topics["nulls"], nulls_records())
    rnd = random.Random(28)
    broker.admin.produce(topics["ikey"], [(long_key(rnd.choice(LONG_KEYS)), json_value(i, rnd)) for i in range(60)])
    broker.admin.produce(topics["custfail"], [(b"good", confluent(1, avro_payload("customer_v1.avsc",
                                                                                   customer_v1(1)))),
                                              (b"bad-one", confluent(9, b"\x00"))])
    with daemon_factory(broker, tmp) as make:
        d = make(topics, start=False)
        text = d.config.read_text()
        for name, section in SECTIONS.items():
            line = f'topic = "{topics[name]}"\n'
            text = text.replace(line, line + section)
        d.config.write_text(text)
        d.start()
        d.wait_running({name: broker.admin.end_offsets(t) for name, t in topics.items()})
        yield Typed(broker, d.config, topics, classes)


def proto_reference(cls: Any, value: bytes | None) -> dict[str, Any] | None:
    """The protobuf runtime itself, its message turned into the row Spark's from_protobuf would give."""
    from google.protobuf.message import DecodeError

    if value is None or value[:5] != confluent(1, b"") or value[5:7] != INDEX_1:
        return None
    try:
        m = cls.FromString(value[7:])
    except DecodeError:
        return None

    def address(a: Any) -> dict[str, Any]:
        return {"city": a.city, "zip": a.zip}

    return {"id": m.id, "name": m.name, "tags": list(m.tags), "scores": dict(m.scores),
            "tier": cls.Tier.Name(m.tier), "address": address(m.address) if m.HasField("address") else None,
            "previous": [address(a) for a in m.previous],
            "updated": m.updated.ToDatetime(tzinfo=dt.UTC) if m.HasField("updated") else None,
            "email": m.email if m.HasField("email") else None, "balance": m.balance, "big": decimal.Decimal(m.big)}


def rows_of(df: Any) -> list[dict[str, Any]]:
    """The DataFrame's rows through Arrow (zone-aware timestamps, decimals, maps as dicts), in id order."""
    return sorted(df.toArrow().to_pylist(maps_as_pydicts="lossy"), key=lambda r: r["id"])


def as_key(k: str | None) -> bytes | None:
    return None if k is None else k.encode()


def wait_count(counter: Any, timeout: float = 30.0) -> int:
    """The per-query count once every observation arrived (the listener may report just after the action)."""
    deadline = time.monotonic() + timeout
    while counter._pending and time.monotonic() < deadline:
        _ = counter.value  # reads the observations that arrived
        time.sleep(0.05)
    return int(counter.value)


def typed_udf(view: GlobalTableView) -> Any:
    """``view.udf()``; on a PySpark without Arrow UDFs (4.0, ``make test-matrix``), None, once its one-line refusal
    is checked."""
    if versions.installed() >= versions.ARROW_UDF:
        return view.udf()
    with pytest.raises(versions.PySparkVersionError, match=r"^view\.udf\(\) of a typed table \(an Arrow UDF\) needs "
                                                           r"PySpark 4\.1 or newer, and pyspark 4\.0\.\d+ is "
                                                           r"installed; view\.join\(df, key_column\) [^\n]*$"):
        view.udf()
    return None


def test_typed_join_udf_flatten_and_small_equal_the_reference_decode(session: Any, typed_tables: Typed) -> None:
    env = typed_tables
    view = GlobalTableView(session, env.config, "cust")
    desc = view.refresh()
    oracle = oracle_at(env.broker, env.topics["cust"], desc["offsets"])
    expected = {k: reference(v) for k, v in oracle.items()}
    keys: list[bytes | None] = [*sorted(oracle), b"cust-absent", None]
    df = keys_df(session, keys)  # a string key column: matched by its UTF-8 bytes
    bad = [k for k in oracle if expected[k] is None]
    assert bad and len(bad) < len(oracle)

    before = view.decode_errors.value
    rows = rows_of(view.join(df, "k", error_col="err"))
    assert len(rows) == len(keys)
    for r in rows:
        k = as_key(r["k"])
        want = expected.get(k) if k is not None else None
        assert r["value"] == want, r["k"]
        assert (r["err"] is not None) == (k in oracle and want is None), r
        assert (r["timestamp"] is None) == (k not in oracle), r
    assert wait_count(view.decode_errors) - before == len(bad)
    reasons = {r["err"].split(" ")[0] for r in rows if r["err"] is not None}
    assert reasons, "every bad value says why"

    # flatten: the reader schema's fields at top level, prefixed; null in every one where the value is null.
    fields = [f["name"] for f in READER["fields"]]
    flat = rows_of(view.join(df, "k", flatten=True))
    assert {f"value_{f}" for f in fields} <= set(flat[0]) and "value" not in flat[0]
    for r in flat:
        k = as_key(r["k"])
        want = expected.get(k) if k is not None else None
        assert {f: r[f"value_{f}"] for f in fields} == (want or dict.fromkeys(fields)), r["k"]

    # The UDF: the same struct, with the timestamp and the error; on a classic session its errors are counted too.
    before = view.decode_errors.value
    udf = typed_udf(view)
    got = rows_of(df.select("id", "k", udf("k").alias("r"))) if udf is not None else []
    for r in got:
        k = as_key(r["k"])
        assert r["r"]["value"] == (expected.get(k) if k is not None else None), r["k"]
        assert (r["r"]["error"] is not None) == (k in oracle and expected[k] is None), r
    assert view.decode_errors.value - before == (0 if is_connect(session) or udf is None else len(bad))

    # Small-table mode: the same rows.
    small = GlobalTableView(session, env.config, "cust", mode="broadcast")
    small.refresh(offsets={int(p): o for p, o in desc["offsets"].items()})
    assert rows_of(small.join(df, "k", error_col="err")) == rows
    small.close()
    view.close()


def test_typed_protobuf_and_on_error_fail(session: Any, typed_tables: Typed) -> None:
    env = typed_tables
    cls = env.classes["shop.Customer"]
    view = GlobalTableView(session, env.config, "prod")
    desc = view.refresh()
    oracle = oracle_at(env.broker, env.topics["prod"], desc["offsets"])
    expected = {k: proto_reference(cls, v) for k, v in oracle.items()}
    assert 0 < sum(v is None for v in expected.values()) < len(expected)
    keys: list[bytes | None] = [*sorted(oracle), "prod-absent-ø".encode()]
    rows = rows_of(view.join(keys_df(session, keys), "k", error_col="err"))
    for r in rows:
        k = as_key(r["k"])
        assert r["value"] == expected.get(k), r["k"]  # type: ignore[arg-type]
        assert (r["err"] is not None) == (k in oracle and expected[k] is None), r  # type: ignore[index]
    view.close()

    failing = GlobalTableView(session, env.config, "custfail")
    desc = failing.refresh()
    good = rows_of(failing.join(keys_df(session, [b"good"]), "k"))
    assert good[0]["value"] == reference(confluent(1, avro_payload("customer_v1.avsc", customer_v1(1))))
    # The task fails naming the key, the partition and offset of the record it came from, and the reason.
    named = bad_record(env, desc["offsets"])
    with pytest.raises(Exception, match=named):
        failing.join(keys_df(session, [b"good", b"bad-one"]), "k").collect()
    failing.close()
    small = GlobalTableView(session, env.config, "custfail", mode="broadcast")
    small.refresh(offsets={int(p): o for p, o in desc["offsets"].items()})
    with pytest.raises(Exception, match=named):
        small.join(keys_df(session, [b"bad-one"]), "k").collect()
    small.close()


def bad_record(env: Typed, offsets: dict[str, int]) -> str:
    """What a failure about custfail's bad record must say: its key, partition and offset (from the broker's own
    records), and why it does not decode."""
    _, _, partition, offset = fold_located(env.broker.settings, env.topics["custfail"],
                                           {int(p): o for p, o in offsets.items()})[b"bad-one"]
    return rf"(?s)key 'bad-one' \(partition {partition}, offset {offset}\).*schema id 9"


def test_a_snapshot_too_large_for_the_columnar_file_decodes_per_batch_alike(
        spark: Any, typed_tables: Typed, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's handle, in this process: with ColumnarTooLarge it multi-gets and decodes each batch, and
    answers (values, timestamps, errors, count; on_error = "fail" too) as the columnar file does."""
    import pyarrow as pa

    from globald.spark import typed as spark_typed
    from globald.typed.arrow import DecodeFailure
    from globald.typed.columnar import ColumnarTooLarge

    def too_large(snapshot: Any, decoder: Any, key_decoder: Any = None) -> Any:
        raise ColumnarTooLarge(f"snapshot {snapshot.id}: pretend it is over 2 GB")

    env = typed_tables
    for table, keys in (("cust", None), ("custfail", [b"good", b"absent"])):
        view = GlobalTableView(spark, env.config, table)
        desc = view.refresh()
        fingerprint = spark_typed.decoders(view.config_path, table)[1].fingerprint
        if keys is None:
            keys = [*sorted(oracle_at(env.broker, env.topics[table], desc["offsets"])), b"absent", None]
        mapped = spark_typed.TypedHandle(view.settings, desc, None, fingerprint)
        assert mapped.table is not None and mapped.table.path is not None
        with monkeypatch.context() as m:
            m.setattr(spark_typed, "open_typed", too_large)
            per_batch = spark_typed.TypedHandle(view.settings, desc, None, fingerprint)
        assert per_batch.table is None
        a, b = mapped.lookup(pa.array(keys, pa.binary())), per_batch.lookup(pa.array(keys, pa.binary()))
        assert (a.values.to_pylist(), a.timestamps.to_pylist(), a.errors.to_pylist(), a.error_count) == \
            (b.values.to_pylist(), b.timestamps.to_pylist(), b.errors.to_pylist(), b.error_count)
        if table == "cust":
            assert b.error_count > 0
        else:
            with pytest.raises(DecodeFailure, match=bad_record(env, desc["offsets"])):
                per_batch.lookup(pa.array([b"good", b"bad-one"], pa.binary()))
        mapped.close()
        per_batch.close()
        view.close()

    # A typed key has no multi-get (the store is keyed by the raw bytes): the task fails saying so.
    view = GlobalTableView(spark, env.config, "jkey")
    desc = view.refresh()
    key_dec, val_dec = spark_typed.decoders(view.config_path, "jkey")
    with monkeypatch.context() as m, pytest.raises(ColumnarTooLarge, match="declares a typed key, which only the "
                                                                           "columnar file can look up"):
        m.setattr(spark_typed, "open_typed", too_large)
        spark_typed.TypedHandle(view.settings, desc, None, spark_typed.file_fingerprint(val_dec, key_dec))
    view.close()


def test_json_values_missing_and_extra_fields_and_bad_records_equal_stdlib_json(session: Any,
                                                                                 typed_tables: Typed) -> None:
    env = typed_tables
    view = GlobalTableView(session, env.config, "json")
    desc = view.refresh()
    oracle = oracle_at(env.broker, env.topics["json"], desc["offsets"])
    expected = {k: json_reference(v, decimal_balance=True) for k, v in oracle.items()}
    bad = [k for k, (_, error) in expected.items() if error]
    assert bad and any(v is not None and None in v.values() for v, _ in expected.values())  # missing fields
    assert any(b"extra" in v for v in oracle.values()) and any(v == b"null" for v in oracle.values())
    keys: list[bytes | None] = [*sorted(oracle), b"json-absent", None]
    before = view.decode_errors.value
    rows = rows_of(view.join(keys_df(session, keys), "k", error_col="err"))
    assert len(rows) == len(keys)
    for r in rows:
        k = as_key(r["k"])
        want, error = expected.get(k, (None, False)) if k is not None else (None, False)
        assert r["value"] == want, r["k"]
        assert (r["err"] is not None) == error, r
        assert (r["timestamp"] is None) == (k not in oracle), r
    reasons = " ".join(r["err"] for r in rows if r["err"] is not None)
    assert "invalid JSON" in reasons and "id: expected an integer" in reasons
    assert wait_count(view.decode_errors) - before == len(bad)
    view.close()


def latest_by_decoded_key(env: Typed, offsets: dict[str, int]) -> tuple[dict[str, tuple[int, bytes, bytes]], int,
                                                                         int]:
    """The oracle fold of the typed-key table, by decoded key: ({key text: (timestamp, raw key, value)} of the
    record each key resolves to (the greatest timestamp, on a tie the greater raw key), keys that do not decode,
    raw keys shadowed)."""
    timed = fold_timestamped(env.broker.settings, env.topics["jkey"], {int(p): o for p, o in offsets.items()})
    latest: dict[str, tuple[int, bytes, bytes]] = {}
    undecodable = 0
    for raw, (value, ts) in timed.items():
        text = string_key_reference(raw)
        if text is None:
            undecodable += 1
        elif text not in latest or (ts, raw) > latest[text][:2]:
            latest[text] = (ts, raw, value)
    return latest, undecodable, len(timed) - undecodable - len(latest)


def test_a_typed_string_key_joins_on_a_string_column(session: Any, typed_tables: Typed) -> None:
    """An Avro string key, Confluent-framed under two writer ids: joined, through the UDF and in small-table mode,
    on a string column holding the decoded key; every row equals the oracle fold resolved by decoded key."""
    from globald.settings.config import load
    from globald.snapshot.reader import open_snapshot
    from globald.typed import load_table
    from globald.typed.columnar import ensure_columnar

    env = typed_tables
    view = GlobalTableView(session, env.config, "jkey")
    desc = view.refresh()
    latest, undecodable, shadowed = latest_by_decoded_key(env, desc["offsets"])
    assert undecodable and shadowed, "the topic must hold keys that do not decode and keys decoding alike"
    keys: list[bytes | None] = [*(t.encode() for t in sorted(latest)), "user-absent-\u00f8".encode(), None]
    df = keys_df(session, keys)
    rows = rows_of(view.join(df, "k", error_col="err"))
    assert len(rows) == len(keys)
    for r in rows:
        ts, _, value = latest.get(r["k"], (None, b"", b""))
        want, error = json_reference(value[5:], decimal_balance=False) if ts is not None else (None, False)
        assert (r["value"], r["timestamp"], r["err"] is not None) == (want, ts, error), r["k"]

    udf = typed_udf(view)
    if udf is not None:
        got = rows_of(df.select("id", "k", udf("k").alias("r")))
        assert [(g["r"]["value"], g["r"]["timestamp"], g["r"]["error"]) for g in got] == \
            [(r["value"], r["timestamp"], r["err"]) for r in rows]

    small = GlobalTableView(session, env.config, "jkey", mode="broadcast")
    small.refresh(offsets={int(p): o for p, o in desc["offsets"].items()})
    assert rows_of(small.join(df, "k", error_col="err")) == rows
    small.close()

    # The columnar file the executors wrote counts what it left out (mapped, not decoded again, here).
    cfg = load(env.config)
    with open_snapshot(cfg.state_dir, "jkey", desc["snapshot"]) as snap:
        key_dec, val_dec = load_table(cfg, "jkey")
        table = ensure_columnar(snap, val_dec, key_dec)
    assert (table.meta["key_errors"], table.meta["key_shadowed"], len(table)) == (undecodable, shadowed, len(latest))
    view.close()


def test_get_decode_takes_the_decoded_key_of_a_typed_key_table(typed_tables: Typed) -> None:
    env = typed_tables
    latest, _, _ = latest_by_decoded_key(env, {str(p): o for p, o in
                                               env.broker.admin.end_offsets(env.topics["jkey"]).items()})
    twice = Counter(string_key_reference(raw) for raw in
                    fold_timestamped(env.broker.settings, env.topics["jkey"],
                                     env.broker.admin.end_offsets(env.topics["jkey"])))
    text = min(t for t, n in twice.items() if t is not None and n > 1)  # a key stored under two raw keys
    r = globald("get", "--config", str(env.config), "--table", "jkey", "--decode", "--json", text)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ts, raw, value = latest[text]
    assert (doc["value"], doc["timestamp"], doc["key_base64"]) == (
        as_json(json_reference(value[5:], decimal_balance=False)[0]), ts, base64.b64encode(raw).decode())
    assert "other stored key(s) of jkey decode to the same key" in r.stderr
    missing = globald("get", "--config", str(env.config), "--table", "jkey", "--decode", "user-absent")
    assert missing.returncode == NOT_FOUND, missing.stderr


def test_a_record_key_is_refused_in_one_line(spark: Any, typed_tables: Typed) -> None:
    from globald.typed.keys import KeyTypeUnsupported

    view = GlobalTableView(spark, typed_tables.config, "rkey")
    view.refresh()
    for attempt in (lambda: view.join(keys_df(spark, [b"1"]), "k"), view.udf):
        with pytest.raises(KeyTypeUnsupported, match=r"^table rkey: its key \(tables\[\d\]\.key, format json\) "
                                                     r"decodes to struct<id: int64[^\n]*only string, bytes and "
                                                     r"integer keys can$"):
            attempt()
    view.close()


def test_an_integer_key_joins_on_an_integer_column(session: Any, typed_tables: Typed) -> None:
    """An Avro long key: a long column matches it by value (and a string column by its decimal text)."""
    from pyspark.sql.types import LongType, StructField, StructType

    env = typed_tables
    view = GlobalTableView(session, env.config, "ikey")
    desc = view.refresh()
    fold = fold_timestamped(env.broker.settings, env.topics["ikey"], {int(p): o for p, o in desc["offsets"].items()})
    by_key = {fastavro.schemaless_reader(io.BytesIO(raw), "long", None): vt for raw, vt in fold.items()}
    assert set(by_key) == set(LONG_KEYS), "every key must have been produced"
    wanted = [*LONG_KEYS, 5, None]
    df = session.createDataFrame([(i, k) for i, k in enumerate(wanted)],
                                 StructType([StructField("id", LongType()), StructField("k", LongType())]))
    rows = rows_of(view.join(df, "k"))
    assert len(rows) == len(wanted)
    for r in rows:
        value, ts = by_key.get(r["k"], (None, None))
        want = json_reference(value, decimal_balance=True)[0] if value is not None else None
        assert (r["value"], r["timestamp"]) == (want, ts), r["k"]
    as_text = rows_of(view.join(df.selectExpr("id", "CAST(k AS STRING) AS k"), "k"))
    assert [(r["value"], r["timestamp"]) for r in as_text] == [(r["value"], r["timestamp"]) for r in rows]
    view.close()


def test_one_hostile_value_leaves_a_join_of_the_good_keys_equal_to_the_reference(session: Any,
                                                                                  typed_tables: Typed) -> None:
    """Issue 33: an array<null> value claiming 3e9 items took every Spark worker's memory, since a worker decodes
    the whole snapshot: a join of only the good keys failed ("Python worker exited unexpectedly"). Now it is one
    decode error, of that value alone; the good keys equal the avro package's decode of the fold. Snapshot mode
    (the columnar file, decoded by the daemon or the first worker) and small-table mode (each worker decodes)."""
    env = typed_tables
    view = GlobalTableView(session, env.config, "hostile")
    desc = view.refresh()
    oracle = oracle_at(env.broker, env.topics["hostile"], desc["offsets"])
    assert HOSTILE_KEY in oracle
    good = sorted(k for k in oracle if k != HOSTILE_KEY)
    df = keys_df(session, good)

    def rows_of(df: Any) -> list[dict[str, Any]]:  # not through toArrow: pyspark's cast of list<null> there fails
        return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["id"])

    rows = rows_of(view.join(df, "k", error_col="err"))
    assert [as_key(r["k"]) for r in rows] == good  # keys_df numbers the keys in order: ids follow them
    for r in rows:
        assert r["err"] is None and r["value"] == avro_read(oracle[as_key(r["k"])]), r
    hostile = rows_of(view.join(keys_df(session, [HOSTILE_KEY]), "k", error_col="err"))
    assert hostile[0]["value"] is None and "max_items" in hostile[0]["err"], hostile

    small = GlobalTableView(session, env.config, "hostile", mode="broadcast")
    small.refresh(offsets={int(p): o for p, o in desc["offsets"].items()})
    assert rows_of(small.join(df, "k", error_col="err")) == rows
    small.close()
    view.close()


def test_every_null_shape_with_a_hostile_value_joins_equal_to_the_reference(session: Any, typed_tables: Typed
                                                                            ) -> None:
    """Issue 40 item 2: a table of 50 good values and one hostile, whose schema has a null field, an empty record,
    a list of records with a null field, a map of nulls, a list of lists of nulls and a list of nulls, joins in
    Spark, the hostile key and an absent one among the keys: every field equal to the avro package's decode of the
    fold. Flattened, so that each field is a column of its own: before the fix the list of records with a null
    field was a batch with offsets past its values (the list<null> rule then in place rebuilt a whole struct
    holding one, so the struct join of this schema passed by chance; the unit tests cover both shapes)."""
    env = typed_tables
    view = GlobalTableView(session, env.config, "nulls")
    desc = view.refresh()
    oracle = oracle_at(env.broker, env.topics["nulls"], desc["offsets"])
    assert len(oracle) == 51 and HOSTILE_KEY in oracle
    keys = [*sorted(oracle), b"absent"]
    asked: list[bytes | None] = [*keys]

    def rows_of(df: Any) -> list[dict[str, Any]]:  # not through toArrow: pyspark's own cast of null types fails
        return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["id"])

    fields = [f["name"] for f in NULLS_SCHEMA["fields"]]  # type: ignore[index]
    want = [dict.fromkeys(fields) if k == HOSTILE_KEY or k not in oracle else nulls_read(oracle[k]) for k in keys]
    rows = rows_of(view.join(keys_df(session, asked), "k", flatten=True, error_col="err"))
    assert [as_key(r["k"]) for r in rows] == keys
    assert [{f: r[f"value_{f}"] for f in fields} for r in rows] == want
    assert [r["err"] is not None for r in rows] == [k == HOSTILE_KEY for k in keys]
    view.close()


def _as_collected(value: Any) -> Any:
    """A reference value as a classic ``collect()`` gives it: timestamps as naive local times."""
    if isinstance(value, dict):
        return {k: _as_collected(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_collected(v) for v in value]
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    return value


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_schemas_join_in_spark_equal_to_what_was_written(spark: Any, data: st.DataObject) -> None:
    """Issue 40 item 2, in Spark: for generated Avro, JSON and Protobuf schemas and values
    (tests.unit.schema_strategies), the column a join hands Spark (the columnar file, a shuffled lookup with an
    absent key, cast to Spark's types: the unit test's ``check``) is read by Spark's JVM from a ``mapInArrow`` and
    collected equal to what was written."""
    from pyspark.sql.types import LongType, StructField, StructType

    fmt = data.draw(st.sampled_from(["avro", "json", "protobuf"]), "format")
    with tempfile.TemporaryDirectory() as d:
        if fmt == "avro":
            node = data.draw(ss.avro_trees, "schema")
            values = data.draw(st.lists(ss.avro_values(node), min_size=1, max_size=6), "values")
            decoder, payloads, expected = avro_case(node, values, Path(d))
        else:
            decoder, payloads, expected = (json_case if fmt == "json" else proto_case)(data, Path(d))
    column, want = check(decoder, payloads, expected)
    batch = pa.RecordBatch.from_arrays([pa.array(range(len(want)), pa.int64()), column], names=["i", "value"])

    def one_batch(_: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield batch

    schema = StructType([StructField("i", LongType(), False), StructField("value", spark_type(decoder), True)])
    rows = sorted(spark.range(1, numPartitions=1).mapInArrow(one_batch, schema).collect(), key=lambda r: r["i"])
    assert [None if r["value"] is None else r["value"].asDict(recursive=True) for r in rows] == _as_collected(want)
