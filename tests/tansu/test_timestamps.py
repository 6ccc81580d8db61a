"""Record timestamps end to end on a modern-protocol broker (KIP-258): a value carries exactly the CreateTime of the
record it came from in the store, ``globald get``, ``globald dump`` and snapshots; headers are ignored; tombstones
delete; binary keys round-trip. On Kafka 0.9 every record lacks a timestamp, so only this lane proves it."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

from tests.harness import Broker, DaemonProcess, globald
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.support.oracle import fold_timestamped
from tests.tansu.data import expected_table, timed_records, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]


def _get(d: DaemonProcess, table: str, key: bytes) -> dict[str, object]:
    r = globald("get", "--config", str(d.config), "--table", table, "--key-format", "hex", key.hex(), "--json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert isinstance(doc, dict)
    return doc


def test_create_times_reach_store_get_dump_and_snapshots(broker: Broker, topic: Callable[..., str],
                                                         daemon: Daemon) -> None:
    t = topic()
    records = timed_records(3_000, keys=500, seed=150)
    broker.admin.produce(t, records)
    want = expected_table(records)
    ends = broker.admin.end_offsets(t)
    # The broker kept every CreateTime it was given: the oracle, read back from it, agrees with what was produced.
    assert fold_timestamped(broker.settings, t, ends) == want
    assert any(k.startswith(b"\x00\xff") for k in want) and any(k.startswith(b"key-") for k in want)

    d = daemon({"tbl": t}, snapshots={"interval_ms": 200, "retain": 3})
    wait_for_table(d, "tbl", want)  # the live store, through `globald dump`

    for key, (value, ts) in list(want.items())[:: max(1, len(want) // 8)]:
        doc = _get(d, "tbl", key)
        assert doc["found"] is True and doc["timestamp"] == ts, doc
        assert doc["value_base64"] == base64.b64encode(value).decode(), doc
    deleted = next(k for k, v, _, _ in reversed(records) if k is not None and v is None and k not in want)
    assert _get(d, "tbl", deleted)["found"] is False  # a tombstone deleted it

    snap = wait_snapshot_at(d, "tbl", ends)
    wait_for_table(d, "tbl", want, snapshot=snap["id"])

    # Tailing: later records with other timestamps replace values and their timestamps alike.
    later = timed_records(600, keys=500, seed=151, base_ts=max(ts for _, ts in want.values()) + 10_000_000)
    broker.admin.produce(t, later)
    want = expected_table(later, want)
    wait_for_table(d, "tbl", want)
    snap = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))
    wait_for_table(d, "tbl", want, snapshot=snap["id"])
    assert d.status()["tables"]["tbl"]["wipes"] == 0


def test_record_without_timestamp_carries_the_producer_clock(broker: Broker, topic: Callable[..., str],
                                                           daemon: Daemon) -> None:
    """A producer that sets no timestamp: librdkafka stamps CreateTime with its own clock at produce time (a record
    on the modern protocol always has one; -1 is only what Kafka 0.9's records give, tested on that lane)."""
    t = topic(partitions=1)
    before = int(time.time() * 1000)
    broker.admin.produce(t, [(b"no-ts", b"v1")])
    after = int(time.time() * 1000)
    want = fold_timestamped(broker.settings, t, broker.admin.end_offsets(t))
    (value, ts), = want.values()
    assert value == b"v1" and before <= ts <= after
    wait_for_table(daemon({"tbl": t}), "tbl", want)


def test_log_append_time_topic_stores_the_broker_time(broker: Broker, daemon: Daemon) -> None:
    """On a topic with message.timestamp.type=LogAppendTime the broker replaces the producer's timestamp with its
    own; globald stores what the record carries. Tansu ignores the setting (the producer's time comes back), so there
    this checks only that the store equals the records, and the rewrite itself is skipped."""
    t = f"lat{os.getpid()}-{time.monotonic_ns()}"
    broker.admin.create(t, partitions=1, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    broker.admin.produce(t, [(b"k", b"v", 1_000, None)])
    after = int(time.time() * 1000)
    d = daemon({"tbl": t})
    want = fold_timestamped(broker.settings, t, broker.admin.end_offsets(t))
    wait_for_table(d, "tbl", want)

    c = Consumer({**broker.settings, "group.id": "globald-tests", "log_level": 3})
    try:
        c.assign([TopicPartition(t, 0, 0)])
        m = c.poll(30)
        assert m is not None and m.error() is None
        ts_type, ts = m.timestamp()
    finally:
        c.close()
    assert want[b"k"][1] == ts
    if ts_type != TIMESTAMP_LOG_APPEND_TIME:
        assert ts == 1_000
        pytest.skip("the broker ignores message.timestamp.type=LogAppendTime (Tansu): no rewritten timestamp to store")
    assert before <= ts <= after + 5_000
