"""The identity check (globald.kafka.identity) of a table far behind its log, on a real broker.

Found by an accelerated soak: a table 260k records behind, whose newest fingerprints lay far back in three busy
partitions and at the end of a quiet one. The check's consumer, with the daemon's prefetch, queued thousands of
records of each busy partition ahead of the quiet one's single record and skipped them one by one, so in a loaded
process it missed its bound at every refresh: the loop waited 2 s per refresh, fell further behind, and the table
flapped degraded. The check must read about one small fetch per partition, however far behind the rungs are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from globald.kafka import identity
from globald.kafka.identity import Fingerprint, record_fingerprint, verify
from tests.harness import Broker

pytestmark = pytest.mark.kafka

BUSY = 60_000  # records in the busy partition, behind the rung
VALUE = 100


def _fingerprint(broker: Broker, topic: str, partition: int, offset: int) -> Fingerprint:
    c = Consumer({**broker.settings, "group.id": "identity-test", "enable.auto.commit": False, "log_level": 3})
    try:
        c.assign([TopicPartition(topic, partition, offset)])
        for _ in range(100):
            m = c.poll(0.2)
            if m is not None and m.error() is None and m.offset() == offset:
                return record_fingerprint(m)
    finally:
        c.close()
    raise AssertionError(f"{topic}[{partition}] has no record at {offset}")


def test_a_check_far_behind_busy_partitions_reads_about_one_fetch_of_each(
        broker: Broker, topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    t = topic(partitions=2)
    broker.admin.produce(t, [(b"busy-%d" % (i % 500), b"x" * VALUE) for i in range(BUSY)], partition=0)
    broker.admin.produce(t, [(b"quiet", b"the only record")], partition=1)
    rungs = {0: (_fingerprint(broker, t, 0, 10),), 1: (_fingerprint(broker, t, 1, 0),)}

    delivered: list[int] = []

    class Counting(identity.Consumer):  # type: ignore[misc]
        """Counts every record the check's consumer hands it, however it asks."""

        def consume(self, *args: Any, **kwargs: Any) -> Any:
            batch = super().consume(*args, **kwargs)
            delivered.extend(m.partition() for m in batch)
            return batch

        def poll(self, *args: Any, **kwargs: Any) -> Any:
            m = super().poll(*args, **kwargs)
            if m is not None:
                delivered.append(m.partition())
            return m

    monkeypatch.setattr(identity, "Consumer", Counting)
    settings = {**broker.settings, "group.id": "globald", "queued.min.messages": 20_000}  # the daemon's prefetch
    reader = identity.RecordReader(settings, threading.Event().wait)
    try:
        verdict = verify(reader, t, rungs, 30.0)
    finally:
        reader.close()
    assert (verdict.mismatches, verdict.unreachable, verdict.unverifiable) == ({}, {}, {})
    busy = delivered.count(0)
    # 64 KiB of ~120-byte records is ~550; the prefetch alone was 20,000 and more.
    assert 0 < busy <= 2_000, f"the check was handed {busy} records of the busy partition to find one"


def test_one_reader_answers_each_round_with_its_own_records(broker: Broker, topic: Callable[..., str]) -> None:
    """The check's consumer lives for the daemon's life (kafka.worker): a round that asks an older offset after a
    newer one, on the same partition, is answered with the older record, never with one fetched for the round
    before (a check reads the newest rung first, then the older ones)."""
    t = topic(partitions=1)
    broker.admin.produce(t, [(b"k%d" % i, b"v%d" % i) for i in range(500)], partition=0)
    newest, oldest = _fingerprint(broker, t, 0, 480), _fingerprint(broker, t, 0, 3)
    reader = identity.RecordReader({**broker.settings, "group.id": "globald"}, threading.Event().wait)
    try:
        for _ in range(3):
            assert reader.read(t, {0: 480}, time.monotonic() + 30) == {0: (480, newest.digest)}
            assert reader.read(t, {0: 3}, time.monotonic() + 30) == {0: (3, oldest.digest)}
        # a whole check, newest rung first, on the same consumer
        verdict = verify(reader, t, {0: (newest, oldest)}, 30.0)
        assert (verdict.mismatches, verdict.unreachable, verdict.unverifiable) == ({}, {}, {})
        wrong = identity.Fingerprint(3, b"\0" * 8)
        assert verify(reader, t, {0: (wrong,)}, 30.0).recreated
    finally:
        reader.close()
