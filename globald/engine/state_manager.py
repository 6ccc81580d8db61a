"""Restore plans, wipes and commits for every table (Kafka Streams' GlobalStateManager).

A plan starts each partition at its stored next-offset, or at the log start when the store has none (and stores
that start, so the store's offsets always cover every partition), and captures the log end as the restore target.
A stored offset the log no longer holds (retention, a recreated topic) is never trusted: the table is wiped and
restored from the log start (KIP-406). A commit makes every write durable and checks that the durable offsets are
the ones applied before the Kafka-format .checkpoint file claims them; a restore ends (and the table may go
RUNNING) only through such a commit. Disk faults raise StoreIOError and claim nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from globald.config import Config, TableConfig
from globald.errors import StoreCorruptError, StoreIOError, StoreUnavailableError
from globald.kafka.clients import partitions, watermarks
from globald.states import Listeners, State, StateMachine
from globald.store.failures import is_corruption
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore

log = logging.getLogger(__name__)


@dataclass
class TableRuntime:
    """The daemon's live view of one table."""

    config: TableConfig
    store: TableStore
    machine: StateMachine
    positions: dict[int, int] = field(default_factory=dict)  # next-offset per partition, as written to the store
    ends: dict[int, int] = field(default_factory=dict)  # restore targets of partitions still restoring
    restored: dict[int, int] = field(default_factory=dict)  # records restored per partition in this restore
    end_offsets: dict[int, int] = field(default_factory=dict)  # last known log end per partition
    partitions: list[int] = field(default_factory=list)
    assigned: bool = False
    dirty: bool = False
    null_keys: int = 0
    records: int = 0
    last_error: str | None = None
    restore_started: float | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def topic(self) -> str:
        return self.config.topic

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in self.partitions]


class StateManager:
    def __init__(self, config: Config, listeners: Listeners) -> None:
        self.config = config
        self.listeners = listeners
        self.options = StoreOptions.from_config(config.store)
        self.tables: dict[str, TableRuntime] = {}
        self.wipes: Counter[tuple[str, str]] = Counter()  # (table, kind) -> count
        self.commits = 0
        self.last_commit_seconds = 0.0

    def open_all(self) -> dict[str, str]:
        """Open every table's store; returns {table: why} for those the disk refused (left closed, to retry)."""
        refused: dict[str, str] = {}
        for tc in self.config.tables:
            store = TableStore(self.config.state_dir, tc.name, tc.topic, self.options)
            rt = TableRuntime(config=tc, store=store, machine=StateMachine(self.listeners, table=tc.name))
            self.tables[tc.name] = rt
            try:
                opened = store.open_or_wipe()
            except StoreUnavailableError as e:  # a full or failing disk: recover_stores opens it once it heals
                log.warning("table %s: cannot open the store (%s); retrying with backoff", tc.name, e)
                refused[tc.name] = str(e)
                continue
            if opened.wiped_reason:
                self._count_wipe(rt, "corrupt_store", opened.wiped_reason)
            rt.positions = store.offsets()
        return refused

    def plan(self, consumer: Consumer, rt: TableRuntime) -> list[TopicPartition]:
        """The assignment that restores ``rt``; wipes it first when its stored offsets are invalid."""
        parts = partitions(consumer, rt.topic)
        marks = {p: watermarks(consumer, rt.topic, p) for p in parts}
        stored = rt.store.offsets()
        invalid = [f"partition {p} stored {o} outside [{marks[p][0]}, {marks[p][1]}]"
                   for p, o in stored.items() if p in marks and not marks[p][0] <= o <= marks[p][1]]
        invalid += [f"partition {p} no longer exists" for p in stored if p not in marks]
        if invalid:
            self.wipe(rt, "invalid_offset", "; ".join(invalid))
            stored = {}
        start = {p: stored.get(p, low) for p, (low, _) in marks.items()}
        self._store_starts(rt, {p: o for p, o in start.items() if p not in stored})
        rt.partitions = parts
        rt.positions = dict(start)
        rt.end_offsets = {p: high for p, (_, high) in marks.items()}
        rt.ends = {p: high for p, (_, high) in marks.items() if start[p] < high}
        rt.restored = {p: 0 for p in rt.ends}
        if rt.ends and rt.restore_started is None:
            rt.restore_started = time.monotonic()
        for p, end in rt.ends.items():
            log.info("table %s: restoring partition %d from %d to %d", rt.name, p, start[p], end)
            self.listeners.restore_event("on_restore_start", rt.name, p, start[p], end)
        return [TopicPartition(rt.topic, p, start[p]) for p in parts]

    def _store_starts(self, rt: TableRuntime, starts: dict[int, int]) -> None:
        """Store the first offset of partitions the store holds nothing of: with no record below it that the log
        still has, the empty partition is the fold there, and the store's offsets then cover every partition."""
        if starts:
            batch = rt.store.new_batch()
            rt.store.put_offsets(batch, starts)
            rt.store.write(batch)
            rt.dirty = True

    def add_partitions(self, rt: TableRuntime, starts: dict[int, int]) -> None:
        """Partitions added to the topic: they start at ``starts`` (their log start), stored at once."""
        self._store_starts(rt, starts)
        rt.partitions = sorted(set(rt.partitions) | set(starts))
        rt.positions.update(starts)

    def wipe(self, rt: TableRuntime, kind: str, detail: str) -> None:
        """Delete the table's data and offsets; the caller restores it from the log start.

        Raises StoreIOError when the emptied store cannot be opened again (a full disk): it is then closed, holds
        nothing, and ``recover_stores`` opens it once the disk heals."""
        self._count_wipe(rt, kind, detail)
        rt.positions, rt.ends, rt.restored = {}, {}, {}
        rt.dirty = False
        rt.restore_started = time.monotonic()
        rt.store.wipe()

    def recover_stores(self) -> None:
        """After a failed write or commit: (re)open every store that refuses writes, wipe one found corrupt.

        Raises while the disk still refuses (the caller retries later); healthy stores are left untouched.
        """
        for rt in self.tables.values():
            error = rt.store.write_error()
            if error is None:
                continue
            if is_corruption(error):
                self.wipe(rt, "corrupt_store", error)
                continue
            log.warning("table %s: store refuses writes (%s); reopening it", rt.name, error)
            try:
                rt.store.reopen()
            except StoreCorruptError as e:
                self.wipe(rt, "corrupt_store", str(e))
            rt.positions = rt.store.offsets()
            rt.dirty = False

    def _count_wipe(self, rt: TableRuntime, kind: str, detail: str) -> None:
        self.wipes[(rt.name, kind)] += 1
        log.warning("table %s: WIPE (%s): %s", rt.name, kind, detail)

    def commit(self, force: bool = False) -> bool:
        """Make every table written since the last commit durable, then write its .checkpoint file.

        A table in a bulk load is left out: nothing of it is durable before ``finish_restore``."""
        started = time.monotonic()
        done = False
        for rt in self.tables.values():
            if (rt.dirty or force) and rt.store.is_open and not rt.store.bulk:
                self._commit_table(rt)
                done = True
        if done:
            self.commits += 1
            self.last_commit_seconds = time.monotonic() - started
        return done

    def _commit_table(self, rt: TableRuntime) -> None:
        durable = rt.store.sync()
        if durable != rt.positions:
            # Something the loop applied is not in the store: claiming it would skip those records for good.
            raise StoreIOError(f"table {rt.name}: durable offsets {durable} are not the applied ones {rt.positions}")
        rt.store.write_checkpoint_file(durable)
        rt.dirty = False

    def finish_restore(self, rt: TableRuntime) -> None:
        """End ``rt``'s restore: make it durable (the bulk load's flush, then a commit that checks the durable offsets
        are the ones restored to) and mark the store complete. Raises StoreIOError, claiming nothing, otherwise."""
        started = time.monotonic()
        if rt.store.bulk:
            rt.store.end_bulk_load()
        self._commit_table(rt)
        rt.store.mark_complete()
        self.commits += 1
        self.last_commit_seconds = time.monotonic() - started

    def close(self, clean: bool) -> None:
        for rt in self.tables.values():
            try:
                rt.store.close(clean=clean)
            except StoreUnavailableError as e:  # the store stays at its last durable commit
                log.warning("table %s: close failed: %s", rt.name, e)
            except Exception:
                log.exception("table %s: close failed", rt.name)

    def restoring(self) -> list[TableRuntime]:
        return [rt for rt in self.tables.values() if rt.machine.state in (State.CREATED, State.RESTORING)]
