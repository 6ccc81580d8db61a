"""The correctness oracle for tests, benchmarks and the soak: the product's ``fold`` (``globald.embedded.oracle``), and
the same fold keeping each value's record timestamp, as globald must store it (KIP-258: -1 where the broker gives
none, as Kafka 0.9), and the partition and offset it comes from. Not shipped in the wheel.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from globald.embedded.oracle import Table, fold, fold_records

__all__ = ["LocatedTable", "Table", "TimestampedTable", "fold", "fold_located", "fold_timestamped"]

TimestampedTable = dict[bytes, tuple[bytes, int]]  # key -> (value, record timestamp or -1)
LocatedTable = dict[bytes, tuple[bytes, int, int, int]]  # key -> (value, timestamp, partition, offset)


def _timestamp(record: Message) -> int:
    ts_type, ts = record.timestamp()
    return -1 if ts_type == TIMESTAMP_NOT_AVAILABLE else ts


def fold_timestamped(settings: dict[str, Any], topic: str, upto: dict[int, int],
                     timeout: float = 120.0) -> TimestampedTable:
    """``fold`` with each value's record timestamp (-1 where the record has none)."""
    return fold_records(settings, topic, upto, lambda value, m: (value, _timestamp(m)), timeout)


def fold_located(settings: dict[str, Any], topic: str, upto: dict[int, int],
                 timeout: float = 120.0) -> LocatedTable:
    """``fold_timestamped`` with the partition and offset of the record each value comes from."""
    # The fold hands over only records of a partition it reads, at an offset: neither is None here.
    return fold_records(settings, topic, upto,
                        lambda value, m: (value, _timestamp(m), m.partition() or 0, m.offset() or 0), timeout)
