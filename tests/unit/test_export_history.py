"""A versioned table's history in exports and snapshot manifests (issue 45): what the export's manifest says of it,
read from the exported database itself; which exports a versioned table may start from; the ``since`` a store
installed from one keeps. End to end (two daemons, a real broker): tests/tansu/test_as_of_export.py."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from globald.common.errors import ManifestError
from globald.export.bootstrap import history_refusal
from globald.export.exporter import export_snapshot
from globald.export.manifest import ExportHistory, ExportManifest, ExportManifestError
from globald.export.target import Target
from globald.settings.config import TableConfig
from globald.snapshot.manifest import Manifest, snapshot_since
from globald.store.gaps import BOOTSTRAP, since_after_gap
from globald.store.names import META_HISTORY_SINCE
from globald.store.offline import open_offline, since_of
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.unit.test_export_units import _doc

DAY = 86_400_000
EID = "0000000000000001-0a0b0c0d"


def _versioned_snapshot(tmp_path: Path, since: int) -> tuple[Path, Manifest]:
    """A versioned table's store with a record, its offsets and a proven ``since``, checkpointed as a snapshot."""
    store = TableStore.open(tmp_path / "state", "tbl", "topic", StoreOptions(), history_ms=DAY).store
    snap = tmp_path / "snapshots" / "0000000000000001"
    try:
        batch = store.new_batch()
        batch.put(b"k", b"\0" * 8 + b"v")
        store.put_offsets(batch, {0: 1}, {})
        store.write(batch, rebuild=lambda: batch)
        snap.mkdir(parents=True)
        store.checkpoint(snap / "db")
    finally:
        store.close()
    with open_offline(snap / "db", StoreOptions(), create=False) as db:  # as a replay's first batch proves one
        db.put_meta({META_HISTORY_SINCE: str(since).encode()}, "test: a proven since")
    m = Manifest(table="tbl", topic="topic", id=snap.name, offsets={0: 1}, created=time.time(),
                 daemon_state="RUNNING", table_state="RUNNING", records=1, history_ms=DAY, since=since)
    return snap, m


def test_an_export_carries_the_since_its_database_proves_and_says_so(tmp_path: Path) -> None:
    snap, m = _versioned_snapshot(tmp_path, 1_700_000_000_000)
    assert since_of(snap / "db") == 1_700_000_000_000
    # What a published (or exactly built) snapshot's manifest says: read from its database, for a versioned table.
    assert snapshot_since(TableConfig(name="tbl", topic="topic", history=DAY), snap / "db") == 1_700_000_000_000
    assert snapshot_since(TableConfig(name="tbl", topic="topic"), tmp_path / "nothing") is None  # opens nothing
    target = Target((tmp_path / "bucket").as_uri())
    done = export_snapshot(target, snap, m, threading.Event()).manifest
    assert done.history == ExportHistory(window_ms=DAY, since=1_700_000_000_000)
    raw = (tmp_path / "bucket" / "tbl" / "exports" / f"{done.id}.json").read_bytes()
    assert ExportManifest.decode(raw, done.id).history == done.history
    # A snapshot manifest naming no window (an older globald's) gives an export without history: never claimed.
    older = dataclasses.replace(m, history_ms=None, since=None)
    assert export_snapshot(target, snap, older, threading.Event()).manifest.history is None


def test_which_exports_a_versioned_table_may_start_from() -> None:
    m = ExportManifest.decode(json.dumps(_doc()).encode(), EID)
    assert m.history is None  # a plain table's, or an older globald's: no "history" in the manifest
    assert history_refusal(m, None) is None  # a plain table takes any
    assert "carries no history" in (history_refusal(m, DAY) or "")
    kept = dataclasses.replace(m, history=ExportHistory(window_ms=DAY, since=5))
    assert history_refusal(kept, DAY) is None
    assert "window of 86400000 ms, the table declares 604800000" in (history_refusal(kept, 7 * DAY) or "")
    unproven = dataclasses.replace(m, history=ExportHistory(window_ms=DAY, since=None))
    assert "proven no since" in (history_refusal(unproven, DAY) or "")


def tailed_since(since: int, exported: int, now: int, lag: int | None) -> tuple[int, str | None]:
    return since_after_gap(since, exported, now, lag, BOOTSTRAP)


def test_the_installed_store_keeps_the_exports_since_only_while_its_tail_cannot_have_lost_a_version() -> None:
    """The rule of any gap in reading (``since_after_gap``; each edge in tests/unit/test_history_resume.py)."""
    exported, since = 1_800_000_000_000, 1_700_000_000_000
    # Within the lag of the export's snapshot: nothing after its offsets can have been compacted away yet.
    assert tailed_since(since, exported, exported + DAY - 1, DAY) == (since, None)
    # Past it: since moves to what a replay begun now proves.
    now = exported + DAY + 10
    moved, why = tailed_since(since, exported, now, DAY)
    assert moved == now - DAY and why is not None and "min.compaction.lag.ms (86400000 ms)" in why
    assert f"the export's snapshot is {DAY + 10} ms old" in why and "versions after its offsets" in why
    # The lag unknown (taken as 0): any tail may have lost versions.
    moved, why = tailed_since(since, exported, exported + 1, None)
    assert moved == exported + 1 and why is not None and "unknown" in why
    # Never earlier than the export's own since.
    assert tailed_since(since, exported, since + 5, 10) == (since, None)
    # An export dated after the bootstrap (its host's clock ahead): its tail's age is unknown, so since moves.
    moved, why = tailed_since(since, now + 1_000, now, DAY)
    assert moved == now - DAY and why is not None and "exporting host's clock is ahead" in why


@pytest.mark.parametrize(("history", "why"), [
    ("7d", "history must be an object"),
    ({"since": 1}, "window_ms"),
    ({"window_ms": 1, "since": "1"}, "history.since"),
    ({"window_ms": 1, "since": 1, "untimed": "../x"}, "untimed"),
])
def test_an_exports_history_is_untrusted_input(history: object, why: str) -> None:
    with pytest.raises(ExportManifestError, match=why):
        ExportManifest.decode(json.dumps(_doc(history=history)).encode(), EID)
    ok = {"window_ms": 1, "since": -5, "clock": 9, "untimed": "0/12"}  # a huge lag can take since below 0
    assert ExportManifest.decode(json.dumps(_doc(history=ok)).encode(), EID).history == ExportHistory(1, -5, 9, "0/12")


def test_topic_ids_as_librdkafka_spells_them_are_accepted() -> None:
    """librdkafka gives a topic ID in standard base64 ("+", "/"): a modern broker's export was refused as invalid."""
    for tid in ("AaIpJu3ZdCOHXXM0+w2xBw", "AaIpJu3ZdCOHXXM0/w2xBw", "AaIpJu3ZdCOHXXM0-w2x_w"):
        assert ExportManifest.decode(json.dumps(_doc(topic_id=tid)).encode(), EID).topic_id == tid


def test_a_snapshot_manifest_reports_its_since() -> None:
    m = Manifest(table="tbl", topic="topic", id="1700000000000001", offsets={0: 1}, created=1.0,
                 daemon_state="RUNNING", table_state="RUNNING", records=1, history_ms=DAY, since=-3)
    assert Manifest.from_json(m.to_json()) == m
    older = {k: v for k, v in m.to_json().items() if k not in ("since", "history_ms")}
    assert (Manifest.from_json(older).since, Manifest.from_json(older).history_ms) == (None, None)
    with pytest.raises(ManifestError, match="since"):
        Manifest.from_json({**m.to_json(), "since": "soon"})


def test_an_exact_build_of_a_versioned_table_is_never_exported() -> None:
    """An exact build sits at past offsets with a recent ``created``: exported, a bootstrap would date its tail from
    that time and keep a ``since`` the tail cannot prove (found in review). A plain table's is exported as before."""
    from globald.export.service import exportable
    from globald.snapshot.manifest import Manifest

    def snap(sid: str, kind: str, history_ms: int | None, created: float = 100.0) -> Manifest:
        return Manifest(table="t", topic="t", id=sid, offsets={0: 5}, created=created, daemon_state="RUNNING",
                        table_state="RUNNING", records=5, kind=kind, history_ms=history_ms,
                        since=None if history_ms is None else 1)

    shown = {0: 9}
    versioned = [snap("b", "exact", 7_000), snap("a", "periodic", 7_000, created=50.0)]
    assert exportable(versioned, shown, wiped_at=0.0) is versioned[1]
    plain = [snap("b", "exact", None), snap("a", "periodic", None)]
    assert exportable(plain, shown, wiped_at=0.0) is plain[0]
    assert exportable(versioned, shown, wiped_at=60.0) is None  # the periodic one predates the last wipe
    assert exportable([snap("c", "periodic", None)], {0: 4}, wiped_at=0.0) is None  # beyond what was shown
