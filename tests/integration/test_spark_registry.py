"""A long-lived Spark application follows schema changes (issue 35), with real PySpark (local mode), the real daemon,
a real broker and the registry double: a new writer id is decoded at the next ``refresh()``, and a new reader
schema (the subject's latest, taken by the daemon at its restart) is read with its own schema by the same session,
in the driver and in its reused Python workers, because decoders are cached under the fingerprint the descriptor
carries. Before: 120 of 120 values kept the old schema, with no error. Every value is compared with fastavro's own
decode of the oracle fold at the descriptor's offsets."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest

from globald.spark import GlobalTableView
from tests.harness import Broker, DaemonProcess, oracle_at
from tests.integration.test_registry_daemon import V1, V2, encode
from tests.integration.test_spark import keys_df, spark
from tests.integration.test_spark_typed import rows_of
from tests.support.registry import RegistryDouble
from tests.unit.typed_fixtures import confluent, customer_v1, customer_v2

__all__ = ["spark"]  # a fixture, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.long]

SECTION = """[tables.value]
format = "avro"
framing = "confluent"
writer_schemas = "registry"
subject = "customers-value"
"""
KEYS = 120


@pytest.fixture
def registry() -> Iterator[RegistryDouble]:
    with RegistryDouble() as r:
        yield r


def expected(registry: RegistryDouble, reader: dict[str, Any], value: bytes) -> Any:
    writer = json.loads(registry.schemas[int.from_bytes(value[1:5], "big")].text)
    return fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(writer),
                                      fastavro.parse_schema(reader))


def joined(view: GlobalTableView, spark: Any, keys: list[bytes]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    desc = view.refresh()
    return desc, rows_of(view.join(keys_df(spark, keys), "k", error_col="err"))


def test_a_running_session_follows_new_writer_ids_and_a_new_reader_schema(
        spark: Any, broker: Broker, topic: Callable[..., str], daemon: Callable[..., DaemonProcess],
        tmp_path: Path, registry: RegistryDouble) -> None:
    t = topic()
    one = registry.register("customers-value", V1)
    keys = [b"cust-%04d" % i for i in range(KEYS)]
    broker.admin.produce(t, [(k, confluent(one, encode(V1, customer_v1(i)))) for i, k in enumerate(keys)])
    d = daemon({"cust": t}, start=False, registry={"url": registry.url, "timeout": 5})
    d.config.write_text(d.config.read_text() + SECTION)
    d.start()
    d.wait_running({"cust": broker.admin.end_offsets(t)})
    view = GlobalTableView(spark, d.config, "cust")

    def check(reader: dict[str, Any]) -> dict[str, Any]:
        desc, rows = joined(view, spark, keys)
        oracle = oracle_at(broker, t, desc["offsets"])
        assert len(rows) == KEYS and set(oracle) == set(keys)
        for r in rows:
            assert r["err"] is None and r["value"] == expected(registry, reader, oracle[r["k"].encode()]), r["k"]
        return desc

    first = check(V1)

    # A producer registers v2 and writes a third of the keys with it: a new writer id, seen at the next refresh.
    two = registry.register("customers-value", V2)
    broker.admin.produce(t, [(k, confluent(two, encode(V2, customer_v2(i)))) for i, k in enumerate(keys[::3])])
    d.wait_running({"cust": broker.admin.end_offsets(t)})
    second = check(V1)  # the reader schema in force is still v1, the one the daemon took at start
    assert second.get("decoder") == first.get("decoder") and second["snapshot"] != first["snapshot"]

    # The daemon restarts and takes the subject's latest, v2, as its reader schema: the same session reads the new
    # version with v2 (its fields phone and visits in every row), in the driver and in every reused worker.
    d.stop()
    d.start()
    d.wait_running({"cust": broker.admin.end_offsets(t)})
    third = check(V2)
    assert third.get("decoder") != second.get("decoder")
    assert "reader schema: table cust value: moved customers-value from version 1 to 2" in d.tail(200)
    view.close()


def test_several_record_types_in_one_topic_read_as_one_struct_field_per_type(
        spark: Any, broker: Broker, topic: Callable[..., str], daemon: Callable[..., DaemonProcess],
        registry: RegistryDouble) -> None:
    """TopicRecordNameStrategy: customers and orders in one topic, each type under its own subject, the reader
    schema a union of both (through references): in Spark, ``value`` is struct<Customer, Order>, exactly one set."""
    from tests.unit.test_registry import CUSTOMER, ORDER, ORDER_V1

    t = topic()
    customer = registry.register(f"{t}-shop.Customer", CUSTOMER)
    order = registry.register(f"{t}-shop.Order", ORDER_V1)  # an older Order: its records take lines' default
    registry.register(f"{t}-shop.Order", ORDER)
    registry.register("events-value", ["shop.Customer", "shop.Order"], references=[
        {"name": "shop.Customer", "subject": f"{t}-shop.Customer", "version": 1},
        {"name": "shop.Order", "subject": f"{t}-shop.Order", "version": 2}])
    records = [(b"c-%d" % i, confluent(customer, encode(CUSTOMER, {"id": i, "name": f"n{i}"}))) for i in range(40)]
    records += [(b"o-%d" % i, confluent(order, encode(ORDER_V1, {"total": i / 4}))) for i in range(40)]
    records.append((b"c-3", confluent(order, encode(ORDER_V1, {"total": 99.0}))))  # a key whose type changes
    broker.admin.produce(t, records)
    d = daemon({"ev": t}, start=False, registry={"url": registry.url, "timeout": 5})
    d.config.write_text(d.config.read_text() + SECTION.replace("customers-value", "events-value"))
    d.start()
    d.wait_running({"ev": broker.admin.end_offsets(t)})
    view = GlobalTableView(spark, d.config, "ev")
    desc = view.refresh()
    oracle = oracle_at(broker, t, desc["offsets"])
    keys = sorted(oracle)
    df = view.join(keys_df(spark, keys), "k", error_col="err")
    assert df.schema["value"].dataType.simpleString() == \
        "struct<Customer:struct<id:bigint,name:string>,Order:struct<total:double,lines:int>>"

    def want(value: bytes) -> dict[str, Any]:
        sid = int.from_bytes(value[1:5], "big")
        got = expected(registry, CUSTOMER if sid == customer else ORDER, value)
        return {"Customer": got, "Order": None} if sid == customer else {"Customer": None, "Order": got}

    rows = rows_of(df)
    assert len(rows) == len(oracle) and all(r["err"] is None for r in rows)
    assert {r["k"]: r["value"] for r in rows} == {k.decode(): want(v) for k, v in oracle.items()}
    assert {r["k"]: r["value"]["Order"] for r in rows}["c-3"] == {"total": 99.0, "lines": 1}
    orders = df.where("value.Order IS NOT NULL").selectExpr("k", "value.Order.total AS total").collect()
    assert sorted((r["k"], r["total"]) for r in orders) == sorted(
        [(f"o-{i}", i / 4) for i in range(40)] + [("c-3", 99.0)])
    flat = view.join(keys_df(spark, keys), "k", flatten=True)
    assert {"value_Customer", "value_Order"} <= set(flat.columns)
    view.close()
