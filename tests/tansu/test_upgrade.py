"""The lazy upgrade of a plain-layout store (KIP-258) with real record timestamps: values an older globald stored
without a timestamp are served with -1, values written since carry their record's CreateTime, and readers and
snapshots merge the two layouts while the upgrade runs and after it. On Kafka 0.9 both kinds carry -1, so only this
lane tells them apart."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.engine.background_upgrade import HOLD_ENV
from globald.snapshot import leases
from globald.store.names import FORMAT_MIXED, FORMAT_TIMESTAMPED, SNAPSHOT_DB_DIR, db_dir, snapshots_dir
from globald.store.reader import StoreReader
from tests.harness import Broker, DaemonProcess
from tests.integration.snapshot_helpers import snapshots_json
from tests.integration.test_formats import _older_globald_store
from tests.support.oracle import TimestampedTable, fold_timestamped
from tests.tansu.data import BASE_TS, expected_table, timed_records, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def _format(path: object) -> int | None:
    with StoreReader(path) as r:  # type: ignore[arg-type]
        return r.format_version()


def _merged(broker: Broker, topic: str, old: TimestampedTable, offsets: dict[int, int]) -> TimestampedTable:
    """The table at ``offsets`` as an upgraded store must serve it: a value still the one the plain store held
    carries -1; one written by a later record carries that record's timestamp (never equal to an old one here)."""
    full = fold_timestamped(broker.settings, topic, offsets)
    return {k: (v, -1) if old.get(k) == (v, ts) else (v, ts) for k, (v, ts) in full.items()}


def _mixed_snapshot(d: DaemonProcess) -> str | None:
    """A published snapshot of ``tbl`` in the mixed layout, or None."""
    for snap in snapshots_json(d, "tbl"):
        if _format(snapshots_dir(d.state_dir, "tbl") / snap["id"] / SNAPSHOT_DB_DIR) == FORMAT_MIXED:
            return str(snap["id"])
    return None


def test_plain_values_carry_minus_one_and_later_writes_their_create_time(
        broker: Broker, topic: Callable[..., str], daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, timed_records(60_000, keys=40_000, seed=190, tombstones=0.05))
    d = daemon({"tbl": t}, start=False, snapshots={"interval_ms": 100, "retain": 100})
    # The upgrade is held in its mixed layout until this file goes: readers and snapshots must be seen merging both
    # layouts, and how fast a machine runs the background pass must not decide whether they are.
    hold = tmp_path / "hold-upgrade"
    hold.touch()
    d.env = {HOLD_ENV: str(hold)}
    ends0 = _older_globald_store(broker, t, d.state_dir)  # the fold as plain values, offsets in the .checkpoint
    old = fold_timestamped(broker.settings, t, ends0)
    newer = timed_records(3_000, keys=60_000, seed=191, base_ts=BASE_TS + 900_000_000)
    broker.admin.produce(t, newer)
    want = expected_table(newer, {k: (v, -1) for k, (v, _) in old.items()})
    assert {ts for _, ts in want.values()} > {-1} and -1 in {ts for _, ts in want.values()}

    d.start()
    wait_for_table(d, "tbl", want, timeout=90)
    assert _format(db_dir(d.state_dir, "tbl")) == FORMAT_MIXED  # so the dump above merged both layouts
    # More records while the upgrade is held, so that snapshots are published in the mixed layout.
    for i in range(5):
        more = timed_records(200, keys=60_000, seed=192 + i, base_ts=BASE_TS + (950 + i) * 1_000_000)
        broker.admin.produce(t, more)
        want = expected_table(more, want)
    wait_for_table(d, "tbl", want, timeout=60)
    deadline = time.monotonic() + 60
    while (mixed := _mixed_snapshot(d)) is None:
        assert time.monotonic() < deadline, f"no snapshot published in the mixed layout; log:\n{d.tail()}"
        time.sleep(0.2)
    assert "upgrade complete" not in d.log.read_text(errors="replace")  # held: the file still exists
    # Held by a reader, as a Spark job holds what it reads: retention drops a snapshot whose offsets a newer one has
    # (the upgrade republishes at the same offsets) unless a lease keeps it.
    leases.take(snapshots_dir(d.state_dir, "tbl"), "upgrade-test", mixed, 600.0)
    hold.unlink()
    deadline = time.monotonic() + 120
    while "upgrade complete" not in d.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, d.tail()
        time.sleep(0.2)
    assert _format(db_dir(d.state_dir, "tbl")) == FORMAT_TIMESTAMPED
    assert d.dump("tbl") == want  # after the upgrade: the same merge, now from one layout

    formats = {}
    for snap in snapshots_json(d, "tbl"):
        sid, offsets = snap["id"], {int(p): o for p, o in snap["offsets"].items()}
        formats[sid] = _format(snapshots_dir(d.state_dir, "tbl") / sid / SNAPSHOT_DB_DIR)
        assert d.dump("tbl", snapshot=sid) == _merged(broker, t, old, offsets), (sid, formats[sid])
    assert formats.get(mixed) == FORMAT_MIXED, f"the mixed snapshot {mixed} is gone or changed: {formats}"
    assert d.status()["tables"]["tbl"]["wipes"] == 0
