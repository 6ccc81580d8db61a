"""The live store of one table: a RocksDB database owned by the daemon.

Consistency contract: record data and the partition next-offsets that cover it are written in one WriteBatch,
so every state a reader can observe (a read-only open, a checkpoint, the state after a crash) holds exactly the
fold of the topic below its stored offsets. A store that is corrupt or of a format this globald cannot read is never
served: it is wiped and rebuilt from the topic. A plain-layout store is kept and upgraded lazily (see ``plain``).
A bulk load (a long restore) writes without the WAL; an atomic flush of every column family ends it, so a crash
loses restore progress, never the pairing of data and offsets.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Checkpoint, Rdict, WriteBatch, WriteOptions

from globald.errors import StoreCorruptError, StoreFormatError, StoreUnavailableError
from globald.store import checkpoint_file, plain
from globald.store.codec import decode_format, decode_offset, encode_offset, partition_key, unreadable_format
from globald.store.names import (
    FORMAT_MIXED,
    FORMAT_TIMESTAMPED,
    META_CF,
    META_FORMAT,
    META_STATUS,
    META_TOPIC,
    META_UPGRADED,
    OFFSETS_CF,
    STATUS_CLEAN,
    STATUS_OPEN,
    VALUES_CF,
    checkpoint_path,
    db_dir,
    table_dir,
)
from globald.store.options import StoreOptions
from globald.store.plain import SURROGATE_TIMESTAMP, PlainMigration, UpgradingBatch

log = logging.getLogger(__name__)

# RocksDB status prefixes that mean "these files are not a usable database"; anything else (a lock, ENOSPC, EIO)
# is not fixed by deleting data and must not trigger a wipe.
_CORRUPTION_MARKERS = ("Corruption", "Invalid argument", "Not implemented", "Unknown", "does not exist",
                       "No such file or directory")  # a file the database refers to (CURRENT exists) is missing


@dataclass
class OpenResult:
    store: TableStore
    wiped_reason: str | None  # set when the store on disk was unusable and was wiped
    crashed: bool  # the previous owner did not close the store cleanly
    imported: dict[int, int]  # offsets taken from a .checkpoint file on first open
    import_note: str = ""  # why offsets were or were not taken from the .checkpoint file


class TableStore:
    """Read-write handle of one table's database. Not thread-safe: the daemon thread owns it (``get`` excepted)."""

    def __init__(self, state_dir: Path, table: str, topic: str, options: StoreOptions) -> None:
        self.state_dir = state_dir
        self.table = table
        self.topic = topic
        self.options = options
        self.path = db_dir(state_dir, table)
        self._db: Rdict | None = None
        self._values = None  # column-family handles, dropped before close so the LOCK is released
        self._values_cf: Rdict | None = None
        self._offsets = None
        self._meta = None
        self._migration: PlainMigration | None = None  # set while the store is FORMAT_MIXED
        self._write_opts = WriteOptions()
        self._bulk = False

    # -- lifecycle ------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path, table: str, topic: str, options: StoreOptions,
             wipe_unusable: bool = True) -> OpenResult:
        """Open (creating if needed) the store; wipe it first when it is corrupt, foreign, of another topic or of
        a format this globald cannot read. With ``wipe_unusable=False`` raise StoreCorruptError instead."""
        store = cls(state_dir, table, topic, options)
        reason: str | None = None
        try:
            crashed = store._open_checked()
            imported, note = store._import_checkpoint_file()
            if not store.offsets() and store._holds_data():
                # Replaying the topic over it could not remove keys whose tombstones compaction already dropped.
                raise StoreCorruptError("store holds data but no offsets, in it or in a .checkpoint file: "
                                        "where it stands in the topic is unknown")
        except StoreCorruptError as e:
            store.close(clean=False)
            if not wipe_unusable:
                raise
            reason = str(e)
            log.warning("table %s: store unusable (%s); wiping and rebuilding from the topic", table, reason)
            store._delete_files()
            crashed = store._open_checked()
            imported, note = {}, "store wiped"
        return OpenResult(store=store, wiped_reason=reason, crashed=crashed, imported=imported, import_note=note)

    def _open_checked(self) -> bool:
        table_dir(self.state_dir, self.table).mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not (self.path / "CURRENT").exists()
        self._connect(bulk=False)
        assert self._meta is not None
        version, stored_topic, status = (self._meta.get(k) for k in (META_FORMAT, META_TOPIC, META_STATUS))
        try:
            fmt = self._adopt(fresh, version)
        except StoreCorruptError:
            self.close(clean=False)
            raise
        if stored_topic is not None and stored_topic != self.topic.encode():
            self.close(clean=False)
            raise StoreCorruptError(f"store holds topic {stored_topic.decode(errors='replace')!r}, not {self.topic!r}")
        if fmt == FORMAT_MIXED:
            self._migration = PlainMigration(self._db)
        crashed = status == STATUS_OPEN
        if crashed:
            log.warning("table %s: previous run did not close the store cleanly; resuming from its offsets",
                        self.table)
        self._put_meta({META_STATUS: STATUS_OPEN}, sync=True)
        return crashed

    def _connect(self, bulk: bool) -> None:
        db_options, families = self.options.column_families(bulk)
        try:
            self._db = Rdict(str(self.path), db_options, column_families=families)
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            text = str(e)
            if any(m in text for m in _CORRUPTION_MARKERS):
                raise StoreCorruptError(f"cannot open: {text}") from None
            raise StoreUnavailableError(f"table {self.table}: cannot open {self.path}: {text}") from None
        self._values = self._db.get_column_family_handle(VALUES_CF)
        self._values_cf = self._db.get_column_family(VALUES_CF)
        self._offsets = self._db.get_column_family(OFFSETS_CF)
        self._meta = self._db.get_column_family(META_CF)
        self._bulk = bulk
        self._write_opts = WriteOptions()
        self._write_opts.disable_wal = bulk

    def _disconnect(self) -> None:
        db = self._db
        assert db is not None
        if self._bulk:
            # Writes made since the last flush live only in memtables. rocksdict flushes a family on its own
            # whenever a family's Rdict is dropped, which would make data durable without its offsets or the
            # reverse; RocksDB's shutdown first flushes every family in one atomic flush, after which those
            # single-family flushes find nothing to do. Running compactions are abandoned, not awaited.
            db.cancel_all_background(False)
        self._values = self._values_cf = self._offsets = self._meta = None
        try:
            db.close()
        except Exception as e:
            if not self._bulk:
                raise
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
            log.info("table %s: bulk load started (WAL off until the restore ends)", self.table)

    def end_bulk_load(self) -> None:
        """Make everything written durable (atomic flush on close) and reopen for serving, WAL on again."""
        if self._bulk:
            self._disconnect()
            self._connect(bulk=False)
            log.info("table %s: bulk load ended: flushed, WAL on", self.table)

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
        self._put_meta({META_FORMAT: str(fmt).encode(), META_TOPIC: self.topic.encode()})
        return fmt

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

    def _put_meta(self, entries: dict[bytes, bytes], sync: bool = False) -> None:
        assert self._db is not None
        batch = WriteBatch(raw_mode=True)
        handle = self._db.get_column_family_handle(META_CF)
        for k, v in entries.items():
            batch.put(k, v, handle)
        opts = WriteOptions()
        opts.sync = sync
        self._db.write(batch, opts)

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
        batch = self.new_batch()
        self.put_offsets(batch, imported)
        self.write(batch)
        log.info("table %s: imported offsets %s from %s", self.table, imported, path)
        return imported, f"imported from {path}"

    def close(self, clean: bool = True) -> None:
        """Close the database. It is released even when RocksDB reports an error (a write that failed earlier)."""
        if self._db is None:
            return
        try:
            if clean:
                self._put_meta({META_STATUS: STATUS_CLEAN})
                self._db.flush()
        finally:
            self._migration = None
            self._disconnect()
            self._bulk = False

    def _delete_files(self) -> None:
        shutil.rmtree(table_dir(self.state_dir, self.table), ignore_errors=True)

    def wipe(self) -> None:
        """Delete everything the table holds (data, offsets, checkpoint file) and reopen it empty."""
        self._close_quietly()
        self._delete_files()
        self._open_checked()

    def reopen(self) -> None:
        """Close and open again. RocksDB refuses every write after one failed (disk full) until it is reopened."""
        self._close_quietly()
        self._open_checked()

    def _close_quietly(self) -> None:
        try:
            self.close(clean=False)
        except Exception as e:  # the error that made us close; the database is released regardless
            log.warning("table %s: close reported: %s", self.table, e)

    def write_error(self) -> str | None:
        """None when the store takes writes; else RocksDB's error. Rewrites a metadata key with its own value."""
        if self._db is None:
            return "store is closed"
        try:
            self._put_meta({META_STATUS: STATUS_OPEN})
        except Exception as e:
            return str(e)
        return None

    # -- data -----------------------------------------------------------------------------------------------

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        return self._db

    @property
    def values_handle(self) -> object:
        return self._values

    def new_batch(self) -> WriteBatch | UpgradingBatch:
        """A batch whose put/delete address the values (offsets go through ``put_offsets``)."""
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._values)
        if self._migration is None:
            return batch
        return UpgradingBatch(batch, self)

    @property
    def plain_handle(self) -> object:
        """The default family's handle while plain values may be left in it."""
        if self._migration is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed or holds no plain values")
        return self._migration.plain_handle

    def put_offsets(self, batch: WriteBatch, offsets: dict[int, int]) -> None:
        handle = self.db.get_column_family_handle(OFFSETS_CF)
        for partition, offset in offsets.items():
            batch.put(partition_key(partition), encode_offset(offset), handle)

    def write(self, batch: WriteBatch | UpgradingBatch) -> None:
        self.db.write(batch.inner if isinstance(batch, UpgradingBatch) else batch, self._write_opts)

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

    def offsets(self) -> dict[int, int]:
        assert self._offsets is not None
        return {int(k): decode_offset(v) for k, v in self._offsets.items()}

    def sync(self) -> None:
        """Make every write so far durable (fsync the WAL). During a bulk load only ``end_bulk_load`` can."""
        if not self._bulk:
            self.db.flush_wal(True)

    def write_checkpoint_file(self, offsets: dict[int, int]) -> None:
        if self._bulk:
            return  # the file may only claim durable offsets; it is rewritten when the bulk load ends
        checkpoint_file.write(checkpoint_path(self.state_dir, self.table),
                              {(self.topic, p): o for p, o in offsets.items()})

    def checkpoint(self, dest: Path) -> None:
        """A consistent, hard-linked copy of the database at ``dest`` (which must not exist)."""
        Checkpoint(self.db).create_checkpoint(str(dest))

    def estimate_keys(self) -> int:
        # Through the family's long-lived handle: a temporary one would flush the family alone when dropped.
        assert self._values_cf is not None
        n = int(self._values_cf.property_int_value("rocksdb.estimate-num-keys") or 0)
        if self._migration is not None:
            n += int(self.db.property_int_value("rocksdb.estimate-num-keys") or 0)
        return n
