"""As-of lookups on the executor (issue 45): ``view.join(df, on, as_of="order_ts")`` answers each row's key as of
that row's own time, from the host's snapshot, with no shuffle of ``df`` and no collect of the history.

Contract: ``AsOfIndex.at(keys, times)`` answers every row as the snapshot's as-of fold (``store.history.as_of``)
would: of the key's versions whose timestamp is at or before the row's time (epoch ms), the one with the greatest
(timestamp, offset); its value and its own timestamp, null in both for a tombstone there, no such version, a null
key or a null time. A row whose time is before the snapshot's ``since`` gets null in both and a reason (never a
guess); a null time gets a reason too. A history that is refused (``HistoryMeta.refusal``) fails the lookup with
that line (the driver says it before any job when it can see the snapshot: ``check``).

How: the snapshot's history family is parsed once per snapshot and host into an Arrow file beside it
(``asof-history-v2.arrow``, written under the host lock by the first worker, atomically, mapped read-only by
every worker: the columnar file's machinery, ``globald.typed.columnar``): one row per key with the key, its hash,
the open-addressing slots, its newest version (by (timestamp, offset)) in ``timestamp`` and ``value``, and its
older versions in ``older``, a list of (timestamp, value) newest first, the family's order. Layout v2 holds only
what a lookup reads, each in the narrowest type that holds it, since the file is mapped by every worker and the
versions' values make most of it: timestamps are int32 milliseconds after the file's oldest (``stamp_base`` in
the metadata) when the versions span at most 2**31 - 1 ms (24.8 days), else int64; values are
``fixed_size_binary`` (no offsets) when every version present has one width, else ``binary``; ``error`` is of
the null type (no bytes). The newest versions are apart from the older ones so that a row asking a time after its
key's newest version (current events: most rows) reads only the newest columns' pages, not the history's.

A batch's keys are found by the columnar file's probe (``ColumnarTable.positions``); each row's newest version is
tried first, then the older ones by a binary search over its key's list, run for the whole batch at once in numpy
(a step per halving: four for ten versions), then an Arrow ``take``. No RocksDB seek per row. Small-table mode
ships the same table from the driver (``globald.spark.small``), indexed in memory. A history too large for one
file (over 2 GB of values) is read by one seek per row instead (slow, logged).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.common.errors import GlobaldError
from globald.store.history import KEY_END, MAX_I64, SUFFIX_BYTES, VALUE, HistoryMeta
from globald.store.names import ASOF_HISTORY_FILE, ASOF_HISTORY_LAYOUT
from globald.typed.columnar import META, ColumnarTable, ColumnarTooLarge, mapped_or_built
from globald.typed.hashing import HASH, key_hashes, slot_table

if TYPE_CHECKING:
    from globald.snapshot.reader import Snapshot
    from globald.spark.executor import Settings

log = logging.getLogger(__name__)

FINGERPRINT, FILE = ASOF_HISTORY_LAYOUT, ASOF_HISTORY_FILE  # declared in store/names.py
CHUNK = 1 << 20  # history entries parsed at once while building
_TO_END = 2**31 - 1
_I32_MAX = 2**31 - 1


class AsOfRefusedError(GlobaldError):
    """An as-of join was asked of a table that cannot answer it: one that declares no ``history``, or whose history
    is refused (records without timestamps, a store not yet rebuilt with history). The message says which; declare
    ``history`` (docs/as-of.md), or produce with timestamps and ``globald reset`` the table."""


def refusal(table: str, marks: HistoryMeta | None) -> str | None:
    """Why ``table``'s snapshot with these history marks cannot answer as-of lookups; None when it can."""
    if marks is None:
        return (f"table {table} keeps no versions in this snapshot: declare history in its [[tables]] entry "
                "(docs/as-of.md) for as-of joins")
    return marks.refusal(table)


# -- building the table ------------------------------------------------------------------------------------------


def _parse(stored_keys: list[bytes], stored: list[bytes]) -> tuple[pa.Array, np.ndarray, pa.Array]:
    """(key, timestamp, value or null for a tombstone) of a chunk of history entries, a column at a time."""
    sk = pa.array(stored_keys, pa.binary())
    offsets = np.frombuffer(sk.buffers()[1], np.int32)[:len(sk) + 1].astype(np.int64)
    data = np.frombuffer(sk.buffers()[2], np.uint8)
    at = (offsets[1:] - SUFFIX_BYTES)[:, None] + np.arange(8)
    desc_ts = np.ascontiguousarray(data[at]).view(">u8").ravel().astype(np.uint64)
    stamps = (np.uint64(MAX_I64) - desc_ts).astype(np.int64)
    keys = pc.binary_slice(sk, 0, -(SUFFIX_BYTES + len(KEY_END)))
    if pc.any(pc.match_substring(keys, b"\x00\xff")).as_py():  # escaped NULs, rare: undo the escape
        keys = pc.replace_substring(keys, b"\x00\xff", b"\x00")
    sv = pa.array(stored, pa.binary())
    flags = np.frombuffer(sv.buffers()[2], np.uint8)[np.frombuffer(sv.buffers()[1], np.int32)[:len(sv)]]
    values = pc.binary_slice(sv, 1, _TO_END)
    values = pc.if_else(pa.array(flags == VALUE[0]), values, pa.scalar(None, pa.binary()))
    return keys.cast(pa.binary()), stamps, values


def build(snapshot: Snapshot) -> pa.Table:
    """The as-of table of ``snapshot``'s history (module docstring). ColumnarTooLarge when it does not fit one
    record batch."""
    about = {"table": snapshot.manifest.table, "snapshot": snapshot.id}
    return table_of(snapshot.history_entries(CHUNK), about, snapshot.history)


def table_of(entries: Iterable[tuple[list[bytes], list[bytes]]], about: dict[str, Any],
             marks: HistoryMeta | None) -> pa.Table:
    """The as-of table of history entries as stored, in family order (``store.history.entries``)."""
    keys: list[pa.Array] = []
    stamps: list[np.ndarray] = []
    values: list[pa.Array] = []
    for chunk_keys, chunk_values in entries:
        k, ts, v = _parse(chunk_keys, chunk_values)
        keys.append(k)
        stamps.append(ts)
        values.append(v)
    try:
        key_column = pa.concat_arrays(keys) if keys else pa.array([], pa.binary())
        value_column = pa.concat_arrays(values) if values else pa.array([], pa.binary())
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as e:
        raise ColumnarTooLarge(f"{about['table']} snapshot {about['snapshot']} history: {e}") from None
    ts_column = np.concatenate(stamps) if stamps else np.empty(0, np.int64)
    n = len(key_column)
    new = np.ones(n, bool)
    if n > 1:  # a key's entries are contiguous: a row starts a key where its key differs from the row before
        new[1:] = ~np.asarray(pc.equal(key_column.slice(1), key_column.slice(0, n - 1)).to_numpy(
            zero_copy_only=False), bool)
    starts = np.flatnonzero(new)
    unique = key_column.take(pa.array(starts))
    hashes = key_hashes(unique)
    slots, probes = slot_table(hashes)
    base, narrow_stamps = _narrow_stamps(ts_column)
    narrow = _narrow_values(value_column)
    older = np.ones(n, bool)
    older[starts] = False
    # Key r's older versions are entries starts[r] + 1 .. starts[r + 1] - 1; with the r newest versions before
    # them taken out, they start at starts[r] - r of the older ones.
    older_offsets = pa.array(np.append(starts - np.arange(len(starts)), n - len(starts)).astype(np.int32))
    version = [pa.field("timestamp", pa.from_numpy_dtype(narrow_stamps.dtype), False), pa.field("value", narrow.type)]
    older_index = pa.array(np.flatnonzero(older))
    versions = pa.ListArray.from_arrays(older_offsets, pa.StructArray.from_arrays(
        [pa.array(narrow_stamps[older]), narrow.take(older_index)], fields=version))
    meta = {**about, "fingerprint": FINGERPRINT, "hash": HASH, "probes": probes, "rows": len(starts),
            "versions": n, "stamp_base": base, "since": None if marks is None else marks.since,
            "refused": refusal(about["table"], marks)}
    return pa.table({
        "key": unique,
        "timestamp": pa.array(narrow_stamps[starts]),  # each key's newest version, (timestamp, offset) the greatest
        "value": narrow.take(pa.array(starts)),
        "older": versions,
        "error": pa.nulls(len(starts)),
        "hash": pa.array(hashes),
        "slots": pa.FixedSizeListArray.from_arrays(pa.array(slots, pa.int32() if slots.dtype == np.int32
                                                            else pa.int64()), 2),
    }).replace_schema_metadata({META: json.dumps(meta)})


def _narrow_stamps(stamps: np.ndarray) -> tuple[int, np.ndarray]:
    """(base, stamps - base as int32) when the versions span at most 2**31 - 1 ms; else (0, the int64 stamps)."""
    if not len(stamps):
        return 0, stamps.astype(np.int32)
    base = int(stamps.min())
    if int(stamps.max()) - base <= _I32_MAX:
        return base, (stamps - base).astype(np.int32)
    return 0, stamps


def _narrow_values(values: pa.Array) -> pa.Array:
    """``values`` as ``fixed_size_binary`` when every one present has the same width: no offsets (4 bytes a version);
    else as they are. A tombstone (null) takes the width in zeros."""
    widths = pc.binary_length(values)
    low, high = pc.min_max(widths).values()
    if low.as_py() is None or low.as_py() != high.as_py() or not low.as_py():
        return values
    return values.cast(pa.binary(low.as_py()))


def ensure(snapshot: Snapshot) -> ColumnarTable:
    """The snapshot's as-of table, mapped from its file; built and written first when there is none (under the
    host lock: one builder per host). A directory this user may not write gets it in this worker's memory."""

    def built() -> pa.Table:
        table = build(snapshot)
        log.info("as-of table of snapshot %s of %s: %d keys, %d versions", snapshot.id, snapshot.manifest.table,
                 table.num_rows, table.num_rows + (len(table.column("older").chunk(0).values) if table.num_rows
                                                   else 0))
        return table

    return mapped_or_built(snapshot.table_dir / snapshot.id / FILE, FINGERPRINT, built,
                           f"the as-of file of snapshot {snapshot.id}")


# -- answering -----------------------------------------------------------------------------------------------------


def times_ms(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """An as-of column as epoch milliseconds (int64, nulls kept): a timestamp (any unit, any zone: an instant) is
    floored to its millisecond (a version at ms m is in force from the start of m); an integer is taken as ms."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_timestamp(kind):
        per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[kind.unit]
        raw = column.cast(pa.int64())
        if per_ms is None:
            return pc.multiply(raw, 1000)
        return raw if per_ms == 1 else pa.array(_floor_div(raw, per_ms), pa.int64())
    if pa.types.is_integer(kind):
        return column.cast(pa.int64())
    raise TypeError(f"as_of must name a timestamp column or a long column of epoch milliseconds, not {kind}")


def _floor_div(raw: pa.Array, by: int) -> pa.Array:
    mask = np.asarray(raw.is_null().to_numpy(zero_copy_only=False), bool)
    values = np.asarray(pc.fill_null(raw, 0).to_numpy(zero_copy_only=False), np.int64) // by
    return pa.array(values, mask=mask if mask.any() else None)


@dataclass
class AsOfIndex:
    """A snapshot's versions, looked up a batch at a time: the as-of table (mapped or in memory), or, for a history
    too large for one file, the open snapshot (one seek a row)."""

    table: ColumnarTable | None
    snap: Snapshot | None
    since: int | None
    refused: str | None
    name: str
    _cols: tuple[np.ndarray, np.ndarray, pa.Array, np.ndarray, pa.Array, int] | None = None

    @classmethod
    def of_table(cls, table: ColumnarTable) -> AsOfIndex:
        return cls(table, None, table.meta.get("since"), table.meta.get("refused"), str(table.meta.get("table")))

    def at(self, keys: pa.Array, times: pa.Array | pa.ChunkedArray, tombstones: bool = False
           ) -> tuple[pa.Array, pa.Array, pa.Array]:
        """(value: binary, timestamp: int64, reason: string) of each binary key at each row's time (module
        docstring). ``tombstones``: a tombstone's timestamp is given too (its value stays null), for a caller
        merging several stored keys (``globald.spark.asof_keys``). AsOfRefusedError when the history is refused."""
        if self.refused is not None:
            raise AsOfRefusedError(self.refused)
        t = times_ms(times)
        n = len(keys)
        t_np = np.asarray(pc.fill_null(t, 0).to_numpy(zero_copy_only=False), np.int64)
        no_time = np.asarray(t.is_null().to_numpy(zero_copy_only=False), bool)
        early = ~no_time & (t_np < self.since) if self.since is not None else np.zeros(n, bool)
        ask = ~no_time & ~early
        if self.table is not None:
            value, stamp = self._search(keys, t_np, ask, tombstones)
        else:
            value, stamp = self._seek(keys, t_np, ask, tombstones)
        reason = pa.nulls(n, pa.string())
        if early.any():
            why = (f"before since: table {self.name}'s history is exact from {self.since} (epoch ms) on; versions "
                   "older than that may be gone, so no answer is given")
            reason = pc.if_else(pa.array(early), pa.scalar(why), reason)
        if no_time.any():
            reason = pc.if_else(pa.array(no_time), pa.scalar("the as-of time is null"), reason)
        return value, stamp, reason

    def _search(self, keys: pa.Array, t: np.ndarray, ask: np.ndarray,
                tombstones: bool = False) -> tuple[pa.Array, pa.Array]:
        """The vectorized as-of fold: each key's list is newest first, so the answer is its first version whose
        timestamp is at or before t, found by one binary search per row, all rows a step at a time."""
        assert self.table is not None
        n = len(keys)
        if not len(self.table):
            return pa.nulls(n, pa.binary()), pa.nulls(n, pa.int64())
        pos = self.table.positions(keys)
        ask = ask & (pos >= 0)
        offsets, stamps, values, newest_stamps, newest_values, base = self._columns()
        sel = np.flatnonzero(ask)
        row = pos[sel]
        at = t[sel]
        if stamps.dtype == np.int32:  # stamps after base: a time before every one is -1, after every one the top
            at = (np.clip(at, base - 1, base + _I32_MAX) - base).astype(np.int32)
        # The newest version first (a recent time: most rows, and only the newest columns' pages are read), then a
        # binary search of the rest's older lists, the rows still searching a step at a time.
        newest = newest_stamps[row] <= at
        lo = offsets[row].astype(np.int64)
        end = offsets[row + 1].astype(np.int64)
        hi = np.where(newest, lo, end)
        todo = np.flatnonzero(lo < hi)
        while len(todo):
            lo_t, hi_t = lo[todo], hi[todo]
            mid = (lo_t + hi_t) >> 1
            at_or_before = stamps[mid] <= at[todo]
            hi_t = np.where(at_or_before, mid, hi_t)
            lo_t = np.where(at_or_before, lo_t, mid + 1)
            lo[todo], hi[todo] = lo_t, hi_t
            todo = todo[lo_t < hi_t]
        is_newest = np.zeros(n, bool)
        is_newest[sel] = newest
        is_older = np.zeros(n, bool)
        is_older[sel] = ~newest & (lo < end)
        at_newest = np.zeros(n, np.int64)
        at_newest[sel] = row
        at_older = np.zeros(n, np.int64)
        at_older[sel] = np.where(is_older[sel], lo, 0)
        value = newest_values.take(pa.array(at_newest, mask=~is_newest))
        if is_older.any():
            value = pc.if_else(pa.array(is_newest), value, values.take(pa.array(at_older, mask=~is_older)))
        if value.type != pa.binary():
            value = value.cast(pa.binary())
        found = is_newest | is_older
        present = found & np.asarray(value.is_valid().to_numpy(zero_copy_only=False), bool)
        stamp = np.zeros(n, np.int64)  # gathered only where found: a table may have no older version at all
        stamp[is_newest] = newest_stamps[at_newest[is_newest]]
        stamp[is_older] = stamps[at_older[is_older]]
        stamp += base
        return value, pa.array(stamp, mask=~(found if tombstones else present))

    def _columns(self) -> tuple[np.ndarray, np.ndarray, pa.Array, np.ndarray, pa.Array, int]:
        """(older lists' offsets, their timestamps as stored, their values, the newest versions' timestamps as
        stored, their values, the stamps' base) of the table: views of the mapping, once."""
        if self._cols is None:
            assert self.table is not None
            older: pa.ListArray = self.table.arrow.column("older").chunk(0)
            child = older.values
            self._cols = (np.asarray(older.offsets.to_numpy(zero_copy_only=False)),
                          np.asarray(child.field("timestamp").to_numpy(zero_copy_only=False)), child.field("value"),
                          np.asarray(self.table.timestamps.to_numpy(zero_copy_only=False)), self.table.values,
                          int(self.table.meta.get("stamp_base", 0)))
        return self._cols

    def _seek(self, keys: pa.Array, t: np.ndarray, ask: np.ndarray,
              tombstones: bool = False) -> tuple[pa.Array, pa.Array]:
        """One RocksDB seek a row (``Snapshot.as_of``): a history too large for one file."""
        assert self.snap is not None
        self.snap.renew()
        out: list[tuple[bytes | None, int] | None] = []
        for key, at, asked in zip(keys.to_pylist(), t.tolist(), ask.tolist(), strict=True):
            v = self.snap.as_of(key, at) if asked and key is not None else None
            out.append(None if v is None or (v.value is None and not tombstones) else (v.value, v.timestamp))
        return (pa.array([None if o is None else o[0] for o in out], pa.binary()),
                pa.array([None if o is None else o[1] for o in out], pa.int64()))

    def stored_keys(self) -> pa.Array | None:
        """The history's distinct stored keys, in key order (what a typed key is translated to); None when it is
        read by seeks (too large for one file)."""
        return None if self.table is None else self.table.keys

    def close(self) -> None:
        if self.snap is not None:
            self.snap.close(release=True)
            self.snap = None


def open_index(snap: Snapshot) -> AsOfIndex:
    """The as-of index of an open snapshot: its mapped file (the snapshot is then closed, its lease released), or
    the snapshot itself, kept open, when its history does not fit one file."""
    marks = snap.history
    try:
        index = AsOfIndex.of_table(ensure(snap))
    except ColumnarTooLarge as e:
        log.warning("as-of lookups of %s read by one seek a row, not mapped: %s", snap.manifest.table, e)
        return AsOfIndex(None, snap, None if marks is None else marks.since, refusal(snap.manifest.table, marks),
                         snap.manifest.table)
    snap.close(release=True)
    return index


# -- the executor's handle -----------------------------------------------------------------------------------------


class AsOfHandle:
    """One worker's as-of index for one descriptor, cached as the other handles are (``executor.handle``)."""

    def __init__(self, index: AsOfIndex, snapshot: str | None, exact: bool, note: str | None) -> None:
        self.index, self.snapshot, self.exact, self.note = index, snapshot, exact, note

    def columns(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        raise TypeError("an as-of handle answers at a time: use at(keys, times)")

    def at(self, keys: pa.Array, times: pa.Array | pa.ChunkedArray, tombstones: bool = False
           ) -> tuple[pa.Array, pa.Array, pa.Array]:
        return self.index.at(keys, times, tombstones)

    def close(self) -> None:
        self.index.close()


def opener(settings: Settings, desc: dict[str, Any], data: Any) -> AsOfHandle:
    """``executor.handle``'s opener for as-of lookups: the shipped as-of table (small-table mode), else this host's
    snapshot of the descriptor, resolved as every lookup resolves it."""
    from globald.spark.executor import MODE_BROADCAST, SnapshotHandle, _open  # executor imports nothing of this

    if desc.get("mode") == MODE_BROADCAST:
        return AsOfHandle(AsOfIndex.of_table(ColumnarTable(data.value)), desc.get("snapshot"), True, None)
    raw = _open(dataclasses.replace(settings, memory_index_mb=0), desc, data)  # the snapshot, kept open
    assert isinstance(raw, SnapshotHandle) and raw.snap is not None
    return AsOfHandle(open_index(raw.snap), raw.snapshot, raw.exact, raw.note)
