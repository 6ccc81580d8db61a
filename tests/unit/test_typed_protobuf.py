"""Protobuf values into Arrow: nested messages, repeated fields, maps, enums, google.protobuf.Timestamp, presence,
and a message that is not the first of its file (Confluent message index [1]). The reference is the protobuf
runtime itself: the same bytes parsed by the message class, read field by field."""

from __future__ import annotations

import datetime as dt
import decimal
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald import typed
from globald.common.errors import ConfigError
from globald.settings.typed_spec import ValueFormat
from globald.typed.arrow import Decoder, python_rows
from tests.unit.typed_fixtures import confluent, descriptor_set, proto_classes

CUSTOMER_INDEX = b"\x02\x02"  # the array [1], zigzag: Customer is the second message of shop.proto


@pytest.fixture(scope="module")
def desc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return descriptor_set(tmp_path_factory.mktemp("proto"))


def decoder(desc: Path, framing: str = "confluent", writer_schemas: Path | None = None) -> Decoder:
    return typed.load(ValueFormat(format="protobuf", schema=desc, message="shop.Customer", framing=framing,
                                  writer_schemas=writer_schemas), "tables[0].value")


def customer(classes: dict[str, Any], i: int) -> Any:
    m = classes["shop.Customer"](id=i, name=f"Customer {i}", tags=[f"t{j}" for j in range(i % 3)],
                                 tier=i % 3, balance=i / 4, big=2**64 - 1 - i)
    m.scores.update({"a": i, "b": -i})
    if i % 2:
        m.address.city, m.address.zip = "Oslo", f"0{i}"
        m.previous.add(city="Lima").CopyFrom(m.address)
        m.email = f"c{i}@example.com"
    m.updated.seconds, m.updated.nanos = 1_700_000_000 + i, 123_456_789
    return m


def reference(classes: dict[str, Any], payload: bytes) -> dict[str, Any]:
    m = classes["shop.Customer"].FromString(payload)
    tier = classes["shop.Customer"].DESCRIPTOR.enum_types_by_name["Tier"].values_by_number[m.tier].name

    def address(a: Any) -> dict[str, str]:
        return {"city": a.city, "zip": a.zip}

    return {"id": m.id, "name": m.name, "tags": list(m.tags), "scores": dict(m.scores), "tier": tier,
            "address": address(m.address) if m.HasField("address") else None,
            "previous": [address(a) for a in m.previous],
            "updated": m.updated.ToDatetime(dt.UTC).replace(microsecond=m.updated.nanos // 1000),
            "email": m.email if m.HasField("email") else None, "balance": m.balance, "big": decimal.Decimal(m.big)}


def test_arrow_type_follows_the_descriptor(desc: Path) -> None:
    t = decoder(desc).arrow_type
    address = pa.struct([("city", pa.string()), ("zip", pa.string())])
    assert t == pa.struct([("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.string())),
                           ("scores", pa.map_(pa.string(), pa.int32())), ("tier", pa.string()),
                           ("address", address), ("previous", pa.list_(address)),
                           ("updated", pa.timestamp("us", "UTC")), ("email", pa.string()),
                           ("balance", pa.float64()), ("big", pa.decimal128(20, 0))])


def test_message_not_first_in_its_file_with_confluent_index(desc: Path) -> None:
    classes = proto_classes(desc)
    payloads = [customer(classes, i).SerializeToString() for i in range(8)]
    decoded = decoder(desc).decode(pa.array([confluent(5, p, CUSTOMER_INDEX) for p in payloads]))
    assert decoded.error_count == 0
    assert python_rows(decoded.values) == [reference(classes, p) for p in payloads]


def test_unframed_and_writer_descriptor_sets(desc: Path, tmp_path: Path) -> None:
    classes = proto_classes(desc)
    payload = customer(classes, 3).SerializeToString()
    assert python_rows(decoder(desc, "none").decode(pa.array([payload])).values) == [reference(classes, payload)]
    ids = tmp_path / "ids"
    ids.mkdir()
    shutil.copy(desc, ids / "4.desc")
    framed = decoder(desc, writer_schemas=ids).decode(
        pa.array([confluent(4, payload, CUSTOMER_INDEX), confluent(6, payload, CUSTOMER_INDEX)]))
    assert python_rows(framed.values)[0] == reference(classes, payload)
    assert "unknown schema id 6" in framed.errors[1].as_py()


@pytest.mark.parametrize(("index", "reason"), [
    (b"\x00", "the record is a shop.Header (message index [0]), the table reads shop.Customer"),
    (b"\x02\x04", "message index [2] points past the 2 message(s)"),
    (b"\x04\x02\x00", "the record is a shop.Customer.Address"),
])
def test_a_message_index_naming_another_message_is_an_error(desc: Path, index: bytes, reason: str) -> None:
    payload = customer(proto_classes(desc), 1).SerializeToString()
    decoded = decoder(desc).decode(pa.array([confluent(5, payload, index)]))
    assert decoded.error_count == 1 and reason in decoded.errors[0].as_py()


def test_truncated_and_garbage_payloads_are_errors(desc: Path) -> None:
    payload = customer(proto_classes(desc), 1).SerializeToString()
    decoded = decoder(desc).decode(pa.array([confluent(5, payload[:-3], CUSTOMER_INDEX), b"\x00\x00",
                                             confluent(5, b"\xff\xff\xff", CUSTOMER_INDEX)]))
    assert decoded.error_count == 3 and decoded.values.null_count == 3


def test_descriptor_errors_name_the_key(desc: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        typed.load(ValueFormat(format="protobuf", schema=desc, message="shop.Nope"), "tables[1].value")
    assert e.value.key == "tables[1].value.message" and "no message shop.Nope" in str(e.value)
    junk = tmp_path / "junk.desc"
    junk.write_bytes(b"not a descriptor set")
    with pytest.raises(ConfigError, match="is not a usable protobuf descriptor set"):
        typed.load(ValueFormat(format="protobuf", schema=junk, message="shop.Customer"), "t")
