"""The one door to a table database that is not a live store: opened here, written through ``writes``, laid out by
``layout``. Who comes through it: an exact snapshot build (``snapshot.builder``), a bootstrap marking a downloaded
store closed (``export.bootstrap``), a Kafka Streams import (``cli.kstreams``), and a read of what a database says
of itself (``read_info``: the exporter and the bootstrap).

Nothing outside ``store/`` opens RocksDB, holds a family or a batch of its own, or writes (``test_architecture_claims``
reads the code for it). Each caller keeps the options it opened with before: a build and an import open with the
table's ``StoreOptions``, creating what is missing; a bootstrap's stamp opens an existing database only; a read is
read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rocksdict import AccessType, ColumnFamily, Options, Rdict, WriteBatch

from globald.store import layout
from globald.store.codec import decode_format, unreadable_format
from globald.store.fingerprint import Fingerprint, Ladder, ladders_in
from globald.store.history import HistoryMeta, HistoryWriter
from globald.store.layout import OriginWriter
from globald.store.names import (
    DEFAULT_CF,
    HISTORY_CF,
    META_CF,
    META_FINGERPRINT_PREFIX,
    META_FORMAT,
    META_STATUS,
    META_TOPIC,
    META_TOPIC_ID,
    OFFSETS_CF,
    ORIGINS_CF,
    STATUS_CLEAN,
    VALUES_CF,
)
from globald.store.options import StoreOptions
from globald.store.writes import write, write_options

Batch = WriteBatch  # what ``OfflineStore.values_batch`` gives: put/delete address the values

# Opened read-only, never written: the same options for every family (see store.layout on why they are shared).
_READ_ONLY = Options(raw_mode=True)
_READ_ONLY.create_if_missing(False)


class OfflineStore:
    """A table database opened by ``open_offline``; writes go through ``writes.write``. Close it (or use it as a
    context manager): the family handles it keeps are dropped first, as one held past close pins the database."""

    def __init__(self, db: Rdict, path: Path) -> None:
        self._db = db
        self.path = path
        self._handles: dict[str, ColumnFamily] = {}

    def __enter__(self) -> OfflineStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._handles.clear()
        self._db.close()

    def _handle(self, cf: str) -> ColumnFamily:
        handle = self._handles.get(cf)
        if handle is None:
            handle = self._handles[cf] = self._db.get_column_family_handle(cf)
        return handle

    # -- writes: every one through writes.write ------------------------------------------------------------

    def write(self, make: Callable[[], WriteBatch], context: str, rebuild: bool = True) -> None:
        """Write the batch ``make()`` gives, atomically; with ``rebuild``, one RocksDB held back is made again from
        ``make`` (``writes.write``), without it the write fails then."""
        write(self._db, make(), write_options(), context, rebuild=make if rebuild else None)

    def put_meta(self, entries: Mapping[bytes, bytes | None], context: str, rebuild: bool = True) -> None:
        """Write ``entries`` to the metadata in one batch; a None value deletes its key."""
        def batch() -> WriteBatch:
            b = WriteBatch(raw_mode=True)
            layout.put_meta(b, self._db, entries)
            return b

        self.write(batch, context, rebuild)

    def put_offsets(self, offsets: Mapping[int, int], context: str) -> None:
        def batch() -> WriteBatch:
            b = WriteBatch(raw_mode=True)
            layout.put_offsets(b, self._db, offsets)
            return b

        self.write(batch, context)

    def put_all(self, cf: str, pairs: Sequence[tuple[bytes, bytes]], context: str) -> None:
        """Write ``pairs`` into family ``cf`` in one batch."""
        family = self._handle(cf)

        def batch() -> WriteBatch:
            b = WriteBatch(raw_mode=True)
            for k, v in pairs:
                b.put(k, v, family)
            return b

        self.write(batch, context)

    def values_batch(self) -> Batch:
        """A new batch whose put/delete address the values family (as the live store's ``new_batch``)."""
        b = WriteBatch(raw_mode=True)
        b.set_default_column_family(self._handle(VALUES_CF))
        return b

    def origin_writer(self, batch: Batch) -> OriginWriter:
        """What adds the origins of the values ``batch`` writes (the database was opened with ``ORIGINS_CF``)."""
        return OriginWriter(batch, self._handle(ORIGINS_CF))

    def history_writer(self, batch: Batch, window_ms: int, lag_ms: int | None = None) -> HistoryWriter:
        """What adds the versions of the records ``batch`` folds (the database was opened with ``HISTORY_CF``);
        ``lag_ms``: the topic's min.compaction.lag.ms, which a pending ``since`` is set from (None: taken as 0)."""
        meta = self._db.get_column_family(META_CF)
        try:
            marks = HistoryMeta.read(meta)
        finally:
            del meta
        return HistoryWriter(batch, self._handle(HISTORY_CF), self._db.get_column_family(HISTORY_CF),
                             self._handle(META_CF), marks, window_ms, lag_ms=lag_ms)

    def drop_family(self, cf: str) -> None:
        self._handles.pop(cf, None)
        self._db.drop_column_family(cf)

    def flush(self) -> None:
        self._db.flush()

    def mark_closed(self, context: str) -> None:
        """Record in the metadata that the store was closed cleanly, and flush: a bootstrap's downloaded store was
        open on the exporting host when its snapshot was taken, and the daemon that opens it here must not report a
        crash that never happened on this host."""
        self.put_meta({META_STATUS: STATUS_CLEAN}, context)
        self.flush()

    # -- reads ---------------------------------------------------------------------------------------------

    def ladders(self) -> tuple[dict[int, Ladder], list[str]]:
        """The fingerprint ladders in the metadata, and the problems of those that do not decode (``ladders_in``)."""
        meta = self._db.get_column_family(META_CF)
        try:
            return ladders_in(meta.items(from_key=META_FINGERPRINT_PREFIX))
        finally:
            del meta

    def estimate_keys(self, cf: str = VALUES_CF) -> int:
        family = self._db.get_column_family(cf)
        try:
            return int(family.property_int_value("rocksdb.estimate-num-keys") or 0)
        finally:
            del family

    def count_keys(self, cf: str | None = None) -> int:
        """Keys in family ``cf`` (the default family without one), counted one by one."""
        family = self._db if cf is None else self._db.get_column_family(cf)
        try:
            return sum(1 for _ in family.keys())  # noqa: SIM118 - an Rdict iterates items
        finally:
            del family

    def items(self, cf: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of family ``cf`` (the default family without one), in key order; raises what the
        iterator's status says once it ends."""
        family = self._db if cf is None else self._db.get_column_family(cf)
        it = family.iter()
        try:
            it.seek_to_first()
            while it.valid():
                yield it.key(), it.value()
                it.next()
            it.status()
        finally:
            del it, family


def open_offline(path: Path, options: StoreOptions, families: Iterable[str] | None = None,
                 create: bool = True) -> OfflineStore:
    """Open the database at ``path`` with ``families`` (every one it has but the default one without), each with
    ``options.rocksdb(create)``. Raises what rocksdict raises (a bare Exception naming the file): callers map it
    (``failures.store_io``, or a refusal of their own)."""
    named = [cf for cf in layout.families(path) if cf != DEFAULT_CF] if families is None else list(families)
    db = Rdict(str(path), options.rocksdb(create), column_families={cf: options.rocksdb(create) for cf in named})
    return OfflineStore(db, path)


class StoreInfoError(Exception):
    """The database cannot be opened read-only or is not a globald store of a format this release reads."""


@dataclass(frozen=True)
class StoreInfo:
    offsets: dict[int, int]
    ladders: dict[int, tuple[Fingerprint, ...]]
    topic: str | None
    topic_id: str | None
    format: int
    typed: bool
    history: HistoryMeta | None = None  # a versioned table's marks (store.history); None: it holds no versions


def read_info(db: Path) -> StoreInfo:
    """What the database at ``db`` says about itself, opened read-only: offsets, fingerprint ladders, topic, topic
    ID, format and, for a versioned table's, its history's marks (``since``: read in one view with the offsets,
    so the ``since`` proven at exactly those offsets). The exporter reads a snapshot's to write its manifest; the
    bootstrap reads a downloaded one's to check it holds what its manifest claims."""
    try:
        families = layout.families(db)
        rd = Rdict(str(db), _READ_ONLY, column_families={cf: _READ_ONLY for cf in families if cf != DEFAULT_CF},
                   access_type=AccessType.read_only())
    except Exception as e:  # rocksdict raises bare Exceptions naming the file
        raise StoreInfoError(f"cannot open {db} read-only: {e}") from None
    try:
        if META_CF not in families or OFFSETS_CF not in families:
            raise StoreInfoError(f"{db} is not a globald store (no {META_CF} or {OFFSETS_CF} family)")
        meta = rd.get_column_family(META_CF)
        raw_format = meta.get(META_FORMAT)
        if raw_format is None or unreadable_format(raw_format):
            raise StoreInfoError(f"{db}: store format {raw_format!r} is not one this globald reads")
        found, problems = ladders_in(meta.items(from_key=META_FINGERPRINT_PREFIX))
        if problems:
            raise StoreInfoError(f"{db}: damaged fingerprint ladders: {'; '.join(problems)}")
        topic, topic_id = meta.get(META_TOPIC), meta.get(META_TOPIC_ID)
        offsets = layout.offsets_in(rd.get_column_family(OFFSETS_CF).items())
        marks = HistoryMeta.read(meta) if HISTORY_CF in families else None
        del meta
        return StoreInfo(offsets=offsets, ladders={p: lad.rungs for p, lad in found.items()},
                         topic=topic.decode(errors="replace") if isinstance(topic, bytes) else None,
                         topic_id=topic_id.decode(errors="replace") if isinstance(topic_id, bytes) else None,
                         format=decode_format(raw_format), typed=ORIGINS_CF in families, history=marks)
    finally:
        rd.close()


def since_of(db: Path) -> int | None:
    """``since`` (epoch ms) of the table database at ``db``, a snapshot's ``<snapshot dir>/db`` or a downloaded
    export's, opened read-only: the one read of a snapshot's ``since`` (its manifest's ``since`` is this, read when
    it was published; Spark's ``as_of=`` joins read either). None when the database holds no versions, or when no
    ``since`` is proven there (pending, or a store that held data before it was versioned). Raises
    ``StoreInfoError`` when the database does not open."""
    marks = read_info(db).history
    return None if marks is None else marks.since
