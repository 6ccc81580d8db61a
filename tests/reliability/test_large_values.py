"""Values of 1 MB and more, on a broker of the module's own configured to accept them (a 0.9 broker refuses
messages over ~1 MB by default). The daemon runs with the client defaults for fetch sizes: a value larger than
a fetch must still arrive whole, never stall the partition, and equal the oracle byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.harness import Broker, DaemonProcess, random_records
from tests.reliability.checks import check_store, live, same_process
from tests.reliability.conftest import new_topic
from tests.reliability.ledger import FaultRow
from tests.support.admin import TopicAdmin

pytestmark = pytest.mark.kafka

MAX = 16 * 1024 * 1024
BROKER_PROPS = {"message.max.bytes": str(MAX), "replica.fetch.max.bytes": str(MAX)}
Own = tuple[Broker, Callable[..., DaemonProcess]]


def test_values_of_one_megabyte_and_more(own: Own, fault: Callable[[str, str], FaultRow]) -> None:
    broker, make = own
    row = fault("values of 1 MB to 12 MB among small ones", "stored whole, equal to the oracle")
    t = new_topic(broker)
    kafka = broker.embedded
    assert kafka is not None
    big = TopicAdmin.for_broker({**broker.settings, "message.max.bytes": MAX}, kafka.zookeeper)
    sizes = [1 << 20, (1 << 20) + 1, 3 << 20, 12 << 20]
    try:
        big.produce(t, random_records(500, keys=100, seed=90))
        big.produce(t, [(b"big-%d" % n, os.urandom(n)) for n in sizes])
        big.produce(t, [(b"big-%d" % sizes[0], os.urandom(sizes[0] - 7))])  # an overwrite, smaller
        big.produce(t, random_records(500, keys=100, seed=91))
    finally:
        big.close()
    d = make({"tbl": t})
    row.injected += len(sizes) + 1
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    row.pid_changes += same_process(d, d.pid)
    check = check_store(broker, d.state_dir, "tbl", t)
    assert row.diverged(check.divergences) == 0 and check.readable, check
    values = live(d, "tbl")
    assert [len(values[b"big-%d" % n]) for n in sizes] == [sizes[0] - 7, *sizes[1:]]
    assert doc["tables"]["tbl"]["records"] == 1005 and row.pid_changes == 0
