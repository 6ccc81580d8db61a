"""One table's RocksDB database as a connection: its column families, how it is opened (serving, or a bulk load),
how its metadata is written, and what RocksDB says about it (offsets held, keys, files, memory).

``TableStore`` builds what the database means on this: opening or wiping, writes, commits, the upgrade of plain
values. Not thread-safe: the daemon thread owns it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rocksdict import Checkpoint, ColumnFamily, Rdict, WriteBatch

from globald.common.errors import StoreIOError, StoreUnavailableError
from globald.store import gaps, history, layout, memory, space
from globald.store.compaction_gate import CompactionGate
from globald.store.failures import store_io
from globald.store.history import HistoryMeta, HistoryWriter, Sweep
from globald.store.names import (
    HISTORY_CF,
    META_CF,
    META_HISTORY_READ,
    META_HISTORY_SINCE,
    OFFSETS_CF,
    ORIGINS_CF,
    VALUES_CF,
    db_dir,
)
from globald.store.options import StoreOptions
from globald.store.plain import PlainMigration
from globald.store.stalls import STALLS, Stalls
from globald.store.writes import write, write_options

log = logging.getLogger(__name__)


class Database:
    """The connection to one table's database; ``TableStore`` is the store built on it."""

    def __init__(self, state_dir: Path, table: str, options: StoreOptions, origins: bool = False,
                 history_ms: int | None = None) -> None:
        self.state_dir = state_dir
        self.table = table
        self.options = options
        self.origins = origins  # a typed table: every value written with its origin (names.ORIGINS_CF)
        self.history_ms = history_ms  # a versioned table's window: every version kept (names.HISTORY_CF)
        self.path = db_dir(state_dir, table)
        self._db: Rdict | None = None
        # Column-family handles, dropped before close so the LOCK is released.
        self._values: ColumnFamily | None = None
        self._values_cf: Rdict | None = None
        self._offsets: Rdict | None = None
        self._meta: Rdict | None = None
        self._origins: ColumnFamily | None = None
        self._origins_cf: Rdict | None = None
        self.stale_origins = False  # opened holding an origins family although the table is no longer typed
        self._history: ColumnFamily | None = None
        self._history_cf: Rdict | None = None
        self.stale_history = False  # opened holding a history family although the table is no longer versioned
        self._sweep = Sweep()  # the pruning of a versioned table's history, batch after batch
        # The topic's min.compaction.lag.ms as the last plan read it (None: unknown): a pending since is set from it.
        self.compaction_lag_ms: int | None = None
        # The wall-clock time (epoch ms) the loop last knew the table reading its topic (engine.reading), written
        # with the offsets of each batch and at a clean close; and why a resume last moved since (status).
        self.history_read_at: int | None = None
        self.history_moved: str | None = None
        # Set while the store is FORMAT_MIXED (TableStore's upgrade): no bulk load then, and plain keys count too.
        self._migration: PlainMigration | None = None
        self._write_opts = write_options()
        self._bulk = False
        self._stalls_at_load = Stalls()
        self._gate = CompactionGate(table, self.path, state_dir,
                                    scale=options.level_base_mb is None and options.target_file_mb is None)

    # -- connection -------------------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        return self._db

    def _connect(self, bulk: bool) -> None:
        with store_io(f"table {self.table}: cannot open {self.path}"):
            # RocksDB opens a database only with every family it has named: one left by a typed declaration too.
            held = layout.families(self.path) if (self.path / "CURRENT").exists() else []
            self.stale_origins = not self.origins and ORIGINS_CF in held
            self.stale_history = self.history_ms is None and HISTORY_CF in held
            # No compaction is started on a disk without room for it (compaction_gate): one that fails there
            # leaves RocksDB refusing every flush and write, and at open it kept a complete table from serving.
            compactions = self._gate.at_open()
            db_options, families = (space.fit_bulk_load(self.options, self.state_dir) if bulk else self._shaped()
                                    ).column_families(bulk, self.origins or self.stale_origins,  # see space.py
                                                      compactions=compactions,
                                                      history=self.history_ms is not None or self.stale_history)
            self._db = Rdict(str(self.path), db_options, column_families=families)
        self._values = self._db.get_column_family_handle(VALUES_CF)
        self._values_cf = self._db.get_column_family(VALUES_CF)
        self._offsets = self._db.get_column_family(OFFSETS_CF)
        self._meta = self._db.get_column_family(META_CF)
        if self.origins:
            self._origins = self._db.get_column_family_handle(ORIGINS_CF)
            self._origins_cf = self._db.get_column_family(ORIGINS_CF)
        if self.history_ms is not None:
            self._history = self._db.get_column_family_handle(HISTORY_CF)
            self._history_cf = self._db.get_column_family(HISTORY_CF)
        self._bulk = bulk
        self._write_opts = write_options(disable_wal=bulk)

    def _shaped(self) -> StoreOptions:
        """The options with leveled compaction's shape scaled to the table (``compaction_gate.shape``), unless set."""
        base, target = self._gate.shape
        o = self.options
        return replace(o, level_base_mb=o.level_base_mb or base, target_file_mb=o.target_file_mb or target)

    def _disconnect(self, abandon: bool = False) -> None:
        """``abandon``: background work (flushes, compactions) is cancelled, not awaited, and the memtables are not
        flushed: what they hold is in the WAL, synced (a stop after its final commit, ``TableStore.close``)."""
        db = self._db
        assert db is not None
        if self._bulk or abandon:
            # Writes made since the last flush live only in memtables. rocksdict flushes a family on its own
            # whenever a family's Rdict is dropped, which would make data durable without its offsets or the
            # reverse; RocksDB's shutdown first flushes every family in one atomic flush, after which those
            # single-family flushes find nothing to do. Running compactions are abandoned, not awaited.
            db.cancel_all_background(False)
        self._values = self._values_cf = self._offsets = self._meta = self._origins = self._origins_cf = None
        self._history = self._history_cf = None
        try:
            db.close()
        except Exception as e:
            if not (self._bulk or abandon):
                raise StoreIOError(f"table {self.table}: close: {e}") from e
            # After cancel_all_background RocksDB always answers "Shutdown in progress", and the outcome of the
            # flush it made is not reported at all: end_bulk_load checks what reached the disk instead.
            log.debug("table %s: close after shutdown: %s", self.table, e)
        finally:
            self._db = None  # released even when RocksDB reports an error (a write that failed earlier)

    @property
    def bulk(self) -> bool:
        return self._bulk

    def begin_bulk_load(self) -> None:
        """Restore mode: writes skip the WAL and append to a memtable sorted at flush (reopens the database).

        Nothing written from now on is durable until ``end_bulk_load`` or ``close``; automatic flushes are
        atomic across families, so a crash rolls data and offsets back together to the last flush.
        """
        if not self._bulk and self._migration is None:  # a store being upgraded keeps its usual write path
            self._disconnect()
            self._connect(bulk=True)
            self._stalls_at_load = replace(STALLS)
            log.info("table %s: bulk load started (WAL off until the restore ends)", self.table)

    def end_bulk_load(self) -> None:
        """Make everything written durable (atomic flush on close) and reopen for serving, WAL on again.

        Raises StoreIOError when the flush did not reach the disk (full, failing): the reopened store then holds
        what an earlier flush made durable, data and offsets together, and the caller resumes from its offsets.
        """
        if not self._bulk:
            return
        written = self.offsets()
        self._disconnect()
        self._connect(bulk=False)
        durable = self.offsets()
        if durable != written:
            raise StoreIOError(f"table {self.table}: the bulk load's flush did not reach the disk: offsets {durable} "
                               f"are durable, {written} were written (no space, or an I/O error)")
        was = self._stalls_at_load
        log.info("table %s: bulk load ended: flushed, WAL on; writes held back by RocksDB: %d (%.1fs), made again: %d",
                 self.table, STALLS.waited - was.waited, STALLS.seconds - was.seconds, STALLS.remade - was.remade)

    def _has_data(self, cf: str | None) -> bool:
        assert self._db is not None
        handle = self._db if cf is None else self._db.get_column_family(cf)
        it = handle.iter()
        it.seek_to_first()
        found = it.valid()
        del it, handle  # iterators and family objects pin the database open
        return found

    def _holds_data(self) -> bool:
        return self._has_data(None) or self._has_data(VALUES_CF)

    def _put_meta(self, entries: Mapping[bytes, bytes | None], sync: bool = False) -> None:
        db = self._db
        assert db is not None

        def batch() -> WriteBatch:
            b = WriteBatch(raw_mode=True)
            layout.put_meta(b, db, entries)
            return b

        write(db, batch(), write_options(sync=sync), f"table {self.table}: metadata write", rebuild=batch)

    # -- what the database holds and what RocksDB says of it ------------------------------------------------

    def offsets(self) -> dict[int, int]:
        """The stored next-offsets (those written so far: durable once ``sync`` or ``end_bulk_load`` returned)."""
        if self._offsets is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        self.fit_compactions()  # read at every publish interval, also of a table nothing is written to
        with store_io(f"table {self.table}: read offsets"):
            return layout.offsets_in(self._offsets.items())

    def checkpoint(self, dest: Path) -> None:
        """A consistent, hard-linked copy of the database at ``dest`` (which must not exist).

        RocksDB flushes the memtables first (rocksdict passes no ``log_size_for_flush``): that needs room for what
        was written since the last flush, never for a compaction (``compaction_gate``)."""
        self.fit_compactions()
        with store_io(f"table {self.table}: checkpoint to {dest}"):
            Checkpoint(self.db).create_checkpoint(str(dest))

    def fit_compactions(self, force: bool = False) -> None:
        """Automatic compactions on while the disk has room for one, off otherwise (``compaction_gate``); looks
        at most once a second unless ``force``. The owner thread calls it (writes, offsets, checkpoints)."""
        db = self._db
        if db is None:
            return
        self._gate.apply(db, [h for h in (self._values_cf, self._origins_cf, self._history_cf) if h is not None],
                         force, scale=not self._bulk)

    @property
    def compactions_on(self) -> bool:
        return self._gate.on

    def files_per_level(self) -> list[int]:
        """SST files of the values family per level, L0 first (a bulk load leaves its flushes in L0)."""
        assert self._values_cf is not None
        return [int(self._values_cf.property_int_value(f"rocksdb.num-files-at-level{n}") or 0) for n in range(7)]

    def history_writer(self, batch: Any) -> HistoryWriter | None:
        """What adds the versions of the records ``batch`` folds, for a versioned table; None for another."""
        if self._history is None or self._history_cf is None or self._meta is None:
            return None
        assert self.history_ms is not None
        return HistoryWriter(batch, self._history, self._history_cf, self.db.get_column_family_handle(META_CF),
                             HistoryMeta.read(self._meta), self.history_ms, None if self._bulk else self._sweep,
                             self.compaction_lag_ms)

    @property
    def history_unproven(self) -> bool:
        """A versioned table whose store held data before it was versioned (``history.HistoryMeta.unproven``)."""
        return self._history is not None and self._meta is not None and HistoryMeta.read(self._meta).unproven

    def history_read_mark(self) -> int | None:
        """When the table was last known reading its topic, as stored (None: not versioned, or never recorded)."""
        if self._history is None or self._meta is None:
            return None
        raw = self._meta.get(META_HISTORY_READ)
        try:
            return None if raw is None else int(raw.decode())
        except ValueError:  # not a mark this globald wrote: nothing recorded, so a resume moves since
            return None

    def history_resumed(self, now: int, last_read: int | None, tolerance_ms: int) -> str | None:
        """The table resumes reading at ``now`` (epoch ms), last known reading at ``last_read``: move its since as
        ``gaps.since_after_gap`` says (stored at once, with the new read mark: a later since is never wrong, and
        it is durable before any record read past the gap); returns why it moved (None: kept, or no since to
        move: pending, unproven, not versioned)."""
        if self._history is None or self._meta is None:
            return None
        marks = HistoryMeta.read(self._meta)
        self.history_read_at = now
        if marks.since is None:
            return None
        since, moved = gaps.since_after_gap(marks.since, last_read, now, self.compaction_lag_ms, gaps.RESUME,
                                            tolerance_ms)
        entries = {META_HISTORY_READ: str(now).encode()}
        if moved is not None:
            entries[META_HISTORY_SINCE] = str(since).encode()
            self.history_moved = moved
        self._put_meta(entries)
        return moved

    def history_window(self, window_ms: int) -> tuple[int | None, int | None]:
        """A reload set the window of this versioned table to ``window_ms`` in place (``settings.changes``,
        windowed): the pruning takes it from the next batch, and ``since`` moves as ``history.windowed_since``
        says, stored at once (a later since is never wrong). Returns (since before, since now); both None when
        there is no since to move (pending, unproven)."""
        assert self.history_ms is not None, "only a versioned table's window changes in place"
        self.history_ms = window_ms
        if self._meta is None:  # closed (a store fault, rewinding): it reopens with the new window and marks
            return None, None
        marks = HistoryMeta.read(self._meta)
        if marks.since is None:
            return None, None
        since = history.windowed_since(marks.since, marks.clock, window_ms)
        if since != marks.since:
            self._put_meta({META_HISTORY_SINCE: str(since).encode()})
        return marks.since, since

    def history_removed(self) -> None:
        """A reload removed ``history`` from this versioned table in place (``settings.changes``, unversioned): the
        latest values and offsets stay as they are; the history goes as a restart drops it (``history.forget``:
        its marks, then its family), so status, snapshots and exports from now on are a plain table's. Closed (a
        store fault, rewinding), it goes when the store reopens without history. Raises StoreIOError when the disk
        refuses: the history then goes at the store's next open."""
        assert self.history_ms is not None, "only a versioned table's history is removed in place"
        self.history_ms = None
        self.history_read_at = self.history_moved = None
        self._history = self._history_cf = None  # no handle left on the family dropped
        self._sweep = Sweep()
        if self._db is None:
            return
        history.forget(self._put_history_marks, lambda: self.db.drop_column_family(HISTORY_CF), self.table,
                       "history was removed by a reload, in place")

    def _put_history_marks(self, entries: dict[bytes, bytes | None]) -> None:
        """Durable before the family is dropped (``history.forget``): a crash never leaves its marks over nothing."""
        self._put_meta(entries, sync=True)

    def history_status(self) -> dict[str, Any] | None:
        """A versioned table's ``tables.<t>.history`` status: since (epoch ms, or null when unproven), versions and
        bytes (RocksDB's estimates), and why as-of lookups are refused when they are; None for another table."""
        family, meta = self._history_cf, self._meta
        if family is None or meta is None:
            return None
        return history.status(family, HistoryMeta.read(meta), self.history_ms, self.table, self.compaction_lag_ms,
                              self.history_moved)

    def memory_usage(self) -> dict[str, int] | None:
        """Bytes RocksDB accounts to this store, by kind (see ``store.memory``); None while it is closed."""
        db = self._db
        if db is None:
            return None
        try:
            return memory.usage(db, [h for h in (self._values_cf, self._offsets, self._meta, self._origins_cf,
                                                 self._history_cf) if h is not None])
        except Exception as e:  # a store being reopened: the next sample has it
            log.debug("store memory of %s: %s", self.table, e)
            return None

    def estimate_keys(self) -> int:
        # Through the family's long-lived handle: a temporary one would flush the family alone when dropped.
        assert self._values_cf is not None
        n = int(self._values_cf.property_int_value("rocksdb.estimate-num-keys") or 0)
        if self._migration is not None:
            n += int(self.db.property_int_value("rocksdb.estimate-num-keys") or 0)
        return n
