"""Restore plans, wipes and commits for every table (Kafka Streams' GlobalStateManager).

A plan starts each partition at its stored next-offset, or at the log start when the store has none, and
captures the log end as the restore target. A stored offset the log no longer holds (retention, a recreated
topic) is never trusted: the table is wiped and restored from the log start (KIP-406). A commit makes every
write durable before the Kafka-format .checkpoint file claims it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from globald.config import Config, TableConfig
from globald.errors import StoreCorruptError
from globald.kafka.clients import partitions, watermarks
from globald.states import Listeners, State, StateMachine
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

    def open_all(self) -> dict[str, TableRuntime]:
        for tc in self.config.tables:
            opened = TableStore.open(self.config.state_dir, tc.name, tc.topic, self.options)
            rt = TableRuntime(config=tc, store=opened.store, machine=StateMachine(self.listeners, table=tc.name))
            if opened.wiped_reason:
                self._count_wipe(rt, "corrupt_store", opened.wiped_reason)
            rt.positions = opened.store.offsets()
            self.tables[tc.name] = rt
        return self.tables

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

    def wipe(self, rt: TableRuntime, kind: str, detail: str) -> None:
        """Delete the table's data and offsets; the caller restores it from the log start."""
        self._count_wipe(rt, kind, detail)
        rt.store.wipe()
        rt.positions, rt.ends, rt.restored = {}, {}, {}
        rt.dirty = False
        rt.restore_started = time.monotonic()

    def recover_stores(self) -> None:
        """After a failed write or commit: reopen every store that refuses writes, wipe one found corrupt.

        Raises while the disk still refuses (the caller retries later); healthy stores are left untouched.
        """
        for rt in self.tables.values():
            error = rt.store.write_error()
            if error is None:
                continue
            if "Corruption" in error:
                self.wipe(rt, "corrupt_store", error)
                continue
            log.warning("table %s: store refuses writes (%s); reopening it", rt.name, error)
            try:
                rt.store.reopen()
            except StoreCorruptError as e:
                self.wipe(rt, "corrupt_store", str(e))
            rt.positions = rt.store.offsets()

    def _count_wipe(self, rt: TableRuntime, kind: str, detail: str) -> None:
        self.wipes[(rt.name, kind)] += 1
        log.warning("table %s: WIPE (%s): %s", rt.name, kind, detail)

    def commit(self, force: bool = False) -> bool:
        """fsync every table written since the last commit, then write its .checkpoint file."""
        started = time.monotonic()
        done = False
        for rt in self.tables.values():
            if not (rt.dirty or force):
                continue
            rt.store.sync()
            rt.store.write_checkpoint_file(rt.store.offsets())
            rt.dirty = False
            done = True
        if done:
            self.commits += 1
            self.last_commit_seconds = time.monotonic() - started
        return done

    def close(self, clean: bool) -> None:
        for rt in self.tables.values():
            try:
                rt.store.close(clean=clean)
            except Exception:
                log.exception("table %s: close failed", rt.name)

    def restoring(self) -> list[TableRuntime]:
        return [rt for rt in self.tables.values() if rt.machine.state in (State.CREATED, State.RESTORING)]
