"""The correctness oracle: the last value per key among a topic's records below given offsets.

Tombstones delete the key, null keys are ignored. Every claim the tests, benchmarks and soak make about a store
or a snapshot is checked against this fold, read straight from the broker. ``fold_timestamped`` keeps each value's
record timestamp too, as globald must store it (KIP-258): -1 where the broker gives none (Kafka 0.9).
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

Table = dict[bytes, bytes]
TimestampedTable = dict[bytes, tuple[bytes, int]]  # key -> (value, record timestamp or -1)
LocatedTable = dict[bytes, tuple[bytes, int, int, int]]  # key -> (value, timestamp, partition, offset)


def fold(settings: dict[str, Any], topic: str, upto: dict[int, int], timeout: float = 120.0) -> Table:
    """Fold ``topic`` from each partition's log start up to (excluding) ``upto[partition]``."""
    return {k: v for k, (v, _) in fold_timestamped(settings, topic, upto, timeout).items()}


def fold_timestamped(settings: dict[str, Any], topic: str, upto: dict[int, int],
                     timeout: float = 120.0) -> TimestampedTable:
    """``fold`` with each value's record timestamp (-1 where the record has none)."""
    return {k: (v, ts) for k, (v, ts, _, _) in fold_located(settings, topic, upto, timeout).items()}


def fold_located(settings: dict[str, Any], topic: str, upto: dict[int, int],
                 timeout: float = 120.0) -> LocatedTable:
    """``fold_timestamped`` with the partition and offset of the record each value comes from."""
    c = Consumer({**settings, "group.id": "globald-oracle", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 3})
    table: LocatedTable = {}
    try:
        todo = {p: o for p, o in upto.items() if o > 0}
        # Start at each log start explicitly: offset 0 may be gone after retention.
        lows = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[0] for p in todo}
        todo = {p: o for p, o in todo.items() if lows[p] < o}
        c.assign([TopicPartition(topic, p, lows[p]) for p in todo])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"oracle fold of {topic} did not reach {upto}; left {todo}")
            for m in c.consume(10000, 0.5):
                p, offset = m.partition(), m.offset()
                # Only errors not about one partition's position lack these: none of them ends a partition.
                if p is None or offset is None or p not in todo:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and offset >= todo[p]:
                        del todo[p]
                    continue
                if offset >= todo[p]:
                    del todo[p]
                    continue
                key = m.key()
                if key is not None:
                    value = m.value()
                    if value is None:
                        table.pop(key, None)
                    else:
                        ts_type, ts = m.timestamp()
                        table[key] = (value, -1 if ts_type == TIMESTAMP_NOT_AVAILABLE else ts, p, offset)
                if offset + 1 >= todo[p]:
                    del todo[p]
    finally:
        c.close()
    return table
