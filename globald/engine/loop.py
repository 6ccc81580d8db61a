"""One run of the engine's loop: poll, then ``UpdateTask.update``, then maybe commit; between polls, the services.

What the loop keeps: a turn never blocks in librdkafka (non-blocking polls, waits on the monotonic clock), so it
turns at least every ``poll_timeout_ms`` whatever the wall clock does; a store or disk fault in any phase rewinds
every table to its stored offsets instead of ending the loop; a table goes RUNNING only through the state manager's
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
from globald.engine.events import OPERATOR_RESET, Emit, RebuildRequests
from globald.engine.problems import KAFKA, STORE, Problems
from globald.engine.state_manager import TOPIC_RECREATED, StateManager, union
from globald.engine.table import TableRuntime
from globald.engine.update_task import PollResult, UpdateTask
from globald.engine.view import LoopStats
from globald.kafka.clients import TopicUnavailableError, TransientKafkaError, partitions, watermarks
from globald.kafka.identity import next_timeout
from globald.settings.config import Config
from globald.store.failures import STORE_FAULTS

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 1.0
_REFRESH_TIMEOUT_S = 2.0
# After this long without an answer from the cluster, the consumer is replaced (see Loop._renew_consumer).
_RENEW_CONSUMER_AFTER_S = 30.0
# librdkafka times a blocking poll on the wall clock (librdkafka#2145): stepped back, an idle poll sleeps through
# the step. The loop polls without blocking and waits between polls on the monotonic clock, at most this long.
_IDLE_WAIT_MAX_S = 0.05
_IDLE_WAIT_MIN_S = 0.001
# How often the broker is asked to confirm ends of partition past the known ends (transactions committed while
# tailing); only while there are some, which topics without transactions never have.
_END_CHECK_INTERVAL_S = 1.0
# How often the cluster is listed while a table's topic is missing from it, to rebuild soon after it comes back.
_VANISHED_REFRESH_S = 1.0


class LoopService(Protocol):
    """Work that must run on the loop thread between two polls (snapshot publishing, operator requests...)."""

    def tick(self) -> None: ...


@dataclass(frozen=True)
class LoopParts:
    """What a loop drives, built once by the global thread."""

    config: Config
    manager: StateManager
    problems: Problems
    stats: LoopStats
    services: Sequence[LoopService]
    emit: Emit
    rebuilds: RebuildRequests
    machine: StateMachine  # the daemon's
    stop: threading.Event


class Loop:
    """One run of the loop: the consumer and the update task exist for exactly as long as it does."""

    def __init__(self, parts: LoopParts, new_consumer: Callable[[], Consumer],
                 stored: dict[str, dict[int, int]]) -> None:
        self.config = parts.config
        self.manager = parts.manager
        self.problems = parts.problems
        self.stats = parts.stats
        self.services = parts.services
        self.emit = parts.emit
        self.rebuilds = parts.rebuilds
        self.machine = parts.machine
        self.stop = parts.stop
        self._new_consumer = new_consumer
        self.consumer = new_consumer()
        self._renewed_at = 0.0
        self.task = UpdateTask(self.manager.tables)
        for name, offsets in stored.items():
            self.task.start(name, offsets)
        self.pending: set[str] = set(self.manager.tables)  # tables to (re)plan and assign
        self.probe_now = False
        self._idle_wait = _IDLE_WAIT_MIN_S
        self._next_commit = time.monotonic() + self.config.commit_interval_ms / 1000
        self._next_metadata = time.monotonic() + self.config.metadata_refresh_ms / 1000
        # Per table: doubled by each of its identity checks left unanswered, back to the base once one is answered.
        # One bound for all would be reset by the next table's answer, and a slow table's check never get longer.
        self._check_timeout_s: dict[str, float] = {}
        self._next_end_check = 0.0
        for rt in self.manager.tables.values():
            self.manager.restoring(rt, "starting")

    # -- one turn: poll, then update, then maybe commit ---------------------------------------------------------

    def turn(self) -> None:
        self.stats.last_loop = time.monotonic()
        try:
            self._turn()
        except STORE_FAULTS as e:  # in any phase: planning, a write, the end of a restore, a commit
            self.rewind_all(str(e))
        for service in self.services:
            try:
                service.tick()
            except Exception as e:  # a bug in one service must not stop the mirror; it is logged and counted
                self.stats.service_failures += 1
                swallowed.record(f"loop_service:{type(service).__name__}", e, log, "%s failed; ignored",
                                 type(service).__name__)
        self._update_daemon_state()

    def _turn(self) -> None:
        for request in self.rebuilds.take():  # an operator's reset: its asker is answered once the wipe ran
            try:
                request.settle(self.rebuild(request.table, OPERATOR_RESET, request.detail))
            except BaseException as e:
                request.settle(f"{type(e).__name__}: {e}")
                raise
        if self.probe_now or (self.problems.has(KAFKA) and self.problems.due(KAFKA)):
            self._probe_kafka()
        if not self.problems.has(KAFKA) and self._stores_ready():  # no point planning what cannot be fetched
            self._plan_pending()
        result = self._poll()
        if result is not None:
            self._account(result)
        now = time.monotonic()
        if now >= self._next_end_check and any(self.task.unconfirmed_ends.values()):
            self._next_end_check = now + _END_CHECK_INTERVAL_S
            self._confirm_ends()
        if now >= self._next_metadata:
            self._next_metadata = now + self.config.metadata_refresh_ms / 1000
            self._refresh_metadata()
        if now >= self._next_commit and not self.manager.store_fault:  # a failed commit would only push recovery back
            self._next_commit = now + self.config.commit_interval_ms / 1000
            self._commit()

    def _poll(self) -> PollResult | None:
        """One consume and its store writes; None when the writes failed (nothing of the poll is lost)."""
        # A poll allocates thousands of Message objects, which the cyclic GC would otherwise traverse over and
        # over while they are alive (a tenth of a restore's time). They form no cycles: pausing the GC for the
        # poll defers nothing, since they are freed before it resumes.
        paused = gc.isenabled()
        gc.disable()
        try:
            first = self._poll_one()
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
        """The first message within ``poll_timeout_ms``, or None; returns at once on ``stop()``.

        Never a blocking librdkafka poll (see _IDLE_WAIT_MAX_S): non-blocking polls, with waits on the monotonic
        clock between them that grow while the queue stays empty, so a restore's queue refilling costs little."""
        deadline = time.monotonic() + self.config.poll_timeout_ms / 1000
        while True:
            first = self.consumer.poll(0)
            if first is not None:
                self._idle_wait = _IDLE_WAIT_MIN_S
                return first
            left = deadline - time.monotonic()
            if left <= 0 or self.stop.is_set():
                return None
            self.stop.wait(min(self._idle_wait, left))
            self._idle_wait = min(self._idle_wait * 2, _IDLE_WAIT_MAX_S)

    def _account(self, result: PollResult) -> None:
        if result.records:  # records arrived and were written: the cluster works
            self.problems.resolved(KAFKA)
            if any(tb.positions and not self.manager.tables[n].store.bulk for n, tb in result.tables.items()):
                self._disk_proven()  # a write through the WAL
        if result.errors:
            self.stats.consumer_errors += len(result.errors)
            log.warning("consumer: %s", "; ".join(sorted(set(result.errors))[:5]))
        for name, tb in result.tables.items():
            rt = self.manager.tables[name]
            if tb.invalid_offset is not None:  # KIP-406: the broker no longer has our offset
                self.rebuild(name, "invalid_offset", tb.invalid_offset)
                continue
            if tb.positions:
                self.stats.last_progress = time.monotonic()
            if rt.restore is not None:
                self._restore_progress(rt, tb.counts)

    def _commit(self) -> None:
        try:
            self.manager.commit({name: self.task.positions(name) for name in sorted(self.task.dirty)})
        except STORE_FAULTS as e:
            self.rewind_all(f"commit failed: {e}")
            return
        committed = [name for name in self.task.dirty if not self.manager.tables[name].store.bulk]
        for name in committed:
            self.task.committed(name)
        if committed or not any(rt.store.bulk for rt in self.manager.tables.values()):
            self._disk_proven()

    def _disk_proven(self) -> None:
        """A durable write went through: the store problem is over, and its backoff starts again from the shortest
        delay. Not on a bulk load's writes, which reach only memtables: the disk's word on them comes when the
        load ends. Taking them as proof reset the backoff at every attempt, and a disk that stayed full had the
        restore redone from its stored offsets every second or two, for as long as it stayed full."""
        self.problems.resolved(STORE)

    # -- restores -----------------------------------------------------------------------------------------------

    def _plan_pending(self) -> None:
        for name in sorted(self.pending):
            if not self.problems.due(name):
                continue
            rt = self.manager.tables[name]
            try:
                plan = self.manager.plan(self.consumer, rt)
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
            self._restore_progress(rt, {})

    def _restore_progress(self, rt: TableRuntime, counts: dict[int, int]) -> None:
        def durable(seconds: float) -> None:  # the restore's end was committed: positions and disk are proven
            self.task.committed(rt.name)
            self._disk_proven()
            self.stats.recoveries.append(seconds)

        self.manager.restore_progress(rt, self.task.positions(rt.name), counts, durable)

    def rebuild(self, table: str, kind: str, detail: str) -> str | None:
        """Wipe ``table`` (counted under ``kind``) and restore it from the log start. Returns None once the store
        is wiped, else why the wipe failed (the stores then rewind, as after any store fault)."""
        rt = self.manager.tables[table]
        self._unassign(rt)
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

    def _unassign(self, rt: TableRuntime) -> None:
        if rt.vanished:  # librdkafka keeps a pause across an unassign: the next assignment would never fetch
            self.consumer.resume(rt.assignment())
            rt.vanished = False
        if rt.assigned:
            self.consumer.incremental_unassign(rt.assignment())
            rt.assigned = False

    # -- faults -------------------------------------------------------------------------------------------------

    def rewind_all(self, reason: str) -> None:
        """Forget the consumer's positions and re-plan every table from what its store holds, once the stores
        take writes again (nothing of a failed write was acknowledged, so nothing is lost)."""
        self.manager.suspect()
        delay = self.problems.failed(STORE, reason, quiet=True)
        log.error("degraded: %s; re-reading from the stored offsets in %.1fs", reason, delay)
        for rt in self.manager.tables.values():
            self._unassign(rt)
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

    def _probe_kafka(self) -> None:
        self.probe_now = False
        try:  # a question about the cluster, not a topic: one of ours may be missing while the brokers are fine
            up = bool(self.consumer.list_topics(timeout=_PROBE_TIMEOUT_S).brokers)
        except KafkaException:
            up = False
        if up:
            self.problems.resolved(KAFKA)
            return
        self.problems.failed(KAFKA, f"kafka unreachable: no broker answered within {_PROBE_TIMEOUT_S:.0f}s")
        now, silent = time.monotonic(), self.problems.lasted(KAFKA)  # since the cluster's problem started
        if min(silent, now - self._renewed_at) >= _RENEW_CONSUMER_AFTER_S:
            self._renew_consumer(now, silent)

    def _renew_consumer(self, now: float, silent: float) -> None:
        """Replace a consumer that has heard nothing from the cluster for a long while, and re-plan every table from
        what its store holds (nothing fetched is lost: positions are the stores'). Seen in an accelerated soak: after
        a broker was SIGKILLed and restarted, the consumer stayed silent for 9 minutes while a new client was
        answered at once. Against a cluster really down a new consumer costs nothing, and at most once a period."""
        self._renewed_at = now
        log.warning("kafka: no answer for %.0fs; replacing the consumer and re-planning every table", silent)
        for rt in self.manager.tables.values():
            rt.assigned = rt.vanished = False  # a new consumer has neither assignment nor pauses
            self.pending.add(rt.name)
        old, self.consumer = self.consumer, self._new_consumer()
        self.stats.consumer_renewals += 1
        try:
            old.close()
        except (KafkaException, RuntimeError) as e:
            log.warning("closing the replaced consumer: %s", e)

    def _refresh_metadata(self) -> None:
        """Pick up partitions added to a topic; check that each topic is still the one its table mirrors."""
        if self.problems.has(KAFKA):
            return
        for rt in self.manager.tables.values():
            if not rt.assigned:
                continue
            try:  # short timeouts: a connected broker answers in milliseconds, and the loop waits meanwhile
                listed = partitions(self.consumer, rt.topic, timeout=_REFRESH_TIMEOUT_S)
                added = [p for p in listed if p not in rt.partitions]
                marks = {p: watermarks(self.consumer, rt.topic, p, timeout=_REFRESH_TIMEOUT_S) for p in added}
            except TopicUnavailableError as e:  # deleted, or not yet recreated: keep serving, keep waiting
                rt.last_error = str(e)
                self.problems.report(rt.name, f"table {rt.name}: {e}; waiting for it")
                self._vanished(rt)
                continue
            except TransientKafkaError as e:  # the cluster did not answer: the other tables would not get one
                self.problems.report(KAFKA, f"kafka: metadata refresh failed: {e}")
                return
            self.problems.resolved(KAFKA)
            lost = [p for p in rt.partitions if p not in listed]
            if lost:  # a topic never loses partitions: this one was recreated with fewer
                self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} has no partitions {lost} any more")
                continue
            same = self._same_topic(rt)
            if same is False:
                continue
            if same and self.problems.has(rt.name):
                rt.last_error = None
                self.problems.resolved(rt.name)
            if not added:
                continue
            log.info("table %s: partitions %s added to %s", rt.name, added, rt.topic)
            plan = self.manager.add_partitions(rt, marks)
            self.task.start(rt.name, {**self.task.positions(rt.name), **plan.starts})
            self.consumer.incremental_assign(plan.assignment)
            self.manager.restore_added(rt, f"partitions {added} added")

    def _vanished(self, rt: TableRuntime) -> None:
        """``rt``'s topic left the cluster's listing: fetch nothing more of it until the topic that comes back under
        its name is shown to be the same (``_same_topic``), and look again soon."""
        if not rt.vanished:
            rt.vanished = True
            self.consumer.pause(rt.assignment())
            log.warning("table %s: topic %s is gone from the cluster; serving what the store holds, fetching nothing "
                        "until a topic of that name is back and found to be the same one", rt.name, rt.topic)
        self._next_metadata = min(self._next_metadata, time.monotonic() + _VANISHED_REFRESH_S)

    def _same_topic(self, rt: TableRuntime) -> bool | None:
        """Read the topic back at the fingerprints last verified, then at those applied since (kafka.identity).
        Another topic under the same name is rebuilt (False). So is one that came back after it vanished when no
        fingerprint could be compared: the daemon saw it go, and cannot show it is the same. None: undecided (the
        table's problem until a later check answers; the cluster itself answered, so it is not Kafka's)."""
        changed = self.manager.changed_id(rt)
        if changed:
            self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} is not the one the store mirrors: {changed}")
            return False
        applied = self.task.ladders(rt.name)
        rungs = {p: union(rt.verified.get(p), applied.get(p)) for p in rt.partitions}
        rungs = {p: r for p, r in rungs.items() if r}
        timeout = self._check_timeout_s.get(rt.name, _REFRESH_TIMEOUT_S)
        verdict = self.manager.verify(rt, rungs, timeout)  # the loop waits meanwhile: keep it short
        self._check_timeout_s[rt.name] = next_timeout(timeout, _REFRESH_TIMEOUT_S, bool(verdict.unreachable))
        log.debug("table %s: identity check of %s: %s", rt.name, {p: [f.offset for f in r] for p, r in rungs.items()},
                  verdict)
        if verdict.recreated:  # conclusive, whatever the partitions that did not answer would have said
            self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} is not the one the store mirrors: "
                         f"{verdict.describe()}")
            return False
        if verdict.unreachable:  # decided at a later refresh; a vanished topic stays paused meanwhile
            self.problems.report(rt.name, f"table {rt.name}: cannot read {rt.topic} back to check it is the topic "
                                 f"the table mirrors: {'; '.join(sorted(set(verdict.unreachable.values())))}")
            if rt.vanished:
                self._next_metadata = min(self._next_metadata, time.monotonic() + _VANISHED_REFRESH_S)
            return None
        if rt.vanished and verdict.unverifiable:
            self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} vanished and came back, and it cannot be "
                         f"shown to be the same: {'; '.join(sorted(set(verdict.unverifiable.values())))}")
            return False
        self.manager.checked(rt, applied, verdict)
        if rt.vanished:
            rt.vanished = False
            self.consumer.resume(rt.assignment())
            log.info("table %s: topic %s is back and holds the records the store applied; fetching again",
                     rt.name, rt.topic)
        return True

    def _confirm_ends(self) -> None:
        """Ask the broker for the end of each partition whose end of partition lay past the known ends. With
        read_committed (managed) its answer is the last stable offset, as the end of partition was."""
        if self.problems.has(KAFKA):
            return
        for name, pending in self.task.unconfirmed_ends.items():
            rt = self.manager.tables[name]
            if not pending or not rt.assigned:
                continue
            try:
                ends = {p: watermarks(self.consumer, rt.topic, p, timeout=_REFRESH_TIMEOUT_S)[1] for p in pending}
            except TransientKafkaError:
                continue  # asked again at the next check
            self.manager.ends_confirmed(rt, ends)
            moved = self.task.confirm_ends(name, ends)
            if moved:
                log.debug("table %s: ends of partition %s confirmed by the broker", name, moved)

    def _update_daemon_state(self) -> None:
        restoring = [rt.name for rt in self.manager.tables.values() if rt.machine.state != State.RUNNING]
        if restoring:
            self.machine.to(State.RESTORING, f"restoring {', '.join(restoring)}")
        else:
            self.machine.to(State.RUNNING, "every table restored")
