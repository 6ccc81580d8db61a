"""Which consistent version of a table ``globald get`` and ``globald dump`` answer from.

The live store is served only when it says it is complete (``META_COMPLETE``, read in the same point-in-time open
as the data it describes): a store being wiped or rebuilt holds an arbitrary prefix of the new topic, and answering
from it reported keys as missing and dumped half tables. Otherwise the answer comes from the table's current
snapshot — the version snapshot readers and Spark are served meanwhile, published before the wipe — with the facts
a caller needs to judge it (why, which snapshot, which offsets). With ``[snapshots] serve_stale = false``, or with no
snapshot at all, there is no consistent version to give: ``TableUnavailableError``, which the CLI exits 3 on.

An open reader holds every file of its version open, so a wipe that starts after the open cannot cut its answer
short; a wipe under way while opening makes the open fail, and the snapshot answers instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from globald.common.errors import (
    GlobaldError,
    SnapshotNotFoundError,
    StoreCorruptError,
    StoreFormatError,
    StoreUnavailableError,
)
from globald.settings.config import Config
from globald.snapshot.manifest import offsets_to_json
from globald.snapshot.reader import Snapshot, current_id, open_snapshot
from globald.status import statusfile
from globald.store.history import time_text
from globald.store.names import db_dir
from globald.store.reader import StoreReader

LIVE, SNAPSHOT = "live", "snapshot"
# A wipe replaces the database, so an open failing now fails the next moment too: do not wait long for it.
LIVE_OPEN_ATTEMPTS = 2
# CURRENT may move on (and retention delete the snapshot it named) between reading it and opening that snapshot.
SNAPSHOT_OPEN_ATTEMPTS = 3


class TableUnavailableError(GlobaldError):
    """No consistent version of the table can be served now: its live store is being rebuilt (or was never fully
    restored) and either ``[snapshots] serve_stale = false`` or no snapshot has been published yet. Wait until the
    table is RUNNING (``globald status``), or set serve_stale = true to be answered from the last snapshot."""


@dataclass
class ReadView:
    """One consistent version of a table, open for reading, and where it comes from."""

    table: str
    source: str  # LIVE or SNAPSHOT
    offsets: dict[int, int]  # next-offset per partition: the version equals the topic's fold below these
    rebuilding: bool | None  # the live store is not complete; None when the caller chose a snapshot itself
    reason: str | None  # why the live store is not served
    state: str | None  # the table's state in the running daemon's status.json (None: no daemon)
    snapshot: str | None
    snapshot_created: float | None
    snapshot_stale: bool | None
    _reader: StoreReader | Snapshot

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        return self._reader.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes, int]]:
        """Every (key, value, timestamp) in key order; raises StoreUnavailableError rather than stop early."""
        return self._reader.items()

    def history_refusal(self, at: int) -> str | None:
        """Why this version cannot answer as of record time ``at``: the table keeps no versions, they cannot be
        proven exact (``store.history``), or ``at`` is before ``since``; None when it can."""
        marks = self._reader.history
        if marks is None:
            return (f"table {self.table} keeps no versions: declare history in its [[tables]] entry (docs/as-of.md) "
                    "for as-of lookups")
        refused = marks.refusal(self.table)
        if refused is not None:
            return refused
        assert marks.since is not None
        if at < marks.since:
            return (f"table {self.table}: {time_text(at)} is before its history's since, {time_text(marks.since)}: "
                    "versions older than since may be gone, so no answer is given, never a guess")
        return None

    def as_of(self, key: bytes, at: int) -> tuple[bytes, int] | None:
        """(value, timestamp) of ``key`` at record time ``at``; None when absent or deleted then. Check
        ``history_refusal`` first."""
        v = self._reader.as_of(key, at)
        return None if v is None or v.value is None else (v.value, v.timestamp)

    def items_as_of(self, at: int) -> Iterator[tuple[bytes, bytes, int]]:
        """Every (key, value, timestamp) in force at record time ``at``, in key order."""
        return self._reader.items_as_of(at)

    def versions_as_of(self, at: int) -> Iterator[tuple[bytes, bytes | None, int]]:
        """(key, value or None for a tombstone, timestamp) of every key's version in force at ``at``, in key order."""
        return ((v.key, v.value, v.timestamp) for v in self._reader.versions_as_of(at))

    def origin(self, key: bytes, value: bytes, timestamp: int) -> tuple[int, int] | None:
        """(partition, offset) of the record a value read here came from, where a typed table's store recorded it."""
        return self._reader.origins([key], [value], [timestamp])[0]

    def describe(self) -> dict[str, Any]:
        """The facts as JSON fields (``get --json``, ``dump --json``)."""
        return {"table": self.table, "source": self.source, "rebuilding": self.rebuilding, "reason": self.reason,
                "state": self.state, "snapshot": self.snapshot, "snapshot_created": self.snapshot_created,
                "snapshot_stale": self.snapshot_stale, "offsets": offsets_to_json(self.offsets)}

    def note(self) -> str | None:
        """One line for stderr when the answer is not the live table; None when it is."""
        if self.source == LIVE or self.rebuilding is None:
            return None
        offsets = ", ".join(f"p{p}={o}" for p, o in sorted(self.offsets.items())) or "no offsets"
        stale = ", marked stale" if self.snapshot_stale else ""
        return (f"globald: table {self.table} is rebuilding ({self.reason}); answering from snapshot {self.snapshot} "
                f"(offsets {offsets}; published {_ago(self.snapshot_created)}{stale}), its last consistent version")

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> ReadView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ago(created: float | None) -> str:
    if created is None:
        return "at an unknown time"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)) + f", {max(0.0, time.time() - created):.1f}s ago"


def _open_live(config: Config, table: str) -> tuple[StoreReader | None, str]:
    """The live store if it can be served, else None and why not."""
    path = db_dir(config.state_dir, table)
    if not (path / "CURRENT").exists():
        return None, "it has no live store (wiped, or not created yet)"
    try:
        reader = StoreReader(path, attempts=LIVE_OPEN_ATTEMPTS)
    except StoreFormatError:
        raise  # not a rebuild: this globald cannot read the store at all, and says so
    except (StoreUnavailableError, StoreCorruptError) as e:  # files vanishing under a wipe read as corrupt
        return None, f"its live store cannot be opened, a wipe may be under way: {e}"
    if reader.complete:
        return reader, ""
    reader.close()
    return None, "its live store has not been restored to a log end since it was created or wiped"


def _why(config: Config, table: str, store_says: str) -> tuple[str | None, str]:
    """The table's state and the best explanation: the daemon's own reason when one runs, else the store's."""
    doc = statusfile.read_live(config.state_dir)
    t = doc.tables.get(table) if doc is not None else None
    if t is None:
        return None, f"no daemon is running; {store_says}"
    if t.state == "RUNNING":  # the daemon has not marked the store complete yet: the store is the one to believe
        return t.state, f"RUNNING, but {store_says}"
    return t.state, f"{t.state}: {t.reason}" if t.reason else f"{t.state}; {store_says}"


def _open_current(config: Config, table: str) -> Snapshot:
    last: SnapshotNotFoundError | None = None
    for _ in range(SNAPSHOT_OPEN_ATTEMPTS):
        sid = current_id(config.state_dir, table)
        try:
            # Staleness was decided by the caller: a snapshot from before the wipe is exactly what it serves.
            return open_snapshot(config.state_dir, table, sid, serve_stale=True)
        except SnapshotNotFoundError as e:
            last = e
            if sid is None or current_id(config.state_dir, table) == sid:
                break
    assert last is not None
    raise last


def open_view(config: Config, table: str) -> ReadView:
    """The newest consistent version of ``table``: the live store when complete, else the current snapshot.

    Raises TableUnavailableError when neither can be served (serve_stale off, or no snapshot yet)."""
    reader, store_says = _open_live(config, table)
    if reader is not None:
        return ReadView(table, LIVE, reader.offsets(), False, None, None, None, None, None, reader)
    state, reason = _why(config, table, store_says)
    if not config.snapshots.serve_stale:
        raise TableUnavailableError(f"table {table} is rebuilding ({reason}) and [snapshots] serve_stale is false: "
                                    "no answer until it is RUNNING again")
    try:
        snap = _open_current(config, table)
    except SnapshotNotFoundError as e:
        raise TableUnavailableError(f"table {table} is rebuilding ({reason}) and has no snapshot to answer from "
                                    f"({e}): no consistent version exists yet") from None
    m = snap.manifest
    if state is None and m.stale_reason:
        reason = f"{reason}; the snapshot says: {m.stale_reason}"
    return ReadView(table, SNAPSHOT, snap.offsets, True, reason, state, m.id, m.created, m.stale, snap)


def open_snapshot_view(config: Config, table: str, snapshot_id: str) -> ReadView:
    """A snapshot the caller named (``dump --snapshot``): no choice made, so nothing said about the live store."""
    snap = open_snapshot(config.state_dir, table, snapshot_id)
    m = snap.manifest
    return ReadView(table, SNAPSHOT, snap.offsets, None, m.stale_reason, None, m.id, m.created, m.stale, snap)
