"""Protobuf from the Schema Registry (issue 35): the real ``SchemaRegistryClient`` against the registry double
(tests/support/registry.py), no broker. A schema that imports another through a registry reference and a
well-known type; writer ids fetched as serialized descriptors when first met, cached durably as descriptor sets
(a writer_schemas directory), decoded from that cache with the registry down; an outage is a pending decode; the
reader's message named by ``message`` in the subject's schema. Records are written with message classes protoc
(grpcio-tools) builds from the same .proto texts, never through globald."""

from __future__ import annotations

import base64
import datetime as dt
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald import typed
from globald.common.errors import ConfigError
from globald.settings.config import Config, load
from globald.typed.arrow import PendingSchema, python_rows
from globald.typed.registry import take_reader_schemas
from tests.harness import globald
from tests.support.registry import RegistryDouble
from tests.unit.test_registry import write_config
from tests.unit.typed_fixtures import confluent

ADDRESS = """syntax = "proto3";
package common;
message Address {
  string city = 1;
  string zip = 2;
}
"""
CUSTOMER_V1 = """syntax = "proto3";
package shop;
import "common/address.proto";
import "google/protobuf/timestamp.proto";

// Customer is second in the file: its Confluent message index is [1].
message Envelope { string source = 1; int32 shard = 2; }

message Customer {
  enum Tier { BRONZE = 0; SILVER = 1; GOLD = 2; }
  int64 id = 1;
  string name = 2;
  repeated string tags = 3;
  Tier tier = 4;
  common.Address address = 5;
  google.protobuf.Timestamp updated = 6;
}
"""
# v2, deployed mid-run: two more fields the v1 reader does not know (protobuf skips them).
CUSTOMER_V2 = CUSTOMER_V1.replace("  google.protobuf.Timestamp updated = 6;\n",
                                  "  google.protobuf.Timestamp updated = 6;\n  optional string phone = 7;\n"
                                  "  int32 visits = 8;\n")
INDEX = b"\x02\x02"  # the message-index array [1], zigzag varints: Customer
ADDRESS_REF = [{"name": "common/address.proto", "subject": "common-address", "version": 1}]
TIERS = ("BRONZE", "SILVER", "GOLD")


def register_customer(registry: RegistryDouble, text: str = CUSTOMER_V1) -> int:
    """What a producer's deployment does: the imported file under its own subject, then the schema naming it."""
    registry.register("common-address", ADDRESS, kind="PROTOBUF")
    return registry.register("customers-value", text, kind="PROTOBUF", references=ADDRESS_REF)


def classes(tmp_path: Path, text: str) -> Any:
    """The Customer message class protoc builds from ``text`` and address.proto (not globald's code)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    src = tmp_path / f"src-{abs(hash(text))}"
    (src / "common").mkdir(parents=True, exist_ok=True)
    (src / "common" / "address.proto").write_text(ADDRESS)
    (src / "customer.proto").write_text(text)
    out = src / "set.desc"
    assert protoc.main(["protoc", f"-I{src}", f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
                        "--include_imports", f"--descriptor_set_out={out}", str(src / "customer.proto")]) == 0
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Customer"))


def customer(cls: Any, i: int) -> bytes:
    m = cls(id=i, name=f"Customer {i}", tags=[f"t{j}" for j in range(i % 3)], tier=i % 3)
    if i % 2:
        m.address.city, m.address.zip = "Oslo", f"0{i}"
    m.updated.seconds, m.updated.nanos = 1_700_000_000 + i, 123_456_000
    if "phone" in cls.DESCRIPTOR.fields_by_name:
        m.phone, m.visits = f"+47{i:08d}", i * 7
    return m.SerializeToString()


def expected(i: int) -> dict[str, Any]:
    """The row of customer ``i`` as the v1 reader reads it, written out by hand."""
    return {"id": i, "name": f"Customer {i}", "tags": [f"t{j}" for j in range(i % 3)], "tier": TIERS[i % 3],
            "address": {"city": "Oslo", "zip": f"0{i}"} if i % 2 else None,
            "updated": dt.datetime(2023, 11, 14, 22, 13, 20, 123_456, tzinfo=dt.UTC) + dt.timedelta(seconds=i)}


@pytest.fixture
def registry() -> Iterator[RegistryDouble]:
    with RegistryDouble() as r:
        yield r


FROM_REGISTRY = 'message = "shop.Customer"\nwriter_schemas = "registry"\nsubject = "customers-value"'


def decoder(config: Config) -> typed.arrow.Decoder:
    return typed.load_table(config, "customers")[1]


def row(dec: typed.arrow.Decoder, value: bytes) -> Any:
    got = dec.decode(pa.array([value], pa.binary()))
    assert got.error_count == 0, got.errors.to_pylist()
    return python_rows(got.values)[0]


def test_the_double_serves_a_protobuf_schema_serialized_as_the_registry_does(registry: RegistryDouble) -> None:
    sid = register_customer(registry)
    from google.protobuf import descriptor_pb2

    def get(path: str) -> Any:
        with urllib.request.urlopen(registry.url + path) as r:
            return json.loads(r.read())

    doc = get(f"/schemas/ids/{sid}")
    assert doc["schema"] == CUSTOMER_V1 and doc["schemaType"] == "PROTOBUF" and doc["references"] == ADDRESS_REF
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(get(f"/schemas/ids/{sid}?format="
                                                                               "serialized")["schema"]))
    assert [m.name for m in proto.message_type] == ["Envelope", "Customer"]
    assert list(proto.dependency) == ["common/address.proto", "google/protobuf/timestamp.proto"]
    version = get("/subjects/common-address/versions/1?deleted=false&format=serialized")
    assert version["version"] == 1 and descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(version["schema"])).message_type[0].name == "Address"
    for bad, refs in (("syntax = \"proto3\"; message {", []),
                      (CUSTOMER_V1, [{"name": "common/address.proto", "subject": "nope", "version": 1}])):
        request = urllib.request.Request(registry.url + "/subjects/x-value/versions", method="POST",
                                         data=json.dumps({"schema": bad, "schemaType": "PROTOBUF",
                                                          "references": refs}).encode(),
                                         headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request)
        assert e.value.code == 422 and json.loads(e.value.read())["error_code"] == 42201


def test_writer_ids_with_an_import_are_fetched_cached_and_decode_with_the_registry_down(
        tmp_path: Path, registry: RegistryDouble) -> None:
    one = register_customer(registry)
    config = load(write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf"))
    assert take_reader_schemas(config)[0][0]
    dec = decoder(config)
    v1, v2 = classes(tmp_path, CUSTOMER_V1), classes(tmp_path, CUSTOMER_V2)
    assert row(dec, confluent(one, customer(v1, 1), INDEX)) == expected(1)
    # A producer deploys v2 while the reader runs: its id is fetched when its first record arrives.
    two = register_customer(registry, CUSTOMER_V2)
    values = pa.array([confluent(two, customer(v2, i), INDEX) for i in range(6)], pa.binary())
    got = dec.decode(values)
    assert got.error_count == 0 and python_rows(got.values) == [expected(i) for i in range(6)]
    assert registry.requests[f"GET /schemas/ids/{two}"] == 1
    cached = config.state_dir / "registry" / "schemas"
    assert sorted(p.name for p in cached.iterdir()) == [f"{one}.desc", f"{two}.desc"]
    # The cache is a writer_schemas directory: a file-form table naming it decodes the same, registry or not.
    registry.stop()
    from google.protobuf import descriptor_pb2

    names = [f.name for f in descriptor_pb2.FileDescriptorSet.FromString((cached / f"{two}.desc").read_bytes()).file]
    assert names == ["google/protobuf/timestamp.proto", "common/address.proto", f"schema-{two}.proto"]
    # A restart with the registry down decodes every id seen before, with the reader the daemon pinned.
    again = decoder(config)
    assert python_rows(again.decode(values).values) == [expected(i) for i in range(6)]
    assert row(again, confluent(one, customer(v1, 9), INDEX)) == expected(9)


def test_an_outage_is_a_pending_decode_then_decoded(tmp_path: Path, registry: RegistryDouble) -> None:
    one = register_customer(registry)
    config = load(write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf"))
    take_reader_schemas(config)
    v2 = classes(tmp_path, CUSTOMER_V2)
    registry.stop()
    two = register_customer(registry, CUSTOMER_V2)  # registered while the reader cannot see it
    dec = decoder(config)
    got = dec.decode(pa.array([confluent(two, customer(v2, 3), INDEX)], pa.binary()))
    assert got.pending == (two,) and got.errors[0].as_py().startswith(f"schema {two} not yet fetched (registry")
    registry.start()
    fresh = decoder(config)  # another process: its own retry clock
    assert fresh.available([two]) and row(fresh, confluent(two, customer(v2, 3), INDEX)) == expected(3)
    assert one != two


def test_the_reader_message_is_named_by_message_and_a_record_of_another_is_an_error(
        tmp_path: Path, registry: RegistryDouble) -> None:
    sid = register_customer(registry)
    config = load(write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf"))
    take_reader_schemas(config)
    header = confluent(sid, b"\x0a\x01x", b"\x00")  # index [0]: a shop.Envelope
    got = decoder(config).decode(pa.array([header], pa.binary()))
    assert "the record is a shop.Envelope (message index [0]), the table reads shop.Customer" in got.errors[0].as_py()
    # A message from the imported file is a reader too (its records' indexes then name it in their own schema).
    text = write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf").read_text()
    (tmp_path / "g.toml").write_text(text.replace('"shop.Customer"', '"common.Address"'))
    assert decoder(load(tmp_path / "g.toml")).arrow_type == pa.struct([("city", pa.string()), ("zip", pa.string())])
    (tmp_path / "g.toml").write_text(text.replace('"shop.Customer"', '"shop.Nope"'))
    with pytest.raises(ConfigError, match=r"tables\[0\].value.message: no message shop.Nope in subject "
                                          "customers-value"):
        decoder(load(tmp_path / "g.toml"))


def test_a_schema_of_another_type_or_not_in_the_registry_is_a_decode_error_not_pending(
        tmp_path: Path, registry: RegistryDouble) -> None:
    register_customer(registry)
    avro = registry.register("other-value", '{"type": "string"}')
    config = load(write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf"))
    take_reader_schemas(config)
    got = decoder(config).decode(pa.array([confluent(avro, b"", INDEX), confluent(99, b"", INDEX)], pa.binary()))
    assert got.pending == () and f"schema {avro} is AVRO, not PROTOBUF" in got.errors[0].as_py()
    assert "schema 99 is not in the registry" in got.errors[1].as_py()
    with pytest.raises(PendingSchema):
        registry.stop()
        decoder(config).decode_value(confluent(98, b"", INDEX))


def test_check_config_reaches_the_registry_and_names_a_message_the_subject_lacks(
        tmp_path: Path, registry: RegistryDouble) -> None:
    register_customer(registry)
    good = write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf")
    done = globald("check-config", "--config", str(good))
    assert done.returncode == 0, done.stderr
    good.write_text(good.read_text().replace('"shop.Customer"', '"shop.Order"'))
    done = globald("check-config", "--config", str(good))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "globald: config error: tables[0].value.message: no message shop.Order in subject customers-value"], done.stderr


def test_records_written_by_confluents_own_protobuf_serializer_decode(tmp_path: Path,
                                                                      registry: RegistryDouble) -> None:
    """The framing (id, message-index array) as Confluent's ProtobufSerializer writes it, for the subject's latest
    version, read back by a protobuf registry table."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    sid = register_customer(registry)
    v1 = classes(tmp_path, CUSTOMER_V1)
    serializer = ProtobufSerializer(v1, SchemaRegistryClient({"url": registry.url}), {
        "auto.register.schemas": False, "use.latest.version": True, "use.deprecated.format": False})
    context = SerializationContext("customers", MessageField.VALUE)
    values = [serializer(v1.FromString(customer(v1, i)), context) for i in range(5)]
    assert all(v[:5] == confluent(sid, b"") for v in values)
    config = load(write_config(tmp_path, registry.url, FROM_REGISTRY, fmt="protobuf"))
    take_reader_schemas(config)
    got = decoder(config).decode(pa.array(values, pa.binary()))
    assert got.error_count == 0 and python_rows(got.values) == [expected(i) for i in range(5)]
