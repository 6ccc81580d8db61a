"""A reader's lease renewed in the middle of a rebuild (issue 33 item 6), against the real daemon.

A reader (as a Spark task does) holds CURRENT with a short lease and renews it while it reads. The table is then
reset, so the daemon wipes it and restores it from the log start, in-process, while the held snapshot is served
stale. The chaos entry's restore hook stops the daemon a third into that restore (SIGSTOP), and it stands there
for longer than the lease: the renewals land inside the rebuild for sure, not before it nor after (a restore seen
under way from outside may end before the next poll). Without them the lease would have run out on the daemon's
monotonic clock by the time retention runs again. After the rebuild, newer snapshots are published (`retain = 1`):
the held one must stay on disk, listed, and equal to the fold at its offsets while the reader keeps renewing, and
go once released.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from globald.snapshot import open_snapshot
from globald.snapshot.reader import OpenOptions, Snapshot
from globald.store.names import SNAPSHOT_LEASES_DIR, snapshots_dir
from tests.chaos import entry, plan
from tests.chaos.daemon import stopped_at_hook
from tests.harness import SLOW_FETCH, Broker, DaemonProcess, globald, oracle_at, random_records
from tests.integration.snapshot_helpers import snapshots_json, snapshots_listed, wait_snapshot_at
from tests.reliability.checks import diff
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]
LEASE_S = 6.0
FROZEN_S = 2.5 * LEASE_S  # stopped mid-restore longer than the lease: only a renewal the daemon sees keeps it
TIMEOUT_S = 180.0  # generous: a 2-core machine shared with other suites


def listed(d: DaemonProcess) -> set[str]:
    return {s["id"] for s in snapshots_json(d, "tbl")}


class Renewer:
    """The reader's lease renewed from a thread of its own every 0.2 s (``renew`` takes a new lease once half of it
    has run out), as a task renews while it reads, however long the test's own looks take: each is a ``globald
    snapshots`` process, seconds apiece on a loaded 2-core machine, and renewals made between two of them came more
    than the 6 s lease apart, which let retention delete the held snapshot (the daemon doing its job)."""

    def __init__(self, reader: Snapshot) -> None:
        self.reader = reader
        self.failed: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)

    def start(self) -> Renewer:
        self.reader.renew()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.reader.renew()
            except BaseException as e:  # said by the test's thread (``stop``)
                self.failed.append(e)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self.failed, f"renewing the lease failed: {self.failed[0]!r}"


def renewing(reader: Snapshot, d: DaemonProcess, what: str, done: Callable[[], Any],
             timeout: float = TIMEOUT_S) -> Any:
    """Until ``done()`` is truthy, while a ``Renewer`` renews the lease; fails naming ``what``. The held snapshot
    must be listed at every look on the way."""
    deadline = time.monotonic() + timeout
    while True:
        assert reader.id in listed(d), f"held snapshot {reader.id} gone while {what}; log:\n{d.tail()}"
        got = done()
        if got:
            return got
        assert d.alive(), f"daemon exited while {what}; log:\n{d.tail()}"
        assert time.monotonic() < deadline, f"timed out: {what}; log:\n{d.tail()}"
        time.sleep(0.2)


@pytest.mark.long  # about 100 s: the long lane (make test-long)
def test_a_lease_renewed_mid_rebuild_keeps_its_snapshot(broker: Broker, topic: Topic, daemon: Daemon,
                                                        tmp_path: Path, fault: Callable[[str, str], FaultRow]) -> None:
    row = fault(f"lease of {LEASE_S:.0f} s renewed while the daemon stands {FROZEN_S:.0f} s mid-rebuild",
                "held snapshot kept through the rebuild and after it, equal to the fold; deleted once released")
    t = topic()
    broker.admin.produce(t, random_records(60_000, keys=20_000, seed=120, value_size=64))
    arm = tmp_path / "arm.json"
    # Small fetches and batches (under the bulk load's threshold): the rebuild's restore lasts seconds, in batches.
    d = daemon({"tbl": t}, start=False, kafka=SLOW_FETCH, consume_batch_size=200,
               snapshots={"interval_ms": 200, "retain": 1})
    d.module, d.env = entry.__name__, {entry.ARM_ENV: str(arm)}
    d.start()
    ends = broker.admin.end_offsets(t)
    d.wait_running({"tbl": ends}, timeout=TIMEOUT_S)
    held = wait_snapshot_at(d, "tbl", ends, timeout=TIMEOUT_S)
    expected = oracle_at(broker, t, held["offsets"])
    reader = Snapshot(d.state_dir, "tbl", held["id"], OpenOptions(lease_s=LEASE_S, holder="spark-task-1"))
    pid = d.pid
    renewer = Renewer(reader).start()  # from here to the release
    try:
        assert {k: v for k, (v, _) in reader.to_dict().items()} == expected
        arm.write_text(json.dumps({"id": 1, "phase": plan.RESTORE, "action": "freeze", "table": "tbl",
                                   "fraction": 0.3}))
        r = globald("reset", "--config", str(d.config), "--table", "tbl", "--yes", timeout=90)
        assert r.returncode == 0, r.stderr
        row.injected += 1
        assert stopped_at_hook(d, arm.with_name(f"{arm.name}.fired-1"), TIMEOUT_S), d.tail()
        said = json.loads((d.state_dir / "status.json").read_bytes())
        assert said["tables"]["tbl"]["state"] == "RESTORING" and said["tables"]["tbl"]["wipes"] == 1, said
        lease_file = snapshots_dir(d.state_dir, "tbl") / SNAPSHOT_LEASES_DIR / "spark-task-1.json"
        versions = {lease_file.stat().st_ino}
        stopped = time.monotonic()
        while time.monotonic() - stopped < FROZEN_S:  # how long the daemon stands mid-rebuild: not a wait
            versions.add(lease_file.stat().st_ino)  # each renewal renames a new file in
            time.sleep(0.2)
        assert len(versions) >= 4, f"{len(versions) - 1} renewals while the daemon stood mid-rebuild"
        os.kill(pid, signal.SIGCONT)

        def rebuilt() -> bool:
            doc = d.status()
            tbl = doc["tables"]["tbl"]
            return (doc.get("pid") == pid and tbl["state"] == "RUNNING" and tbl["wipes"] == 1
                    and all(tbl["offsets"].get(str(p), -1) >= o for p, o in ends.items()))

        renewing(reader, d, "the rebuild restores on", rebuilt)
        # Newer snapshots after the rebuild: with retain = 1 the held one is kept by its renewed lease alone.
        def published(want: dict[str, int]) -> list[dict[str, Any]]:
            return [s for s in snapshots_listed(d, "tbl") if s["current"] and s["offsets"] == want and not s["stale"]]

        for seed in (121, 122):
            broker.admin.produce(t, random_records(200, keys=20_000, seed=seed))
            want = {str(p): o for p, o in broker.admin.end_offsets(t).items()}
            renewing(reader, d, f"a snapshot at {want} is published", partial(published, want))
        kept_from = time.monotonic()
        renewing(reader, d, "it is held past two lease periods after the rebuild",
                 lambda: time.monotonic() - kept_from >= 2 * LEASE_S)
        assert (snapshots_dir(d.state_dir, "tbl") / held["id"]).is_dir()
        with open_snapshot(d.state_dir, "tbl", held["id"]) as again:  # a new task of the same job, stale served
            got = {k: v for k, v, _ in again}
        assert row.diverged(diff(got, expected)) == 0, "the held snapshot differs from the fold at its offsets"
    finally:
        try:
            renewer.stop()
        finally:
            reader.close(release=True)
    deadline = time.monotonic() + TIMEOUT_S
    while held["id"] in listed(d):  # released: the next retention deletes it
        assert time.monotonic() < deadline, f"snapshot {held['id']} kept after its lease was released"
        time.sleep(0.2)
    assert d.pid == pid and d.alive()
