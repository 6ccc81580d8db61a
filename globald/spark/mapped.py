"""A raw table's snapshot as one memory-mapped file per host, shared by every Python worker (issue 34 item 3).

Why: a worker that reads a snapshot into its own in-memory index holds its own copy of the table (an executor with
16 cores, 16 copies). A raw table is a typed table whose value decoder is the identity, so it takes the typed
path's columnar file as it is (``globald.typed.columnar.ensure_columnar``): the first worker of the host writes it
beside the snapshot under the host lock, with an atomic rename, and every worker maps it read-only; the page cache
then holds one copy per host. Lookups are the file's open-addressing probe (hash, gather, byte check, ``take``).

Contract: ``open_raw(snapshot, limit)`` is the snapshot's content (key, stored value, record timestamp) as a
mapped ``ColumnarTable``, or None when the snapshot is over ``limit`` bytes of keys and values (or too large for
one file): the caller then reads it by multi-gets. ``raw_columns`` answers every key as the snapshot's point
lookup would: its stored value and timestamp, null in both for an absent or null key. The file is checked as the
typed path checks it (Arrow's own validation of every offset, the declaration's fingerprint, the hash function);
one that fails is rebuilt from the snapshot, never trusted, never unpickled. It lives in the snapshot's directory,
so retention removes it with its snapshot; a worker still mapping it keeps its pages until its handle closes.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from globald.spark.memindex import gather
from globald.typed import load
from globald.typed.arrow import Decoder
from globald.typed.columnar import ColumnarTable, ColumnarTooLarge, ensure_columnar

if TYPE_CHECKING:
    from globald.snapshot.reader import Snapshot

log = logging.getLogger(__name__)

RAW_WHERE = "value"  # the raw decoder's name in messages; part of the file's fingerprint, so fixed


@lru_cache(maxsize=1)
def raw_decoder() -> Decoder:
    """The identity decoder: the stored bytes are the value (binary)."""
    return load(None, RAW_WHERE)


def open_raw(snapshot: Snapshot, limit: int) -> ColumnarTable | None:
    """The snapshot's mapped file, written first if this worker is the host's first; None when it is over
    ``limit`` bytes (keys, values and the file's index) or too large for one file."""
    try:
        return ensure_columnar(snapshot, raw_decoder(), limit=limit)
    except ColumnarTooLarge as e:
        log.info("raw snapshot read by multi-gets, not mapped: %s", e)
        return None


def raw_columns(table: ColumnarTable, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(value: binary, timestamp: int64) of each key of a binary array; null in both where absent or null. A raw
    file has no decode errors, so only the values and timestamps are gathered (not ``ColumnarTable.lookup``'s
    errors too: a third of its time here)."""
    if not len(table):
        return pa.nulls(len(keys), pa.binary()), pa.nulls(len(keys), pa.int64())
    return gather(table.values, _stamps(table), table.positions(keys))


def _stamps(table: ColumnarTable) -> np.ndarray:
    """The file's timestamp column as numpy, a view of the mapping (it has no nulls)."""
    return np.asarray(table.timestamps.to_numpy(zero_copy_only=True))
