"""The one fold of a topic's records into a store's batch, shared by the live store (``update_task``) and the
exact-snapshot builder (``snapshot.builder``): both must hold the same bytes for the same records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from globald.store.codec import NO_TIMESTAMP, pack_i64
from globald.store.history import HistoryWriter
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
        records = records if isinstance(records, Sequence) else list(records)
        history.add_all(records)  # a pass of its own, which a plain table's fold never pays for
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

