"""Read-only access to a table database: the live store (opened read-only, never locked) or a snapshot copy.

A reader sees the database as of the moment it was opened: data and offsets from the same committed write
batches, never a half-applied poll. Values come back as (value, timestamp).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from globald.errors import StoreUnavailableError
from globald.store.codec import decode_offset, decode_value
from globald.store.names import META_CF, META_FORMAT, OFFSETS_CF, VALUES_CF


def _read_only_options(path: Path) -> Options:
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
    return o


class StoreReader:
    """Read-only view of a table database directory."""

    def __init__(self, path: Path, attempts: int = 5) -> None:
        self.path = path
        last: Exception | None = None
        for i in range(attempts):
            try:
                self._db = Rdict(str(path), _read_only_options(path), access_type=AccessType.read_only())
                break
            except Exception as e:  # the owner may be rotating files under us; retry briefly
                last = e
                time.sleep(0.05 * (i + 1))
        else:
            raise StoreUnavailableError(f"cannot open {path} read-only: {last}")
        self._values = self._db.get_column_family(VALUES_CF)

    def close(self) -> None:
        self._values = None
        self._db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def format_version(self) -> int | None:
        raw = self._db.get_column_family(META_CF).get(META_FORMAT)
        return int(raw) if raw else None

    def offsets(self) -> dict[int, int]:
        return {int(k): decode_offset(v) for k, v in self._db.get_column_family(OFFSETS_CF).items()}

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        raw = self._values.get(key)
        return None if raw is None else decode_value(raw)

    def multi_get(self, keys: list[bytes]) -> list[tuple[bytes, int] | None]:
        return [None if raw is None else decode_value(raw) for raw in self._values.get(keys)]

    def items(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, timestamp) for keys in [start, end), in key order."""
        it = self._values.iter()
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                return
            value, ts = decode_value(it.value())
            yield key, value, ts
            it.next()

    def prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes, int]]:
        for item in self.items(start=prefix):
            if not item[0].startswith(prefix):
                return
            yield item

    def estimate_keys(self) -> int:
        return int(self._values.property_int_value("rocksdb.estimate-num-keys") or 0)
