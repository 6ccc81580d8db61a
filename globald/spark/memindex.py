"""A snapshot held whole in a Python worker's memory, for lookups at hash-table speed.

Contract: a ``MemoryIndex`` holds exactly the content of the snapshot (or broadcast content) it was loaded from,
and ``lookup`` answers every key as that snapshot's point lookup would: the value and timestamp of the key's record,
null in both for an absent or null key. It is never updated: a new descriptor loads a new index.

Why: a RocksDB point lookup through rocksdict costs ~1.6 us per key even from the block cache, so a batched
multi-get runs at about half the speed of a Python dict (bench/results/profile-spark-lookups.txt). A pandas Index
keeps a C hash table; here of the keys' 64-bit hashes, computed for a whole batch at once, so ``get_indexer``
finds each key's row, Arrow's ``equal`` confirms the bytes, and ``take`` gathers the values: ~0.2 us per key,
with no Python per row. Tables larger than the worker's budget stay on the multi-get.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pandas.util import hash_array

log = logging.getLogger(__name__)

# What one entry costs beyond its key and value bytes: the key's Python bytes object (~33 B), its hash-table slot
# and position (~24 B), the Arrow offsets (4 B) and timestamp (8 B), rounded up.
ENTRY_OVERHEAD = 80
DEFAULT_MEMORY_INDEX_MB = 256


class MemoryIndex:
    """Keys hashed into a pandas Index of 64-bit hashes (its hash table is built by the first lookup, once);
    values and timestamps in columns aligned with it. Should two of the table's keys share a hash, the index keeps
    the keys themselves instead (a hash table of Python objects, about twice as slow)."""

    def __init__(self, keys: list[bytes] | pa.Array, values: pa.Array, stamps: np.ndarray) -> None:
        self._keys = keys if isinstance(keys, pa.Array) else pa.array(keys, pa.binary())
        self._values = values
        self._stamps = stamps
        hashes = _hash(self._keys)
        self._by_hash: pd.Index | None = pd.Index(hashes, copy=False)
        self._by_key: pd.Index | None = None
        if not self._by_hash.is_unique:
            log.info("memory index: two of %d keys share a 64-bit hash; indexing the keys themselves", len(self._keys))
            self._by_hash = None
            self._by_key = pd.Index(self._keys.to_numpy(zero_copy_only=False), dtype=object, copy=False)

    def __len__(self) -> int:
        return len(self._values)

    @classmethod
    def load(cls, items: Iterable[tuple[bytes, bytes, int]], budget: int) -> MemoryIndex | None:
        """An index of ``items`` (key, value, timestamp), or None once they would take more than ``budget`` bytes
        (the caller keeps reading the snapshot instead)."""
        keys: list[bytes] = []
        values: list[bytes] = []
        stamps: list[int] = []
        used = 0
        for k, v, ts in items:
            used += len(k) + len(v) + ENTRY_OVERHEAD
            if used > budget:
                return None
            keys.append(k)
            values.append(v)
            stamps.append(ts)
        return cls(keys, pa.array(values, pa.binary()), np.array(stamps, np.int64))

    @classmethod
    def of_table(cls, table: pa.Table) -> MemoryIndex:
        """An index of a small table's content (columns key, value: binary; timestamp: int64), as shipped."""
        def column(name: str) -> pa.Array:
            return table.column(name).combine_chunks()

        return cls(column("key"), column("value"), column("timestamp").to_numpy(zero_copy_only=False))

    def lookup(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(value: binary, timestamp: int64) for a binary array of keys; nulls where absent or null."""
        if not len(self._values):
            return pa.nulls(len(keys), pa.binary()), pa.nulls(len(keys), pa.int64())
        return gather(self._values, self._stamps, self._positions(keys))

    def _positions(self, keys: pa.Array) -> np.ndarray:
        """Each key's row in the index, -1 where absent or null."""
        if self._by_key is not None:  # null keys become None, which no stored key equals
            return np.asarray(self._by_key.get_indexer(keys.to_numpy(zero_copy_only=False)))
        assert self._by_hash is not None
        pos = np.asarray(self._by_hash.get_indexer(_hash(keys)))
        # A hash names one stored key; whether it is this key only the bytes tell (an absent or null key may share
        # a stored key's hash).
        same = pc.fill_null(pc.equal(keys, self._keys.take(pa.array(np.maximum(pos, 0)))), False)
        return np.where(same.to_numpy(zero_copy_only=False) & (pos >= 0), pos, -1)


def gather(values: pa.Array, stamps: np.ndarray, pos: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """(value, timestamp) at each row of ``pos`` (-1: null in both), from columns of at least one row. The
    timestamps are gathered by numpy (no nulls to mask in the common case), the values by one Arrow ``take``."""
    missing = pos < 0
    if not missing.any():
        return values.take(pa.array(pos)), pa.array(stamps[pos])
    return values.take(pa.array(pos, mask=missing)), pa.array(stamps[np.where(missing, 0, pos)], mask=missing)


def _hash(keys: pa.Array) -> np.ndarray:
    """64-bit SipHash of each key (pandas' vectorized hash of the keys' bytes); a null key hashes like None."""
    return np.asarray(hash_array(keys.to_numpy(zero_copy_only=False), categorize=False))
