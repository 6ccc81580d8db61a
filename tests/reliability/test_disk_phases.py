"""A full disk in every phase of the daemon's life: fresh start, restart of an existing store, a bulk-load restore
(whose failure surfaces only when the load ends), and stop.

Whatever the phase: the daemon stays up with the same PID and says it is degraded; no state, ``.checkpoint`` or
manifest claims offsets the durable store does not hold; once space returns it resumes by itself and the store and
every snapshot equal the oracle fold at their own offsets.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.store import checkpoint_file
from globald.store.names import checkpoint_path, db_dir
from tests.harness import Broker, DaemonProcess, random_records
from tests.reliability.checks import check_snapshots, check_store, read_store, same_process, watch
from tests.reliability.disk import fill, tmpfs
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]


def no_false_claims(broker: Broker, state_dir: Path, table: str, topic: str, row: FaultRow) -> None:
    """The store was read and equals the oracle at its own offsets (``check_store`` fails when it could not
    compare); .checkpoint and every visible snapshot claim no more."""
    check = check_store(broker, state_dir, table, topic)
    assert row.diverged(check.divergences) == 0, check
    durable = check.offsets
    try:
        claimed = {p: o for (t, p), o in checkpoint_file.read(checkpoint_path(state_dir, table)).items() if t == topic}
    except (OSError, checkpoint_file.CheckpointFormatError):
        claimed = {}
    beyond = {p: o for p, o in claimed.items() if o > durable.get(p, 0)}
    assert row.diverged(len(beyond)) == 0, f".checkpoint claims {claimed}, the store holds offsets {durable}"
    for snap in check_snapshots(broker, state_dir, table, topic):
        assert row.diverged(snap.divergences) == 0, snap


def resumed(d: DaemonProcess, pid: int, table: str, ends: dict[int, int]) -> dict[str, Any]:
    return d.wait_for(lambda s: s.get("pid") == pid and s["state"] == "RUNNING" and not s.get("degraded")
                      and all(s["tables"][table]["offsets"].get(str(p)) == o for p, o in ends.items()),
                      timeout=180, what="RUNNING at the log end, not degraded")


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_disk_full_during_bulk_load_restore(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                                            fault: Callable[[str, str], FaultRow]) -> None:
    """The load writes without a WAL into memtables, so the disk's refusal surfaces when the load ends (its flush):
    the table must not go RUNNING on offsets the disk never took."""
    row = fault("disk full during a bulk-load restore (150k records, ~8 MB free)",
                "degraded, never RUNNING on lost data; retried less and less often; restored once space returned, "
                "same PID")
    t = topic()
    broker.admin.produce(t, random_records(150_000, keys=150_000, seed=70, tombstones=0.0, value_size=300))
    ends = broker.admin.end_offsets(t)
    with tmpfs(tmp_path / "disk", 48) as disk:
        filler = fill(disk, leave=8 << 20)
        d = daemon({"tbl": t}, state_dir=disk / "state", snapshots={"interval_ms": 200})
        pid = d.pid
        row.injected += 1

        def never_running_on_nothing(doc: dict[str, Any]) -> None:
            tbl = doc.get("tables", {}).get("tbl", {})
            if tbl.get("state") == "RUNNING":
                held, _ = read_store(db_dir(d.state_dir, "tbl"))
                assert held == {p: int(o) for p, o in ends.items()}, (
                    f"RUNNING while the store holds offsets {held}, not {ends}; log:\n{d.tail()}")

        docs = watch(d, 25, check=never_running_on_nothing)
        until = time.monotonic() + 60  # a loaded machine may take longer to reach the end of the load
        while not (any(doc.get("degraded") for doc in docs) or "degraded" in d.log.read_text()):
            assert time.monotonic() < until, f"never degraded on a full disk; log:\n{d.tail()}"
            docs += watch(d, 2, check=never_running_on_nothing)
        # The backoff grows while the disk stays full. A load's writes only reach memtables: taken as proof that
        # the disk works, they reset it, and the restore was redone every 0.2-0.7 s for as long as the disk was full.
        until = time.monotonic() + 120
        while max(retry_delays(d), default=0.0) < 3.0:
            assert time.monotonic() < until, f"retry delays never grew: {retry_delays(d)}; log:\n{d.tail()}"
            docs += watch(d, 2, check=never_running_on_nothing)
        no_false_claims(broker, d.state_dir, "tbl", t, row)
        filler.unlink()
        doc = resumed(d, pid, "tbl", ends)
        row.pid_changes += same_process(d, pid)
        assert doc["tables"]["tbl"]["wipes"] == 0
        no_false_claims(broker, d.state_dir, "tbl", t, row)
        held, data = read_store(db_dir(d.state_dir, "tbl"))
        assert held == ends and len(data) > 0
        assert d.stop() == 0


def retry_delays(d: DaemonProcess) -> list[float]:
    return [float(x) for x in re.findall(r"re-reading from the stored offsets in ([0-9.]+)s", d.log.read_text())]


@pytest.mark.parametrize("phase", ["fresh start", "restart"])
def test_disk_full_at_start(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                            fault: Callable[[str, str], FaultRow], phase: str) -> None:
    row = fault(f"disk full at {phase}", "degraded, same PID; restored once space returned")
    t = topic()
    broker.admin.produce(t, random_records(5_000, keys=2_000, seed=71))
    with tmpfs(tmp_path / "disk", 16) as disk:
        state = disk / "state"
        if phase == "restart":
            d = daemon({"tbl": t}, state_dir=state)
            d.wait_running({"tbl": broker.admin.end_offsets(t)})
            assert d.stop() == 0
            broker.admin.produce(t, random_records(5_000, keys=2_000, seed=72))
        else:
            state.mkdir(mode=0o700)
        filler = fill(disk, leave=0)
        d = daemon({"tbl": t}, state_dir=state)
        pid = d.pid
        row.injected += 1
        until = time.monotonic() + 60  # startup alone can take seconds on a loaded machine
        while "degraded" not in (said := d.log.read_text()):
            assert time.monotonic() < until, f"never degraded on a full disk; log:\n{d.tail()}"
            watch(d, 1)
        watch(d, 2)  # and it stays up
        said = d.log.read_text()
        assert "Traceback" not in said, d.tail()
        filler.unlink()
        ends = broker.admin.end_offsets(t)
        doc = resumed(d, pid, "tbl", ends)
        row.pid_changes += same_process(d, pid)
        assert doc["tables"]["tbl"]["wipes"] == 0, doc
        no_false_claims(broker, d.state_dir, "tbl", t, row)
        assert d.stop() == 0


def test_disk_full_at_stop(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                           fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("disk full at stop", "exit 0; the store stays at its last durable commit, == oracle")
    t = topic()
    broker.admin.produce(t, random_records(5_000, keys=2_000, seed=73))
    with tmpfs(tmp_path / "disk", 16) as disk:
        d = daemon({"tbl": t}, state_dir=disk / "state", commit_interval_ms=60_000)
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        broker.admin.produce(t, random_records(2_000, keys=2_000, seed=74, value_size=200))
        # Applied, not committed (the commit interval is a minute): the stop's final commit is the one to meet the
        # full disk.
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        fill(disk, leave=0)
        row.injected += 1
        assert d.stop() == 0, d.tail()
        said = d.log.read_text()
        assert "Traceback" not in said, d.tail()
        # The fault landed where it was aimed: the final commit met the full disk and said so.
        assert any("final commit failed" in line and "No space left" in line for line in said.splitlines()), d.tail()
        no_false_claims(broker, d.state_dir, "tbl", t, row)
        status = json.loads((d.state_dir / "status.json").read_text())
        assert status["state"] in ("NOT_RUNNING", "RUNNING"), status
