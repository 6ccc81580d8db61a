"""Plain values (no timestamp, in the default family) and their lazy move to the timestamped layout (KIP-258).

Contract: while a store is FORMAT_MIXED each key is in VALUES_CF or, as a plain value served with the surrogate
timestamp -1, in the default family; VALUES_CF wins if both hold it. Every move (put timestamped + delete plain) and
every write of a new record (which also deletes the plain copy) is one WriteBatch, so any consistent view — a
read-only open, a snapshot, the store after a crash — merges to the same table.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

from rocksdict import Rdict, WriteBatch

from globald.store.codec import NO_TIMESTAMP, decode_value, encode_value
from globald.store.failures import classify
from globald.store.names import DEFAULT_CF, VALUES_CF
from globald.store.writes import write, write_options

SURROGATE_TIMESTAMP = NO_TIMESTAMP  # what a plain value is served with: its record timestamp was never stored
MOVE_CHUNK = 512  # keys per WriteBatch of the background pass
MAX_READ_QUEUE = 100_000  # keys read as plain values waiting for the loop thread; beyond this the pass finds them

Item = tuple[bytes, bytes, int]  # (key, value, timestamp)


def get(values: Rdict | None, plain: Rdict | None, key: bytes) -> tuple[bytes, int] | None:
    raw = None if values is None else values.get(key)
    if raw is not None:
        return decode_value(raw)
    value = None if plain is None else plain.get(key)
    return None if value is None else (value, SURROGATE_TIMESTAMP)


def fetch_many(db: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """RocksDB's batched multi-get (rocksdict's stub types the key list too narrowly for bytes)."""
    found: list[bytes | None] = cast(Any, db).get(keys)
    return found


def multi_get(values: Rdict | None, plain: Rdict | None, keys: list[bytes]) -> list[tuple[bytes, int] | None]:
    return [None if r is None else decode_value(r) for r in multi_get_stored(values, plain, keys)]


def multi_get_stored(values: Rdict | None, plain: Rdict | None, keys: list[bytes]) -> list[bytes | None]:
    """Like ``multi_get`` but values stay in their stored form (8-byte big-endian timestamp, then the value), for
    callers that split a whole batch at once; plain values get the surrogate timestamp prefix."""
    found: list[bytes | None] = [None] * len(keys) if values is None else fetch_many(values, keys)
    if plain is None:
        return found
    missing = [i for i, f in enumerate(found) if f is None]
    if missing:
        for i, value in zip(missing, fetch_many(plain, [keys[i] for i in missing]), strict=True):
            if value is not None:
                found[i] = encode_value(SURROGATE_TIMESTAMP, value)
    return found


def _scan(cf: Rdict, start: bytes | None, end: bytes | None,
          decode: Callable[[bytes], tuple[bytes, int]]) -> Iterator[Item]:
    it = cf.iter()
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    while it.valid():
        key = it.key()
        if end is not None and key >= end:
            return
        value, ts = decode(it.value())
        yield key, value, ts
        it.next()
    # An iterator stops the same way at the end and at a damaged block: only its status tells them apart,
    # and a scan cut short must never pass for the whole table.
    try:
        it.status()
    except Exception as e:  # a damaged block is corruption, not a disk that may heal (failures.classify)
        raise classify(e, "read failed") from None


def _plain(value: bytes) -> tuple[bytes, int]:
    return value, SURROGATE_TIMESTAMP


def items(values: Rdict | None, plain: Rdict | None, start: bytes | None = None,
          end: bytes | None = None) -> Iterator[Item]:
    """(key, value, timestamp) in key order over both layouts; a key in both comes from VALUES_CF."""
    timestamped = _scan(values, start, end, decode_value) if values is not None else iter(())
    if plain is None:
        yield from timestamped
        return
    last: bytes | None = None
    # heapq.merge is stable: for equal keys the VALUES_CF item (first iterable) comes first and wins.
    for item in heapq.merge(timestamped, _scan(plain, start, end, _plain), key=lambda i: i[0]):
        if item[0] != last:
            last = item[0]
            yield item


class HasPlainHandle(Protocol):
    @property
    def plain_handle(self) -> Any: ...


class UpgradingBatch:
    """A WriteBatch of a FORMAT_MIXED store: a record written or deleted also leaves the default family.

    It asks its store for the family handle at each use instead of keeping it: a live handle would keep the
    database (and its LOCK) open after the store is closed."""

    __slots__ = ("_store", "inner")

    def __init__(self, inner: WriteBatch, store: HasPlainHandle) -> None:
        self.inner = inner
        self._store = store

    def put(self, key: bytes, value: bytes, column_family: Any = None) -> None:
        if column_family is None:
            self.inner.put(key, value)
            self.inner.delete(key, self._store.plain_handle)
        else:
            self.inner.put(key, value, column_family)

    def delete(self, key: bytes, column_family: Any = None) -> None:
        if column_family is None:
            self.inner.delete(key)
            self.inner.delete(key, self._store.plain_handle)
        else:
            self.inner.delete(key, column_family)


class PlainMigration:
    """Moves the plain values of one open store into VALUES_CF. ``step`` runs on the loop thread (the only writer);
    ``note_read`` may be called from any thread and only queues the key for the next step."""

    def __init__(self, db: Rdict) -> None:
        self._db = db
        self._values = db.get_column_family(VALUES_CF)
        self._values_handle = db.get_column_family_handle(VALUES_CF)
        self.plain_handle = db.get_column_family_handle(DEFAULT_CF)
        self._write_opts = write_options()
        self._cursor: bytes | None = None
        self._read: set[bytes] = set()
        self._lock = threading.Lock()
        self.moved = 0

    @property
    def plain(self) -> Rdict:
        return self._db  # an Rdict reads and iterates its default family

    def note_read(self, key: bytes) -> None:
        with self._lock:
            if len(self._read) < MAX_READ_QUEUE:
                self._read.add(key)

    def step(self, budget_s: float) -> bool:
        """Move plain values for about ``budget_s`` seconds; True once the default family is empty."""
        deadline = time.monotonic() + budget_s
        with self._lock:
            read, self._read = sorted(self._read), set()
        if read:
            values = fetch_many(self._db, read)
            self._move([(k, v) for k, v in zip(read, values, strict=True) if v is not None])
        it = self._db.iter()
        if self._cursor is None:
            it.seek_to_first()
        else:
            it.seek(self._cursor)
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            while len(chunk) < MOVE_CHUNK and it.valid():
                chunk.append((it.key(), it.value()))
                it.next()
            if chunk:
                self._move(chunk)
                self._cursor = chunk[-1][0] + b"\x00"  # the smallest key after the last one moved
            if not it.valid():
                it.status()  # raises if the scan stopped on an error rather than at the end
                del it
                return self._empty()
            if time.monotonic() >= deadline:
                return False

    def _move(self, pairs: list[tuple[bytes, bytes]]) -> None:
        if not pairs:
            return

        def batch() -> WriteBatch:
            present = fetch_many(self._values, [k for k, _ in pairs])
            b = WriteBatch(raw_mode=True)
            for (key, value), newer in zip(pairs, present, strict=True):
                if newer is None:
                    b.put(key, encode_value(SURROGATE_TIMESTAMP, value), self._values_handle)
                b.delete(key, self.plain_handle)
            return b

        write(self._db, batch(), self._write_opts, "plain values upgrade", rebuild=batch)
        self.moved += len(pairs)

    def _empty(self) -> bool:
        it = self._db.iter()
        it.seek_to_first()
        empty = not it.valid()
        del it
        if not empty:
            self._cursor = None  # nothing writes plain values, but never finish on a belief: rescan
        return empty
