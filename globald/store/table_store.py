"""The live store of one table: a RocksDB database owned by the daemon.

Consistency contract: record data and the partition next-offsets that cover it are written in one WriteBatch,
so every state a reader can observe (a read-only open, a checkpoint, the state after a crash) holds exactly the
fold of the topic below its stored offsets; a typed table's values are written with their origins in the same
batch (``names.ORIGINS_CF``). A store that is corrupt or of a format this globald cannot read is never
served: it is wiped and rebuilt from the topic. A plain-layout store is kept and upgraded lazily (see ``plain``).
A bulk load (a long restore) writes without the WAL and leaves its flushes uncompacted in L0 (see
``StoreOptions.bulk_l0_mb``); an atomic flush of every column family ends it, so a crash loses restore
progress, never the pairing of data and offsets. Compactions, during the load or after it, only rewrite flushed
files.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rocksdict import WriteBatch

from globald.common.errors import (
    GlobaldError,
    StoreCorruptError,
    StoreFormatError,
    StoreIOError,
    StoreUnavailableError,
)
from globald.store import checkpoint_file, durable, history, layout, plain
from globald.store.codec import decode_format, unreadable_format
from globald.store.database import Database
from globald.store.failures import classify, out_of_space, store_io
from globald.store.fingerprint import Ladder, ladders_in
from globald.store.layout import OriginWriter
from globald.store.names import (
    COMPLETE_YES,
    FORMAT_MIXED,
    FORMAT_TIMESTAMPED,
    META_COMPLETE,
    META_FINGERPRINT_PREFIX,
    META_FORMAT,
    META_HISTORY_READ,
    META_STATUS,
    META_TOPIC,
    META_TOPIC_ID,
    META_UPGRADED,
    ORIGINS_CF,
    STATUS_CLEAN,
    STATUS_OPEN,
    VALUES_CF,
    checkpoint_path,
    table_dir,
)
from globald.store.options import StoreOptions
from globald.store.plain import SURROGATE_TIMESTAMP, PlainMigration, UpgradingBatch
from globald.store.protocol import Batch
from globald.store.writes import write

log = logging.getLogger(__name__)

@dataclass
class OpenResult:
    store: TableStore
    wiped_reason: str | None  # set when the store on disk was unusable and was wiped
    crashed: bool  # the previous owner did not close the store cleanly
    imported: dict[int, int]  # offsets taken from a .checkpoint file on first open
    import_note: str = ""  # why offsets were or were not taken from the .checkpoint file


class TableStore(Database):
    """Read-write handle of one table's database, the engine's ``protocol.Store``. Not thread-safe: the daemon
    thread owns it (``get`` excepted)."""

    def __init__(self, state_dir: Path, table: str, topic: str, options: StoreOptions, origins: bool = False,
                 history_ms: int | None = None) -> None:
        super().__init__(state_dir, table, options, origins, history_ms)
        self.topic = topic

    # -- lifecycle ------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path, table: str, topic: str, options: StoreOptions,
             wipe_unusable: bool = True, origins: bool = False, history_ms: int | None = None) -> OpenResult:
        """Open (creating if needed) the store; wipe it first when it is corrupt, foreign, of another topic or of
        a format this globald cannot read. With ``wipe_unusable=False`` raise StoreCorruptError instead.
        ``origins``: the table is typed (``TableConfig.typed``), and its values are written with their origins.
        ``history_ms``: the table is versioned (``TableConfig.history``), and every version is kept."""
        return cls(state_dir, table, topic, options, origins, history_ms).open_or_wipe(wipe_unusable)

    def open_or_wipe(self, wipe_unusable: bool = True) -> OpenResult:
        """Open this (closed) store as ``open`` does. Raises StoreIOError while the disk refuses, leaving it closed."""
        reason: str | None = None
        try:
            crashed = self._open_checked()
            imported, note = self._import_checkpoint_file()
            if not self.offsets() and self._holds_data():
                # Replaying the topic over it could not remove keys whose tombstones compaction already dropped.
                raise StoreCorruptError("store holds data but no offsets, in it or in a .checkpoint file: "
                                        "where it stands in the topic is unknown")
        except StoreCorruptError as e:
            self._close_quietly()
            if not wipe_unusable:
                raise
            reason = str(e)
            log.warning("table %s: store unusable (%s); wiping and rebuilding from the topic", self.table, reason)
            self._delete_files()
            crashed = self._open_checked()
            imported, note = {}, "store wiped"
        except BaseException:
            self._close_quietly()
            raise
        return OpenResult(store=self, wiped_reason=reason, crashed=crashed, imported=imported, import_note=note)

    def _open_checked(self) -> bool:
        with store_io(f"table {self.table}: cannot create {table_dir(self.state_dir, self.table)}"):
            durable.clear_leftovers(table_dir(self.state_dir, self.table))  # of a wipe or .checkpoint write cut short
            durable.make_dirs(self.path)  # RocksDB fsyncs its own files, not the directories above them
        fresh = not (self.path / "CURRENT").exists()
        self._connect(bulk=False)
        try:
            return self._check_opened(fresh)
        except BaseException:
            self._close_quietly()  # a half-checked store is never left open: callers see it closed
            raise

    def _check_opened(self, fresh: bool) -> bool:
        assert self._meta is not None
        version, stored_topic, status = (self._meta.get(k) for k in (META_FORMAT, META_TOPIC, META_STATUS))
        fmt = self._adopt(fresh, version)
        if stored_topic is not None and stored_topic != self.topic.encode():
            raise StoreCorruptError(f"store holds topic {stored_topic.decode(errors='replace')!r}, not {self.topic!r}")
        if fmt == FORMAT_MIXED:
            self._migration = PlainMigration(self.db)
        if self.stale_origins:  # left by a typed declaration: no longer kept up to date, so not kept at all
            with store_io(f"table {self.table}: drop the origins of a table no longer typed"):
                self.db.drop_column_family(ORIGINS_CF)
            self.stale_origins = False
            log.info("table %s: the table is no longer typed; dropped the origins recorded for its values", self.table)
        marks = history.adopt(self.db, self._meta, self.table, self.history_ms, self.stale_history,
                              lambda: fresh or not (self.offsets() or self._holds_data()), self._put_history_marks)
        self.stale_history = False
        crashed = status == STATUS_OPEN
        if crashed:
            log.warning("table %s: previous run did not close the store cleanly; resuming from its offsets",
                        self.table)
        self._put_meta({**marks, META_STATUS: STATUS_OPEN}, sync=True)
        return crashed

    def _adopt(self, fresh: bool, version: bytes | None) -> int:
        """The store's format, after stamping a fresh or plain store. Raises StoreCorruptError when unreadable."""
        if version is not None:
            problem = unreadable_format(version)
            if problem:
                raise StoreFormatError(problem)
            return decode_format(version)
        is_plain = not fresh and self._has_data(None)
        if not fresh and self._has_data(VALUES_CF):
            raise StoreCorruptError("store holds timestamped values but no format marker")
        fmt = FORMAT_MIXED if is_plain else FORMAT_TIMESTAMPED
        if is_plain:
            log.info("table %s: plain-layout store (values without timestamps); serving them with timestamp %d and "
                     "moving them to the timestamped layout in the background", self.table, SURROGATE_TIMESTAMP)
        self._put_meta(layout.stamp(fmt, self.topic))
        return fmt

    def _import_checkpoint_file(self) -> tuple[dict[int, int], str]:
        """KIP-1035 interop: a store holding data but no offsets adopts those of a Kafka-format .checkpoint.

        An empty store never does: offsets without the data below them would skip it for good."""
        path = checkpoint_path(self.state_dir, self.table)
        if self.offsets():
            return {}, "the store already holds its offsets"
        try:
            found = checkpoint_file.read(path)
        except checkpoint_file.CheckpointFormatError as e:
            log.warning("table %s: ignoring unreadable checkpoint file: %s", self.table, e)
            return {}, f"unreadable checkpoint file ignored: {e}"
        imported = {p: o for (t, p), o in found.items() if t == self.topic}
        if not imported:
            return {}, f"no offsets of topic {self.topic} in {path}" if found else f"no checkpoint file at {path}"
        if not self._holds_data():
            log.warning("table %s: ignoring offsets %s in %s: the store is empty, so it restores from the log start",
                        self.table, imported, path)
            return {}, "checkpoint offsets ignored: the store holds no data, so it restores from the log start"
        self.write_offsets(imported)
        log.info("table %s: imported offsets %s from %s", self.table, imported, path)
        return imported, f"imported from {path}"

    def close(self, clean: bool = True, stopping: bool = False) -> None:
        """Close the database. It is released even when RocksDB reports an error (a write that failed earlier).

        ``stopping``: the daemon's stop, after its final commit made every write durable in the WAL. The memtables
        are then not flushed and background work is abandoned, not awaited (``Database._disconnect``): the close
        took 0.15-0.5 s of a stop at a load of 9 with 40-100 MB written since the last flush, a flush and the
        compactions it started that durability does not need; the next open replays the WAL instead (0.3 s for
        25 MB, 0.04 s after a flushed close). A bulk load's memtables are still flushed by RocksDB's shutdown: that
        keeps a restore's progress, and its data and offsets together."""
        if self._db is None:
            return
        try:
            if clean:  # a versioned table read its topic until the loop last saw it (put_read_mark)
                read = {} if self._history is None or self.history_read_at is None else \
                    {META_HISTORY_READ: str(self.history_read_at).encode()}
                self._put_meta({META_STATUS: STATUS_CLEAN, **read}, sync=stopping)  # durable without the flush
                if not stopping:
                    with store_io(f"table {self.table}: flush at close"):
                        self._db.flush()
        finally:
            self._migration = None
            self._disconnect(abandon=stopping)
            self._bulk = False

    def _delete_files(self) -> None:
        try:  # one durable rename first: a power loss never finds half a store (or its .checkpoint) in its place
            durable.remove_tree(table_dir(self.state_dir, self.table))
        except OSError:  # the rename was refused: delete in place, as a wipe must not leave the old store
            shutil.rmtree(table_dir(self.state_dir, self.table), ignore_errors=True)

    def wipe(self) -> None:
        """Delete everything the table holds (data, offsets, checkpoint file) and reopen it empty."""
        self._close_quietly()
        self._delete_files()
        self._open_checked()

    def replace_with(self, stage: Path) -> None:
        """Put ``stage`` (a complete store directory its maker checked: ``export.bootstrap``) in place of this
        emptied one, and open it. The old directory goes by one durable rename, the stage comes by another: a power
        loss between leaves no store, which the next start bootstraps or restores; never half of one. Raises
        StoreIOError while the disk refuses (the store is then left closed for ``recover_stores``)."""
        self._close_quietly()
        with store_io(f"table {self.table}: put the refilled store in place"):
            self._delete_files()
            durable.rename(stage, table_dir(self.state_dir, self.table))
        self.open_or_wipe(wipe_unusable=False)

    def reopen(self) -> None:
        """Close and open again (RocksDB refuses every write after one failed until it is reopened). Raises
        StoreCorruptError for a store found unusable, StoreIOError while the disk refuses (left closed)."""
        self._close_quietly()
        self.open_or_wipe(wipe_unusable=False)

    def _close_quietly(self) -> None:
        try:
            self.close(clean=False)
        except Exception as e:  # the error that made us close; the database is released regardless
            log.warning("table %s: close reported: %s", self.table, e)

    def write_error(self) -> GlobaldError | None:
        """None when the store takes writes; else why not, mapped once (``failures``): StoreCorruptError for a store
        that cannot be trusted, StoreUnavailableError for one a reopen may heal. Rewrites a metadata key."""
        if self._db is None:
            return StoreUnavailableError("store is closed")
        try:
            self._put_meta({META_STATUS: STATUS_OPEN})
        except Exception as e:
            return classify(e, f"table {self.table}: write check")
        return None

    # -- data -----------------------------------------------------------------------------------------------

    def new_batch(self) -> Batch:
        """A batch whose put/delete address the values (offsets go through ``put_offsets``)."""
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._values)
        if self._migration is None:
            return batch
        return UpgradingBatch(batch, self)

    def origin_writer(self, batch: Batch) -> OriginWriter | None:
        """What adds the origins of the values ``batch`` writes, for a typed table; None for a raw one."""
        return None if self._origins is None else OriginWriter(batch, self._origins)

    @property
    def plain_handle(self) -> object:
        """The default family's handle while plain values may be left in it."""
        if self._migration is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed or holds no plain values")
        return self._migration.plain_handle

    def put_offsets(self, batch: Batch, offsets: Mapping[int, int],
                    ladders: Mapping[int, Ladder] | None = None) -> None:
        """Add ``offsets`` (and the fingerprint ladders of the records below them) to ``batch``."""
        layout.put_offsets(_inner(batch), self.db, offsets, ladders)

    def put_read_mark(self, batch: Batch) -> None:
        """Add to ``batch`` (one that moves offsets) when the loop last knew a versioned table reading its topic
        (``history_read_at``): the mark a restart measures its gap from (``store.gaps.since_after_gap``). The loop's
        mark, not the write's time: records fetched after a gap, written before the loop saw it, must not make
        the gap look closed."""
        if self._history is not None and self.history_read_at is not None:
            layout.put_meta(_inner(batch), self.db, {META_HISTORY_READ: str(self.history_read_at).encode()})

    def fingerprints(self) -> dict[int, Ladder]:
        """The stored fingerprint ladder of each partition that has one (see ``fingerprint``)."""
        if self._meta is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        with store_io(f"table {self.table}: read fingerprints"):
            found, problems = ladders_in(self._meta.items(from_key=META_FINGERPRINT_PREFIX))
        for problem in problems:
            log.warning("table %s: ignoring fingerprint %s", self.table, problem)
        return found

    def write(self, batch: Batch, rebuild: Callable[[], Batch]) -> None:
        """Write ``batch`` atomically. ``rebuild`` makes the same batch again, offsets included: a write that
        RocksDB holds back (flushes behind) is made again from it once there is room (see ``writes.write``)."""
        self.fit_compactions()
        write(self.db, _inner(batch), self._write_opts, f"table {self.table}: write", rebuild=lambda: _inner(rebuild()))

    def checkpoint(self, dest: Path) -> None:
        """As ``Database.checkpoint``; a store that a failed background write (a compaction the disk could not
        hold) left refusing flushes is reopened, which clears RocksDB's error, and the checkpoint taken again."""
        try:
            super().checkpoint(dest)
        except StoreIOError as e:
            if not out_of_space(e) or self._bulk:
                raise
            for left in (dest, dest.with_name(dest.name + ".tmp")):  # RocksDB's work directory, if it left one
                shutil.rmtree(left, ignore_errors=True)
            log.warning("table %s: checkpoint refused for lack of room (%s); reopening the store to clear RocksDB's "
                        "background error, compactions paused while the disk is short", self.table, e)
            self.reopen()
            super().checkpoint(dest)

    def write_offsets(self, offsets: dict[int, int]) -> None:
        """Store ``offsets`` alone (partitions whose next record the store holds no data below)."""

        def batch() -> Batch:
            b = self.new_batch()
            self.put_offsets(b, offsets)
            return b

        self.write(batch(), rebuild=batch)

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        """(value, timestamp) of ``key``. Safe from any thread; a plain value found is queued for its move."""
        migration, values = self._migration, self._values_cf
        if values is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        found = plain.get(values, None if migration is None else migration.plain, key)
        if migration is not None and found is not None and found[1] == SURROGATE_TIMESTAMP:
            migration.note_read(key)
        return found

    # -- upgrade of plain values -------------------------------------------------------------------------------

    @property
    def upgrading(self) -> bool:
        """The store is FORMAT_MIXED: some values may still be plain, in the default family."""
        return self._migration is not None

    def upgrade_step(self, budget_s: float) -> bool:
        """Move plain values for about ``budget_s`` seconds (loop thread only); True once none is left."""
        migration = self._migration
        if migration is None:
            return True
        if not migration.step(budget_s):
            return False
        # Record the upgrade before reclaiming space: a crash in between leaves only deleted entries behind.
        self._put_meta({META_FORMAT: str(FORMAT_TIMESTAMPED).encode(),
                        META_UPGRADED: str(int(time.time())).encode()}, sync=True)
        self._migration = None
        # RocksDB cannot drop its default family; compacting it away leaves no file behind.
        self.db.compact_range(None, None)
        log.info("table %s: upgrade complete: %d plain values moved to the timestamped layout; store is format %d",
                 self.table, migration.moved, FORMAT_TIMESTAMPED)
        return True

    def sync(self) -> dict[int, int]:
        """Make every write so far durable (fsync the WAL) and return the offsets that are now durable.

        During a bulk load nothing is durable before ``end_bulk_load``: raises StoreUnavailableError then.
        """
        if self._bulk:
            raise StoreUnavailableError(f"table {self.table}: in a bulk load only its end makes writes durable")
        with store_io(f"table {self.table}: sync"):
            self.db.flush_wal(True)
        return self.offsets()

    def write_checkpoint_file(self, offsets: dict[int, int]) -> None:
        """The Kafka-format file for tools that must not open the store; callers pass offsets ``sync`` returned."""
        with store_io(f"table {self.table}: write {checkpoint_path(self.state_dir, self.table)}"):
            checkpoint_file.write(checkpoint_path(self.state_dir, self.table),
                                  {(self.topic, p): o for p, o in offsets.items()})

    @property
    def topic_id(self) -> str | None:
        """The ID of the topic the store mirrors, where the cluster gave one (``record_topic_id``)."""
        if self._meta is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        raw = self._meta.get(META_TOPIC_ID)
        return raw.decode() if isinstance(raw, bytes) else None

    def record_topic_id(self, topic_id: str) -> None:
        if self.topic_id != topic_id:
            self._put_meta({META_TOPIC_ID: topic_id.encode()})

    @property
    def complete(self) -> bool:
        """The store has been restored to a log end once (see META_COMPLETE); a wipe clears it."""
        if self._meta is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        return self._meta.get(META_COMPLETE) == COMPLETE_YES

    def mark_complete(self) -> None:
        """Record, durably, that the store holds a whole table (call once its offsets are durable)."""
        if not self.complete:
            self._put_meta({META_COMPLETE: COMPLETE_YES}, sync=True)

def _inner(batch: Batch) -> WriteBatch:
    return batch.inner if isinstance(batch, UpgradingBatch) else batch
