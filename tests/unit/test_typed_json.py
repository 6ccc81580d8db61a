"""JSON values into Arrow, typed by a Spark DDL string or a JSON Schema: missing and extra fields, wrong types,
invalid JSON. The reference is the standard library's json, converted by hand to the types the schema names."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pytest

from globald import typed
from globald.common.errors import ConfigError
from globald.settings.typed_spec import ValueFormat
from globald.typed.arrow import Decoder, python_rows
from tests.unit.typed_fixtures import FIXTURES, confluent

RECORDS = [
    {"id": 1, "name": "Ada", "tags": ["a", "b"], "scores": {"x": 1}, "address": {"city": "Oslo", "zip": "0150"},
     "balance": 12.5, "since": "2021-03-04", "updated": "2024-05-01T10:00:00.250+02:00", "active": True},
    {"id": 2, "extra": {"ignored": [1, 2]}, "address": {"city": "Lima", "floor": 3}},  # missing and extra fields
    {"id": 3, "name": None, "tags": [], "scores": {}, "updated": "2024-05-01T08:00:00"},  # no zone: UTC
]


def load(schema: str, framing: str = "none", on_error: str = "null") -> Decoder:
    return typed.load(ValueFormat(format="json", schema=FIXTURES / schema, framing=framing, on_error=on_error), "t")


def expected(r: dict[str, object], balance: type) -> dict[str, object]:
    """What the schema makes of a record, by hand."""
    updated = r.get("updated")
    stamp = dt.datetime.fromisoformat(updated) if isinstance(updated, str) else None
    address = r.get("address")
    return {
        "id": r["id"], "name": r.get("name"), "tags": r.get("tags"), "scores": r.get("scores"),
        "address": {"city": address["city"], "zip": address.get("zip")} if isinstance(address, dict) else None,
        "balance": None if "balance" not in r else balance(str(r["balance"])),
        "since": dt.date.fromisoformat(str(r["since"])) if "since" in r else None,
        "updated": None if stamp is None else stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC),
        "active": r.get("active"),
    }


def test_ddl_schema() -> None:
    d = load("customer.ddl")
    assert d.arrow_type.field("balance").type == pa.decimal128(12, 2)
    assert d.arrow_type.field("updated").type == pa.timestamp("us", "UTC")
    decoded = d.decode(pa.array([json.dumps(r).encode() for r in RECORDS], pa.binary()))
    assert decoded.error_count == 0
    assert python_rows(decoded.values) == [
        {k: v for k, v in expected(r, decimal.Decimal).items() if k in d.arrow_type.names} for r in RECORDS]


def test_json_schema() -> None:
    d = load("customer.schema.json")
    assert d.arrow_type.field("id").type == pa.int64()
    assert d.arrow_type.field("scores").type == pa.map_(pa.string(), pa.int64())
    decoded = d.decode(pa.array([json.dumps(r).encode() for r in RECORDS], pa.binary()))
    assert decoded.error_count == 0
    assert python_rows(decoded.values) == [
        {name: expected(r, float)[name] for name in d.arrow_type.names} for r in RECORDS]


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"id": 1, "name": ', "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"),
    (b'{"id": "seven"}', 'id: expected an integer, got "seven"'),
    (b'{"id": 1, "tags": "a"}', 'tags: expected an array, got "a"'),
    (b'{"id": 1, "address": {"city": 5}}', "address.city"),  # a number for a string: its JSON text, as Spark
    (b'{"id": 1, "since": "yesterday"}', 'since: expected an ISO 8601 date, got "yesterday"'),
    (b"[1, 2]", "expected an object"),
    (b'{"id": 1, "scores": {"x": 1.5}}', "scores.x: expected an integer"),
])
def test_bad_records_are_null_with_a_reason(value: bytes, reason: str) -> None:
    decoded = load("customer.ddl").decode(pa.array([value, b'{"id": 9}'], pa.binary()))
    errors = decoded.errors.to_pylist()
    if reason == "address.city":  # not an error: Spark's from_json keeps the JSON text of a non-string
        assert errors == [None, None] and python_rows(decoded.values)[0]["address"]["city"] == "5"
        return
    assert decoded.error_count == 1 and reason in errors[0] and errors[1] is None
    assert decoded.values.is_valid().to_pylist() == [False, True]


def test_int_out_of_range_for_its_column_is_that_row_only() -> None:
    decoded = load("customer.ddl").decode(pa.array([b'{"id": 1, "scores": {"x": 4294967296}}', b'{"id": 2}']))
    assert decoded.error_count == 1 and "does not fit the schema's type" in decoded.errors[0].as_py()
    assert python_rows(decoded.values)[1]["id"] == 2


def test_confluent_framed_json() -> None:
    decoded = load("customer.ddl", "confluent").decode(pa.array([confluent(3, b'{"id": 4}'), b'{"id": 4}']))
    assert python_rows(decoded.values)[0]["id"] == 4
    assert "wrong magic byte 123" in decoded.errors[1].as_py()


@pytest.mark.parametrize(("text", "reason"), [
    ("id BIGINT, tags ARRAY<STRING", "expected >"),
    ("id WHATEVER", "unknown type WHATEVER"),
    ('{"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}',
     "no single column type"),
])
def test_bad_json_schemas_name_the_key_and_file(tmp_path: Path, text: str, reason: str) -> None:
    schema = tmp_path / "s.txt"
    schema.write_text(text)
    with pytest.raises(ConfigError) as e:
        typed.load(ValueFormat(format="json", schema=schema), "tables[0].value")
    assert e.value.key == "tables[0].value.schema" and str(schema) in str(e.value) and reason in str(e.value)
