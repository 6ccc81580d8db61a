"""Shared by the typed-table tests: the schema files of tests/fixtures/typed and reference encoders.

Records are written with fastavro and the protobuf runtime directly, and framed by hand (struct), so that what the
tests feed the decoders never comes from globald's own code path.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
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
