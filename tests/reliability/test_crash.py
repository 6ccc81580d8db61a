"""Crash consistency: SIGKILL at random points of restore, steady state, commit, wipe and snapshot publish.

Each cycle starts the real daemon (through ``killpoints``, which arms one kill point) while records keep arriving,
lets it die at that point, and then checks the store it left on disk against the oracle at the offsets stored
inside it, and every snapshot on disk: complete and equal to the oracle at its manifest offsets, or invisible.
The next cycle restarts the daemon on that state. The schedule is random but seeded (the seed is in the ledger).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rocksdict import WriteBatch

from globald.store.codec import encode_offset, partition_key
from globald.store.names import META_CF, META_FORMAT, OFFSETS_CF, STATUS_FILE, db_dir
from tests.harness import Broker, DaemonProcess, daemon_factory, open_store_db, random_records
from tests.reliability import killpoints
from tests.reliability.checks import check_snapshots, check_store, snapshots_available
from tests.reliability.conftest import FULL, new_topic
from tests.reliability.ledger import FaultRow
from tests.reliability.load import Load

pytestmark = pytest.mark.kafka

SEED = int(os.environ.get("GLOBALD_RELIABILITY_SEED", str(random.randrange(1 << 30))))
TABLE = "tbl"

# Rows of the ledger, one per kind of moment the daemon is killed in.
RESTORE, STEADY, COMMIT, WIPE, SNAPSHOT = (
    "SIGKILL during restore", "SIGKILL in steady state", "SIGKILL during commit", "SIGKILL during wipe",
    "SIGKILL during snapshot publish")
EXPECTED = "restarted; store == oracle after every kill"


@dataclass
class Cycle:
    kind: str  # which ledger row; RESTORE and STEADY rows are decided by the state the daemon died in
    spec: str | None = None  # an in-process kill point, or None for a kill from outside at a random moment
    wait_state: str | None = None  # for outside kills: the state to reach first (None: any, once started)
    prepare: Callable[[Path, Broker, str], None] | None = None


def corrupt_offset(state_dir: Path, broker: Broker, topic: str) -> None:
    """Store an offset past the log end, as a recreated topic would leave: the next plan must wipe the table."""
    ends = broker.admin.end_offsets(topic)
    _write_meta(db_dir(state_dir, TABLE), OFFSETS_CF, partition_key(0), encode_offset(ends[0] + 1_000_000))


def bump_format(state_dir: Path, broker: Broker, topic: str) -> None:
    """A store of an unknown format: the next open must wipe it."""
    _write_meta(db_dir(state_dir, TABLE), META_CF, META_FORMAT, b"999")


def _write_meta(path: Path, cf: str, key: bytes, value: bytes) -> None:
    if not (path / "CURRENT").exists():
        return  # nothing to damage: the last kill left no store, the next start restores anyway
    db = open_store_db(path)
    wb = WriteBatch(raw_mode=True)
    wb.put(key, value, db.get_column_family_handle(cf))
    db.write(wb)
    del wb
    db.close()


def schedule(rnd: random.Random, snapshots: bool) -> list[Cycle]:
    r = rnd.randint
    restore = [Cycle(RESTORE, f"write-after:{r(2, 25)}"), Cycle(RESTORE, f"write-before:{r(2, 25)}"),
               Cycle(RESTORE), Cycle(COMMIT, f"commit-synced:{r(1, 3)}"), Cycle(RESTORE, f"write-after:{r(2, 25)}")]
    steady = [Cycle(STEADY, wait_state="RUNNING"), Cycle(STEADY, f"write-after:{r(30, 80)}"),
              Cycle(STEADY, wait_state="RUNNING"), Cycle(COMMIT, f"commit-synced:{r(3, 12)}"),
              Cycle(COMMIT, f"checkpoint-file-replace:{r(3, 12)}"), Cycle(STEADY, f"status-replace:{r(2, 6)}"),
              Cycle(COMMIT, f"checkpoint-file-replace:{r(3, 12)}"), Cycle(STEADY, wait_state="RUNNING"),
              Cycle(COMMIT, f"commit-synced:{r(3, 12)}")]
    wipes = [Cycle(WIPE, f"wipe-unlink:{r(1, 12)}", prepare=corrupt_offset),
             Cycle(RESTORE, f"write-after:{r(2, 25)}"),
             Cycle(WIPE, "wipe-deleted:1", prepare=corrupt_offset),
             Cycle(RESTORE),
             Cycle(WIPE, f"wipe-unlink:{r(1, 12)}", prepare=bump_format),
             Cycle(COMMIT, f"commit-synced:{r(1, 3)}"),
             Cycle(WIPE, f"wipe-unlink:{r(1, 6)}", prepare=corrupt_offset),
             Cycle(STEADY, wait_state="RUNNING")]
    snaps = [Cycle(SNAPSHOT, f"{p}:{r(1, 6)}") for p in killpoints.SNAPSHOT_POINTS] if snapshots else []
    cycles = restore + steady + wipes + snaps
    return cycles * 3 if FULL else cycles


@dataclass
class Rig:
    broker: Broker
    topic: str
    daemon: DaemonProcess
    rnd: random.Random
    rows: dict[str, FaultRow]
    kills_by_state: dict[str, int] = field(default_factory=dict)
    snapshots_verified: int = 0  # visible snapshots compared with the oracle, over all checks
    stores_compared: int = 0  # stores read and compared with the oracle, over all checks
    uncompared: list[str] = field(default_factory=list)  # kills that left no store to compare, and where
    left_nothing: bool = False  # the last kill left no readable store

    def run(self, cycle: Cycle) -> None:
        d = self.daemon
        state_dir = d.state_dir
        if cycle.prepare is not None:
            self._store_to_damage()
            cycle.prepare(state_dir, self.broker, self.topic)
        log_from = d.log.stat().st_size if d.log.exists() else 0
        d.env = {killpoints.ENV: cycle.spec} if cycle.spec else {}
        d.start()
        row = self.rows[cycle.kind]
        if cycle.spec:
            try:
                rc = d.proc.wait(90) if d.proc else None
            except Exception:
                d.stop(signal.SIGKILL)
                raise AssertionError(f"kill point {cycle.spec} not reached in 90 s; log:\n{d.tail()}") from None
            said = d.log.read_text(errors="replace")[log_from:]
            if rc != -signal.SIGKILL or f"{killpoints.MARKER} {cycle.spec.split(':')[0]}" not in said:
                row.pid_changes += 1
                raise AssertionError(f"daemon died unplanned (rc {rc}) before {cycle.spec}; log:\n{d.tail()}")
        else:
            d.wait_for(lambda s: s.get("pid") == d.pid and cycle.wait_state in (None, s["state"]), timeout=90,
                       what=f"pid {d.pid} in {cycle.wait_state or 'any state'}")
            time.sleep(self.rnd.uniform(0.0, 0.4))
            d.stop(signal.SIGKILL)
        state = self._state_at_death(state_dir, d.pid)
        self.kills_by_state[state] = self.kills_by_state.get(state, 0) + 1
        if cycle.kind in (RESTORE, STEADY):
            row = self.rows[STEADY if state == "RUNNING" else RESTORE]
        row.injected += 1
        # Offsets past the log end are the damage this cycle injected, left in place by a wipe that was cut short;
        # a kill inside a wipe may also leave no store, or one that cannot be opened, and so may a kill from outside
        # right after such a one (status names the pid before the store is created again). Nothing else may: a store
        # that could not be compared fails the check.
        may_be_gone = cycle.kind == WIPE or (cycle.spec is None and bool(self.uncompared) and self.left_nothing)
        self.verify(row, f"after {cycle.spec or 'a kill from outside in ' + state}",
                    may_be_gone=may_be_gone, injected_damage=cycle.prepare is corrupt_offset)

    def _store_to_damage(self) -> None:
        """A store for ``prepare`` to damage, made by an unarmed run when the last kill left none: a kill from
        outside right after a wipe's may land before the store is created again (status names the pid first), and
        with nothing damaged the next start has nothing to wipe, so its wipe kill point is never reached (the cycle
        then failed after 90 s, "kill point not reached")."""
        d = self.daemon
        if (db_dir(d.state_dir, TABLE) / "CURRENT").exists():
            return
        d.env = {}
        d.start()
        d.wait_for(lambda s: s.get("pid") == d.pid and s["state"] in ("RESTORING", "RUNNING")
                   and (db_dir(d.state_dir, TABLE) / "CURRENT").exists(), timeout=120, what="a store to damage")
        assert d.stop() == 0, d.tail()

    def verify(self, row: FaultRow, when: str, may_be_gone: bool = False, injected_damage: bool = False) -> None:
        state_dir = self.daemon.state_dir
        check = check_store(self.broker, state_dir, TABLE, self.topic,
                            allow_uncompared=may_be_gone or injected_damage)
        self.left_nothing = not check.readable
        if not check.readable:
            assert may_be_gone, f"{when}: the store could not be read: {check}"
            self.uncompared.append(f"{when}: {check.error}")
        assert injected_damage or not check.invalid_offsets, f"{when}: {check}"
        self.stores_compared += check.compared
        assert row.diverged(check.divergences) == 0, f"{when}: store diverges from the oracle in {check}"
        for snap in check_snapshots(self.broker, state_dir, TABLE, self.topic):
            assert row.diverged(snap.divergences) == 0, f"{when}: snapshot {snap}"
            self.snapshots_verified += snap.visible and snap.error is None

    @staticmethod
    def _state_at_death(state_dir: Path, pid: int) -> str:
        try:
            doc = json.loads((state_dir / STATUS_FILE).read_text())
        except (OSError, ValueError):
            return "STARTING"
        return str(doc.get("state")) if doc.get("pid") == pid else "STARTING"


@pytest.mark.long
def test_sigkill_at_random_points(broker: Broker, tmp_path: Path, fault: Callable[[str, str], FaultRow]) -> None:
    rnd = random.Random(SEED)
    snaps = snapshots_available()
    rows = {k: fault(k, EXPECTED) for k in (RESTORE, STEADY, COMMIT, WIPE)}
    if snaps:
        rows[SNAPSHOT] = fault(SNAPSHOT, EXPECTED + "; every snapshot complete and equal, or invisible")
    for r in rows.values():
        r.notes.append(f"GLOBALD_RELIABILITY_SEED={SEED}")
    topic = new_topic(broker)
    # More than a bulk-load restore's threshold (100k records), so that kills during restore also hit restores
    # that write without the WAL.
    broker.admin.produce(topic, random_records(110_000, keys=8_000, seed=SEED, tombstones=0.1))
    load = Load(broker.admin, topic, rate=800, keys=8_000, seed=SEED).start()
    extra = {"snapshots": {"interval_ms": 100}} if snaps else {}
    try:
        with daemon_factory(broker, tmp_path) as make:
            # 1 MiB memtables: a bulk-load restore of these records leaves a dozen flushes in L0, merged after
            # RUNNING, so kills also land while that merge runs (and during the load, with its flushes piled up).
            d = make({TABLE: topic}, start=False, consume_batch_size=500, commit_interval_ms=100,
                     store={"write_buffer_mb": 1}, **extra)
            d.module = "tests.reliability.killpoints"
            rig = Rig(broker, topic, d, rnd, rows)
            cycles = schedule(rnd, snaps)
            for cycle in cycles:
                rig.run(cycle)
            load.stop()
            assert load.failed_batches == 0
            # A last start with nothing armed: the daemon must finish the job and agree with the oracle.
            d.env = {}
            d.start()
            d.wait_running({TABLE: broker.admin.end_offsets(topic)}, timeout=120)
            rig.verify(rows[STEADY], "final run")
    finally:
        load.stop()
    kills = sum(r.injected for r in rows.values())
    assert kills >= 20 and kills == len(cycles)
    assert rig.snapshots_verified > 0 or not snaps, "snapshots are published, yet none was ever compared"
    # Only kills inside a wipe may leave nothing to compare; every other kill, and the final run, compared a store.
    wipe_kills = rows[WIPE].injected
    assert rig.stores_compared >= kills - wipe_kills + 1, (rig.stores_compared, kills, wipe_kills, rig.uncompared)
    for r in rows.values():
        r.notes.append(f"daemon state at death: {rig.kills_by_state}; snapshots verified: {rig.snapshots_verified}; "
                       f"stores compared: {rig.stores_compared}; left nothing to compare: {len(rig.uncompared)}")
