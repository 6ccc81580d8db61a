"""Typed keys: a table whose ``[tables.key]`` declares a format is looked up by its *decoded* key.

Why: the stored key is the bytes Kafka delivered (an Avro string is a length varint then UTF-8, a Confluent-framed
one also carries a schema id), so a join column holding ``"cust-1"`` matches none of them. The columnar file of such
a table is indexed on a canonical form of each decoded key, and the join column is converted the same way before
the lookup.

Contract:
- The canonical form (``canonical``) of a primitive value is bytes: a string its UTF-8, an integer its decimal text
  (Arrow's cast to string), binary itself. So a string key matches a string column, and an integer key matches an
  integer column or a string column holding its decimal text ("42", not "042" or "42.0").
- Key types without one (structs: Avro records, Protobuf messages, JSON objects; floats, dates, timestamps, whose
  text depends on units and rounding) are refused at join time: ``KeyTypeUnsupported``, one line naming the table
  and the key type.
- A key that does not decode (or decodes to null) is left out of the index and counted; it can never be asked for.
- Two stored keys decoding to the same logical key (one written under schema ids 1 and 2): the one with the greater
  timestamp is kept, on a tie the later in the snapshot's key order; the others are counted as shadowed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.common.errors import GlobaldError

if TYPE_CHECKING:
    from globald.typed.arrow import Decoder

V = TypeVar("V", bytes, bytes | None)  # a record's value; None: a tombstone, in an as-of lookup's versions
KEYS_VERSION = "canonical-v1"  # part of a typed-key file's fingerprint: a change of canonical form rebuilds it


class KeyTypeUnsupported(GlobaldError, TypeError):
    """A table's declared key decodes to a type a join column cannot be matched against (a struct, a float, a
    date...). Join on a table whose key is a string, bytes or an integer, or declare the key raw."""


def has_canonical_form(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_integer(t))


def require_canonical(key_decoder: Decoder, table: str) -> None:
    """Raise KeyTypeUnsupported when ``table``'s typed key cannot be matched by a join column."""
    if key_decoder.typed and not has_canonical_form(key_decoder.arrow_type):
        raise KeyTypeUnsupported(
            f"table {table}: its key ({key_decoder.where}, format {key_decoder.format.format}) decodes to "
            f"{key_decoder.arrow_type}, which a join column cannot match; only string, bytes and integer keys can")


def canonical(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The canonical bytes of each key (null stays null): strings their UTF-8, integers their decimal text, bytes
    themselves. Raises TypeError for another type."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_dictionary(kind):
        return canonical(column.dictionary_decode())
    if pa.types.is_integer(kind):
        column, kind = column.cast(pa.string()), pa.string()
    if pa.types.is_null(kind):
        return pa.nulls(len(column), pa.binary())
    if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        return column.cast(pa.large_binary())
    if pa.types.is_string(kind) or pa.types.is_string_view(kind) or pa.types.is_fixed_size_binary(kind):
        return column.cast(pa.binary())
    if pa.types.is_binary(kind):
        return column
    raise TypeError(f"keys of a typed-key table are looked up as strings, bytes or integers, not {kind}")


def fingerprint(value_decoder: Decoder, key_decoder: Decoder | None) -> str:
    """What a columnar file is valid for: the value decoder's fingerprint alone for a raw key (the files of
    raw-key tables keep their names), else a digest of both and the canonical form, so that a raw-key file and a
    typed-key file of one snapshot never share a path."""
    if key_decoder is None or not key_decoder.typed:
        return value_decoder.fingerprint
    text = f"{value_decoder.fingerprint}\0key\0{key_decoder.fingerprint}\0{KEYS_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()


def decoded_keys(raw: pa.Array, key_decoder: Decoder) -> tuple[pa.Array, np.ndarray]:
    """(canonical keys, rows) of the keys of ``raw`` that decode to a non-null value; the others are left out."""
    decoded = key_decoder.decode(raw, collect=True)  # never raises: a bad key is a reason, counted by the caller
    keys = canonical(decoded.values)
    valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), bool)
    if valid.all():
        return keys, np.arange(len(raw), dtype=np.int64)
    rows = np.flatnonzero(valid)
    return keys.take(pa.array(rows)), rows


def latest_rows(keys: pa.Array, hashes: np.ndarray, stamps: np.ndarray) -> np.ndarray | None:
    """The rows to index when several share a canonical key: for each key the row with the greatest timestamp,
    on a tie the later row; in row order. None when every key is distinct (the common case, told by the hashes)."""
    n = len(keys)
    if len(np.unique(hashes)) == n:
        return None
    order = pa.table({"k": keys, "t": pa.array(stamps, pa.int64()), "r": pa.array(np.arange(n, dtype=np.int64))})
    ranked = pc.sort_indices(order, sort_keys=[("k", "ascending"), ("t", "ascending"), ("r", "ascending")])
    ranked_np = np.asarray(ranked.to_numpy(zero_copy_only=False), np.int64)
    sorted_keys = keys.take(ranked)
    last = np.ones(n, bool)  # the last row of each run of equal keys is the one kept
    if n > 1:
        last[:-1] = np.asarray(pc.not_equal(sorted_keys.slice(0, n - 1), sorted_keys.slice(1))
                               .to_numpy(zero_copy_only=False), bool)
    kept = np.sort(ranked_np[last])
    return None if len(kept) == n else kept


def find_decoded(items: Iterable[tuple[bytes, V, int]], key_decoder: Decoder, wanted: bytes,
                 batch: int = 4096) -> tuple[tuple[bytes, V, int] | None, int]:
    """(the record whose decoded key's canonical form is ``wanted``, how many others it shadows), by decoding every
    key of ``items`` (key order) in batches: what ``get --decode`` does on a typed-key table, whose store is keyed
    by the raw bytes. The same rule as the columnar file: the greatest timestamp, on a tie the later key. With
    ``--as-of``, ``items`` are each stored key's version in force then, tombstones (value None) included: the
    answer is then the as-of fold over the decoded key, as Spark's (``globald.spark.asof_keys``)."""
    best: tuple[bytes, V, int] | None = None
    matches = 0
    records = iter(items)
    while chunk := list(islice(records, batch)):
        keys, rows = decoded_keys(pa.array([k for k, _, _ in chunk], pa.binary()), key_decoder)
        hit = np.asarray(pc.equal(keys, pa.scalar(wanted, keys.type)).to_numpy(zero_copy_only=False), bool)
        for row in rows[hit]:
            matches += 1
            if best is None or chunk[row][2] >= best[2]:
                best = chunk[row]
    return best, max(matches - 1, 0)
