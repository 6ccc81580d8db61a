"""A topic written by a transactional producer: commit markers take offsets no consumer is given. The daemon's
consumer reads committed records only (isolation.level=read_committed, managed), and a restore is complete at the
end of partition the broker reports, which is past the last marker: the stored offsets are the data's ends, not
the last record + 1, also for a transaction committed while tailing (an end past the plan's, confirmed by asking
the broker). Tansu writes the markers but does not hide aborted records from read_committed consumers, so
only committed transactions are produced here.

An exact-offset snapshot whose fold must read across a marker is refused as ``compacted``: the builder requires
contiguous offsets, and a marker's offset cannot be told from a record the cleaner removed
(docs/guarantees.md, "Transactional topics")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from globald.embedded.admin import TimedRecord
from globald.snapshot import exact_requests
from globald.snapshot.exact_requests import Code
from tests.harness import Broker, DaemonProcess
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.support.oracle import TimestampedTable
from tests.tansu.data import BASE_TS, expected_table, timed_records, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def _commit(p: Producer, topic: str, records: list[TimedRecord]) -> None:
    p.begin_transaction()
    for key, value, ts, _ in records:
        p.produce(topic, key=key, value=value, timestamp=ts or 0)
    p.commit_transaction(30)


def _transactional(broker: Broker, topic: str) -> Producer:
    p = Producer({**broker.settings, "transactional.id": f"globald-tests-{topic}", "log_level": 3})
    p.init_transactions(30)
    return p


def test_commit_markers_are_passed_and_offsets_reach_the_end(broker: Broker, topic: Callable[..., str],
                                                             daemon: Callable[..., DaemonProcess]) -> None:
    t = topic(partitions=1)
    p = _transactional(broker, t)
    want: TimestampedTable = {}
    produced = 0
    for i in range(3):
        records = timed_records(50, keys=40, seed=200 + i, base_ts=BASE_TS + i * 1_000_000, null_keys=0)
        _commit(p, t, records)
        produced += len(records)
        want = expected_table(records, want)
    ends = broker.admin.end_offsets(t)
    assert ends[0] == produced + 3  # each commit marker took one offset

    d = daemon({"tbl": t}, snapshots={"interval_ms": 200, "retain": 3})
    wait_for_table(d, "tbl", want)
    doc = d.wait_for(lambda s: s["tables"]["tbl"]["offsets"] == {"0": ends[0]}, what="offsets past the last marker")
    assert doc["tables"]["tbl"]["records"] == produced
    wait_snapshot_at(d, "tbl", ends)

    # Records 0-49, the first commit marker at 50, then 51 onwards: a fold up to 52 would have to skip offset 50.
    first_marker = 50
    resp = exact_requests.request(d.state_dir, "tbl", {0: first_marker + 2}, timeout=60)
    assert resp.code == Code.COMPACTED, resp
    # Up to the marker, the offsets are contiguous: served exactly.
    resp = exact_requests.request(d.state_dir, "tbl", {0: first_marker}, timeout=60)
    assert resp.code == Code.READY, resp


def test_marker_of_a_transaction_committed_while_tailing_is_passed(broker: Broker, topic: Callable[..., str],
                                                                  daemon: Callable[..., DaemonProcess]) -> None:
    t = topic(partitions=1)
    p = _transactional(broker, t)
    first = timed_records(30, keys=40, seed=220, base_ts=BASE_TS, null_keys=0)
    _commit(p, t, first)
    d = daemon({"tbl": t}, snapshots={"interval_ms": 200, "retain": 3})
    want = expected_table(first)
    wait_for_table(d, "tbl", want)
    more = timed_records(20, keys=40, seed=221, base_ts=BASE_TS + 9_000_000, null_keys=0)
    _commit(p, t, more)
    want = expected_table(more, want)
    ends = broker.admin.end_offsets(t)
    assert ends[0] == len(first) + len(more) + 2
    wait_for_table(d, "tbl", want)
    doc = d.wait_for(lambda s: s["tables"]["tbl"]["offsets"] == {"0": ends[0]},
                     what="offsets past the marker of a transaction committed while tailing")
    assert doc["tables"]["tbl"]["wipes"] == 0
    # A snapshot at the topic's end, the Spark view's default target, is published: served without a build.
    wait_snapshot_at(d, "tbl", ends)
    assert exact_requests.request(d.state_dir, "tbl", ends, timeout=30).code == Code.READY
