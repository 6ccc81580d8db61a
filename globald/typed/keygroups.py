"""The stored keys of each decoded key: how an as-of lookup of a typed-key table (``[tables.key]``) finds a join
column's key, whose versions are kept under the bytes Kafka delivered (``globald.spark.asof_keys``).

Contract: ``KeyGroups(stored, key_decoder)`` takes distinct stored keys in key order (the as-of file's) and indexes
them by the canonical form of their decoded key (``globald.typed.keys.canonical``: the latest-value typed join's
form). ``find(keys)`` gives each canonical key its group and how many stored keys the group has; ``stored(groups,
j)`` the group's j-th stored key, in key order (null past its end). Several stored keys decode alike when a key
was written twice otherwise (another schema id, an overlong varint): the caller merges their versions. A stored key
that does not decode (or decodes to null) is in no group and counted (``key_errors``): no join column can ask for
it, as in the latest-value file.

The index is the columnar file's own open-addressing table (``ColumnarTable.positions``), held in memory: one row
per canonical key, its ``value`` the list of its stored keys' rows.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.typed.columnar import META, ColumnarTable
from globald.typed.hashing import HASH, key_hashes, slot_table
from globald.typed.keys import decoded_keys

if TYPE_CHECKING:
    from globald.typed.arrow import Decoder


class KeyGroups:
    """Canonical key -> its stored keys (module docstring)."""

    def __init__(self, stored: pa.Array, key_decoder: Decoder, table: str) -> None:
        self.raw = stored
        canon, rows = decoded_keys(stored, key_decoder)
        self.key_errors = len(stored) - len(rows)
        hashes = key_hashes(canon)
        if len(np.unique(hashes)) == len(canon):  # the common case: every decoded key is stored once
            unique, members, starts = canon, rows, np.arange(len(canon) + 1)
        else:  # by canonical key, then by stored row (key order): a group's stored keys in key order
            order = pc.sort_indices(pa.table({"k": canon, "r": pa.array(rows)}),
                                    sort_keys=[("k", "ascending"), ("r", "ascending")])
            ordered = canon.take(order)
            members = rows[np.asarray(order.to_numpy(zero_copy_only=False), np.int64)]
            n = len(ordered)
            new = np.ones(n, bool)
            if n > 1:
                new[1:] = np.asarray(pc.not_equal(ordered.slice(1), ordered.slice(0, n - 1))
                                     .to_numpy(zero_copy_only=False), bool)
            firsts = np.flatnonzero(new)
            unique, starts = ordered.take(pa.array(firsts)), np.append(firsts, n)
            hashes = hashes[np.asarray(order.to_numpy(zero_copy_only=False), np.int64)[firsts]]
        self.members = np.asarray(members, np.int64)
        self.starts = np.asarray(starts, np.int64)
        slots, probes = slot_table(hashes)
        groups = len(unique)
        self.shadowed = len(canon) - groups  # stored keys sharing a decoded key with another
        meta = {"table": table, "hash": HASH, "probes": probes, "rows": groups}
        self.index = ColumnarTable(pa.table({
            "key": unique.cast(pa.binary()),
            "timestamp": pa.nulls(groups, pa.int64()),
            "value": pa.ListArray.from_arrays(pa.array(self.starts, pa.int32()), pa.array(self.members)),
            "error": pa.nulls(groups, pa.string()),
            "hash": pa.array(hashes, pa.uint64()),
            "slots": pa.FixedSizeListArray.from_arrays(pa.array(slots), 2),
        }).replace_schema_metadata({META: json.dumps(meta)}))

    def find(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(group, stored keys in it) of each canonical key: -1 and 0 where absent or null."""
        pos = self.index.positions(keys)
        present = pos >= 0
        safe = np.where(present, pos, 0)
        counts = np.where(present, self.starts[safe + 1] - self.starts[safe], 0) if len(self.starts) > 1 else (
            np.zeros(len(pos), np.int64))
        return pos, counts

    def stored(self, groups: np.ndarray, j: int) -> pa.Array:
        """The ``j``-th stored key (key order) of each group: null where the group is -1 or has fewer."""
        if len(self.starts) < 2:
            return pa.nulls(len(groups), self.raw.type)
        safe = np.where(groups >= 0, groups, 0)
        has = (groups >= 0) & (self.starts[safe] + j < self.starts[safe + 1])
        rows = self.members[np.where(has, self.starts[safe] + j, 0)] if len(self.members) else np.zeros(
            len(groups), np.int64)
        return self.raw.take(pa.array(rows, mask=~has))
