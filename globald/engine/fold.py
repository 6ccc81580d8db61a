"""The one fold of a topic's records into a store's batch, shared by the live store (``update_task``) and the
exact-snapshot builder (``snapshot.builder``): both must hold the same bytes for the same records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from globald.store.codec import NO_TIMESTAMP, pack_i64
from globald.store.history import KEY_END, MAX_I64, MAX_U32, TOMBSTONE, VALUE, HistoryWriter, pack_suffix
from globald.store.layout import OriginWriter

Put = Callable[[bytes, bytes], None]
Delete = Callable[[bytes], None]


def fold(records: Iterable[Message], put: Put, delete: Delete, origins: OriginWriter | None = None,
         history: HistoryWriter | None = None) -> int:
    """Fold records (no error events), in order, into a batch: a tombstone deletes its key, a value is stored with
    its record timestamp (KIP-258; NO_TIMESTAMP when the broker gives none) and, given ``origins`` (a typed
    table), with its partition and offset; given ``history`` (a versioned table), every record is also added as a
    version (the caller calls ``history.finish()`` before the batch is written). Returns the null keys, skipped."""
    if history is not None:
        return _fold_versioned(records, put, delete, origins, history)
    # The restore's hot loop: one Python frame for the whole run, and codec.encode_value spelled out (a call per
    # record cost a fifth of the loop's CPU).
    pack = pack_i64
    null_keys = 0
    for m in records:
        key = m.key()
        if key is None:
            null_keys += 1
        elif (value := m.value()) is None:
            delete(key)
            if origins is not None:
                origins.delete(key)
        else:
            ts_type, ts = m.timestamp()
            stored = pack(NO_TIMESTAMP if ts_type == TIMESTAMP_NOT_AVAILABLE else ts) + value
            put(key, stored)
            if origins is not None:
                origins.put(key, m.partition(), m.offset(), stored)  # type: ignore[arg-type]  # set on records
    return null_keys



def _fold_versioned(records: Iterable[Message], put: Put, delete: Delete, origins: OriginWriter | None,
                    history: HistoryWriter) -> int:
    """``fold`` of a versioned table: each record is also added as a version (``store.history``: its layout, and
    ``version_key`` spelled out here), in the same loop, so that its key, value and timestamp are asked for once.
    A pass of its own for the versions cost a versioned restore a fifth of its loop (bench/history_restore.py).
    ``0 in key`` looks for a zero byte with memchr, where ``b"\\x00" in key`` takes the substring search; ``clock``
    starts below every timestamp kept."""
    records = records if isinstance(records, Sequence) else list(records)  # counted at the end
    pack = pack_i64
    version, handle, clock, untimed = history.sink()
    suffix = pack_suffix
    null_keys = untimed_keys = 0
    for m in records:
        key = m.key()
        if key is None:
            null_keys += 1
            continue
        value = m.value()
        ts_type, ts = m.timestamp()
        if value is None:
            delete(key)
            if origins is not None:
                origins.delete(key)
        else:
            stored = pack(NO_TIMESTAMP if ts_type == TIMESTAMP_NOT_AVAILABLE else ts) + value
            put(key, stored)
            if origins is not None:
                origins.put(key, m.partition(), m.offset(), stored)  # type: ignore[arg-type]  # set on records
        if ts_type == TIMESTAMP_NOT_AVAILABLE or ts < 0:  # no place in time: kept as no version
            untimed_keys += 1
            if untimed is None:
                untimed = f"{m.partition()}/{m.offset()}"
            continue
        if 0 in key:
            key = key.replace(b"\x00", b"\x00\xff")
        version(key + KEY_END + suffix(MAX_I64 - ts, MAX_I64 - m.offset(), MAX_U32 - m.partition()),  # type: ignore[operator]
                TOMBSTONE if value is None else VALUE + value, handle)
        if ts > clock:
            clock = ts
    history.added(clock, untimed, len(records) - null_keys - untimed_keys)
    return null_keys
