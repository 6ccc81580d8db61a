"""A topic recreated with more records, on a broker with topic IDs (KIP-516): the changed ID alone tells the new
topic from the old one, and the table is rebuilt from it (reason ``topic_recreated``).

Only while the daemon is stopped: with librdkafka 2.16, a consumer assigned a Tansu topic that is deleted dies
in librdkafka's main thread (SIGSEGV, a NULL string compared), globald or not; Kafka 0.9 covers the running case
(tests/reliability/test_recreated_topic.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.harness import Broker, DaemonProcess
from tests.tansu.data import BASE_TS, expected_table, timed_records, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]


def test_topic_recreated_while_stopped_is_rebuilt_by_its_new_id(broker: Broker, topic: Callable[..., str],
                                                                daemon: Daemon) -> None:
    t = topic()
    old = timed_records(600, keys=200, seed=170)
    broker.admin.produce(t, old)
    d = daemon({"tbl": t})
    wait_for_table(d, "tbl", expected_table(old))
    assert d.stop() == 0
    broker.admin.delete(t)
    broker.admin.create(t, partitions=3)
    new = timed_records(1_500, keys=200, seed=171, base_ts=BASE_TS + 500_000_000)
    broker.admin.produce(t, new)
    d.start()
    wait_for_table(d, "tbl", expected_table(new), timeout=90)
    log = d.log.read_text()
    assert "WIPE (topic_recreated)" in log and "its topic ID is" in log, d.tail()
