"""Read-only access to a table database: the live store (opened read-only, never locked) or a snapshot copy.

A reader sees the database as of the moment it was opened: data and offsets from the same committed write
batches, never a half-applied poll. Values come back as (value, timestamp); in a store still upgrading from the
plain layout both layouts are merged (see ``plain``). A format this globald cannot read is refused, never guessed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocksdict import AccessType, BlockBasedOptions, Cache, Options, Rdict

from globald.common.errors import StoreFormatError
from globald.common.waits import pause
from globald.store import history, layout, plain
from globald.store.codec import decode_format, encode_value, unreadable_format
from globald.store.failures import classify
from globald.store.history import HistoryMeta, Version
from globald.store.names import (
    COMPLETE_YES,
    DEFAULT_CF,
    FORMAT_MIXED,
    FORMAT_PLAIN,
    HISTORY_CF,
    META_CF,
    META_COMPLETE,
    META_FORMAT,
    OFFSETS_CF,
    ORIGINS_CF,
    VALUES_CF,
)
from globald.store.options import StoreOptions

Origin = tuple[int, int]  # (partition, offset) of the record a stored value came from
READ_BLOCK_CACHE_MB = 64  # uncompressed blocks a reader keeps (allocated as used): a 100k-key table fits


def _read_only_options(path: Path, cache: Cache) -> Options:
    o = Options(raw_mode=True)
    o.create_if_missing(False)
    # Open every table file up front: the live owner may delete compacted files while we read.
    o.set_max_open_files(-1)
    # RocksDB starts this many threads to open those files; starting 16 costs more than opening a few dozen
    # files, so use one per 64 files (keeps a snapshot open at ~1-2 ms instead of ~4-10 ms).
    try:
        files = sum(1 for e in os.scandir(path) if e.name.endswith(".sst"))
    except OSError:
        files = 0
    o.set_max_file_opening_threads(max(1, min(16, files // 64)))
    # Point lookups (Spark executors) read blocks from this cache; the bloom filters the store writes are only
    # consulted when the reader names the same filter policy, so an absent key skips the data blocks.
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_bloom_filter(StoreOptions.bloom_bits_per_key, False)
    o.set_block_based_table_factory(table)
    return o


def _open_read_only(path: Path) -> Rdict:
    """Every column family is named with the options above: a family opened implicitly would get RocksDB's
    8 MB default block cache and no filter policy (measured: half the lookup rate on a 100k-key table)."""
    cache = Cache(READ_BLOCK_CACHE_MB << 20)
    families = {cf: _read_only_options(path, cache) for cf in layout.families(path) if cf != DEFAULT_CF}
    return Rdict(str(path), _read_only_options(path, cache), column_families=families,
                 access_type=AccessType.read_only())


class StoreReader:
    """Read-only view of a table database directory."""

    def __init__(self, path: Path, attempts: int = 5) -> None:
        self.path = path
        last: Exception | None = None
        for i in range(attempts):
            try:
                self._db = _open_read_only(path)
                break
            except Exception as e:  # the owner may be rotating files under us; retry briefly
                last = e
                pause(0.05 * (i + 1))
        else:  # damaged or missing files are StoreCorruptError, a disk or a lock that may heal StoreIOError
            raise classify(last or OSError("no attempt made"), f"cannot open {path} read-only") from None
        self._meta = self._family(META_CF)
        raw = None if self._meta is None else self._meta.get(META_FORMAT)
        problem = None if raw is None else unreadable_format(raw)
        if problem:
            self.close()
            raise StoreFormatError(f"{path}: {problem}")
        self.format = FORMAT_PLAIN if raw is None else decode_format(raw)
        # Read in the same open as the data, so it describes exactly the view this reader serves: a store being
        # rebuilt lacks it until the engine has restored it to a log end (see names.META_COMPLETE).
        self.complete = self._meta is not None and self._meta.get(META_COMPLETE) == COMPLETE_YES
        self._values = self._family(VALUES_CF)
        self._origins = self._family(ORIGINS_CF)  # a typed table's (names.ORIGINS_CF)
        self._history = self._family(HISTORY_CF)  # a versioned table's (names.HISTORY_CF)
        # Read in the same open as the versions, as ``complete`` is.
        self.history: HistoryMeta | None = (None if self._history is None or self._meta is None
                                            else HistoryMeta.read(self._meta))
        # Plain values are consulted only while the store says some may be left: format 1 pays nothing.
        self._plain: Rdict | None = self._db if self.format in (FORMAT_PLAIN, FORMAT_MIXED) else None

    def _family(self, name: str) -> Rdict | None:
        """A column family of the database, or None for a plain-layout store that never had it."""
        try:
            return self._db.get_column_family(name)
        except Exception:  # rocksdict raises a bare Exception naming the missing family
            return None

    def close(self) -> None:
        self._values = self._plain = self._meta = self._origins = self._history = None
        self._db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def format_version(self) -> int | None:
        """META_FORMAT as stored; None for a plain-layout store that no globald has opened yet."""
        return None if self.format == FORMAT_PLAIN else self.format

    def offsets(self) -> dict[int, int]:
        offsets = self._family(OFFSETS_CF)
        return {} if offsets is None else layout.offsets_in(offsets.items())

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        return plain.get(self._values, self._plain, key)

    def multi_get(self, keys: list[bytes]) -> list[tuple[bytes, int] | None]:
        return plain.multi_get(self._values, self._plain, keys)

    def multi_get_stored(self, keys: list[bytes]) -> list[bytes | None]:
        """Values in their stored form (timestamp prefix, then the value): see ``plain.multi_get_stored``."""
        return plain.multi_get_stored(self._values, self._plain, keys)

    def items(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, timestamp) for keys in [start, end), in key order."""
        return plain.items(self._values, self._plain, start, end)

    def origins(self, keys: Sequence[bytes], values: Sequence[bytes], stamps: Sequence[int]) -> list[Origin | None]:
        """(partition, offset) of the record each (key, value, timestamp) was read from, as a typed table's store
        recorded it; None where it did not (a raw table, a value written before the table was typed)."""
        if self._origins is None or not keys:
            return [None] * len(keys)
        stored = [encode_value(ts, v) for v, ts in zip(values, stamps, strict=True)]
        return layout.origins_in(self._origins, keys, stored)

    def as_of(self, key: bytes, t: int) -> Version | None:
        """The version of ``key`` in force at record time ``t`` (``store.history``): the greatest (timestamp,
        offset) at or before ``t``, a tombstone included; None without one, or in a store without versions."""
        return None if self._history is None else history.as_of(self._history, key, t)

    def history_entries(self, chunk: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """The history family's entries as stored, in chunks (``store.history.entries``); none without one."""
        return iter(()) if self._history is None else history.entries(self._history, chunk)

    def items_as_of(self, t: int) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, timestamp) of every key holding a value at record time ``t``, in key order."""
        return iter(()) if self._history is None else history.items_as_of(self._history, t)

    def versions_as_of(self, t: int) -> Iterator[history.Version]:
        """The version in force at record time ``t`` of every key that has one, tombstones included, in key order."""
        return iter(()) if self._history is None else history.versions_as_of(self._history, t)

    def prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes, int]]:
        for item in self.items(start=prefix):
            if not item[0].startswith(prefix):
                return
            yield item

    def estimate_keys(self) -> int:
        n = 0 if self._values is None else int(self._values.property_int_value("rocksdb.estimate-num-keys") or 0)
        if self._plain is not None:
            n += int(self._plain.property_int_value("rocksdb.estimate-num-keys") or 0)
        return n
