"""Reader leases across wall-clock steps of the daemon (libfaketime), issue 21 item 4.

A reader (as a Spark task does) holds CURRENT with a 600 s lease; newer snapshots are published, so the held one is
kept by its lease alone. The daemon's wall clock is stepped +2 h and back. Retention must keep the held snapshot on
disk, openable and equal to the fold at its offsets, for as long as it is held, and delete it once released. A
lease nobody renews expires after its duration of the daemon's own time, even with the daemon's clock stepped back.

Every wait is on a condition the daemon shows: a step is taken to have reached retention once the daemon has
published a snapshot stamped with the stepped clock, since every publish runs retention right after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.oracle import Table
from globald.snapshot import leases, open_snapshot
from globald.snapshot.reader import OpenOptions, Snapshot
from globald.store.names import snapshots_dir
from tests.chaos.entry import SLEEP_FIX_ENV
from tests.chaos.tools import Clock
from tests.harness import Broker, DaemonProcess, oracle_at, random_records
from tests.integration.snapshot_helpers import snapshots_json, snapshots_listed, wait_status
from tests.reliability.checks import diff
from tests.reliability.ledger import FaultRow
from tests.reliability.test_clock_steps import faketime_env

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]
STEP_S = 7200
READER_LEASE_S = 600.0
SHORT_LEASE_S = 8.0
TIMEOUT_S = 120.0  # generous: a 2-core machine shared with other suites


def until(what: str, d: DaemonProcess, fn: Callable[[], Any], timeout: float = TIMEOUT_S) -> Any:
    """``fn()`` once it is truthy; fails naming ``what`` (and the daemon's log) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if not d.alive():
            raise AssertionError(f"daemon exited while waiting for {what}; log:\n{d.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; snapshots {snapshots_json(d, 'tbl')}; "
                                 f"log:\n{d.tail()}")
        time.sleep(0.2)


def publish_stepped(broker: Broker, d: DaemonProcess, t: str, seed: int, offset: int) -> dict[str, Any]:
    """Produce, then wait for a fresh CURRENT at the new end stamped by a daemon clock ``offset`` s from ours.

    Retention runs after every publish, so once this returns it has run at least once on the stepped clock."""
    broker.admin.produce(t, random_records(20, keys=500, seed=seed))
    want = {str(p): o for p, o in broker.admin.end_offsets(t).items()}

    def published() -> dict[str, Any] | None:
        cur = [s for s in snapshots_listed(d, "tbl") if s["current"] and s["offsets"] == want and not s["stale"]]
        return cur[0] if cur and abs(cur[0]["created"] - (time.time() + offset)) < 600 else None

    return until(f"a snapshot at {want} published on the daemon's clock {offset:+d} s", d, published)


def listed(d: DaemonProcess) -> set[str]:
    return {s["id"] for s in snapshots_json(d, "tbl")}


def assert_held(row: FaultRow, d: DaemonProcess, reader: Snapshot, expected: Table, when: str) -> None:
    """The held snapshot is on disk, listed, and a new reader opening it now reads the fold at its offsets."""
    reader.renew()  # as a task does while it reads: a no-op until half the lease has run out on our clock
    sid = reader.id
    assert (snapshots_dir(d.state_dir, "tbl") / sid).is_dir(), f"held snapshot {sid} deleted {when}; log:\n{d.tail()}"
    assert sid in listed(d), f"held snapshot {sid} not listed {when}"
    with open_snapshot(d.state_dir, "tbl", sid) as again:  # as another task of the same job would, after the step
        got = {k: v for k, v, _ in again}
    assert expected and row.diverged(diff(got, expected)) == 0, f"held snapshot {sid} differs from the fold {when}"


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_a_held_snapshot_survives_wall_clock_steps_and_goes_once_released(
        broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path, fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("daemon's wall clock stepped +2 h, back, +2 h after a restart, -2 h; a reader holds a 600 s lease",
                "held snapshot kept, equal to the fold, across the steps and a restart; deleted once released; "
                "an unrenewed lease ends on time")
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=500, seed=90))
    control = tmp_path / "faketime"
    d = daemon({"tbl": t}, start=False, snapshots={"interval_ms": 200, "retain": 1})
    # libfaketime 0.9.10 fails Python's time.sleep with EINVAL (tests/chaos/tools.py), which a write stall after the
    # restart met as a store fault: the chaos entry point swaps in a relative sleep and is globald's CLI otherwise.
    d.env = {**faketime_env(control), SLEEP_FIX_ENV: "1"}
    clock = Clock(control)  # replaced by rename: libfaketime never reads a half-written offset
    d.module = "tests.chaos.entry"
    d.start()
    state = d.state_dir
    pid = d.pid
    first = publish_stepped(broker, d, t, 91, 0)
    reader = Snapshot(state, "tbl", first["id"], OpenOptions(lease_s=READER_LEASE_S, holder="spark-task-1"))
    try:
        expected = oracle_at(broker, t, first["offsets"])
        assert {k: v for k, (v, _) in reader.to_dict().items()} == expected
        # Newer snapshots: with retain = 1, the first is kept by its lease alone once retention has run.
        publish_stepped(broker, d, t, 92, 0)
        newest = publish_stepped(broker, d, t, 93, 0)
        until("retention down to the newest and the leased snapshot", d,
              lambda: listed(d) == {first["id"], newest["id"]})

        clock.set(STEP_S)  # NTP correcting a clock, a VM resumed
        row.injected += 1
        publish_stepped(broker, d, t, 94, STEP_S)
        stepped = publish_stepped(broker, d, t, 95, STEP_S)
        wait_status(d, lambda s: s["updated"] >= stepped["created"] + 3, timeout=TIMEOUT_S)  # more sweeps
        assert_held(row, d, reader, expected, f"after the daemon's clock stepped +{STEP_S} s")

        clock.set(0)
        row.injected += 1
        back = publish_stepped(broker, d, t, 96, 0)
        wait_status(d, lambda s: abs(s["updated"] - back["created"]) < 600 and s["updated"] >= back["created"] + 3,
                    timeout=TIMEOUT_S)
        assert_held(row, d, reader, expected, "after the daemon's clock stepped back")

        # A daemon that starts has no history of the lease: it counts it from its start, so a step after it changes
        # nothing either. (Started with its clock already stepped, librdkafka under libfaketime stalls: tools.py.)
        assert d.stop() == 0
        d.start()
        pid = d.pid
        publish_stepped(broker, d, t, 99, 0)
        clock.set(STEP_S)
        row.injected += 1
        restarted = publish_stepped(broker, d, t, 100, STEP_S)
        wait_status(d, lambda s: s["updated"] >= restarted["created"] + 3, timeout=TIMEOUT_S)
        assert_held(row, d, reader, expected, "after a restart and a +2 h step")

        # An unrenewed short lease, taken while the daemon's clock runs 2 h behind ours, still ends after its
        # duration of the daemon's time: retention stays bounded.
        clock.set(-STEP_S)
        row.injected += 1
        short = publish_stepped(broker, d, t, 97, -STEP_S)
        taken = time.monotonic()
        leases.take(snapshots_dir(state, "tbl"), "spark-task-2", short["id"], SHORT_LEASE_S)
        publish_stepped(broker, d, t, 98, -STEP_S)
        until(f"snapshot {short['id']} deleted once its {SHORT_LEASE_S:.0f} s lease ran out unrenewed", d,
              lambda: short["id"] not in listed(d))
        held_for = time.monotonic() - taken
        assert held_for >= SHORT_LEASE_S, f"a {SHORT_LEASE_S} s lease was dropped after {held_for:.1f} s"
        assert_held(row, d, reader, expected, "while the daemon's clock ran 2 h behind")
    finally:
        reader.close(release=True)
    clock.set(0)
    until(f"snapshot {first['id']} deleted once its lease was released", d, lambda: first["id"] not in listed(d))
    assert not (snapshots_dir(state, "tbl") / first["id"]).exists()
    assert d.pid == pid and d.alive()
