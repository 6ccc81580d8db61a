"""The correctness oracles: the last value per key among a topic's records below given offsets (``fold``), and the
value in force at a record time (``as_of``, the as-of fold of a versioned table).

Tombstones delete the key, null keys are ignored. The demo checks the store it shows against ``fold``, read
straight from the broker; the tests, benchmarks and soak check every claim about a store or a snapshot against the
same fold, through ``tests/support/oracle.py``, which also keeps each value's record timestamp and location.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Message, TopicPartition

Table = dict[bytes, bytes]
Timed = dict[bytes, tuple[bytes, int]]  # key -> (value, timestamp)
T = TypeVar("T")
# The longest one consume() call waits for its batch to fill: it returns at once when the batch is full, and a fold
# always ends with a partial one, so a longer wait is paid once per fold (0.5 s was half of a small test's fold).
# The fold's own deadline, not this, bounds how long a slow broker may take.
CONSUME_WAIT_S = 0.05


def fold(settings: dict[str, Any], topic: str, upto: dict[int, int], timeout: float = 120.0) -> Table:
    """Fold ``topic`` from each partition's log start up to (excluding) ``upto[partition]``."""
    return fold_records(settings, topic, upto, lambda value, _: value, timeout)


@dataclass(frozen=True)
class Record:
    """One record, as the as-of fold needs it: ``value`` None is a tombstone, ``timestamp`` -1 none given."""

    key: bytes
    value: bytes | None
    timestamp: int
    partition: int
    offset: int


def as_of(records: Iterable[Record], key: bytes, t: int) -> tuple[bytes, int] | None:
    """The as-of fold: of the records of ``key`` whose timestamp is <= ``t``, the one with the greatest (timestamp,
    offset) (then partition, for the same offset in two partitions) answers, as (value, timestamp); a tombstone
    there, or no such record, is None. Out-of-order timestamps are placed by timestamp, not by arrival."""
    best: Record | None = None
    for r in records:
        if r.key == key and 0 <= r.timestamp <= t and (
                best is None or (r.timestamp, r.offset, r.partition) > (best.timestamp, best.offset, best.partition)):
            best = r
    return None if best is None or best.value is None else (best.value, best.timestamp)


def as_of_table(records: Iterable[Record], t: int) -> Timed:
    """``as_of`` of every key at ``t``: {key: (value, timestamp)} for the keys holding a value then."""
    rs = list(records)
    found = {k: as_of(rs, k, t) for k in {r.key for r in rs}}
    return {k: v for k, v in found.items() if v is not None}


def records(settings: dict[str, Any], topic: str, upto: dict[int, int], timeout: float = 120.0) -> list[Record]:
    """Every keyed record of ``topic`` below ``upto``, in each partition's order (the input of ``as_of``)."""
    out: list[Record] = []

    def each(m: Message) -> None:
        ts_type, ts = m.timestamp()
        out.append(Record(m.key(), m.value(), ts if ts_type != TIMESTAMP_NOT_AVAILABLE else -1,  # type: ignore[arg-type]
                          m.partition(), m.offset()))  # type: ignore[arg-type]  # set on records

    _read(settings, topic, upto, each, timeout)
    return out


def fold_records(settings: dict[str, Any], topic: str, upto: dict[int, int], entry: Callable[[bytes, Message], T],
                 timeout: float = 120.0) -> dict[bytes, T]:
    """``fold``, each key's last value kept as ``entry(value, record)`` makes it."""
    table: dict[bytes, T] = {}

    def each(m: Message) -> None:
        key = m.key()
        assert key is not None
        value = m.value()
        if value is None:
            table.pop(key, None)
        else:
            table[key] = entry(value, m)

    _read(settings, topic, upto, each, timeout)
    return table


def _read(settings: dict[str, Any], topic: str, upto: dict[int, int], each: Callable[[Message], None],
          timeout: float) -> None:
    """Call ``each`` with every keyed record of ``topic`` from each partition's log start below ``upto``."""
    c = Consumer({**settings, "group.id": "globald-oracle", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 3})
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
            for m in c.consume(10000, CONSUME_WAIT_S):
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
                if m.key() is not None:
                    each(m)
                if offset + 1 >= todo[p]:
                    del todo[p]
    finally:
        c.close()
