"""Applies one poll's records to the table stores: one WriteBatch per table, offsets inside it.

Contract: after ``apply`` returns, each touched table's store holds the records of this poll together with the
next-offsets just past them, written atomically; a table that reported an invalid offset in the poll gets no
write at all (it is about to be wiped). Null keys are skipped and counted; tombstones delete.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, Message
from rocksdict import WriteBatch

from globald.engine.state_manager import TableRuntime
from globald.store.codec import NO_TIMESTAMP, pack_i64

log = logging.getLogger(__name__)

_EOF = KafkaError._PARTITION_EOF
_NO_TIMESTAMP = pack_i64(NO_TIMESTAMP)
_INVALID_OFFSET = KafkaError._AUTO_OFFSET_RESET


@dataclass
class TableBatch:
    """What one poll did to one table."""

    positions: dict[int, int] = field(default_factory=dict)  # new next-offset per touched partition
    counts: dict[int, int] = field(default_factory=dict)  # records applied per partition
    null_keys: int = 0
    invalid_offset: str | None = None


@dataclass
class PollResult:
    tables: dict[str, TableBatch] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # transient consumer errors, for logs and status

    @property
    def records(self) -> int:
        return sum(sum(b.counts.values()) for b in self.tables.values())


class UpdateTask:
    """Turns consumed messages into store writes for the tables in ``tables`` (keyed by topic)."""

    def __init__(self, tables: dict[str, TableRuntime]) -> None:
        self._tables = tables
        # The consumer is assigned only the tables' topics: with one table, every record is of its topic.
        self._only_topic = next(iter(tables)) if len(tables) == 1 else None

    def apply(self, messages: Sequence[Message]) -> PollResult:
        # The restore's hot loop. A fetch delivers long runs of one partition, so the table lookup, the record
        # count and the next-offset are settled once per run; per record only key, value and timestamp are read.
        result = PollResult()
        batches: dict[str, WriteBatch] = {}
        topic: str | None = None
        partition = -1
        target: _Target | None = None
        last: Message | None = None
        run = 0
        for m in messages:
            err = m.error()
            if err is not None:
                if run:
                    target.close_run(partition, last, run)  # type: ignore[union-attr]
                    run = 0
                topic = None  # the error may have invalidated the table: look it up again
                self._on_error(m, err, self._tables.get(m.topic() or ""), result)
                continue
            t = self._only_topic or m.topic()
            p = m.partition()
            if p != partition or t != topic:
                if run:
                    target.close_run(partition, last, run)  # type: ignore[union-attr]
                    run = 0
                partition = p
                if t != topic:
                    topic = t
                    target = self._target(t, result, batches)
            if target is None:
                continue
            last = m
            run += 1
            key = m.key()
            if key is None:
                target.tb.null_keys += 1
                continue
            value = m.value()
            if value is None:
                target.delete(key)
            else:
                ts_type, ts = m.timestamp()
                target.put(key, (_NO_TIMESTAMP if ts_type == TIMESTAMP_NOT_AVAILABLE else pack_i64(ts)) + value)
        if run:
            target.close_run(partition, last, run)  # type: ignore[union-attr]
        for rt in self._tables.values():
            tb = result.tables.get(rt.name)
            if tb is None or tb.invalid_offset is not None or not tb.positions:
                continue
            batch = batches.get(rt.name)
            if batch is None:
                batch = rt.store.new_batch()
            rt.store.put_offsets(batch, tb.positions)
            rt.store.write(batch)
        return result

    def _target(self, topic: str | None, result: PollResult, batches: dict[str, WriteBatch]) -> _Target | None:
        """Where records of ``topic`` go in this poll; None when they are to be skipped."""
        rt = self._tables.get(topic or "")
        if rt is None:
            return None
        tb = result.tables.get(rt.name)
        if tb is None:
            tb = result.tables[rt.name] = TableBatch()
        if tb.invalid_offset is not None:
            return None
        batch = batches.get(rt.name)
        if batch is None:
            batch = batches[rt.name] = rt.store.new_batch()
        return _Target(tb, batch)

    @staticmethod
    def _on_error(m: Message, err: KafkaError, rt: TableRuntime | None, result: PollResult) -> None:
        code = err.code()
        if rt is None:
            if code != _EOF:
                result.errors.append(err.str())
            return
        tb = result.tables.setdefault(rt.name, TableBatch())
        partition, offset = m.partition(), m.offset()
        position = tb.positions.get(partition, rt.positions.get(partition))
        if code == _EOF:
            # The broker's end (past compaction gaps and transaction markers) is a valid next-offset. An end past
            # every end seen for the partition is a leftover of an assignment given up since (a rebuilt table).
            if offset is not None and position is not None and position < offset \
                    <= max(rt.end_offsets.get(partition, -1), position):
                tb.positions[partition] = offset
            return
        if code == _INVALID_OFFSET:
            # Only an error about the offset we fetch from now counts; one about an earlier assignment is stale.
            if offset == position:
                tb.invalid_offset = f"invalid offset {offset} for {m.topic()}[{partition}]: {err.str()}"
            else:
                log.info("ignoring a stale invalid-offset error for %s[%s] at %s (now at %s)", m.topic(), partition,
                         offset, position)
            return
        result.errors.append(f"{m.topic()}[{m.partition()}]: {err.str()}")


class _Target:
    """One table's share of a poll: its counters and its write batch's bound methods."""

    __slots__ = ("delete", "put", "tb")

    def __init__(self, tb: TableBatch, batch: WriteBatch) -> None:
        self.tb = tb
        self.put = batch.put
        self.delete = batch.delete

    def close_run(self, partition: int, last: Message, run: int) -> None:
        """Account for ``run`` consecutive records of ``partition`` ending with ``last``."""
        self.tb.positions[partition] = last.offset() + 1
        self.tb.counts[partition] = self.tb.counts.get(partition, 0) + run
