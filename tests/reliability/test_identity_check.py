"""The identity check (globald.kafka.identity) of a table far behind its log, on a real broker.

Found by an accelerated soak: a table 260k records behind, whose newest fingerprints lay far back in three busy
partitions and at the end of a quiet one. The check's consumer, with the daemon's prefetch, queued thousands of
records of each busy partition ahead of the quiet one's single record and skipped them one by one, so in a loaded
process it missed its bound at every refresh: the loop waited 2 s per refresh, fell further behind, and the table
flapped degraded. The check must read about one small fetch per partition, however far behind the rungs are.
"""

from __future__ import annotations

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
    verdict = verify(settings, t, rungs, 30.0)
    assert (verdict.mismatches, verdict.unreachable, verdict.unverifiable) == ({}, {}, {})
    busy = delivered.count(0)
    # 64 KiB of ~120-byte records is ~550; the prefetch alone was 20,000 and more.
    assert 0 < busy <= 2_000, f"the check was handed {busy} records of the busy partition to find one"
