"""Avro values into Arrow: every type the contract names, evolution across two writer schemas (Confluent ids 1 and 2)
read through a reader schema, and bad records. The reference is fastavro called directly with the same schemas, and
for the evolution cases also the avro package (Apache's implementation, which production does not use)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald import typed
from globald.common.errors import ConfigError
from globald.settings.typed_spec import ValueFormat
from globald.typed.arrow import DecodeFailure, RecordContext, python_rows
from tests.unit.typed_fixtures import (
    FIXTURES,
    IDS,
    avro_payload,
    avro_schema,
    confluent,
    customer_v1,
    customer_v2,
)

READER = FIXTURES / "customer_reader.avsc"


def framed(on_error: str = "null") -> typed.arrow.Decoder:
    return typed.load(ValueFormat(format="avro", schema=READER, framing="confluent", writer_schemas=IDS,
                                  on_error=on_error), "tables[0].value")


def reference(value: bytes) -> dict[str, Any]:
    """fastavro directly: the writer schema the id names, resolved to the reader schema."""
    writer = avro_schema(f"ids/{int.from_bytes(value[1:5], 'big')}.avsc")
    return fastavro_read(value[5:], writer, avro_schema("customer_reader.avsc"))


def fastavro_read(payload: bytes, writer: Any, reader: Any) -> dict[str, Any]:
    import fastavro

    return fastavro.schemaless_reader(io.BytesIO(payload), writer, reader)  # type: ignore[return-value]


def test_arrow_type_follows_the_schema() -> None:
    t = framed().arrow_type
    assert t.field("tags").type == pa.list_(pa.string())
    assert t.field("scores").type == pa.map_(pa.string(), pa.int32())
    assert t.field("tier").type == pa.string()
    assert t.field("address").type == pa.struct([("city", pa.string()), ("zip", pa.string())])
    assert t.field("balance").type == pa.decimal128(12, 2)
    assert t.field("since").type == pa.date32()
    assert t.field("updated").type == pa.timestamp("ms", "UTC")
    assert t.field("segment").type == pa.string() and "email" not in [f.name for f in t]


def test_unframed_values_read_with_the_reader_schema_alone() -> None:
    schema_v2 = FIXTURES / "customer_v2.avsc"
    decoder = typed.load(ValueFormat(format="avro", schema=schema_v2), "t")
    value = avro_payload("customer_v2.avsc", customer_v2(5))
    assert python_rows(decoder.decode(pa.array([value])).values) == [
        fastavro_read(value, avro_schema("customer_v2.avsc"), None)]


BAD = [
    (lambda good: good[:-4], "truncated or corrupt Avro payload"),
    (lambda good: good[:3], "truncated Confluent header"),
    (lambda good: b"\x01" + good[1:], "wrong magic byte 1"),
    (lambda good: confluent(9, good[5:]), "unknown schema id 9"),
    (lambda good: good + b"\x00\x00", "2 bytes left after the record"),
]


@pytest.mark.parametrize(("spoil", "reason"), BAD)
def test_a_bad_record_is_null_counted_with_its_reason(spoil: Any, reason: str) -> None:
    good = confluent(2, avro_payload("customer_v2.avsc", customer_v2(3)))
    decoded = framed().decode(pa.array([good, spoil(good), None], pa.binary()))
    assert decoded.error_count == 1
    assert decoded.values.is_valid().to_pylist() == [True, False, False]
    errors = decoded.errors.to_pylist()
    assert errors[0] is None and errors[2] is None and reason in errors[1]


def test_on_error_fail_names_key_partition_offset_and_reason() -> None:
    good = confluent(2, avro_payload("customer_v2.avsc", customer_v2(3)))
    context = RecordContext(keys=[b"k1", b"k2"], partitions=[0, 2], offsets=[10, 41])
    with pytest.raises(DecodeFailure) as e:
        framed("fail").decode(pa.array([good, confluent(9, good[5:])], pa.binary()), context)
    assert str(e.value) == ("tables[0].value: value of key 'k2' (partition 2, offset 41) does not decode: "
                            f"unknown schema id 9 (no 9.avsc in writer_schemas {IDS})")
    assert (e.value.key, e.value.partition, e.value.offset) == (b"k2", 2, 41)


def test_schema_errors_name_the_key_and_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nosuch"}]}')
    with pytest.raises(ConfigError) as e:
        typed.load(ValueFormat(format="avro", schema=bad), "tables[3].value")
    assert e.value.key == "tables[3].value.schema" and str(bad) in str(e.value)
    union = tmp_path / "union.avsc"
    union.write_text(json.dumps({"type": "record", "name": "U", "fields": [{"name": "a", "type": ["int", "string"]}]}))
    with pytest.raises(ConfigError, match="no single column type"):
        typed.load(ValueFormat(format="avro", schema=union), "t")
    with pytest.raises(ConfigError, match="cannot read"):
        typed.load(ValueFormat(format="avro", schema=tmp_path / "missing.avsc"), "t")
    (tmp_path / "ids").mkdir()
    (tmp_path / "ids" / "one.avsc").write_text("{}")
    with pytest.raises(ConfigError, match="must be a schema id"):
        typed.load(ValueFormat(format="avro", schema=READER, framing="confluent", writer_schemas=tmp_path / "ids"), "t")


def test_time_of_day_is_the_number_on_the_wire(tmp_path: Path) -> None:
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "time-micros"}}]}
    path = tmp_path / "t.avsc"
    path.write_text(json.dumps(schema))
    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), {"ms": 3_600_000, "us": 1})
    decoder = typed.load(ValueFormat(format="avro", schema=path), "t")
    assert decoder.arrow_type == pa.struct([("ms", pa.int32()), ("us", pa.int64())])
    assert python_rows(decoder.decode(pa.array([buf.getvalue()])).values) == [{"ms": 3_600_000, "us": 1}]


def avro_package_write(schema_file: str, record: dict[str, Any]) -> bytes:
    """``record`` written by the avro package (Apache's own implementation), not fastavro."""
    import avro.io
    import avro.schema

    buf = io.BytesIO()
    schema = avro.schema.parse((FIXTURES / schema_file).read_text())
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(buf))
    return buf.getvalue()


def avro_package_read(value: bytes) -> dict[str, Any]:
    """The avro package's schema resolution: the writer schema the id names, read through the reader schema."""
    import avro.io
    import avro.schema

    writer = avro.schema.parse((IDS / f"{int.from_bytes(value[1:5], 'big')}.avsc").read_text())
    reader = avro.schema.parse(READER.read_text())
    return avro.io.DatumReader(writer, reader).read(avro.io.BinaryDecoder(io.BytesIO(value[5:])))  # type: ignore[no-any-return]


@pytest.mark.parametrize(("write", "read"), [(avro_payload, reference), (avro_package_write, avro_package_read)],
                         ids=["fastavro", "avro-package"])
def test_two_writer_schemas_resolve_through_the_reader(write: Any, read: Any) -> None:
    """Against fastavro, and against the avro package (Apache's implementation, which production does not use):
    it writes the records (v1 and v2) and resolves them through the reader schema itself."""
    values = [confluent(1, write("customer_v1.avsc", customer_v1(i))) for i in range(12)]
    values += [confluent(2, write("customer_v2.avsc", customer_v2(i))) for i in range(12, 24)]
    decoded = framed().decode(pa.array(values, pa.binary()))
    assert decoded.error_count == 0
    rows = python_rows(decoded.values)
    assert rows == [read(v) for v in values]
    # v1 records: v2's added fields take their defaults, v1's email is dropped; both get the reader's segment.
    assert rows[1]["visits"] == 0 and rows[1]["phone"] is None and "email" not in rows[1]
    assert rows[13]["visits"] == 13 * 7 and rows[13]["phone"] == "+4700000013"
    assert {r["segment"] for r in rows} == {"retail"}
    assert rows[0]["address"] is None and rows[7]["address"] == {"city": "Oslo", "zip": None}
