"""What a run showed of its topic outlives the run (issue 33, item 6): after a restart that finds the topic replaced
while the daemon was stopped, the last snapshot the previous run verified is served (stale) while the table
rebuilds, instead of nothing (``snapshot.recreated``: ``VERIFIED``)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.embedded.oracle import fold
from globald.snapshot.reader import current_id
from globald.store.names import SNAPSHOT_VERIFIED, snapshots_dir
from tests import midway
from tests.harness import Broker, DaemonProcess, random_records
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.reliability.checks import diff, explain, read_store
from tests.reliability.ledger import FaultRow
from tests.reliability.test_recreated_topic import OLD, rebuilt_equal, replace_topic

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]


def _vouched(d: DaemonProcess) -> list[str]:
    """The snapshots VERIFIED vouches for."""
    try:
        return list(json.loads((snapshots_dir(d.state_dir, "tbl") / SNAPSHOT_VERIFIED).read_text())["snapshots"])
    except (OSError, ValueError, KeyError):
        return []


def test_a_restart_that_finds_the_topic_replaced_serves_the_last_verified_snapshot(
        broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path, fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("topic recreated while stopped, after a check verified the last snapshot",
                "that snapshot stays CURRENT (stale) during the rebuild, equal to the old fold; then == new topic")
    t = topic()
    broker.admin.produce(t, random_records(OLD, keys=300, seed=90))
    old_ends = broker.admin.end_offsets(t)
    arm = tmp_path / "arm.json"
    d = daemon({"tbl": t}, start=False, metadata_refresh_ms=500)
    midway.arm(d, arm)
    d.start()
    d.wait_running({"tbl": old_ends})
    sid = wait_snapshot_at(d, "tbl", old_ends)["id"]
    # A refresh's check showed the store, and with it that snapshot, to hold the old topic: persisted.
    d.wait_for(lambda s: sid in _vouched(d), what=f"{SNAPSHOT_VERIFIED} naming {sid}")
    assert d.stop() == 0, d.tail()
    old_fold = fold(broker.settings, t, old_ends)  # the old topic is gone once replaced
    replace_topic(broker, t, seed=91)
    row.injected += 1
    midway.freeze_at_restore(arm, "tbl", fraction=0.3)  # the rebuild's restore, once the check found the new topic
    d.start()
    midway.wait_frozen(d, arm)
    try:
        assert "WIPE (topic_recreated)" in d.log.read_text(), d.tail()
        assert current_id(d.state_dir, "tbl") == sid, "the verified snapshot is not served during the rebuild"
        data = read_store(snapshots_dir(d.state_dir, "tbl") / sid / "db")[1]
        assert diff(data, old_fold) == 0, explain(data, old_fold)
        assert sid not in _vouched(d), "a wipe must forget what the old store vouched for"
    finally:
        os.kill(d.pid, signal.SIGCONT)
    rebuilt_equal(broker, d, t, row, d.pid)
