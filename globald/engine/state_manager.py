"""Restore plans, wipes, commits and the stores' health for every table (Kafka Streams' GlobalStateManager).

What callers can rely on: a plan starts each partition at its stored next-offset, or at the log start when the
store has none (and stores that start, so a store's offsets always cover every partition), and captures the log
end as the restore target; partitions added to a topic later are planned the same way. A stored offset the log no
longer holds (retention, a recreated topic) is never trusted: the table is wiped and restored from the log start
(KIP-406). A commit makes every write durable and checks that the durable offsets are the ones the update task
applied before the .checkpoint file claims them; a restore ends only through such a commit, and only then does the
table go RUNNING (the state manager owns a restore from its targets to that move; the loop reports its progress).
Disk faults raise StoreIOError and claim nothing; ``recover_stores`` reopens what the disk refused once it takes
writes again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from globald.common.errors import StoreCorruptError, StoreIOError, StoreUnavailableError
from globald.common.states import State, StateMachine
from globald.engine.events import (
    EMPTY_STORE,
    BatchRestored,
    Committed,
    Emit,
    RestoreEnded,
    RestoreStarted,
    StateChanged,
    Wiped,
)
from globald.engine.identity import PlanFacts, TopicIdentity
from globald.engine.table import Restore, TableRuntime
from globald.engine.tables import TableSet
from globald.engine.view import Checkpointed, TableView
from globald.kafka.clients import TransientKafkaError
from globald.settings.config import Config, TableConfig
from globald.settings.ref import ConfigRef
from globald.store.fingerprint import Ladder
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore

log = logging.getLogger(__name__)

# A restore of at least this many records runs as a bulk load (WAL off, append-only memtable); smaller ones are
# not worth the two reopens of the store.
BULK_LOAD_MIN_RECORDS = 100_000
TOPIC_RECREATED = "topic_recreated"  # the wipe kind of a table whose topic was found to be another one
# The wipe kind of a versioned table whose store held data before it was (``store.history``: its since is unproven).
HISTORY_ADDED = "history_added"


def invalid_offsets(stored: Mapping[int, int], marks: Mapping[int, tuple[int, int]]) -> list[str]:
    """Why each stored offset is one the log no longer holds (KIP-406), given each partition's (log start, end)."""
    invalid = [f"partition {p} stored {o} outside [{marks[p][0]}, {marks[p][1]}]"
               for p, o in stored.items() if p in marks and not marks[p][0] <= o <= marks[p][1]]
    return invalid + [f"partition {p} no longer exists" for p in stored if p not in marks]


@dataclass(frozen=True)
class Plan:
    assignment: list[TopicPartition]
    starts: dict[int, int]  # the positions the update task starts from (what the store holds)
    ladders: dict[int, Ladder]  # the fingerprints stored with them


class StateManager:
    """The engine's owner of plans, durability and wipes, and its read interface (``engine.view.EngineView``).
    ``identity`` is handed over by the global thread, which builds it with the cluster worker it asks through."""

    identity: TopicIdentity

    def __init__(self, config: ConfigRef, emit: Emit) -> None:
        self._config = config
        self._emit = emit
        self.options = StoreOptions.from_config(config.now.store)  # [store] changes need a restart
        self.tables = TableSet()  # the engine's one set of tables; the loop changes it (``engine.tables``)
        self.wipes: Counter[tuple[str, str]] = Counter()  # (table, kind) -> count
        self._suspect = False

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config.now

    @property
    def store_fault(self) -> bool:
        """A write, commit or open failed and the stores have not been recovered since: nothing may be published
        from them, and no commit is attempted (it would fail the same way)."""
        return self._suspect

    def suspect(self) -> None:
        self._suspect = True

    def _notify(self, table: str | None, new: State, old: State, reason: str) -> None:
        self._emit(StateChanged(table, new, old, reason))

    def open_all(self) -> tuple[dict[str, dict[int, int]], dict[str, str]]:
        """Open every table's store: ({table: stored offsets}, {table: why} for stores the disk refused, which are
        left closed for ``recover_stores`` to open once it heals)."""
        stored: dict[str, dict[int, int]] = {}
        refused: dict[str, str] = {}
        for tc in self.config.tables:
            offsets, why = self.open_table(tc)
            if why is not None:
                refused[tc.name] = why
            else:
                stored[tc.name] = offsets
        return stored, refused

    def open_table(self, tc: TableConfig) -> tuple[dict[int, int], str | None]:
        """Open one table's store, at start or when a reload adds it (``TableSet.add``): (its stored
        offsets, None), or ({}, why) when the disk refused it (left closed for ``recover_stores``)."""
        store = TableStore(self.config.state_dir, tc.name, tc.topic, self.options, tc.typed, tc.history)
        rt = TableRuntime(config=tc, store=store, machine=StateMachine(self._notify, table=tc.name))
        self.tables.register(rt)
        try:
            opened = store.open_or_wipe()
        except StoreUnavailableError as e:
            log.warning("table %s: cannot open the store (%s); retrying with backoff", tc.name, e)
            return {}, str(e)
        if opened.wiped_reason:
            self._count_wipe(rt, "corrupt_store", opened.wiped_reason)
        offsets = store.offsets()
        if not offsets and rt.emptied is None:
            rt.emptied = EMPTY_STORE  # a refill source may fill it (engine.refill)
        return offsets, None

    # -- planning -----------------------------------------------------------------------------------------------

    def plan(self, rt: TableRuntime, facts: PlanFacts, refill: bool = False) -> Plan | None:
        """The assignment that restores ``rt``, from what the cluster said of its topic (``facts``, asked off the
        loop thread: ``TopicIdentity.ask_plan``); wipes it first when its stored offsets are invalid or its topic
        is another one, and then, with ``refill``, stops there (None: the loop refills the emptied store first,
        ``engine.refill``, and plans it again). A restoring table with at least BULK_LOAD_MIN_RECORDS to read is
        bulk-loaded. Raises TransientKafkaError when the check could not be made (asked again later)."""
        parts, marks = facts.partitions, facts.marks
        stored = rt.store.offsets()
        changed = self.identity.changed_id(rt, facts.topic_id) if stored else None
        if changed:  # said before the offsets, which a new topic can only make look invalid
            self.rebuild_recreated(rt, changed)
            stored = {}
        invalid = invalid_offsets(stored, marks)
        if invalid:
            detail = "; ".join(invalid)
            rt.machine.to(State.RESTORING, f"invalid offset, rebuilding: {detail}")  # even a RUNNING table
            self.wipe(rt, "invalid_offset", detail)
            stored = {}
        if rt.config.versioned and self._history_planned(rt, facts.compaction_lag_ms):
            stored = {}
        if refill and rt.emptied:
            return None
        ladders = rt.store.fingerprints() if stored else {}
        if stored:
            if facts.verdict is None:  # asked about another store than this one: ask again
                raise TransientKafkaError(f"table {rt.name}: the store changed while its topic was checked")
            recreated = self.identity.judge(rt, facts.verdict, {p: f for p, f in ladders.items() if p in marks})
            if recreated:
                self.rebuild_recreated(rt, recreated)
                if refill:
                    return None
                stored, ladders = {}, {}
        if facts.topic_id is not None:
            rt.store.record_topic_id(facts.topic_id)
        start = {p: stored.get(p, low) for p, (low, _) in marks.items()}
        rt.emptied = None  # planned from the topic: nothing to refill any more
        self._store_starts(rt, {p: o for p, o in start.items() if p not in stored})
        self.identity.planned(rt, ladders, start)  # checked above, or empty: the topic there now from its start
        rt.partitions = parts
        rt.end_offsets = {p: high for p, (_, high) in marks.items()}
        targets = {p: high for p, (_, high) in marks.items() if start[p] < high}
        self._begin_restore(rt, start, targets)
        if rt.machine.state == State.RESTORING and \
                sum(end - start[p] for p, end in targets.items()) >= BULK_LOAD_MIN_RECORDS:
            # Only a restoring table: a RUNNING one catching up (after a disk fault) must stay durable by commits.
            rt.store.begin_bulk_load()
        return Plan([TopicPartition(rt.topic, p, start[p]) for p in parts], start, ladders)

    def _history_planned(self, rt: TableRuntime, lag_ms: int | None) -> bool:
        """Take the topic's ``min.compaction.lag.ms`` (a pending since is set from it), and wipe a store that held
        data before history was declared, so that its replay proves a since (returns True then): no operator step,
        at start or when a reload adds ``history``."""
        store = rt.store
        store.compaction_lag_ms = lag_ms
        if not store.history_unproven:
            return False
        detail = "its store held data before history was declared: replaying the topic to prove its since"
        rt.machine.to(State.RESTORING, f"history added, rebuilding: {detail}")
        self.wipe(rt, HISTORY_ADDED, detail)
        lag = "unknown, taken as 0" if lag_ms is None else f"{lag_ms} ms"
        log.info("table %s: its history starts with this replay: since = the replay's start - the topic's "
                 "min.compaction.lag.ms (%s)", rt.name, lag)
        return True

    def add_partitions(self, rt: TableRuntime, marks: Mapping[int, tuple[int, int]]) -> Plan:
        """Partitions added to the topic while ``rt`` is assigned: each starts at its log start, stored at once."""
        start = {p: low for p, (low, _) in marks.items()}
        self._store_starts(rt, start)
        self.identity.added(rt, start)
        rt.partitions = sorted(set(rt.partitions) | set(start))
        rt.end_offsets.update({p: high for p, (_, high) in marks.items()})
        targets = {p: high for p, (low, high) in marks.items() if low < high}
        if targets:
            self._begin_restore(rt, start, targets)
        return Plan([TopicPartition(rt.topic, p, o) for p, o in start.items()], start, {})

    def _begin_restore(self, rt: TableRuntime, start: dict[int, int], targets: dict[int, int]) -> None:
        if rt.restore is None:
            rt.restore = Restore(dict(targets))
        else:  # a re-plan (or added partitions) during a restore: its clock keeps running
            rt.restore.targets.update(targets)
        rt.restore.restored.update({p: 0 for p in targets})
        for p, end in targets.items():
            log.info("table %s: restoring partition %d from %d to %d", rt.name, p, start[p], end)
            self._emit(RestoreStarted(rt.name, p, start[p], end))

    def restore_progress(self, rt: TableRuntime, positions: Mapping[int, int], counts: Mapping[int, int],
                         durable: Callable[[float], None]) -> None:
        """Account one poll to ``rt``'s restore (``counts``: records applied per partition; ``positions``: where
        the update task now stands): a partition that reached its target has ended (RestoreEnded). Once every one
        has and the table is assigned, a RESTORING table ends its restore through a verified commit
        (``finish_restore``), ``durable`` hears how long the restore took, and the table goes RUNNING; a RUNNING
        table that caught up after a disk fault is left to the commits. Raises StoreIOError, and the table stays
        RESTORING, unless the restore is durable."""
        restore = rt.restore
        assert restore is not None
        restore.applied(dict(counts))
        for p, n in counts.items():
            if p in restore.targets and n:
                self._emit(BatchRestored(rt.name, p, positions[p], n))
        for p in [p for p, end in restore.targets.items() if positions.get(p, -1) >= end]:
            del restore.targets[p]
            total = restore.restored.get(p, 0)
            log.info("table %s: partition %d restored (%d records)", rt.name, p, total)
            self._emit(RestoreEnded(rt.name, p, total))
        if restore.targets or not rt.assigned:
            return
        if rt.machine.state != State.RESTORING:  # a RUNNING table caught up after a disk fault: commits cover it
            rt.restore = None
            return
        self.finish_restore(rt, positions)
        # Before RUNNING is announced: what the caller learns from a durable commit is known to every subscriber.
        durable(time.monotonic() - restore.started)
        rt.machine.to(State.RUNNING, "restored to the log end")

    def restoring(self, rt: TableRuntime, why: str) -> None:
        """``rt`` is to be restored (the loop is starting, or a rebuild is about to wipe it): RESTORING, and why."""
        rt.machine.to(State.RESTORING, why)

    def restore_added(self, rt: TableRuntime, why: str) -> None:
        """A RUNNING table with partitions left to restore (added to its topic) is RESTORING again until they are."""
        if rt.restore is not None and rt.restore.targets and rt.machine.state == State.RUNNING:
            rt.machine.to(State.RESTORING, why)

    def ends_confirmed(self, rt: TableRuntime, ends: Mapping[int, int]) -> None:
        """The broker confirmed log ends past those ``rt`` knew (transaction markers): they are its ends now."""
        for p, end in ends.items():
            rt.end_offsets[p] = max(rt.end_offsets.get(p, -1), end)

    def _store_starts(self, rt: TableRuntime, starts: dict[int, int]) -> None:
        """Store the first offset of partitions the store holds nothing of: with no record below it that the log
        still has, the empty partition is the fold there, and the store's offsets then cover every partition."""
        if starts:
            rt.store.write_offsets(starts)

    # -- the topic's identity (engine.identity owns it) ---------------------------------------------------------

    def rebuild_recreated(self, rt: TableRuntime, why: str) -> None:
        """Wipe ``rt``, whose topic was found to be another one of the same name; the caller restores it."""
        detail = f"topic {rt.topic} is not the one the store mirrors: {why}"
        rt.machine.to(State.RESTORING, f"topic recreated, rebuilding: {detail}")
        self.wipe(rt, TOPIC_RECREATED, detail)

    # -- wipes and recovery -------------------------------------------------------------------------------------

    def wipe(self, rt: TableRuntime, kind: str, detail: str) -> None:
        """Delete the table's data and offsets; the caller restores it from the log start.

        Raises StoreIOError when the emptied store cannot be opened again (a full disk): it is then closed, holds
        nothing, and ``recover_stores`` opens it once the disk heals."""
        self._count_wipe(rt, kind, detail)
        rt.restore = Restore({})  # the rebuild's clock starts now
        rt.store.wipe()

    def _count_wipe(self, rt: TableRuntime, kind: str, detail: str) -> None:
        self.wipes[(rt.name, kind)] += 1
        rt.emptied = kind
        log.warning("table %s: WIPE (%s): %s", rt.name, kind, detail)
        shown = self.identity.forget(rt.name)  # nothing of an emptied store is shown until its next plan
        # Another topic under the name: what was applied past the offsets last shown, and every snapshot taken
        # past them, may hold records of both. Empty when this run showed nothing (found by its first plan).
        self._emit(Wiped(rt.name, kind, detail, shown if kind == TOPIC_RECREATED else None))

    def recover_stores(self) -> dict[str, dict[int, int]]:
        """After a failed write or commit: (re)open every store that refuses writes, wipe one found corrupt.
        Returns the stored offsets of each store it reopened or wiped.

        Raises while the disk still refuses (the caller retries later); healthy stores are left untouched.
        """
        recovered: dict[str, dict[int, int]] = {}
        for rt in self.tables.values():
            error = rt.store.write_error()
            if error is None:
                continue
            if isinstance(error, StoreCorruptError):
                self.wipe(rt, "corrupt_store", str(error))
            else:
                log.warning("table %s: store refuses writes (%s); reopening it", rt.name, error)
                try:
                    rt.store.reopen()
                except StoreCorruptError as e:
                    self.wipe(rt, "corrupt_store", str(e))
            recovered[rt.name] = rt.store.offsets()
        self._suspect = False
        return recovered

    # -- durability ---------------------------------------------------------------------------------------------

    def bulk_loading(self, table: str) -> bool:
        """``table`` is in a bulk load: nothing of it is durable before ``finish_restore``, so neither a write nor
        an empty commit of it proves the disk."""
        return self.tables[table].store.bulk

    def commit(self, positions: Mapping[str, Mapping[int, int]]) -> None:
        """Make each table in ``positions`` (as the update task applied them) durable, then write its .checkpoint
        file. A table in a bulk load is left out: nothing of it is durable before ``finish_restore``."""
        for name, applied in positions.items():
            rt = self.tables[name]
            if rt.store.is_open and not rt.store.bulk:
                self._commit_table(rt, applied)

    def _commit_table(self, rt: TableRuntime, applied: Mapping[int, int]) -> None:
        started = time.monotonic()
        durable = rt.store.sync()
        if durable != applied:
            # Something the loop applied is not in the store: claiming it would skip those records for good.
            raise StoreIOError(f"table {rt.name}: durable offsets {durable} are not the applied ones {dict(applied)}")
        rt.store.write_checkpoint_file(durable)
        self._emit(Committed(rt.name, durable, time.monotonic() - started))

    def finish_restore(self, rt: TableRuntime, applied: Mapping[int, int]) -> None:
        """End ``rt``'s restore: make it durable (the bulk load's flush, then a commit that checks the durable offsets
        are the ones restored to) and mark the store complete. Raises StoreIOError, claiming nothing, otherwise."""
        if rt.store.bulk:
            rt.store.end_bulk_load()
        self._commit_table(rt, applied)
        rt.store.mark_complete()
        rt.restore = None

    # -- the read interface (engine.view.EngineView) ----------------------------------------------------------

    def table_views(self) -> list[TableView]:
        return [rt.view() for rt in self.tables.values()]

    def table_view(self, table: str) -> TableView | None:
        rt = self.tables.get(table)
        return None if rt is None else rt.view()

    def history_status(self, table: str) -> dict[str, Any] | None:
        rt = self.tables.get(table)
        if rt is None or not rt.store.is_open:
            return None
        try:
            return rt.store.history_status()
        except Exception as e:  # a store being reopened: the next status has it
            log.debug("history status of %s: %s", table, e)
            return None

    def live_offsets(self, table: str) -> dict[int, int]:
        return self.tables[table].store.offsets()

    def checkpoint(self, table: str, dest: Path) -> Checkpointed:
        store = self.tables[table].store
        records = store.estimate_keys()
        store.checkpoint(dest)
        with StoreReader(dest) as copy:  # the offsets the copy holds, never those it is believed to hold
            return Checkpointed(copy.offsets(), records)

    def wipe_counts(self) -> dict[tuple[str, str], int]:
        return dict(self.wipes)

    def memory_usage(self) -> dict[str, dict[str, int] | None]:
        return {name: rt.store.memory_usage() for name, rt in self.tables.items()}

    def close(self, clean: bool, stopping: bool = False) -> None:
        """``stopping``: the daemon's stop, after the final commit (``TableStore.close``)."""
        for rt in self.tables.values():
            try:
                rt.store.close(clean=clean, stopping=stopping)
            except StoreUnavailableError as e:  # the store stays at its last durable commit
                log.warning("table %s: close failed: %s", rt.name, e)
