"""Protobuf from the Schema Registry against the real daemon, a real broker (Kafka 0.9) and the real
``SchemaRegistryClient`` talking to the registry double: a schema importing another through a registry reference,
message index [1]; a new writer id registered mid-run decodes without a restart; an outage leaves pending decodes
that resolve on the same snapshot; a restart with the registry down decodes every id it cached. Every decoded row
is compared with the oracle fold at the snapshot's offsets, each value parsed by the message class protoc builds
(not globald) and written out by hand (``expected``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Broker, DaemonProcess, oracle_at
from tests.integration.test_registry_daemon import check_decoded, decoded_at
from tests.support.registry import RegistryDouble
from tests.unit.test_registry_protobuf import (
    CUSTOMER_V1,
    CUSTOMER_V2,
    INDEX,
    classes,
    customer,
    expected,
    register_customer,
)
from tests.unit.typed_fixtures import confluent

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
# v3, registered while the registry is down: one more field again.
CUSTOMER_V3 = CUSTOMER_V2.replace("  int32 visits = 8;\n", "  int32 visits = 8;\n  string note = 9;\n")
SECTION = """[tables.value]
format = "protobuf"
message = "shop.Customer"
framing = "confluent"
writer_schemas = "registry"
subject = "customers-value"
"""


def produced(sid: int, cls: Any, n: int, keys: int, start: int) -> list[tuple[bytes, bytes | None]]:
    """Customers ``start``.. under id ``sid``, on ``keys`` keys, every 7th a tombstone."""
    return [(b"cust-%04d" % ((start + i) % keys), None if i % 7 == 3 else
             confluent(sid, customer(cls, start + i), INDEX)) for i in range(n)]


def check_file(d: DaemonProcess, broker: Broker, topic: str, v1: Any, decode: dict[str, Any]) -> None:
    """The decoded file's rows against the oracle fold at its offsets, each parsed with the v1 reader's class."""
    check_decoded(d, broker, topic, decode, lambda value: expected(v1.FromString(value[5 + len(INDEX):]).id))


@pytest.mark.long
def test_protobuf_with_a_reference_new_ids_mid_run_an_outage_and_a_restart_with_the_registry_down(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    v1, v2, v3 = (classes(tmp_path, text) for text in (CUSTOMER_V1, CUSTOMER_V2, CUSTOMER_V3))
    with RegistryDouble() as registry:
        one = register_customer(registry)
        broker.admin.produce(t, produced(one, v1, 300, keys=120, start=0))
        d = daemon({"cust": t}, start=False, snapshots={"decode_interval_ms": 500},
                   registry={"url": registry.url, "timeout": 5})
        d.config.write_text(d.config.read_text() + SECTION)
        d.start()
        check_file(d, broker, t, v1, decoded_at(d, broker.admin.end_offsets(t)))
        assert "took customers-value version 1" in d.tail(200)

        # A producer deploys v2 mid-run: its id is fetched when its first record is decoded, no restart.
        two = register_customer(registry, CUSTOMER_V2)
        broker.admin.produce(t, produced(two, v2, 300, keys=120, start=1000))
        check_file(d, broker, t, v1, decoded_at(d, broker.admin.end_offsets(t)))
        assert registry.requests[f"GET /schemas/ids/{two}"] >= 1
        assert (d.state_dir / "registry" / "schemas" / f"{two}.desc").exists()

        # An outage, and v3 deployed meanwhile: its values are pending decodes, then decoded once it answers.
        registry.stop()
        three = register_customer(registry, CUSTOMER_V3)
        broker.admin.produce(t, produced(three, v3, 50, keys=120, start=2000))
        decode = decoded_at(d, broker.admin.end_offsets(t))
        oracle = oracle_at(broker, t, decode["offsets"])
        waiting = [k for k, v in oracle.items() if v is not None and v[1:5] == three.to_bytes(4, "big")]
        assert waiting and decode["pending"] == len(waiting) == decode["errors"], decode
        snapshot = decode["snapshot"]
        registry.start()
        decode = d.wait_for(lambda s: (s["tables"]["cust"].get("decode") or {}).get("pending") == 0 and
                            s["tables"]["cust"]["decode"]["snapshot"] == snapshot, timeout=120,
                            what="the pending values decoded")["tables"]["cust"]["decode"]
        check_file(d, broker, t, v1, decode)

        # A restart with the registry down: run starts, says so, and decodes every id it cached.
        d.stop()
        registry.stop()
        broker.admin.produce(t, produced(one, v1, 40, keys=120, start=3000) +
                             produced(three, v3, 40, keys=120, start=4000))
        d.start()
        check_file(d, broker, t, v1, decoded_at(d, broker.admin.end_offsets(t)))
        assert "decoding with the 3 schema(s) cached in state_dir" in d.tail(400)
