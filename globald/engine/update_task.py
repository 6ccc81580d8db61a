"""Applies one poll's records to the table stores: one WriteBatch per table, offsets inside it (GlobalStateUpdateTask).

Contract: the task owns every table's positions (next-offset per partition). After ``update`` returns, each touched
table's store holds the records of the poll together with the positions just past them, written atomically, and
``positions(table)`` equals the offsets stored in that table's store; a write that fails changes no position. A
table that reported an invalid offset in the poll gets no write at all (it is about to be wiped). Null keys are
skipped and counted; tombstones delete; a typed table's values carry their origins (``engine.fold``, the one fold,
shared with the exact-snapshot builder). An end of partition past every end the table's plan saw (a transaction
committed since: its marker takes an offset no record fills) moves no position until the broker confirms it
(``confirm_ends``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from confluent_kafka import KafkaError, Message

from globald.engine.fold import Delete, Put, fold
from globald.engine.table import TableRuntime
from globald.engine.tables import TableSet
from globald.store.fingerprint import EMPTY, Fingerprint, Ladder, record_fingerprint
from globald.store.history import HistoryWriter
from globald.store.layout import OriginWriter
from globald.store.protocol import Batch

log = logging.getLogger(__name__)

_EOF = KafkaError._PARTITION_EOF
_INVALID_OFFSET = KafkaError._AUTO_OFFSET_RESET

@dataclass
class TableBatch:
    """What one poll did to one table."""

    positions: dict[int, int] = field(default_factory=dict)  # new next-offset per touched partition
    counts: dict[int, int] = field(default_factory=dict)  # records applied per partition
    null_keys: int = 0
    invalid_offset: str | None = None
    newest: dict[int, Fingerprint] = field(default_factory=dict)  # the last record applied per partition


@dataclass
class PollResult:
    tables: dict[str, TableBatch] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # transient consumer errors, for logs and status

    @property
    def records(self) -> int:
        return sum(sum(b.counts.values()) for b in self.tables.values())


@dataclass
class Applied:
    """Running totals of one table since the daemon started."""

    records: int = 0
    null_keys: int = 0


class UpdateTask:
    """Turns consumed messages into store writes for ``tables``, routed by their topics (``TableSet.route``), and
    keeps their positions."""

    def __init__(self, tables: Mapping[str, TableRuntime]) -> None:
        # The loop's set of tables; a fixed mapping of them (a benchmark's, a test's) is made one.
        self._tables = tables if isinstance(tables, TableSet) else TableSet.of(tables.values())
        self._positions: dict[str, dict[int, int]] = {name: {} for name in tables}
        self._ladders: dict[str, dict[int, Ladder]] = {name: {} for name in tables}
        self.applied = {name: Applied() for name in tables}
        self.dirty: set[str] = set()  # tables written since their last commit
        # Per table, ends of partition past the known ends, waiting for the broker's word (see _on_error).
        self.unconfirmed_ends: dict[str, dict[int, int]] = {name: {} for name in tables}

    def positions(self, table: str) -> dict[int, int]:
        return dict(self._positions[table])

    def ladders(self, table: str) -> dict[int, Ladder]:
        """The fingerprints of the records applied to ``table``, as stored with its positions."""
        return dict(self._ladders[table])

    def start(self, table: str, positions: Mapping[int, int], ladders: Mapping[int, Ladder] | None = None) -> None:
        """Take ``positions`` (and the fingerprint ``ladders`` stored with them) as the table's: what its store
        holds, after a plan, a wipe or a reopen."""
        self._positions[table] = dict(positions)
        if ladders is not None:
            self._ladders[table] = dict(ladders)
        self.unconfirmed_ends[table] = {}

    @property
    def _only_topic(self) -> str | None:
        """The one topic every record is of, when there is one (``TableSet.only_topic``)."""
        return self._tables.only_topic

    def add(self, name: str) -> None:
        """A table a reload added (``TableSet.add``, which routes its topic to it): its positions are its store's
        once planned."""
        self._positions[name], self._ladders[name], self.unconfirmed_ends[name] = {}, {}, {}
        self.applied[name] = Applied()

    def remove(self, name: str) -> None:
        """A table a reload dropped (``TableSet.drop``, which routes its topic nowhere): its positions go."""
        for per_table in (self._positions, self._ladders, self.unconfirmed_ends, self.applied):
            per_table.pop(name, None)
        self.dirty.discard(name)

    def committed(self, table: str) -> None:
        self.dirty.discard(table)

    def update(self, messages: Sequence[Message]) -> PollResult:
        # A fetch delivers long runs of one partition: this loop only finds where each run ends (an error event,
        # another partition or topic), and each run is folded, counted and positioned in one go.
        result = PollResult()
        batches: dict[str, Batch] = {}
        versions: dict[str, HistoryWriter] = {}  # a versioned table's, finished before its batch is written
        only = self._only_topic
        topic: str | None = None
        partition = -1
        target: _Target | None = None
        start = 0  # the current run is messages[start:i]
        for i, m in enumerate(messages):
            err = m.error()
            if err is None:
                t = only or m.topic()
                p = m.partition()
                if p == partition and t == topic:
                    continue
            if target is not None and start < i:
                target.close_run(partition, messages[start:i])
            if err is not None:
                start = i + 1
                topic, partition = None, -1  # the error may have invalidated the table: look it up again
                self._on_error(m, err, self._tables.route(m.topic() or ""), result)
                continue
            start = i
            partition = p if p is not None else -1
            if t != topic:
                topic = t
                target = self._target(t, result, batches, versions)
        if target is not None and start < len(messages):
            target.close_run(partition, messages[start:])
        self._write(result, batches, messages, versions)
        return result

    def _write(self, result: PollResult, batches: dict[str, Batch],
               messages: Sequence[Message] = (), versions: Mapping[str, HistoryWriter] | None = None) -> None:
        for name, tb in result.tables.items():
            if tb.invalid_offset is not None or not tb.positions:
                continue
            rt = self._tables[name]
            batch = batches.get(name) or rt.store.new_batch()
            if versions and name in versions:
                versions[name].finish()
            held = self._ladders[name]
            ladders = {p: held.get(p, EMPTY).climb(f) for p, f in tb.newest.items()}
            rt.store.put_offsets(batch, tb.positions, ladders)
            rt.store.put_read_mark(batch)
            # raises on a store fault: no position moves
            rt.store.write(batch, rebuild=partial(self._refold, rt, messages, tb.positions, ladders))
            self._positions[name].update(tb.positions)
            held.update(ladders)
            pending = self.unconfirmed_ends[name]
            for p, position in tb.positions.items():
                if pending.get(p, position) <= position:  # records reached it: nothing left to confirm
                    pending.pop(p, None)
            self.dirty.add(name)
            totals = self.applied[name]
            totals.records += sum(tb.counts.values())
            totals.null_keys += tb.null_keys

    def _refold(self, rt: TableRuntime, messages: Sequence[Message], positions: dict[int, int],
                ladders: dict[int, Ladder]) -> Batch:
        """The batch ``update`` built for ``rt`` from ``messages``, made again (a write RocksDB held back)."""
        batch = rt.store.new_batch()
        history = rt.store.history_writer(batch)
        fold((m for m in messages if m.error() is None and (self._only_topic or m.topic()) == rt.topic),
             batch.put, batch.delete, rt.store.origin_writer(batch), history)
        if history is not None:
            history.finish()
        rt.store.put_offsets(batch, positions, ladders)
        rt.store.put_read_mark(batch)
        return batch

    def confirm_ends(self, table: str, ends: Mapping[int, int]) -> dict[int, int]:
        """Settle ``table``'s unconfirmed ends with ``ends``, the partitions' ends the broker gave when asked after
        they were seen: one within them is a valid next-offset, written like a poll's positions; one beyond is the
        leftover of an earlier assignment, dropped. Returns the positions moved; raises on a store fault."""
        pending = self.unconfirmed_ends[table]
        tb = TableBatch()
        for p in [p for p in pending if p in ends]:
            offset = pending.pop(p)
            position = self._positions[table].get(p)
            if position is not None and position < offset <= ends[p]:
                tb.positions[p] = offset
        if tb.positions:
            self._write(PollResult(tables={table: tb}), {})
        return tb.positions

    def _target(self, topic: str | None, result: PollResult, batches: dict[str, Batch],
                versions: dict[str, HistoryWriter]) -> _Target | None:
        """Where records of ``topic`` go in this poll; None when they are to be skipped."""
        rt = self._tables.route(topic or "")
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
            history = rt.store.history_writer(batch)
            if history is not None:
                versions[rt.name] = history
        return _Target(tb, batch, rt.store.origin_writer(batch), versions.get(rt.name))

    def _on_error(self, m: Message, err: KafkaError, rt: TableRuntime | None, result: PollResult) -> None:
        code = err.code()
        if rt is None:
            if code != _EOF:
                result.errors.append(err.str())
            return
        tb = result.tables.setdefault(rt.name, TableBatch())
        partition, offset = m.partition(), m.offset()
        if partition is None:
            result.errors.append(f"{m.topic()}: {err.str()}")
            return
        position = tb.positions.get(partition, self._positions[rt.name].get(partition))
        if code == _EOF:
            # The broker's end (past compaction gaps and transaction markers) is a valid next-offset. An end past
            # every end seen for the partition is either a leftover of an assignment given up since (a rebuilt
            # table) or the end of a transaction committed since the plan (its marker took the offset): only the
            # broker can tell, so the loop asks it (confirm_ends).
            if offset is not None and position is not None and position < offset:
                if offset <= rt.end_offsets.get(partition, -1):
                    tb.positions[partition] = offset
                else:
                    self.unconfirmed_ends[rt.name][partition] = offset
            return
        if code == _INVALID_OFFSET:
            # Only an error about the offset we fetch from now counts; one about an earlier assignment is stale.
            if offset == position:
                tb.invalid_offset = f"invalid offset {offset} for {m.topic()}[{partition}]: {err.str()}"
            else:
                log.info("ignoring a stale invalid-offset error for %s[%s] at %s (now at %s)", m.topic(), partition,
                         offset, position)
            return
        result.errors.append(f"{m.topic()}[{partition}]: {err.str()}")


class _Target:
    """One table's share of a poll: its counters, its write batch's bound methods and, for a typed table, what
    writes the origins of its values into that batch."""

    __slots__ = ("delete", "history", "origins", "put", "tb")

    def __init__(self, tb: TableBatch, batch: Batch, origins: OriginWriter | None,
                 history: HistoryWriter | None) -> None:
        self.tb = tb
        self.put: Put = batch.put
        self.delete: Delete = batch.delete
        self.origins = origins
        self.history = history

    def close_run(self, partition: int, run: Sequence[Message]) -> None:
        """Fold ``run``, consecutive records of ``partition``, into the batch and account for them."""
        tb = self.tb
        tb.null_keys += fold(run, self.put, self.delete, self.origins, self.history)
        last = run[-1]
        offset = last.offset()
        assert offset is not None  # librdkafka gives every record its offset
        tb.positions[partition] = offset + 1
        tb.newest[partition] = record_fingerprint(last)
        tb.counts[partition] = tb.counts.get(partition, 0) + len(run)
