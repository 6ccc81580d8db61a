"""One run of the engine's loop: poll, then ``UpdateTask.update``, then maybe commit; between polls, the services.

What the loop keeps: a turn never blocks in librdkafka (non-blocking polls, waits on the monotonic clock; every
question to the cluster and every client close runs on the cluster worker's thread, ``kafka.worker``), so it turns
at least every ``poll_timeout_ms`` whatever the wall clock does; a store or disk fault in any phase rewinds every
table to its stored offsets instead of ending the loop; a table goes RUNNING only through the state manager's
verified commit. The consumer and the update task exist for exactly as long as the loop does.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, Message

from globald.common import swallowed
from globald.common.states import State, StateMachine
from globald.common.waits import Deadline
from globald.engine.cluster_watch import (
    ClusterWatch,
    Decision,
    EndsConfirmed,
    LoopFacts,
    PartitionsAdded,
    Pause,
    Rebuild,
    Renew,
    Resume,
)
from globald.engine.events import OPERATOR_RESET, Emit, RebuildRequests
from globald.engine.identity import TopicIdentity
from globald.engine.problems import KAFKA, STORE, Problems
from globald.engine.reading import ReadingMarks
from globald.engine.refill import Refiller, Refills
from globald.engine.state_manager import StateManager
from globald.engine.table import TableRuntime
from globald.engine.tables import Driver
from globald.engine.update_task import PollResult, UpdateTask
from globald.engine.view import LoopStats
from globald.kafka.clients import TransientKafkaError
from globald.kafka.worker import ClusterWorker
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.store.failures import STORE_FAULTS

log = logging.getLogger(__name__)

# librdkafka times a blocking poll on the wall clock (librdkafka#2145): stepped back, an idle poll sleeps through
# the step. The loop polls without blocking and waits between polls on the monotonic clock, at most this long.
_IDLE_WAIT_MAX_S = 0.05
_IDLE_WAIT_MIN_S = 0.001


class LoopService(Protocol):
    """Work that must run on the loop thread between two polls (snapshot publishing, operator requests...)."""

    def tick(self) -> None: ...


@dataclass(frozen=True)
class LoopParts:
    """What a loop drives, built once by the global thread."""

    config: ConfigRef  # the config in force, read at each use
    manager: StateManager
    worker: ClusterWorker  # every question to the cluster, and every client close
    identity: TopicIdentity  # the one the manager consults too
    problems: Problems
    stats: LoopStats
    services: Sequence[LoopService]
    emit: Emit
    rebuilds: RebuildRequests
    machine: StateMachine  # the daemon's
    stop: threading.Event
    refills: Refills | None = None  # where a store a wipe emptied may be refilled from ([export] bootstrap)


class Loop:
    """One run of the loop: the consumer and the update task exist for exactly as long as it does."""

    def __init__(self, parts: LoopParts, new_consumer: Callable[[], Consumer],
                 stored: dict[str, dict[int, int]]) -> None:
        self._config = parts.config
        self.manager, self.problems, self.stats = parts.manager, parts.problems, parts.stats
        self.services, self.emit, self.rebuilds = parts.services, parts.emit, parts.rebuilds
        self.machine, self.stop = parts.machine, parts.stop
        self._new_consumer = new_consumer
        self.consumer = new_consumer()
        self.tables = self.manager.tables  # the one set of tables (``engine.tables``): a reload changes it
        self.task = UpdateTask(self.tables)
        for name, offsets in stored.items():
            self.task.start(name, offsets)
        self.pending: set[str] = set(self.tables)  # tables to (re)plan and assign
        self.identity = parts.identity
        self.worker = parts.worker
        self.watch = ClusterWatch(self.tables, self.identity, self.worker, self.problems,
                                  self.config.metadata_refresh_ms / 1000)
        self.refill = Refiller(parts.refills, self.identity)
        self.reading = ReadingMarks()
        self.tables.drive(Driver(self.manager, self.task, self.identity, self.refill, self.problems, self.emit,
                                 self.pending, self.unassign, self.rewind_all))
        self._idle_wait = _IDLE_WAIT_MIN_S
        self._next_commit = time.monotonic() + self.config.commit_interval_ms / 1000
        for rt in self.tables.values():
            self.manager.restoring(rt, "starting")

    @property
    def config(self) -> Config:
        """The config in force (a reload's from the turn after it was applied)."""
        return self._config.now

    # -- one turn: poll, then update, then maybe commit ---------------------------------------------------------

    def turn(self) -> None:
        self.stats.last_loop = time.monotonic()
        self.worker.follow()  # a reload's [kafka]: new clients before anything is asked of them
        try:
            self._turn()
        except STORE_FAULTS as e:  # in any phase: planning, a write, the end of a restore, a commit
            self.rewind_all(str(e))
        stuck = self.worker.replace_stuck()
        if stuck:
            log.warning("cluster worker: %s; left behind, the next questions go to a new one", stuck)
        for service in self.services:
            try:
                service.tick()
            except Exception as e:  # a bug in one service must not stop the mirror; it is logged and counted
                swallowed.record(f"loop_service:{type(service).__name__}", e, log, "%s failed; ignored",
                                 type(service).__name__)
        self._update_daemon_state()

    def _turn(self) -> None:
        # Before any answer is taken: one that comes in from here on ends this turn's idle wait (``_poll_one``).
        self.worker.wake.clear()
        for request in self.rebuilds.take():  # an operator's reset: its asker is answered once the wipe ran
            try:
                request.settle(self.rebuild(request.table, OPERATOR_RESET, request.detail))
            except BaseException as e:
                request.settle(f"{type(e).__name__}: {e}")
                raise
        planned = False
        if not self.problems.has(KAFKA) and self._stores_ready():  # no point planning what cannot be fetched
            planned = self._plan_pending()
        # A table planned this turn may already be RUNNING (an empty or restored one): the daemon's state is told at
        # the end of this turn, not after an idle poll. Its first records are due within a fetch: the idle waits
        # start again from the shortest, not from the longest an idle wait for the plan's answer grew to.
        if planned:
            self._idle_wait = _IDLE_WAIT_MIN_S
        self.reading.turn(self.tables, self._reading)  # a gap moves since before a record past it is written
        result = self._poll(wait=not planned)
        if result is not None:
            self._account(result)
        names = self.tables
        facts = LoopFacts({n: self.task.ladders(n) for n in names}, {n: self.task.positions(n) for n in names},
                          self.task.unconfirmed_ends, self.stats.last_progress)
        for decision in self.watch.turn(facts):
            self._act(decision)
        now = time.monotonic()
        if now >= self._next_commit and not self.manager.store_fault:  # a failed commit would only push recovery back
            self._next_commit = now + self.config.commit_interval_ms / 1000
            self._commit()

    def _poll(self, wait: bool = True) -> PollResult | None:
        """One consume and its store writes (``wait``: for up to ``poll_timeout_ms`` while nothing came); None when
        the writes failed (nothing of the poll is lost)."""
        # A poll allocates thousands of Message objects, which the cyclic GC would otherwise traverse over and
        # over while they are alive (a tenth of a restore's time). They form no cycles: pausing the GC for the
        # poll defers nothing, since they are freed before it resumes.
        paused = gc.isenabled()
        gc.disable()
        try:
            first = self._poll_one() if wait else self.consumer.poll(0)
            messages = [] if first is None else [first]
            if first is not None and self.config.consume_batch_size > 1:
                messages += self.consumer.consume(self.config.consume_batch_size - 1, 0)
            try:
                return self.task.update(messages)
            except STORE_FAULTS as e:  # a store write failed (disk full, I/O error)
                self.rewind_all(f"store write failed: {e}")
                return None
        finally:
            if paused:
                gc.enable()

    def _poll_one(self) -> Message | None:
        """The first message within ``poll_timeout_ms``, or None; returns at once on ``stop()`` and when the cluster
        worker answered a question (a plan's answer is applied at the next turn, not after an idle poll).

        Never a blocking librdkafka poll (see _IDLE_WAIT_MAX_S): non-blocking polls, with waits on the monotonic
        clock between them that grow while the queue stays empty, so a restore's queue refilling costs little. The
        waits are on the worker's ``wake``, which ``stop()`` sets too; the stop flag is read after each one."""
        deadline = time.monotonic() + self.config.poll_timeout_ms / 1000
        while True:
            first = self.consumer.poll(0)
            if first is not None:
                self._idle_wait = _IDLE_WAIT_MIN_S
                return first
            left = deadline - time.monotonic()
            if left <= 0 or self.stop.is_set() or self.worker.wake.is_set():
                return None
            self.worker.wake.wait(min(self._idle_wait, left))
            self._idle_wait = min(self._idle_wait * 2, _IDLE_WAIT_MAX_S)

    def _account(self, result: PollResult) -> None:
        if result.records:  # records arrived and were written: the cluster works
            self.problems.resolved(KAFKA)
            if any(tb.positions and not self.manager.bulk_loading(n) for n, tb in result.tables.items()):
                self._disk_proven()  # a write through the WAL
        if result.errors:
            self.stats.consumer_errors += len(result.errors)
            log.warning("consumer: %s", "; ".join(sorted(set(result.errors))[:5]))
        for name, tb in result.tables.items():
            rt = self.tables[name]
            if tb.invalid_offset is not None:  # KIP-406: the broker no longer has our offset
                self.rebuild(name, "invalid_offset", tb.invalid_offset)
                continue
            if tb.positions:
                self.stats.last_progress = time.monotonic()
            if rt.restore is not None:
                self._restore_progress(rt, tb.counts)

    def _reading(self, rt: TableRuntime) -> bool:
        """Whether ``rt`` reads its topic at this turn (``engine.reading``)."""
        return rt.assigned and not self.identity.vanished(rt.name) and not self.problems.has(KAFKA) and \
            not self.manager.store_fault

    def committable(self) -> dict[str, dict[int, int]]:
        """The positions of the tables a commit may claim: not those waiting for their plan (its answer comes from
        the cluster worker at a later turn). Their positions are the last run's until the plan takes the store's
        own; after a write the disk refused, claiming them failed every commit, and every failure rewound the table
        and dropped the plan's answer before it came (a clean-clone run of test_disk_below_rule)."""
        return {name: self.task.positions(name) for name in sorted(self.task.dirty) if name not in self.pending}

    def _commit(self) -> None:
        positions = self.committable()
        try:
            self.manager.commit(positions)
        except STORE_FAULTS as e:
            self.rewind_all(f"commit failed: {e}")
            return
        committed = [name for name in positions if not self.manager.bulk_loading(name)]
        for name in committed:
            self.task.committed(name)
        # Nothing committed proves the disk only once every table is planned and none is in a bulk load: a table
        # waiting for its plan's answer is about to begin one, whose writes say nothing of the disk (see below).
        if committed or not (self.pending or any(map(self.manager.bulk_loading, self.tables))):
            self._disk_proven()

    def _disk_proven(self) -> None:
        """A durable write went through: the store problem is over, and its backoff starts again from the shortest
        delay. Not on a bulk load's writes, which reach only memtables: the disk's word on them comes when the
        load ends. Taking them as proof reset the backoff at every attempt, and a disk that stayed full had the
        restore redone from its stored offsets every second or two, for as long as it stayed full."""
        self.problems.resolved(STORE)

    # -- restores -----------------------------------------------------------------------------------------------

    def _plan_pending(self) -> bool:
        """Plan and assign every pending table whose plan's answer is in; True if any was."""
        planned = False
        for name in sorted(self.pending):
            if not self.problems.due(name):
                continue
            rt = self.tables[name]
            try:
                if self.refill.hold(rt):  # emptied by a wipe, and refilled from an export before it is planned
                    continue
                facts = self.identity.plan_answer(rt)  # asked of the cluster worker; None until it is in
                if facts is None:
                    continue
                plan = self.manager.plan(rt, facts, refill=self.refill.on)
                if plan is None:  # the plan wiped it: refilled first, planned again after
                    continue
                self.task.start(name, plan.starts, plan.ladders)
                self.consumer.incremental_assign(plan.assignment)
            except STORE_FAULTS:
                raise  # the disk, not the table: every table rewinds
            except (TransientKafkaError, KafkaException) as e:  # Kafka unreachable, topic missing
                rt.last_error = str(e)
                delay = self.problems.failed(name, f"table {name}: {e}")
                log.warning("table %s: cannot plan restore (%s); retrying in %.1fs", name, e, delay)
                continue
            rt.assigned = True
            rt.last_error = None
            self.problems.resolved(name)
            self.pending.discard(name)
            planned = True
            self._restore_progress(rt, {})
        return planned

    def _restore_progress(self, rt: TableRuntime, counts: dict[int, int]) -> None:
        def durable(seconds: float) -> None:  # the restore's end was committed: positions and disk are proven
            self.task.committed(rt.name)
            self._disk_proven()
            self.stats.recoveries.append(seconds)

        self.manager.restore_progress(rt, self.task.positions(rt.name), counts, durable)

    def rebuild(self, table: str, kind: str, detail: str) -> str | None:
        """Wipe ``table`` (counted under ``kind``) and restore it from the log start. Returns None once the store
        is wiped, else why the wipe failed (the stores then rewind, as after any store fault)."""
        rt = self.tables[table]
        self.refill.cancel(table)  # what a refill still out would install predates this wipe
        self.unassign(rt)
        # RESTORING before the wipe: status readers learn of the rebuild before the data goes.
        self.manager.restoring(rt, f"{kind.replace('_', ' ')}, rebuilding: {detail}")
        self.pending.add(table)
        self.problems.resolved(table)
        self.task.start(table, {}, {})
        self.task.committed(table)
        try:
            self.manager.wipe(rt, kind, detail)
        except STORE_FAULTS as e:  # the emptied store could not be reopened: recover_stores does, once it can
            self.rewind_all(f"table {table}: wipe: {e}")
            return f"{type(e).__name__}: {e}"
        return None

    def unassign(self, rt: TableRuntime) -> None:
        self.identity.cancel(rt.name)  # answers about the assignment or store as they were no longer apply
        if self.identity.back(rt.name):  # librdkafka keeps a pause across an unassign: the next assignment
            self.consumer.resume(rt.assignment())  # would never fetch
        if rt.assigned:
            self.consumer.incremental_unassign(rt.assignment())
            rt.assigned = False

    # -- what the cluster watch decided -------------------------------------------------------------------------

    def _act(self, decision: Decision) -> None:
        match decision:
            case Rebuild(table, kind, detail):
                self.rebuild(table, kind, detail)
            case Pause(table):
                self.consumer.pause(self.tables[table].assignment())
            case Resume(table):
                self.consumer.resume(self.tables[table].assignment())
            case PartitionsAdded(table, marks):
                rt = self.tables[table]
                plan = self.manager.add_partitions(rt, marks)
                self.task.start(table, {**self.task.positions(table), **plan.starts})
                self.consumer.incremental_assign(plan.assignment)
                self.manager.restore_added(rt, f"partitions {sorted(marks)} added")
            case EndsConfirmed(table, ends):
                self.manager.ends_confirmed(self.tables[table], ends)
                moved = self.task.confirm_ends(table, ends)
                if moved:
                    log.debug("table %s: ends of partition %s confirmed by the broker", table, moved)
            case Renew(silent):
                self._renew_consumer(silent)

    def _renew_consumer(self, silent: float) -> None:
        """Replace a consumer that has heard nothing from the cluster for a long while (``cluster_watch.Renew``),
        and re-plan every table from what its store holds (nothing fetched is lost: positions are the stores')."""
        log.warning("kafka: no answer for %.0fs; replacing the consumer and re-planning every table", silent)
        self.replace_consumer(self._new_consumer())
        # The cluster worker's clients too: its probe is what clears the cluster's problem while no record
        # arrives, and tables are planned only then, so a wedged probe client would hold every table for good.
        self.worker.renew()

    def replace_consumer(self, new: Consumer) -> None:
        """Take ``new`` as the consumer (a silent one renewed, or new [kafka] properties from a reload) and re-plan
        every table from what its store holds; the old consumer is closed on the cluster worker."""
        self.watch.renewed()
        for rt in self.tables.values():
            self.identity.cancel(rt.name)
            self.identity.back(rt.name)  # a new consumer has neither assignment nor pauses
            rt.assigned = False
            self.pending.add(rt.name)
        old, self.consumer = self.consumer, new
        self.stats.consumer_renewals += 1
        self.worker.retire(old)  # closed off the loop thread: a destroy can wait as long as a clock step

    def close(self, joins: Deadline) -> None:
        """The consumer goes to the cluster worker to be closed there, then the worker stops, waited for within
        what is left of ``joins`` (the stop's shared bound)."""
        for rt in self.tables.values():
            rt.assigned = False  # nothing is assigned once the consumer is closed: no more watermarks from it
        self.refill.close()
        self.worker.retire(self.consumer)
        if not self.worker.close(joins.left()):
            log.warning("a Kafka client did not close within the stop's bound (stuck in librdkafka); stopping "
                        "without it")

    # -- faults -------------------------------------------------------------------------------------------------

    def rewind_all(self, reason: str) -> None:
        """Forget the consumer's positions and re-plan every table from what its store holds, once the stores
        take writes again (nothing of a failed write was acknowledged, so nothing is lost)."""
        self.manager.suspect()
        delay = self.problems.failed(STORE, reason, quiet=True)
        log.error("degraded: %s; re-reading from the stored offsets in %.1fs", reason, delay)
        for rt in self.tables.values():
            self.unassign(rt)
            rt.last_error = reason
            self.pending.add(rt.name)

    def _stores_ready(self) -> bool:
        if not self.manager.store_fault:
            return True
        if not self.problems.due(STORE):
            return False
        try:
            recovered = self.manager.recover_stores()
        except STORE_FAULTS as e:  # still full, still failing: try again later
            delay = self.problems.failed(STORE, f"store unavailable: {e}", quiet=True)
            log.warning("stores still refuse writes (%s); next attempt in %.1fs", e, delay)
            return False
        for name, offsets in recovered.items():
            self.task.start(name, offsets)
            self.task.committed(name)
        return True

    def _update_daemon_state(self) -> None:
        restoring = [rt.name for rt in self.tables.values() if rt.machine.state != State.RUNNING]
        if restoring:
            self.machine.to(State.RESTORING, f"restoring {', '.join(restoring)}")
        else:
            self.machine.to(State.RUNNING, "every table restored")
