"""A long-lived Spark application reads a Protobuf table whose schemas come from the Schema Registry (issue 35), with
real PySpark (local mode), the real daemon, a real broker and the registry double: the subject's schema imports
another through a reference, a new writer id is decoded at the next ``refresh()``, and the reader schema the
daemon takes again at its restart (v2, two more fields) is read by the same session. Every row is compared with
the oracle fold at the descriptor's offsets, each value parsed with protoc's message class and written out by
hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.spark import GlobalTableView
from tests.harness import Broker, DaemonProcess, oracle_at
from tests.integration.test_registry_protobuf_daemon import SECTION, produced
from tests.integration.test_spark import keys_df, spark
from tests.integration.test_spark_typed import rows_of
from tests.support.registry import RegistryDouble
from tests.unit.test_registry_protobuf import CUSTOMER_V1, CUSTOMER_V2, INDEX, classes, expected, register_customer

__all__ = ["spark"]  # a fixture, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.long]

KEYS = 120


def test_a_running_session_reads_a_protobuf_registry_table_and_follows_its_schemas(
        spark: Any, broker: Broker, topic: Callable[..., str], daemon: Callable[..., DaemonProcess],
        tmp_path: Path) -> None:
    t = topic()
    v1, v2 = classes(tmp_path, CUSTOMER_V1), classes(tmp_path, CUSTOMER_V2)
    with RegistryDouble() as registry:
        one = register_customer(registry)
        broker.admin.produce(t, produced(one, v1, KEYS, keys=KEYS, start=0))
        d = daemon({"cust": t}, start=False, registry={"url": registry.url, "timeout": 5})
        d.config.write_text(d.config.read_text() + SECTION)
        d.start()
        d.wait_running({"cust": broker.admin.end_offsets(t)})
        view = GlobalTableView(spark, d.config, "cust")

        def check(want: Callable[[bytes], dict[str, Any]]) -> dict[str, Any]:
            desc = view.refresh()
            oracle = oracle_at(broker, t, desc["offsets"])
            keys = sorted(oracle)
            rows = {r["k"]: r for r in rows_of(view.join(keys_df(spark, keys), "k", error_col="err"))}
            assert len(rows) == len(oracle) > KEYS // 2
            for k, v in oracle.items():
                assert rows[k.decode()]["err"] is None and rows[k.decode()]["value"] == want(v), k
            return desc

        def as_v1(value: bytes) -> dict[str, Any]:
            return expected(v1.FromString(value[5 + len(INDEX):]).id)

        first = check(as_v1)

        # A producer registers v2 and writes a third of the keys with it: a new writer id, seen at the next refresh.
        two = register_customer(registry, CUSTOMER_V2)
        broker.admin.produce(t, produced(two, v2, KEYS // 3, keys=KEYS, start=0))
        d.wait_running({"cust": broker.admin.end_offsets(t)})
        second = check(as_v1)  # the reader in force is still v1, the one the daemon took at start
        assert second.get("decoder") == first.get("decoder") and second["snapshot"] != first["snapshot"]

        # The daemon restarts and takes the subject's latest, v2: the same session reads phone and visits, set on
        # the records written with v2, unset (null, and proto3's default 0) on those written with v1.
        d.stop()
        d.start()
        d.wait_running({"cust": broker.admin.end_offsets(t)})

        def as_v2(value: bytes) -> dict[str, Any]:
            m = v2.FromString(value[5 + len(INDEX):])
            written_v2 = int.from_bytes(value[1:5], "big") == two
            return {**expected(m.id), "phone": f"+47{m.id:08d}" if written_v2 else None,
                    "visits": m.id * 7 if written_v2 else 0}

        third = check(as_v2)
        assert third.get("decoder") != second.get("decoder")
        assert "moved customers-value from version 1 to 2" in d.tail(200)
        view.close()
