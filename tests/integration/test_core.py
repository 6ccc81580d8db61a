"""The daemon against a real broker and real RocksDB: oracle equality, restart, SIGKILL, KIP-406 recovery."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable

import pytest

from globald.common.states import State
from globald.status import statusfile
from globald.status.document import DaemonStatus
from tests.harness import Broker, DaemonProcess, oracle_at, random_records, values_only

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def ends_of(broker: Broker, topic: str) -> dict[int, int]:
    return broker.admin.end_offsets(topic)


def assert_matches_oracle(broker: Broker, d: DaemonProcess, table: str, topic: str) -> dict[str, int]:
    offsets = d.status()["tables"][table]["offsets"]
    dump = d.dump(table)
    assert values_only(dump) == oracle_at(broker, topic, offsets)
    return offsets


def test_store_equals_oracle_fold(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    records = random_records(20_000, keys=2_000, seed=1, tombstones=0.1)
    records.append((b"empty-value", b""))  # an empty value is a value, not a tombstone
    broker.admin.produce(t, records)
    d = daemon({"customers": t})
    doc = d.wait_running({"customers": ends_of(broker, t)})
    dump = d.dump("customers")
    expected = oracle_at(broker, t, doc["tables"]["customers"]["offsets"])
    assert values_only(dump) == expected
    assert dump[b"empty-value"][0] == b""
    if not broker.has_timestamps:
        assert {ts for _, ts in dump.values()} == {-1}
    # Tail: new records, overwrites and tombstones arrive while RUNNING.
    live = random_records(3_000, keys=2_000, seed=2, tombstones=0.2)
    broker.admin.produce(t, live)
    d.wait_running({"customers": ends_of(broker, t)})
    assert_matches_oracle(broker, d, "customers", t)
    assert d.stop() == 0


def test_null_keys_are_skipped_and_counted(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    # Brokers refuse null keys on compacted topics, so they can only come from a topic with delete retention.
    t = topic(compact=False)
    records = random_records(2_000, keys=100, seed=13, null_keys=0.1)
    broker.admin.produce(t, records)
    d = daemon({"tbl": t})
    doc = d.wait_running({"tbl": ends_of(broker, t)})
    assert doc["tables"]["tbl"]["null_keys"] == sum(1 for k, _ in records if k is None)
    assert_matches_oracle(broker, d, "tbl", t)


def test_restart_fetches_only_new_records(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(5_000, keys=500, seed=3))
    d = daemon({"tbl": t})
    d.wait_running({"tbl": ends_of(broker, t)})
    assert d.stop() == 0
    assert d.status()["state"] == "NOT_RUNNING" and d.status()["pid"] is None

    new = random_records(777, keys=500, seed=4)
    broker.admin.produce(t, new)
    d.start()
    doc = d.wait_running({"tbl": ends_of(broker, t)})
    assert doc["tables"]["tbl"]["records"] == len(new)
    assert doc["tables"]["tbl"]["wipes"] == 0
    assert_matches_oracle(broker, d, "tbl", t)


def test_sigkill_during_restore_then_restart(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(300_000, keys=30_000, seed=5, tombstones=0.1))
    # Small memtables: the bulk load (WAL off) flushes often, so a kill leaves a real prefix of the topic behind.
    d = daemon({"tbl": t}, store={"write_buffer_mb": 2})
    rnd = random.Random(6)
    kills = 0
    doc: DaemonStatus | None = None
    for _ in range(3):
        # status.json read directly: a restore now takes well under a second, less than `globald status` needs.
        while (doc := statusfile.read_live(d.state_dir)) is None or doc.pid != d.pid:
            time.sleep(0.01)
        time.sleep(rnd.uniform(0.0, 0.3))
        doc = statusfile.read_live(d.state_dir)
        if doc is None or doc.state != State.RESTORING:
            break
        d.stop(signal.SIGKILL)  # the restore is still running: the store holds a prefix of the topic
        kills += 1
        d.start()
    assert kills >= 1, f"restore finished before any kill: {doc}"
    d.wait_running({"tbl": ends_of(broker, t)}, timeout=120)
    assert_matches_oracle(broker, d, "tbl", t)


def test_sigkill_in_steady_state_then_restart(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(5_000, keys=1_000, seed=7))
    d = daemon({"tbl": t})
    d.wait_running({"tbl": ends_of(broker, t)})
    stop = threading.Event()

    def load() -> None:
        seed = 100
        while not stop.is_set():
            broker.admin.produce(t, random_records(500, keys=1_000, seed=seed, tombstones=0.2))
            seed += 1

    producer = threading.Thread(target=load)
    producer.start()
    try:
        time.sleep(1.5)
        d.stop(signal.SIGKILL)
    finally:
        stop.set()
        producer.join()
    d.start()
    d.wait_running({"tbl": ends_of(broker, t)})
    assert_matches_oracle(broker, d, "tbl", t)


def test_a_stop_stuck_past_its_grace_prints_stacks_and_exits(broker: Broker, topic: Callable[..., str],
                                                            daemon: Daemon) -> None:
    """A stop that cannot finish (here a user's state callback blocks the loop thread forever) must not hang until
    the service manager's SIGKILL: after its grace the daemon prints where every thread is and exits 1. The store
    keeps its last durable commit, and the next start resumes from it."""
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=400, seed=31))
    d = daemon({"tbl": t}, start=False)
    d.module, d.env = "tests.support.stuck_stop", {"STUCK_STOP_GRACE_S": "3"}
    d.start()
    d.wait_running({"tbl": ends_of(broker, t)})
    started = time.monotonic()
    assert d.stop(timeout=30) == 1
    took = time.monotonic() - started
    log = d.log.read_text()
    assert "block_forever_on_shutdown" in log, d.tail()  # the stuck frame is named
    assert took >= 3, f"exited after {took:.1f}s, before its grace"
    broker.admin.produce(t, random_records(500, keys=400, seed=32))
    d.module, d.env = "globald", None
    d.start()
    d.wait_running({"tbl": ends_of(broker, t)})
    assert_matches_oracle(broker, d, "tbl", t)


def test_log_start_advanced_while_stopped(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(3_000, keys=300, seed=8))
    d = daemon({"tbl": t})
    d.wait_running({"tbl": ends_of(broker, t)})
    assert d.stop() == 0
    stored = d.status()["tables"]["tbl"]["offsets"]

    lows = broker.admin.advance_log_start(t)
    assert all(lows[int(p)] > o for p, o in stored.items())
    broker.admin.produce(t, random_records(200, keys=300, seed=9))
    d.start()
    doc = d.wait_running({"tbl": ends_of(broker, t)})
    assert doc["tables"]["tbl"]["wipes"] == 1
    assert doc["pid"] == d.pid
    assert_matches_oracle(broker, d, "tbl", t)


def test_topic_recreated_with_fewer_records_while_running(broker: Broker, topic: Callable[..., str],
                                                          daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(6_000, keys=600, seed=10))
    d = daemon({"tbl": t}, metadata_refresh_ms=500)
    d.wait_running({"tbl": ends_of(broker, t)})
    pid = d.pid

    broker.admin.delete(t)
    broker.admin.create(t, partitions=3)
    fewer = random_records(90, keys=600, seed=11)
    broker.admin.produce(t, fewer)
    ends = ends_of(broker, t)
    doc = d.wait_for(
        lambda s: s["state"] == "RUNNING" and s["tables"]["tbl"]["wipes"] >= 1
        and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
        timeout=90, what="rebuilt after recreate")
    assert doc["pid"] == pid and d.alive()
    assert_matches_oracle(broker, d, "tbl", t)


def test_second_daemon_on_same_state_dir_is_refused(broker: Broker, topic: Callable[..., str],
                                                    daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(100, keys=10, seed=12))
    first = daemon({"tbl": t})
    first.wait_running({"tbl": ends_of(broker, t)})
    second = DaemonProcess(first.config, first.log.with_name("second.log")).start()
    assert second.proc is not None and second.proc.wait(30) == 4  # refused (globald.common.exitcodes.REFUSED)
    assert "owned by another globald" in second.log.read_text()
    assert first.alive()
    assert first.status()["pid"] == first.pid
    assert_matches_oracle(broker, first, "tbl", t)
