"""Snapshots after a table's topic was found to be another one of the same name (``engine.events.Wiped.verified``).

A topic deleted and recreated between two of the daemon's identity checks (or while it was frozen) is found at the
next check; meanwhile the consumer may have applied records of the new topic from the old offsets, and snapshots
taken then may hold records of both. The engine says, with the wipe, below which offsets each partition was last
shown to hold the mirrored topic's records. Here, what the publisher then keeps:

- a snapshot at or below those offsets in every partition stays, marked stale like any snapshot after a wipe, and
  the newest of them is CURRENT (``serve_stale``) until the rebuilt table is RUNNING;
- every other one is marked stale with a reason starting ``unverified`` (first: a crash before the rest leaves it
  marked, and the next run drops it), CURRENT is moved off it, and it is deleted, unless a lease or a build holds
  it. A held one stays on disk, marked, never CURRENT, until released (the retention sweep then deletes it): its
  reader keeps the version it holds, as a lease promises, and learns from the manifest that it is unverified;
- when none is at or below those offsets, CURRENT is removed: readers get no snapshot (``get``/``dump`` exit 3,
  Spark ``SnapshotUnavailableError``) rather than one that may mix two topics, and status says why.

What a run showed outlives it: each ``Verified`` is written to ``snapshots/<t>/VERIFIED`` with the snapshots it
vouches for (those at or below its offsets then), durably (``vouch``). A run that finds at its first check that
the topic was replaced while it was stopped has shown nothing itself; it keeps what the last run vouched for
(``vouched``): those snapshots held only the old topic's records when they were shown to. Any wipe forgets it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import (
    Manifest,
    Offsets,
    offsets_from_json,
    offsets_to_json,
    read_json,
    valid_id,
    write_json,
)
from globald.snapshot.reader import manifests_of
from globald.snapshot.table_state import SnapshotTable
from globald.store import durable
from globald.store.names import SNAPSHOT_CURRENT, SNAPSHOT_TRASH_PREFIX, SNAPSHOT_VERIFIED

log = logging.getLogger(__name__)

UNVERIFIED = "unverified"  # how the stale reason of a snapshot that may mix two topics starts


def within(offsets: Offsets, shown: Offsets) -> bool:
    """Whether a snapshot at ``offsets`` is at or below ``shown`` in every partition (one ``shown`` lacks is not)."""
    return all(p in shown and o <= shown[p] for p, o in offsets.items())


def unverified(m: Manifest) -> bool:
    return m.stale and (m.stale_reason or "").startswith(UNVERIFIED)


def vouch(state_dir: Path, tab: SnapshotTable, shown: Offsets) -> dict[str, Any]:
    """Persist ``shown`` with the snapshots it vouches for (not stale, at or below it); returns what was written."""
    ids = sorted(m.id for m in manifests_of(state_dir, tab.config.name) if not m.stale and within(m.offsets, shown))
    doc = {"offsets": offsets_to_json(shown), "snapshots": ids}
    write_json(tab.dir / SNAPSHOT_VERIFIED, doc)
    return doc


def vouched(tab: SnapshotTable) -> tuple[Offsets, set[str]]:
    """What the last run persisted (``vouch``): its offsets and snapshot ids; nothing when absent or unreadable."""
    try:
        doc = read_json(tab.dir / SNAPSHOT_VERIFIED)
        ids = {str(i) for i in doc["snapshots"] if valid_id(str(i))}
        return offsets_from_json(doc["offsets"]), ids
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            log.warning("table %s: %s unreadable (%s): no snapshot kept on its word", tab.config.name,
                        SNAPSHOT_VERIFIED, e)
        return {}, set()


def forget_vouched(tab: SnapshotTable) -> None:
    """A wipe: what was shown of the old store vouches for nothing from now on."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tab.dir / SNAPSHOT_VERIFIED)
        durable.fsync_dir(tab.dir)


def keep_verified(state_dir: Path, tab: SnapshotTable, shown: Offsets, why: str, held: set[str]) -> None:
    """Apply the rules above to ``tab`` (its lock held: ``SnapshotTable.locked``); ``held``: snapshots leased or
    being copied. With nothing shown in this run, what the last run vouched for is kept (``vouched``)."""
    name = tab.config.name
    found = manifests_of(state_dir, name)
    only: set[str] | None = None
    if not shown:
        shown, only = vouched(tab)
    keep = [m for m in found if not m.stale and within(m.offsets, shown) and (only is None or m.id in only)]
    kept = {m.id for m in keep}
    doubtful = [m for m in found if unverified(m) or (not m.stale and m.id not in kept)]
    mark = (f"{UNVERIFIED}: taken past the offsets last shown to be of topic {tab.config.topic} "
            f"({offsets_text(shown) or 'none in this run'}); it may hold records of the topic that replaced it. {why}")
    for m in doubtful:
        if not unverified(m):
            with contextlib.suppress(OSError):  # best effort: deleted below unless held
                manifests.write(tab.dir / m.id, m.marked_stale(mark))
    if tab.current is not None and tab.current.id in {m.id for m in doubtful}:
        point_current(tab, keep[0] if keep else None, shown)
    for m in doubtful:
        if m.id in held:
            log.warning("table %s: snapshot %s is past the offsets last shown to be of topic %s, but held (a lease or "
                        "a build): kept, marked stale as unverified, never CURRENT, deleted once released", name, m.id,
                        tab.config.topic)
            continue
        with contextlib.suppress(OSError):  # the retention sweep deletes it later
            durable.remove_tree(tab.dir / m.id, tab.dir / f"{SNAPSHOT_TRASH_PREFIX}{m.id}")
    if doubtful:
        log.warning("table %s: %d snapshots past the offsets last shown to be of topic %s (%s) dropped from service",
                    name, len(doubtful), tab.config.topic, offsets_text(shown) or "none in this run")


def point_current(tab: SnapshotTable, m: Manifest | None, shown: Offsets) -> None:
    """Point CURRENT at ``m``, or remove it: nothing is served rather than a snapshot that may mix two topics."""
    name, path = tab.config.name, tab.dir / SNAPSHOT_CURRENT
    was = tab.current.id if tab.current else None
    if m is not None:
        durable.replace_file(path, m.id + "\n")
        log.warning("table %s: CURRENT moves back from %s to %s, the newest snapshot at or below the offsets last "
                    "shown to be of topic %s (%s)", name, was, m.id, tab.config.topic, offsets_text(shown))
        tab.pointed(m, m.stale_reason)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    durable.fsync_dir(tab.dir)
    why = (f"no snapshot served: none is at or below the offsets last shown to be of topic {tab.config.topic} "
           f"({offsets_text(shown) or 'none in this run'})")
    tab.pointed(None, why)
    log.warning("table %s: CURRENT (%s) removed, %s; readers get none until the rebuilt table is RUNNING", name, was,
                why)


def offsets_text(offsets: Offsets) -> str:
    return ", ".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
