"""The live store of one table: a RocksDB database owned by the daemon.

Consistency contract: record data and the partition next-offsets that cover it are written in one WriteBatch,
so every state a reader can observe (a read-only open, a checkpoint, the state after a crash) holds exactly the
fold of the topic below its stored offsets. A store that is corrupt or of an unknown format is never served: it
is wiped and rebuilt from the topic. A bulk load (a long restore) writes without the WAL; an atomic flush of every
column family (on close) ends it, so a crash loses restore progress, never the pairing of data and offsets.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Checkpoint, Rdict, WriteBatch, WriteOptions

from globald.errors import StoreCorruptError, StoreUnavailableError
from globald.store import checkpoint_file
from globald.store.codec import decode_offset, encode_offset, partition_key
from globald.store.names import (
    COLUMN_FAMILIES,
    FORMAT_VERSION,
    META_CF,
    META_FORMAT,
    META_STATUS,
    META_TOPIC,
    OFFSETS_CF,
    STATUS_CLEAN,
    STATUS_OPEN,
    VALUES_CF,
    checkpoint_path,
    db_dir,
    table_dir,
)
from globald.store.options import StoreOptions

log = logging.getLogger(__name__)

# RocksDB status prefixes that mean "these files are not a usable database"; anything else (a lock, ENOSPC, EIO)
# is not fixed by deleting data and must not trigger a wipe.
_CORRUPTION_MARKERS = ("Corruption", "Invalid argument", "Not implemented", "Unknown", "does not exist")


@dataclass
class OpenResult:
    store: TableStore
    wiped_reason: str | None  # set when the store on disk was unusable and was wiped
    crashed: bool  # the previous owner did not close the store cleanly
    imported: dict[int, int]  # offsets taken from a .checkpoint file on first open


class TableStore:
    """Read-write handle of one table's database. Not thread-safe: the daemon thread owns it."""

    def __init__(self, state_dir: Path, table: str, topic: str, options: StoreOptions) -> None:
        self.state_dir = state_dir
        self.table = table
        self.topic = topic
        self.options = options
        self.path = db_dir(state_dir, table)
        self._db: Rdict | None = None
        self._values = None  # column-family handles, dropped before close so the LOCK is released
        self._values_rd: Rdict | None = None
        self._offsets = None
        self._meta = None
        self._write_opts = WriteOptions()
        self._bulk = False

    # -- lifecycle ------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path, table: str, topic: str, options: StoreOptions) -> OpenResult:
        """Open (creating if needed) the store; wipe it first when it is corrupt, foreign or of another topic."""
        store = cls(state_dir, table, topic, options)
        reason: str | None = None
        try:
            crashed = store._open_checked()
        except StoreCorruptError as e:
            reason = str(e)
            log.warning("table %s: store unusable (%s); wiping and rebuilding from the topic", table, reason)
            store.close(clean=False)
            store._delete_files()
            crashed = store._open_checked()
        imported = {} if reason else store._import_checkpoint_file()
        return OpenResult(store=store, wiped_reason=reason, crashed=crashed, imported=imported)

    def _open_checked(self) -> bool:
        table_dir(self.state_dir, self.table).mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not (self.path / "CURRENT").exists()
        self._connect(bulk=False)
        assert self._meta is not None
        version, stored_topic, status = (self._meta.get(k) for k in (META_FORMAT, META_TOPIC, META_STATUS))
        if fresh or (version is None and self._is_empty()):
            self._put_meta({META_FORMAT: str(FORMAT_VERSION).encode(), META_TOPIC: self.topic.encode()})
            version, stored_topic = str(FORMAT_VERSION).encode(), self.topic.encode()
        problem = None
        if version != str(FORMAT_VERSION).encode():
            shown = version.decode(errors="replace") if version else "none"
            problem = f"store format {shown} is not format {FORMAT_VERSION}"
        elif stored_topic is not None and stored_topic != self.topic.encode():
            problem = f"store holds topic {stored_topic.decode(errors='replace')!r}, not {self.topic!r}"
        if problem:
            self.close(clean=False)
            raise StoreCorruptError(problem)
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
        self._values_rd = self._db.get_column_family(VALUES_CF)
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
        self._values = self._values_rd = self._offsets = self._meta = None
        try:
            db.close()
        except Exception as e:
            if not self._bulk:
                raise
            log.debug("table %s: close after shutdown: %s", self.table, e)
        self._db = None

    @property
    def bulk(self) -> bool:
        return self._bulk

    def begin_bulk_load(self) -> None:
        """Restore mode: writes skip the WAL and append to a memtable sorted at flush (reopens the database).

        Nothing written from now on is durable until ``end_bulk_load`` or ``close``; automatic flushes are
        atomic across families, so a crash rolls data and offsets back together to the last flush.
        """
        if not self._bulk:
            self._disconnect()
            self._connect(bulk=True)
            log.info("table %s: bulk load started (WAL off until the restore ends)", self.table)

    def end_bulk_load(self) -> None:
        """Make everything written durable (atomic flush on close) and reopen for serving, WAL on again."""
        if self._bulk:
            self._disconnect()
            self._connect(bulk=False)
            log.info("table %s: bulk load ended: flushed, WAL on", self.table)

    def _is_empty(self) -> bool:
        assert self._db is not None
        for name in (None, *COLUMN_FAMILIES):
            handle = self._db if name is None else self._db.get_column_family(name)
            it = handle.iter()
            it.seek_to_first()
            found = it.valid()
            del it, handle  # iterators and family objects pin the database open
            if found:
                return False
        return True

    def _put_meta(self, entries: dict[bytes, bytes], sync: bool = False) -> None:
        assert self._db is not None
        batch = WriteBatch(raw_mode=True)
        handle = self._db.get_column_family_handle(META_CF)
        for k, v in entries.items():
            batch.put(k, v, handle)
        opts = WriteOptions()
        opts.sync = sync
        self._db.write(batch, opts)

    def _import_checkpoint_file(self) -> dict[int, int]:
        """KIP-1035 interop: a store with no offsets adopts those of an existing Kafka-format .checkpoint."""
        if self.offsets():
            return {}
        try:
            found = checkpoint_file.read(checkpoint_path(self.state_dir, self.table))
        except checkpoint_file.CheckpointFormatError as e:
            log.warning("table %s: ignoring unreadable checkpoint file: %s", self.table, e)
            return {}
        imported = {p: o for (t, p), o in found.items() if t == self.topic}
        if imported:
            batch = self.new_batch()
            self.put_offsets(batch, imported)
            self.write(batch)
            log.info("table %s: imported offsets %s from %s", self.table, imported, checkpoint_file.__name__)
        return imported

    def close(self, clean: bool = True) -> None:
        if self._db is None:
            return
        if clean:
            self._put_meta({META_STATUS: STATUS_CLEAN})
            self._db.flush()
        self._disconnect()
        self._bulk = False

    def _delete_files(self) -> None:
        shutil.rmtree(table_dir(self.state_dir, self.table), ignore_errors=True)

    def wipe(self) -> None:
        """Delete everything the table holds (data, offsets, checkpoint file) and reopen it empty."""
        self.close(clean=False)
        self._delete_files()
        self._open_checked()

    # -- data -----------------------------------------------------------------------------------------------

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StoreUnavailableError(f"table {self.table}: store is closed")
        return self._db

    @property
    def values_handle(self) -> object:
        return self._values

    def new_batch(self) -> WriteBatch:
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._values)
        return batch

    def put_offsets(self, batch: WriteBatch, offsets: dict[int, int]) -> None:
        handle = self.db.get_column_family_handle(OFFSETS_CF)
        for partition, offset in offsets.items():
            batch.put(partition_key(partition), encode_offset(offset), handle)

    def write(self, batch: WriteBatch) -> None:
        self.db.write(batch, self._write_opts)

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
        assert self._values_rd is not None
        return int(self._values_rd.property_int_value("rocksdb.estimate-num-keys") or 0)
