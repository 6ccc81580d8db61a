"""Shared by the typed-table tests: the schema files of tests/fixtures/typed and reference encoders.

Records are written with fastavro and the protobuf runtime directly, and framed by hand (struct), so that what the
tests feed the decoders never comes from globald's own code path.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import random
import struct
from pathlib import Path
from typing import Any

import fastavro

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "typed"
IDS = FIXTURES / "ids"


def avro_schema(name: str) -> Any:
    return fastavro.parse_schema(json.loads((FIXTURES / name).read_text()))


def avro_payload(schema_file: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, avro_schema(schema_file), record)
    return buf.getvalue()


def varint(n: int) -> bytes:
    """An Avro int or long (zigzag varint), by hand: also a block count no schema-driven writer would write."""
    raw, out = (n << 1) ^ (n >> 63), bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    return bytes(out + bytes([raw]))


def confluent(schema_id: int, payload: bytes, index_bytes: bytes = b"") -> bytes:
    """Magic 0 and the big-endian id, by hand; ``index_bytes`` the protobuf message-index array as written."""
    return struct.pack(">bI", 0, schema_id) + index_bytes + payload


def customer_v1(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"Customer {i}", "email": f"c{i}@example.com" if i % 2 else None,
            "tags": [f"t{j}" for j in range(i % 3)], "scores": {"a": i, "b": -i} if i % 4 else {},
            "tier": ("BRONZE", "SILVER", "GOLD")[i % 3],
            "address": {"city": "Oslo", "zip": None if i % 5 else "0150"} if i % 6 else None,
            "balance": decimal.Decimal(i * 101) / 100, "since": dt.date(2020, 1, 1) + dt.timedelta(days=i),
            "updated": dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i * 1001)}


def customer_v2(i: int) -> dict[str, Any]:
    record = {k: v for k, v in customer_v1(i).items() if k != "email"}
    return {**record, "phone": f"+47{i:08d}" if i % 3 else None, "visits": i * 7}


def descriptor_set(out: Path) -> Path:
    """shop.proto compiled by protoc (grpcio-tools) into a descriptor set with its imports."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    target = out / "shop.desc"
    rc = protoc.main(["protoc", f"-I{FIXTURES}", f"-I{include}", "--include_imports",
                      f"--descriptor_set_out={target}", str(FIXTURES / "shop.proto")])
    assert rc == 0, "protoc failed on shop.proto"
    return target


def proto_classes(desc: Path) -> dict[str, Any]:
    """The runtime's message classes of a descriptor set, by full name."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    files = descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes()).file
    for f in files:
        pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
            for name in ("shop.Header", "shop.Customer")}


# JSON values and Avro string keys, written and read back here without globald's code (stdlib json, a hand-rolled
# Avro string reader), so that the typed tests compare globald with an independent decode.
JSON_FIELDS = ("name", "tags", "scores", "address", "balance", "since", "updated", "active")


def json_value(i: int, rnd: random.Random) -> bytes:
    """A customer as JSON text: fields missing at random, some the schema does not name; a few invalid JSON, a few
    with an id that is not an integer, a few JSON null."""
    roll = rnd.random()
    if roll < 0.04:
        return b'{"id": %d, "name": "cut sh' % i
    if roll < 0.07:
        return json.dumps({"id": f"x{i}", "name": "id is text"}).encode()
    if roll < 0.08:
        return b"null"
    doc: dict[str, Any] = {
        "id": i, "name": f"Customer {i} \u00f8", "tags": [f"t{j}" for j in range(i % 3)], "scores": {"a": i, "b": -i},
        "address": {"city": "Oslo", "zip": f"{i:04d}", "floor": i % 7}, "balance": i / 4,
        "since": (dt.date(2020, 1, 1) + dt.timedelta(days=i)).isoformat(),
        "updated": (dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i * 1001)).isoformat(),
        "active": bool(i % 2)}
    for f in JSON_FIELDS:
        if rnd.random() < 0.2:
            del doc[f]
    if "address" in doc and rnd.random() < 0.3:
        del doc["address"]["zip"]
    if rnd.random() < 0.3:
        doc.update(extra={"nested": [1, 2]}, loyalty="gold")
    return json.dumps(doc).encode()


def json_reference(payload: bytes, decimal_balance: bool) -> tuple[dict[str, Any] | None, bool]:
    """(the row Spark's from_json gives for customer.ddl, or for customer.schema.json when not
    ``decimal_balance``; whether the value is an error), by the standard library's json."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return None, True
    if doc is None:
        return None, False
    if not isinstance(doc.get("id"), int) or isinstance(doc["id"], bool):
        return None, True
    a, b, since, updated = doc.get("address"), doc.get("balance"), doc.get("since"), doc.get("updated")
    return {"id": doc["id"], "name": doc.get("name"), "tags": doc.get("tags"), "scores": doc.get("scores"),
            "address": None if a is None else {"city": a.get("city"), "zip": a.get("zip")},
            "balance": None if b is None else decimal.Decimal(str(b)) if decimal_balance else float(b),
            "since": None if since is None else dt.date.fromisoformat(since),
            "updated": None if updated is None else dt.datetime.fromisoformat(updated),
            "active": doc.get("active")}, False


def avro_string(text: str) -> bytes:
    return avro_payload("key.avsc", text)  # type: ignore[arg-type]


def string_key_reference(raw: bytes, ids: tuple[int, ...] = (1, 2)) -> str | None:
    """A Confluent-framed Avro string read by hand (magic, id, zigzag varint length, UTF-8); None where it is
    not one whole such string under one of ``ids``."""
    if len(raw) < 6 or raw[0] != 0 or int.from_bytes(raw[1:5], "big") not in ids:
        return None
    n = shift = 0
    at = 5
    while at < len(raw):
        byte = raw[at]
        n, shift, at = n | (byte & 0x7F) << shift, shift + 7, at + 1
        if not byte & 0x80:
            break
    length = (n >> 1) ^ -(n & 1)
    if length < 0 or at + length != len(raw):
        return None
    try:
        return raw[at:].decode("utf-8")
    except UnicodeDecodeError:
        return None


def json_records(n: int, keys: int, seed: int) -> list[tuple[bytes, bytes | None]]:
    rnd = random.Random(seed)
    return [(b"json-%04d" % rnd.randrange(keys), None if rnd.random() < 0.04 else json_value(i, rnd))
            for i in range(n)]


def keyed_records(n: int, keys: int, seed: int) -> list[tuple[bytes, bytes | None, int, None]]:
    """Avro string keys framed under ids 1 and 2 (so one logical key is often stored under two raw keys), a few
    under an unknown id or truncated (keys that do not decode); few distinct timestamps, so that ties happen."""
    rnd = random.Random(seed)
    out: list[tuple[bytes, bytes | None, int, None]] = []
    for i in range(n):
        text, sid, roll = f"user-{rnd.randrange(keys):04d}-\u00f8", rnd.choice((1, 2)), rnd.random()
        if roll < 0.03:
            key = confluent(9, avro_string(text))
        elif roll < 0.05:
            key = confluent(sid, avro_string(text)[:-1])  # cuts the ø in half
        else:
            key = confluent(sid, avro_string(text))
        value = None if rnd.random() < 0.04 else confluent(1, json_value(i, rnd))
        out.append((key, value, 1_700_000_000_000 + rnd.randrange(40), None))
    return out
