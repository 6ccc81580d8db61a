"""Invalid offsets and changing topics, on top of tests/integration/test_core.py (which covers the log start
advanced while the daemon is stopped, and a topic recreated with fewer records while it runs).

Here: the log start advanced past a daemon that lags behind, a topic recreated empty, a topic deleted and left
missing for a while (the daemon says it waits, never exits, then rebuilds), and partitions added to a topic
(picked up without a restart). Every case ends equal to the oracle with the same PID.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import Broker, DaemonProcess, random_records
from tests.reliability.checks import check_store, live, same_process, watch
from tests.reliability.conftest import running
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]


def settle(broker: Broker, d: DaemonProcess, topic: str, row: FaultRow, pid: int,
           wipes: Callable[[int], bool]) -> dict[str, Any]:
    """RUNNING at the log end, same PID, ``wipes(count)`` holds, equal to the oracle at the stored offsets."""
    ends = broker.admin.end_offsets(topic)
    doc = d.wait_for(lambda s: s.get("pid") == pid and s["state"] == "RUNNING"
                     and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
                     timeout=120, what=f"RUNNING at {ends}")
    row.pid_changes += same_process(d, pid)
    check = check_store(broker, d.state_dir, "tbl", topic)
    assert row.diverged(check.divergences) == 0 and check.readable and not check.invalid_offsets, check
    assert wipes(doc["tables"]["tbl"]["wipes"]), doc["tables"]["tbl"]
    assert row.pid_changes == 0
    return doc


def test_log_start_advanced_while_the_daemon_lags(broker: Broker, topic: Topic, daemon: Daemon,
                                                  fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("log start advanced past a lagging daemon", "wiped once, rebuilt in-process")
    t = topic()
    d = running(broker, daemon, t, random_records(3_000, keys=300, seed=40))
    pid = d.pid
    # Frozen, the daemon cannot fetch ahead: everything produced now is behind its position.
    os.kill(pid, signal.SIGSTOP)
    try:
        broker.admin.produce(t, random_records(2_000, keys=300, seed=41))
        broker.admin.advance_log_start(t)
        broker.admin.produce(t, random_records(300, keys=300, seed=42))
    finally:
        os.kill(pid, signal.SIGCONT)
    row.injected += 1
    settle(broker, d, t, row, pid, wipes=lambda n: n == 1)
    assert "invalid_offset" in d.log.read_text()


def test_topic_recreated_empty_while_running(broker: Broker, topic: Topic, daemon: Daemon,
                                            fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("topic deleted and recreated empty while running", "wiped, empty like the new topic")
    t = topic()
    d = running(broker, daemon, t, random_records(2_000, keys=200, seed=43), metadata_refresh_ms=500)
    pid = d.pid
    broker.admin.delete(t)
    broker.admin.create(t, partitions=3)
    row.injected += 1
    d.wait_for(lambda s: s["tables"]["tbl"]["wipes"] >= 1, timeout=90, what="a wipe")
    settle(broker, d, t, row, pid, wipes=lambda n: n >= 1)
    assert live(d, "tbl") == {}


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_topic_missing_for_a_while_then_recreated(broker: Broker, topic: Topic, daemon: Daemon,
                                                 fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("topic deleted, missing 10 s, then recreated", "waits (degraded, says so), then rebuilds")
    t = topic()
    d = running(broker, daemon, t, random_records(2_000, keys=200, seed=44), metadata_refresh_ms=500)
    pid = d.pid
    broker.admin.delete(t)
    row.injected += 1
    docs = watch(d, 10)
    waiting = [doc for doc in docs if t in (doc.get("degraded") or "") and "waiting" in (doc.get("degraded") or "")]
    assert waiting, f"status never said it waits for {t}: {docs[-1]}"
    assert all(doc["tables"]["tbl"]["state"] == "RUNNING" for doc in docs), "serving the last good data meanwhile"
    assert "waiting for it" in d.log.read_text()
    broker.admin.create(t, partitions=3)
    broker.admin.produce(t, random_records(50, keys=200, seed=45))
    settle(broker, d, t, row, pid, wipes=lambda n: n >= 1)
    assert d.status()["degraded"] is None


@pytest.mark.parametrize("while_", ["running", "stopped"])
def test_partitions_added(broker: Broker, topic: Topic, daemon: Daemon, fault: Callable[[str, str], FaultRow],
                          while_: str) -> None:
    row = fault(f"partitions added while the daemon is {while_}", "picked up without a restart, no wipe"
                if while_ == "running" else "picked up at start, no wipe")
    t = topic(partitions=1)
    broker.admin.produce(t, random_records(1_000, keys=300, seed=46))
    d = daemon({"tbl": t}, metadata_refresh_ms=500)
    d.wait_running({"tbl": broker.admin.end_offsets(t)})
    if while_ == "stopped":
        assert d.stop() == 0
    broker.admin.add_partitions(t, 3)
    # Keys of their own: one key in two partitions has no defined last value (Kafka orders within a partition).
    for p in (1, 2):
        records = random_records(400, keys=300, seed=47 + p)
        broker.admin.produce(t, [(b"p%d-" % p + (k or b""), v) for k, v in records], partition=p)
    broker.admin.produce(t, random_records(100, keys=300, seed=50), partition=0)
    row.injected += 1
    if while_ == "stopped":
        d.start()
    doc = settle(broker, d, t, row, d.pid, wipes=lambda n: n == 0)
    assert sorted(doc["tables"]["tbl"]["offsets"]) == ["0", "1", "2"]
    # The new partitions' offsets are stored: a restart resumes there instead of re-reading them.
    assert d.stop() == 0
    d.start()
    time.sleep(0.5)
    doc = settle(broker, d, t, row, d.pid, wipes=lambda n: n == 0)
    assert doc["tables"]["tbl"]["records"] == 0
