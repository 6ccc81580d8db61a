"""The versions of a versioned table (``[[tables]] history``): their layout in ``names.HISTORY_CF``, how a batch adds
and prunes them, and the as-of lookup.

Layout: one entry per record, keyed ``escape(key) + ~timestamp + ~offset + ~partition`` (each complement 8, 8 and
4 big-endian bytes), its value ``b"\\x01" + value`` or ``b"\\x00"`` for a tombstone. ``escape`` keeps byte order and
is prefix-free (``0x00`` becomes ``0x00 0xff``, the key ends with ``0x00 0x01``), so the entries of one key are
contiguous, in key order, newest (timestamp, offset) first: the as-of answer for time t is the first entry at or
after ``escape(key) + ~t``, one seek. The versions are written by the fold in the batch that writes the values and
the offsets (KIP-892's atomicity: a reader never sees versions without their offsets, or the reverse).

``since`` (``names.META_HISTORY_SINCE``, epoch ms) is the earliest record time from which as-of answers are exact.
An empty store is marked ``SINCE_PENDING``; the first batch of versions it writes sets it to ``replay_since``: the
time of that batch (at or after the replay's start) less the topic's ``min.compaction.lag.ms`` as the cluster
worker read it at the plan (unknown, as on a Kafka 0.9 broker: taken as 0, a later ``since``, never an earlier
one). The window moves it forward (``since >= clock - history``, ``clock`` being the newest record timestamp
applied: record time, not the wall clock), and so does a reload that shortens the window (``windowed_since``:
never back when it grows); a store that tails without a gap keeps it; it goes with the store (a
KIP-406 wipe, a recreated topic, a reset). A store that held data before it was versioned has no ``since``
(``unproven``): nothing proves what it saw, so the state manager rebuilds it from the topic at its plan.

Records without a timestamp (-1: a Kafka 0.9 broker, or a producer that set none) cannot be placed in time: they
are applied to the latest values as always but kept as no version; the first one is recorded
(``names.META_HISTORY_UNTIMED``, "partition/offset") and as-of lookups of the table are refused with that line.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rocksdict import Rdict

from globald.store.failures import store_io
from globald.store.names import (
    HISTORY_CF,
    META_HISTORY_CLOCK,
    META_HISTORY_READ,
    META_HISTORY_SINCE,
    META_HISTORY_UNTIMED,
)

log = logging.getLogger(__name__)

_MAX_I64 = (1 << 63) - 1
_MAX_U32 = (1 << 32) - 1
_SUFFIX = struct.Struct(">QQI")  # ~timestamp, ~offset, ~partition
_DESC_TS = struct.Struct(">Q")
_END = b"\x00\x01"  # ends an escaped key
_PAST_END = b"\x00\x02"  # sorts after every entry of the key, before the next key's
TOMBSTONE = b"\x00"
VALUE = b"\x01"
# For readers that parse entries a column at a time (``entries``): the bytes after a key's escaped form, and the
# number the timestamp and offset are complemented from.
SUFFIX_BYTES = _SUFFIX.size
KEY_END = _END
MAX_I64 = _MAX_I64
# For a fold that writes the versions in its own loop (``engine.fold``): ``version_key`` spelled out there.
MAX_U32 = _MAX_U32
pack_suffix = _SUFFIX.pack


def escape(key: bytes) -> bytes:
    """``key`` as the order-preserving, prefix-free start of its versions' entries."""
    return key.replace(b"\x00", b"\x00\xff") + _END


def version_key(key: bytes, timestamp: int, offset: int, partition: int) -> bytes:
    return escape(key) + _SUFFIX.pack(_MAX_I64 - timestamp, _MAX_I64 - offset, _MAX_U32 - partition)


@dataclass(frozen=True)
class Version:
    key: bytes
    value: bytes | None  # None: a tombstone
    timestamp: int
    offset: int
    partition: int


def decode(stored_key: bytes, stored: bytes) -> Version:
    """The version an entry of the history family holds."""
    end = len(stored_key) - _SUFFIX.size
    desc_ts, desc_off, desc_p = _SUFFIX.unpack_from(stored_key, end)
    key = stored_key[:end - len(_END)].replace(b"\x00\xff", b"\x00")
    value = stored[1:] if stored[:1] == VALUE else None
    return Version(key, value, _MAX_I64 - desc_ts, _MAX_I64 - desc_off, _MAX_U32 - desc_p)


def _prefix_of(stored_key: bytes) -> bytes:
    return stored_key[:len(stored_key) - _SUFFIX.size]


def as_of(family: Rdict, key: bytes, t: int) -> Version | None:
    """The version of ``key`` with the greatest (timestamp, offset) whose timestamp is <= ``t`` (tombstones
    included: the caller reads one as null); None when there is none."""
    prefix = escape(key)
    it = family.iter()
    try:
        it.seek(prefix + _DESC_TS.pack(_MAX_I64 - t))
        if not it.valid():
            return None
        found: bytes = it.key()
        return decode(found, it.value()) if _prefix_of(found) == prefix else None
    finally:
        del it


def items_as_of(family: Rdict, t: int) -> Iterator[tuple[bytes, bytes, int]]:
    """(key, value, timestamp) of every key whose as-of answer at ``t`` is a value, in key order: two seeks a key."""
    return ((v.key, v.value, v.timestamp) for v in versions_as_of(family, t) if v.value is not None)


def versions_as_of(family: Rdict, t: int) -> Iterator[Version]:
    """The version in force at ``t`` of every key that has one, tombstones included, in key order: two seeks a key
    (what ``get --decode --as-of`` merges over the stored keys of one decoded key)."""
    it = family.iter()
    try:
        it.seek_to_first()
        desc_t = _DESC_TS.pack(_MAX_I64 - t)
        while it.valid():
            prefix = _prefix_of(it.key())
            it.seek(prefix + desc_t)
            if it.valid() and _prefix_of(it.key()) == prefix:
                yield decode(it.key(), it.value())
            it.seek(prefix[:-len(_END)] + _PAST_END)
    finally:
        del it


def entries(family: Rdict, chunk: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Every entry of the history family as stored (keys, values), in family order (key order, each key's newest
    (timestamp, offset) first), in lists of ``chunk``: for a reader that parses them a column at a time
    (``globald.spark.asof``)."""
    it = family.iter()
    try:
        it.seek_to_first()
        keys: list[bytes] = []
        values: list[bytes] = []
        while it.valid():
            keys.append(it.key())
            values.append(it.value())
            if len(keys) >= chunk:
                yield keys, values
                keys, values = [], []
            it.next()
        if keys:
            yield keys, values
    finally:
        del it


def replay_since(now_ms: int, compaction_lag_ms: int) -> int:
    """``since`` of a replay from the log start begun at ``now_ms``: records newer than the topic's
    ``min.compaction.lag.ms`` are never compacted away, so every version from then on is still in the topic."""
    return now_ms - max(0, compaction_lag_ms)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_ELAPSED_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def elapsed_ms() -> int:
    """A clock that only time passing moves, in ms: wall-clock steps (NTP, a resumed VM's) do not, while a frozen
    process or a suspended machine does (CLOCK_BOOTTIME where there is one): what a gap in reading is measured on
    while the loop runs (``engine.reading``)."""
    return time.clock_gettime_ns(_ELAPSED_CLOCK) // 1_000_000


def time_text(ms: int) -> str:
    """An epoch-ms record time as ISO 8601 UTC, with the number."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z ({ms})"


def windowed_since(since: int, clock: int | None, window_ms: int) -> int:
    """``since`` of a store whose window a reload set to ``window_ms`` in place (``settings.changes``, windowed),
    its newest record time applied being ``clock`` (None: none yet). A shorter window moves it forward at once to
    what the window bounds (``since >= clock - window``, as a batch would); a longer one keeps it: versions older
    than the old window may have been pruned already, so it never moves back, and later batches bound it by the
    new window as they go."""
    return since if clock is None else max(since, clock - window_ms)


SWEEP_MIN = 1024  # entries the pruning walks at least per batch that adds versions (Sweep)
# ``since`` of an empty store, until its first batch of versions sets it.
SINCE_PENDING = b"pending"


@dataclass(frozen=True)
class HistoryMeta:
    """What a store's metadata says of its history."""

    since: int | None  # None: not proven (a store that held data before it was versioned), or pending
    clock: int | None  # the newest record timestamp applied
    untimed: str | None  # "partition/offset" of the first record without a timestamp
    pending: bool = False  # an empty store's history, which no record has started yet

    @classmethod
    def read(cls, meta: Any) -> HistoryMeta:
        raws = [meta.get(k) for k in (META_HISTORY_SINCE, META_HISTORY_CLOCK, META_HISTORY_UNTIMED)]
        since, clock, untimed = (None if r is None else r.decode() for r in raws)
        pending = raws[0] == SINCE_PENDING
        return cls(None if since is None or pending else int(since), None if clock is None else int(clock), untimed,
                   pending)

    @property
    def unproven(self) -> bool:
        """A store that held data before it was versioned: no ``since`` can be proven for what it saw."""
        return self.since is None and not self.pending

    def refusal(self, table: str) -> str | None:
        """Why as-of lookups of ``table`` are refused; None when they are answered."""
        if self.pending:
            return (f"table {table}: its history starts with the first record applied since its store was emptied, "
                    "and none has been yet")
        if self.untimed is not None:
            return (f"table {table}: its records carry no timestamp (the first: partition/offset {self.untimed}; a "
                    "Kafka 0.9 broker, or a producer that set none), so they have no place in time: as-of lookups "
                    "are refused; remove history from the table, or produce with timestamps and `globald reset` it")
        if self.since is None:
            return (f"table {table}: its store held data before history was declared, so no as-of answer can be "
                    "proven exact: it is rebuilt from the topic with history at its next plan")
        return None


class Sweep:
    """Where the pruning of one store's history goes on from, batch after batch: each batch that adds versions also
    walks the next stretch of the family in key order, about twice as many entries as it adds, so the walk keeps
    ahead of the growth and comes round to every key, written again or not. Memory only: a restart starts it over."""

    __slots__ = ("cursor",)

    def __init__(self) -> None:
        self.cursor = b""

    def step(self, family: Rdict, cutoff: int, budget: int) -> list[bytes]:
        """Entries, of the next ``budget`` or so, whose validity ended at or before ``cutoff``: those older than a
        version of their key at or before ``cutoff`` (which is kept: the as-of answer at ``since`` needs it)."""
        gone: list[bytes] = []
        it = family.iter()
        try:
            it.seek(self.cursor)
            if not it.valid():
                it.seek_to_first()
            prefix, kept, seen = b"", False, 0
            while it.valid():
                stored_key: bytes = it.key()
                p = _prefix_of(stored_key)
                if p != prefix:  # a key's entries are walked whole: "kept" is only known from its newest one
                    if seen >= budget:
                        break
                    prefix, kept = p, False
                if kept:
                    gone.append(stored_key)
                elif _MAX_I64 - _DESC_TS.unpack_from(stored_key, len(p))[0] <= cutoff:
                    kept = True
                seen += 1
                it.next()
            self.cursor = it.key() if it.valid() else b""
        finally:
            del it
        return gone


class HistoryWriter:
    """Adds the versions of the records a batch folds (``engine.fold``) to that batch, and at ``finish`` the next
    stretch of pruning (``Sweep``) and the new ``since``, ``clock`` and ``untimed`` marks, in the same batch."""

    __slots__ = ("_added", "_batch", "_clock", "_family", "_handle", "_lag", "_meta", "_meta_handle", "_sweep",
                 "_untimed", "_window")

    def __init__(self, batch: Any, handle: Any, family: Rdict, meta_handle: Any, meta: HistoryMeta, window_ms: int,
                 sweep: Sweep | None = None, lag_ms: int | None = None) -> None:
        """``sweep`` None: no pruning (a bulk load, whose memtables are slow to read; an exact build). ``lag_ms``:
        the topic's ``min.compaction.lag.ms`` (None: unknown, taken as 0), which a pending ``since`` is set from."""
        self._batch, self._handle, self._family, self._meta_handle = batch, handle, family, meta_handle
        self._meta, self._window, self._sweep, self._lag = meta, window_ms, sweep, lag_ms
        self._clock = meta.clock
        self._untimed: str | None = None
        self._added = 0

    def sink(self) -> tuple[Callable[..., None], Any, int, str | None]:
        """What a fold that adds the versions in its own loop (``engine.fold``) needs: the batch's ``put``, the
        history family's handle, the clock so far (-1: none, below every timestamp kept) and the first record
        without a timestamp seen so far (None: none); it hands back what it saw with ``added``."""
        return self._batch.put, self._handle, -1 if self._clock is None else self._clock, self._untimed

    def added(self, clock: int, untimed: str | None, versions: int) -> None:
        """What a fold's loop (``sink``) saw: the newest timestamp, the first record without one (set only when
        the store has none recorded yet), and how many versions it added."""
        self._clock = None if clock < 0 else clock
        if untimed is not None and self._meta.untimed is None:
            self._untimed = untimed
        self._added += versions

    def finish(self) -> None:
        """Prune and mark: call once, after the last ``add`` and before the batch is written."""
        put = self._batch.put
        if self._untimed is not None:
            put(META_HISTORY_UNTIMED, self._untimed.encode(), self._meta_handle)
        clock = self._clock
        if clock is None or not self._added:
            return
        if clock != self._meta.clock:
            put(META_HISTORY_CLOCK, str(clock).encode(), self._meta_handle)
        cutoff = clock - self._window
        since = replay_since(now_ms(), self._lag or 0) if self._meta.pending else self._meta.since
        if since is not None and (self._meta.pending or cutoff > since):
            put(META_HISTORY_SINCE, str(max(since, cutoff)).encode(), self._meta_handle)
        if self._sweep is not None:
            for stored_key in self._sweep.step(self._family, cutoff, max(SWEEP_MIN, 2 * self._added)):
                self._batch.delete(stored_key, self._handle)


def status(family: Rdict, meta: HistoryMeta, window_ms: int | None, table: str,
           lag_ms: int | None = None, moved: str | None = None) -> dict[str, Any]:
    """``tables.<t>.history`` of the status: since (epoch ms, null when unproven), versions and bytes (RocksDB's
    estimates for the history family), the window, the topic's ``min.compaction.lag.ms`` as last read (null:
    unknown, taken as 0), why as-of lookups are refused (null when answered), and why a resume after a gap in
    reading last moved since (``store.gaps.since_after_gap``; null when none did since the daemon started)."""
    sizes = ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables")
    return {"since": meta.since, "versions": int(family.property_int_value("rocksdb.estimate-num-keys") or 0),
            "bytes": sum(int(family.property_int_value(p) or 0) for p in sizes), "window_ms": window_ms,
            "compaction_lag_ms": lag_ms, "refused": meta.refusal(table), "moved": moved}


# Every mark of a history (``names.META_HISTORY_*``): dropped with its family (``forget``).
MARKS = (META_HISTORY_SINCE, META_HISTORY_CLOCK, META_HISTORY_UNTIMED, META_HISTORY_READ)


def forget(put_meta: Callable[[dict[bytes, bytes | None]], None], drop: Callable[[], None], table: str,
           why: str) -> None:
    """Drop the history of a table no longer versioned: its marks first (``put_meta`` deletes them, durably), then
    its family (``drop``). The one way a history goes: at a store's open (``adopt``: removed at a restart, or a
    drop cut short), by a reload that removes it in place (``Database.history_removed``) and in an exact build on
    a base that had it (``snapshot.builder``). In this order a crash between the two leaves a family without
    ``since``, which no reader takes for a history (``HistoryMeta.unproven``: as-of lookups refused) and which the
    next open resolves: dropped again when the table is not versioned, rebuilt from the topic at its plan when a
    restart declares history again. The other order could leave a ``since`` over an empty family made anew."""
    with store_io(f"table {table}: drop the history of a table no longer versioned"):
        put_meta(dict.fromkeys(MARKS))
        drop()
    log.info("table %s: %s; dropped its history", table, why)


def adopt(db: Rdict, meta: Rdict, table: str, window_ms: int | None, stale: bool, empty: Callable[[], bool],
          put_meta: Callable[[dict[bytes, bytes | None]], None]) -> dict[bytes, bytes | None]:
    """What a store just opened does with its history (``TableStore``): the history family of a table no longer
    versioned (``stale``) is dropped here (``forget``); the metadata to put is returned (None: a key to delete):
    any mark a table without history still holds, or ``since`` pending for a versioned store that is ``empty()``.
    A versioned store holding data without ``since`` gets none (``unproven``): nothing proves what it saw, and the
    state manager rebuilds it from the topic at its plan."""
    if stale:  # no longer kept up to date, so not kept at all
        forget(put_meta, lambda: db.drop_column_family(HISTORY_CF), table, "the table is no longer versioned")
        return {}
    if window_ms is None:  # marks without their family (a drop cut short by an older globald): gone too
        return {k: None for k in MARKS if meta.get(k) is not None}
    if meta.get(META_HISTORY_SINCE) is not None:
        return {}
    if empty():
        return {META_HISTORY_SINCE: SINCE_PENDING}
    log.warning("%s", HistoryMeta.read(meta).refusal(table))
    return {}
