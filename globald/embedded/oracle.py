"""The correctness oracle: the last value per key among a topic's records below given offsets.

Tombstones delete the key, null keys are ignored. The demo checks the store it shows against ``fold``, read
straight from the broker; the tests, benchmarks and soak check every claim about a store or a snapshot against the
same fold, through ``tests/support/oracle.py``, which also keeps each value's record timestamp and location.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

Table = dict[bytes, bytes]
T = TypeVar("T")


def fold(settings: dict[str, Any], topic: str, upto: dict[int, int], timeout: float = 120.0) -> Table:
    """Fold ``topic`` from each partition's log start up to (excluding) ``upto[partition]``."""
    return fold_records(settings, topic, upto, lambda value, _: value, timeout)


def fold_records(settings: dict[str, Any], topic: str, upto: dict[int, int], entry: Callable[[bytes, Message], T],
                 timeout: float = 120.0) -> dict[bytes, T]:
    """``fold``, each key's last value kept as ``entry(value, record)`` makes it."""
    c = Consumer({**settings, "group.id": "globald-oracle", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 3})
    table: dict[bytes, T] = {}
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
                        table[key] = entry(value, m)
                if offset + 1 >= todo[p]:
                    del todo[p]
    finally:
        c.close()
    return table
