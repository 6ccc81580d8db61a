"""The stored keys of each decoded key: how an as-of lookup of a typed-key table (``[tables.key]``) finds a join
column's key, whose versions are kept under the bytes Kafka delivered (``globald.spark.asof_keys``).

Contract: ``groups_table(stored, key_decoder, about)`` takes distinct stored keys in key order (the as-of file's)
and makes a table indexed by the canonical form of their decoded key (``globald.typed.keys.canonical``: the
latest-value typed join's form), one row per decoded key, its ``value`` the list of the stored keys that decode to
it, in key order. ``KeyGroups(table)`` answers ``find(keys)``: each canonical key's group and how many stored keys
the group has; ``stored(groups, j)``: each group's j-th stored key (null past its end). Several stored keys decode
alike when a key was written twice otherwise (another schema id, an overlong varint): the caller merges their
versions. A stored key that does not decode (or decodes to null) is in no group and counted (``key_errors``): no
join column can ask for it, as in the latest-value file.

The table is the columnar file's own format (its open-addressing key index, ``ColumnarTable.positions``): written
once per snapshot and host beside the snapshot, mapped by every worker. It holds stored key bytes, not rows of the
as-of file, so it does not depend on that file's layout; ``fingerprint`` names the key declaration it decoded with.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.typed.columnar import META, ColumnarTable
from globald.typed.hashing import HASH, key_hashes, slot_table
from globald.typed.keys import KEYS_VERSION, decoded_keys

if TYPE_CHECKING:
    from globald.typed.arrow import Decoder

LAYOUT = "keygroups-v1"


def fingerprint(key_decoder: Decoder) -> str:
    """What a groups file is valid for: the key declaration, the canonical form and this layout."""
    return hashlib.sha256(f"{key_decoder.fingerprint}\0{KEYS_VERSION}\0{LAYOUT}".encode()).hexdigest()


def groups_table(stored: pa.Array, key_decoder: Decoder, about: dict[str, Any]) -> pa.Table:
    """The groups of ``stored`` (distinct stored keys, key order) by decoded key (module docstring)."""
    canon, rows = decoded_keys(stored, key_decoder)
    hashes = key_hashes(canon)
    if len(np.unique(hashes)) == len(canon):  # the common case: every decoded key is stored once
        unique, members, starts = canon, rows, np.arange(len(canon) + 1)
    else:  # by canonical key, then by stored row (key order): a group's stored keys in key order
        order = pc.sort_indices(pa.table({"k": canon, "r": pa.array(rows)}),
                                sort_keys=[("k", "ascending"), ("r", "ascending")])
        order_np = np.asarray(order.to_numpy(zero_copy_only=False), np.int64)
        ordered, members, n = canon.take(order), rows[order_np], len(canon)
        new = np.ones(n, bool)
        if n > 1:
            new[1:] = np.asarray(pc.not_equal(ordered.slice(1), ordered.slice(0, n - 1))
                                 .to_numpy(zero_copy_only=False), bool)
        firsts = np.flatnonzero(new)
        unique, starts, hashes = ordered.take(pa.array(firsts)), np.append(firsts, n), hashes[order_np[firsts]]
    groups = len(unique)
    slots, probes = slot_table(hashes)
    meta = {**about, "fingerprint": fingerprint(key_decoder), "hash": HASH, "probes": probes, "rows": groups,
            "key_errors": len(stored) - len(rows), "shadowed": len(canon) - groups}
    return pa.table({
        "key": unique.cast(pa.binary()),
        "timestamp": pa.nulls(groups, pa.int64()),
        "value": pa.ListArray.from_arrays(pa.array(starts, pa.int32()),
                                          stored.take(pa.array(np.asarray(members, np.int64)))),
        "error": pa.nulls(groups, pa.string()),
        "hash": pa.array(hashes, pa.uint64()),
        "slots": pa.FixedSizeListArray.from_arrays(pa.array(slots), 2),
    }).replace_schema_metadata({META: json.dumps(meta)})


class KeyGroups:
    """Canonical key -> its stored keys, over a groups table (mapped or in memory)."""

    def __init__(self, table: ColumnarTable) -> None:
        self.table = table
        lists: pa.ListArray = table.values
        self.starts = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), np.int64)
        self.members = lists.values  # every group's stored keys, one after the other
        self.key_errors = int(table.meta.get("key_errors", 0))
        self.shadowed = int(table.meta.get("shadowed", 0))  # stored keys sharing a decoded key with another

    def find(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(group, stored keys in it) of each canonical key: -1 and 0 where absent or null."""
        pos = self.table.positions(keys)
        safe = np.maximum(pos, 0)
        counts = np.where(pos >= 0, self.starts[safe + 1] - self.starts[safe], 0) if len(self.table) else (
            np.zeros(len(pos), np.int64))
        return pos, counts

    def stored(self, groups: np.ndarray, j: int) -> pa.Array:
        """The ``j``-th stored key (key order) of each group: null where the group is -1 or has fewer."""
        if not len(self.table):
            return pa.nulls(len(groups), pa.binary())
        safe = np.maximum(groups, 0)
        has = (groups >= 0) & (self.starts[safe] + j < self.starts[safe + 1])
        return self.members.take(pa.array(np.where(has, self.starts[safe] + j, 0), mask=~has))
