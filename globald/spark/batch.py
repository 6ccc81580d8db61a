"""Lookups a whole Arrow batch at a time: the executor's hot path, with no Python loop per row.

Contract: for every row the answer equals a single-key lookup of that row's key (UTF-8 bytes for strings): the
value and timestamp of the key's stored record, or null in both for an absent key and for a null key (which is
never looked up). A batch's keys go at once to an in-memory index (``globald.spark.memindex``) or to the store as
one batched multi-get, whose stored form (8-byte big-endian timestamp, then the value, ``globald.store.codec``) is
split by Arrow compute kernels and one numpy byteswap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

Fetch = Callable[[list[bytes]], list[bytes | None]]  # keys -> stored values (None: absent)
Columns = Callable[[pa.Array], tuple[pa.Array, pa.Array]]  # binary keys -> (value, timestamp), null where absent

_PREFIX = 8  # bytes of the big-endian timestamp before every stored value
_TO_END = 2**31 - 1  # binary_slice's stop for "to the end" (its default misbehaves on pyarrow 26)


def binary_keys(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A key column as a binary array: strings become their UTF-8 bytes without a Python call per key."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return column.cast(pa.binary())
    if pa.types.is_null(kind):
        return pa.nulls(len(column), pa.binary())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return column
    raise TypeError(f"lookup keys must be bytes or str, not {kind}")


def fetch_stored(fetch: Fetch, keys: pa.Array) -> pa.Array:
    """Stored values aligned with ``keys`` (binary, null where the key is null or absent): one multi-get."""
    if keys.null_count == 0:
        return pa.array(fetch(keys.to_pylist()), pa.binary())
    valid = keys.is_valid()
    found = pa.array(fetch(keys.filter(valid).to_pylist()), pa.binary())
    # Row i takes the found value at its rank among the non-null keys; a null index gives a null row.
    rank = pc.subtract(pc.cumulative_sum(valid.cast(pa.int64())), 1)
    return found.take(pc.if_else(valid, rank, pa.scalar(None, pa.int64())))


def split_stored(stored: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(value: binary, timestamp: int64) columns of a stored-value column; nulls stay null in both."""
    n = len(stored)
    present = n - stored.null_count
    if present and pc.min(pc.binary_length(stored)).as_py() < _PREFIX:
        raise ValueError(f"a stored value is shorter than its {_PREFIX}-byte timestamp prefix")
    value = pc.binary_slice(stored, _PREFIX, _TO_END)
    if present == 0:
        return value, pa.nulls(n, pa.int64())
    prefixes = pc.binary_slice(stored, 0, _PREFIX)  # exactly 8 bytes per present row, back to back
    start = int(np.frombuffer(prefixes.buffers()[1], np.int32, 1, prefixes.offset * 4)[0])
    ts = np.frombuffer(prefixes.buffers()[2], ">i8", present, start).astype(np.int64)  # the byteswap
    if present == n:
        return value, pa.array(ts)
    mask = stored.is_valid().to_numpy(zero_copy_only=False)
    full = np.zeros(n, np.int64)
    full[mask] = ts
    return value, pa.array(full, mask=~mask)


@dataclass(frozen=True)
class MultiGet:
    """The ``Columns`` of a store read by multi-gets: one per batch, its stored values split by Arrow kernels."""

    fetch: Fetch

    def __call__(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        return split_stored(fetch_stored(self.fetch, keys))


def lookup_arrow(columns: Columns, column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """(value, timestamp) arrays for a column of keys."""
    return columns(binary_keys(column))


def series_keys(keys: pd.Series) -> pa.Array:
    """A pandas Series of keys (str, bytes; None/NaN for null) as an Arrow binary array."""
    try:
        arr = pa.array(keys, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. str and non-UTF-8 bytes in one Series: key by key
        arr = pa.array([encode_key(k) for k in keys.astype(object).where(keys.notna(), None).tolist()],
                       pa.binary())
    return binary_keys(arr)


def encode_key(key: object) -> bytes | None:
    """Keys are bytes as stored; strings are looked up by their UTF-8 encoding; None matches nothing."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"lookup keys must be bytes or str, not {type(key).__name__}")


def lookup_pandas(columns: Columns, keys: pd.Series) -> pd.DataFrame:
    """The pandas UDF's answer: a DataFrame of value (binary) and timestamp (int64), both Arrow-backed (pandas'
    ArrowDtype; null where absent), so neither this function nor Spark's conversion back to Arrow makes a Python
    object per row."""
    value, ts = lookup_arrow(columns, series_keys(keys))
    return pd.DataFrame({"value": pd.Series(pd.arrays.ArrowExtensionArray(value), index=keys.index, copy=False),
                         "timestamp": pd.Series(pd.arrays.ArrowExtensionArray(ts), index=keys.index, copy=False)})
