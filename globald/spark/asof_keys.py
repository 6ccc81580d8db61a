"""As-of lookups of a table whose key is typed (``[tables.key]``): the join column is matched against the decoded
keys by canonical form, as the latest-value typed join matches it (``globald.typed.keys``), and each row is then
answered by the as-of search of the stored key bytes it stands for (``globald.spark.asof``).

Contract: ``TypedAsOf.at(column, times)`` answers each row as the as-of fold over the *decoded* key: of every
version of every stored key whose decoded key's canonical form is the row's, the one with the greatest timestamp at
or before the row's time; a tombstone there, or none, is null. Where one decoded key is stored under several byte
strings (written under two schema ids, an overlong varint), their versions are merged so: a tombstone of one
encoding hides an older value of another. Of versions of two encodings at the same millisecond the one of the
stored key later in key order answers (the as-of file keeps no offsets; the latest-value typed join breaks that tie
the same way), within one encoding the later offset, as the fold. Times before ``since`` and null times get the
raw search's reasons. A history too large for one file (read by seeks) has no key list to translate against: it is
refused with ColumnarTooLarge, as the latest-value typed join refuses a snapshot too large for its file.

Cost: the history's distinct stored keys are decoded once per snapshot and host, by the first worker that needs
them, into a file beside the snapshot (``asof-keys-<fingerprint>.arrow``: ``globald.typed.keygroups``), written
under the host lock and mapped by every worker, as the as-of file is; small-table mode (and a directory this user
may not write) builds it in the worker's memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.spark.asof import AsOfHandle
from globald.store.names import ASOF_KEYS_PREFIX, COLUMNAR_SUFFIX
from globald.typed.arrow import Decoder
from globald.typed.columnar import ColumnarTable, ColumnarTooLarge, mapped_or_built
from globald.typed.keygroups import KeyGroups, fingerprint, groups_table
from globald.typed.keys import canonical


class TypedAsOf:
    """One worker's as-of answers by decoded key, over its as-of handle of one descriptor."""

    def __init__(self, handle: AsOfHandle, key_decoder: Decoder, table: str) -> None:
        stored = handle.index.stored_keys()
        if stored is None:
            raise ColumnarTooLarge(f"table {table}'s history is too large for one as-of file and is read by seeks; "
                                   "its key is typed ([tables.key]), which only the file's key list can translate: "
                                   "declare the key raw to look it up as of a time")
        self.handle = handle
        about = {"table": table, "snapshot": handle.snapshot}
        directory = getattr(handle.index.table, "path", None)  # the mapped as-of file's: beside its snapshot
        self.groups = KeyGroups(ColumnarTable(groups_table(stored, key_decoder, about)) if directory is None
                                else _ensure(Path(directory).parent, stored, key_decoder, about))

    def at(self, column: pa.Array | pa.ChunkedArray, times: pa.Array | pa.ChunkedArray
           ) -> tuple[pa.Array, pa.Array, pa.Array]:
        """(value, timestamp, reason) of each row's decoded key at its time (module docstring)."""
        keys = canonical(column)
        if isinstance(times, pa.ChunkedArray):
            times = times.combine_chunks()
        groups, counts = self.groups.find(keys)
        value, stamp, reason = self.handle.at(self.groups.stored(groups, 0), times, tombstones=True)
        widest = int(counts.max(initial=0))
        if widest > 1:  # a decoded key stored under several byte strings: the newest version of them all
            value, stamp = self._merge(value, stamp, groups, counts, times, widest)
        present = value.is_valid()
        return value, pc.if_else(present, stamp, pa.scalar(None, pa.int64())), reason

    def _merge(self, value: pa.Array, stamp: pa.Array, groups: np.ndarray, counts: np.ndarray, times: pa.Array,
               widest: int) -> tuple[pa.Array, pa.Array]:
        """Each row's version of greatest timestamp over its group's stored keys (in key order: on a tie, the
        later key's), tombstones included, as (value, timestamp)."""
        n = len(value)
        candidates, sources = [value], np.zeros(n, np.int64)
        rows = np.arange(n, dtype=np.int64)
        best, known = _stamps(stamp)
        for j in range(1, widest):
            sel = np.flatnonzero(counts > j)
            v, s, _ = self.handle.at(self.groups.stored(groups[sel], j), times.take(pa.array(sel)), tombstones=True)
            s_np, s_known = _stamps(s)
            later = s_known & (~known[sel] | (s_np >= best[sel]))
            won = sel[later]
            sources[won], rows[won] = len(candidates), np.flatnonzero(later)
            best[won], known[won] = s_np[later], True
            candidates.append(v)
        starts = np.cumsum([0, *(len(c) for c in candidates)])[:-1]
        pick = pa.array(starts[sources] + rows)
        merged = pa.concat_arrays(candidates).take(pick)
        return merged, pa.array(best, mask=~known)


def _ensure(directory: Path, stored: pa.Array, key_decoder: Decoder, about: dict[str, Any]) -> ColumnarTable:
    """The snapshot's groups file, mapped; built and written first when there is none (one builder per host)."""
    fp = fingerprint(key_decoder)
    return mapped_or_built(directory / f"{ASOF_KEYS_PREFIX}{fp[:24]}{COLUMNAR_SUFFIX}", fp,
                           lambda: groups_table(stored, key_decoder, about),
                           f"the as-of key file of snapshot {about.get('snapshot')} of {about.get('table')}")


def _stamps(stamp: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(timestamps with 0 for null, whether each is known) of a timestamp column."""
    known = np.asarray(stamp.is_valid().to_numpy(zero_copy_only=False), bool)
    return np.asarray(pc.fill_null(stamp, 0).to_numpy(zero_copy_only=False), np.int64).copy(), known
