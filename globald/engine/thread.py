"""The global thread: one consumer, every partition of every table, restore then tail (GlobalStreamThread).

What callers can rely on: the daemon is RESTORING while any table is restoring and RUNNING once every table has
reached the log end captured when its restore began and that restore is durable in its store. Faults that may heal
(broker down, topic missing, a full or failing disk, in any phase) are retried with backoff in-process; invalid
offsets wipe and rebuild the table in-process. Only a bug ends the loop, in state ERROR. The loop turns at least
every ``poll_timeout_ms`` (and every 50 ms when idle) whatever the wall clock does, so a stop request is acted on
within one turn.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from globald.config import Config
from globald.engine.background_upgrade import BackgroundUpgrade
from globald.engine.state_manager import StateManager, TableRuntime
from globald.engine.update_task import PollResult, UpdateTask
from globald.errors import StoreCorruptError, StoreUnavailableError
from globald.kafka.clients import (
    TopicUnavailableError,
    TransientKafkaError,
    make_consumer,
    partitions,
    watermarks,
)
from globald.kafka.retry import Backoff
from globald.states import Listeners, State, StateMachine

log = logging.getLogger(__name__)

# A restore of at least this many records runs as a bulk load (WAL off, append-only memtable); smaller ones are
# not worth the two reopens of the store.
BULK_LOAD_MIN_RECORDS = 100_000
# Keys of GlobalThread._problems that are not a table's: the cluster, and the local disk.
KAFKA, STORE = "kafka", "store"
# librdkafka's client-wide error saying no broker can be reached. It also fires when the bootstrap connection
# is dropped for the brokers it announced ("0/2 brokers are down"), and nothing says when a broker is back, so
# it only makes the loop probe: a metadata request, bounded by this timeout, decides.
_CLUSTER_DOWN = KafkaError._ALL_BROKERS_DOWN
_PROBE_TIMEOUT_S = 1.0
_REFRESH_TIMEOUT_S = 2.0
# librdkafka times a blocking poll on the wall clock (librdkafka#2145): stepped back, an idle poll sleeps through
# the step. The loop polls without blocking and waits between polls on the monotonic clock, at most this long.
_IDLE_WAIT_MAX_S = 0.05
_IDLE_WAIT_MIN_S = 0.001
# Errors of the disk or of a store: the loop answers them by rewinding to the stored offsets, never by ending.
STORE_FAULTS = (StoreUnavailableError, StoreCorruptError, OSError)


class GlobalThread:
    def __init__(self, config: Config, listeners: Listeners | None = None,
                 consumer_factory: Callable[..., Consumer] = make_consumer) -> None:
        self.config = config
        self.listeners = listeners or Listeners()
        self.machine = StateMachine(self.listeners)
        self.manager = StateManager(config, self.listeners)
        self._consumer_factory = consumer_factory
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        self._pending: set[str] = set()
        self._backoff = Backoff()
        self.after_commit: list[Callable[[], None]] = []
        self.after_poll: list[Callable[[], None]] = [BackgroundUpgrade(self.manager.tables)]
        self.last_loop = time.monotonic()
        self.last_progress = time.monotonic()
        self.consumer_errors = 0
        # What is wrong right now, by source (KAFKA, STORE or a table name); each entry is cleared by the first
        # success of the thing that failed, so "degraded" always describes the present.
        self._problems: dict[str, str] = {}
        self._probe_now = False
        self._stores_suspect = False  # a write or commit failed: check (and reopen) the stores before re-planning
        self._idle_wait = _IDLE_WAIT_MIN_S
        self.recoveries: list[float] = []  # seconds from an invalid-offset error to RUNNING again

    # -- public -----------------------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def tables(self) -> dict[str, TableRuntime]:
        return self.manager.tables

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_stop(self, seconds: float) -> None:
        """Sleep ``seconds`` on the monotonic clock, or until ``stop()``."""
        self._stop.wait(seconds)

    @property
    def degraded(self) -> str | None:
        """What keeps the daemon from mirroring its topics right now, or None."""
        return "; ".join(self._problems[k] for k in sorted(self._problems)) or None

    def _problem(self, source: str, text: str) -> None:
        if source not in self._problems:
            log.warning("degraded: %s", text)
        self._problems[source] = text

    def _resolved(self, source: str) -> None:
        text = self._problems.pop(source, None)
        if text is not None:
            log.info("recovered: %s", text)

    def _on_kafka_error(self, err: KafkaError) -> None:
        """librdkafka's error callback, called from within consume() on the loop thread."""
        if err.code() == _CLUSTER_DOWN:
            self._probe_now = True

    def run(self) -> None:
        """Run until ``stop()``; commit and close on the way out. Raises only on a bug, after entering ERROR."""
        clean = False
        try:
            self._start()
            while not self._stop.is_set():
                self._tick()
            clean = True
        except BaseException as e:
            log.exception("global thread failed")
            if self.machine.state not in (State.ERROR, State.NOT_RUNNING):
                self.machine.to(State.ERROR, f"{type(e).__name__}: {e}")
            raise
        finally:
            self._shutdown(clean)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def _start(self) -> None:
        self.machine.to(State.RESTORING, "starting")
        refused = self.manager.open_all()
        if refused:
            self._rewind_all("; ".join(f"table {name}: {why}" for name, why in sorted(refused.items())))
        self._consumer = self._consumer_factory(self.config, on_error=self._on_kafka_error)
        for rt in self.tables.values():
            rt.machine.to(State.RESTORING, "starting")
            self._pending.add(rt.name)
        self._task = UpdateTask({rt.topic: rt for rt in self.tables.values()})
        self._next_commit = time.monotonic() + self.config.commit_interval_ms / 1000
        self._next_metadata = time.monotonic() + self.config.metadata_refresh_ms / 1000

    def _shutdown(self, clean: bool) -> None:
        if clean:
            self.machine.to(State.PENDING_SHUTDOWN, "stop requested")
            for rt in self.tables.values():
                rt.machine.to(State.PENDING_SHUTDOWN, "stop requested")
            try:
                self.manager.commit(force=True)
                self._after(self.after_commit)
            except STORE_FAULTS as e:
                log.warning("final commit failed (%s); the stores stay at their last durable commit", e)
                clean = False
        self.manager.close(clean=clean)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.exception("consumer close failed")
        if self.machine.state == State.PENDING_SHUTDOWN:
            for rt in self.tables.values():
                rt.machine.to(State.NOT_RUNNING, "stopped")
            self.machine.to(State.NOT_RUNNING, "stopped")

    # -- the loop -----------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        self.last_loop = time.monotonic()
        try:
            self._turn()
        except STORE_FAULTS as e:  # in any phase: planning, a write, the end of a restore, a commit
            self._rewind_all(str(e))

    def _turn(self) -> None:
        assert self._consumer is not None
        if self._probe_now or (KAFKA in self._problems and self._backoff.due(KAFKA)):
            self._probe_kafka()
        if KAFKA not in self._problems and self._stores_ready():  # no point planning what cannot be fetched/written
            self._plan_pending()
        result = self._poll()
        if result is None:
            return
        if result.records:  # records arrived and were written: both the cluster and the disk work
            self._resolved(KAFKA)
            self._store_healed()
        if result.errors:
            self.consumer_errors += len(result.errors)
            log.warning("consumer: %s", "; ".join(sorted(set(result.errors))[:5]))
        for name, tb in result.tables.items():
            rt = self.tables[name]
            if tb.invalid_offset is not None:
                self._recover(rt, tb.invalid_offset)
                continue
            if tb.positions:
                rt.positions.update(tb.positions)
                rt.dirty = True
                self.last_progress = time.monotonic()
            rt.null_keys += tb.null_keys
            rt.records += sum(tb.counts.values())
            if rt.ends:
                self._restore_progress(rt, tb.counts)
        now = time.monotonic()
        if now >= self._next_metadata:
            self._next_metadata = now + self.config.metadata_refresh_ms / 1000
            self._refresh_metadata()
        if now >= self._next_commit and not self._stores_suspect:  # a failed commit would only push recovery back
            self._next_commit = now + self.config.commit_interval_ms / 1000
            self._commit()
        self._after(self.after_poll)
        self._update_daemon_state()

    def _poll(self) -> PollResult | None:
        """One consume and its store writes; None when the writes failed (nothing of the poll is lost)."""
        assert self._consumer is not None
        # A poll allocates thousands of Message objects, which the cyclic GC would otherwise traverse over and
        # over while they are alive (a tenth of a restore's time). They form no cycles: pausing the GC for the
        # poll defers nothing, since they are freed before it resumes.
        paused = gc.isenabled()
        gc.disable()
        try:
            first = self._poll_one()
            messages = [] if first is None else [first]
            if first is not None and self.config.consume_batch_size > 1:
                messages += self._consumer.consume(self.config.consume_batch_size - 1, 0)
            try:
                return self._task.apply(messages)
            except STORE_FAULTS as e:  # a store write failed (disk full, I/O error)
                self._rewind_all(f"store write failed: {e}")
                return None
        finally:
            if paused:
                gc.enable()

    def _poll_one(self) -> Any:
        """The first message within ``poll_timeout_ms``, or None; returns at once on ``stop()``.

        Never a blocking librdkafka poll (see _IDLE_WAIT_MAX_S): non-blocking polls, with waits on the monotonic
        clock between them that grow while the queue stays empty, so a restore's queue refilling costs little."""
        assert self._consumer is not None
        deadline = time.monotonic() + self.config.poll_timeout_ms / 1000
        while True:
            first = self._consumer.poll(0)
            if first is not None:
                self._idle_wait = _IDLE_WAIT_MIN_S
                return first
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return None
            self._stop.wait(min(self._idle_wait, left))
            self._idle_wait = min(self._idle_wait * 2, _IDLE_WAIT_MAX_S)

    def _commit(self) -> None:
        try:
            committed = self.manager.commit()
        except STORE_FAULTS as e:
            self._rewind_all(f"commit failed: {e}")
            return
        if committed:
            self._store_healed()
            self._after(self.after_commit)

    def _probe_kafka(self) -> None:
        assert self._consumer is not None
        self._probe_now = False
        try:  # a question about the cluster, not a topic: one of ours may be missing while the brokers are fine
            up = bool(self._consumer.list_topics(timeout=_PROBE_TIMEOUT_S).brokers)
        except KafkaException:
            up = False
        if up:
            self._backoff.succeeded(KAFKA)
            self._resolved(KAFKA)
        else:
            self._backoff.failed(KAFKA)
            self._problem(KAFKA, f"kafka unreachable: no broker answered within {_PROBE_TIMEOUT_S:.0f}s")

    def _after(self, hooks: list[Callable[[], None]]) -> None:
        for fn in hooks:
            self.listeners.call(fn)

    def _plan_pending(self) -> None:
        assert self._consumer is not None
        for name in sorted(self._pending):
            if not self._backoff.due(name):
                continue
            rt = self.tables[name]
            try:
                tps = self.manager.plan(self._consumer, rt)
                # Only a restoring table: a RUNNING one catching up (after a disk fault) must stay durable by commits.
                if rt.machine.state == State.RESTORING and \
                        sum(end - rt.positions.get(p, 0) for p, end in rt.ends.items()) >= BULK_LOAD_MIN_RECORDS:
                    rt.store.begin_bulk_load()
                self._consumer.incremental_assign(tps)
            except STORE_FAULTS:
                raise  # the disk, not the table: the loop rewinds every table
            except Exception as e:  # Kafka unreachable, topic missing
                delay = self._backoff.failed(name)
                if not isinstance(e, TransientKafkaError) and self._backoff.failures(name) == 1:
                    log.exception("table %s: restore plan failed", name)
                rt.last_error = str(e)
                self._problem(name, f"table {name}: {e}")
                log.warning("table %s: cannot plan restore (%s); retrying in %.1fs", name, e, delay)
                continue
            rt.assigned = True
            rt.last_error = None
            self._resolved(name)
            self._pending.discard(name)
            self._backoff.succeeded(name)
            self._restore_progress(rt, {})

    def _restore_progress(self, rt: TableRuntime, counts: dict[int, int]) -> None:
        for p, n in counts.items():
            if p in rt.ends and n:
                rt.restored[p] = rt.restored.get(p, 0) + n
                self.listeners.restore_event("on_batch_restored", rt.name, p, rt.positions[p], n)
        for p in [p for p, end in rt.ends.items() if rt.positions.get(p, -1) >= end]:
            del rt.ends[p]
            log.info("table %s: partition %d restored (%d records)", rt.name, p, rt.restored.get(p, 0))
            self.listeners.restore_event("on_restore_end", rt.name, p, rt.restored.get(p, 0))
        if not rt.ends and rt.assigned and rt.machine.state == State.RESTORING:
            self.manager.finish_restore(rt)  # raises, and the table stays RESTORING, unless the restore is durable
            self._after(self.after_commit)
            if rt.restore_started is not None:
                took = time.monotonic() - rt.restore_started
                self.recoveries.append(took)
                rt.restore_started = None
            rt.machine.to(State.RUNNING, "restored to the log end")

    def _recover(self, rt: TableRuntime, detail: str) -> None:
        """KIP-406: the broker no longer has our offset. Wipe the table and rebuild it from the log start."""
        self.rebuild(rt.name, "invalid_offset", detail)

    def rebuild(self, table: str, kind: str, detail: str) -> None:
        """Wipe ``table`` (counted under ``kind``) and restore it from the log start. Loop thread only, e.g. from
        an after_poll hook: the store and the consumer belong to the loop."""
        rt = self.tables[table]
        assert self._consumer is not None
        self._unassign(rt)
        # RESTORING before the wipe: status readers learn of the rebuild before the data goes.
        rt.machine.to(State.RESTORING, f"{kind.replace('_', ' ')}, rebuilding: {detail}")
        self._pending.add(rt.name)
        self._backoff.succeeded(rt.name)
        try:
            self.manager.wipe(rt, kind, detail)
        except STORE_FAULTS as e:  # the emptied store could not be reopened: recover_stores does, once it can
            self._rewind_all(f"table {table}: wipe: {e}")

    def _unassign(self, rt: TableRuntime) -> None:
        assert self._consumer is not None
        if rt.assigned:
            self._consumer.incremental_unassign(rt.assignment())
            rt.assigned = False

    @property
    def store_fault(self) -> bool:
        """A write, commit or open failed and the stores have not been checked since: publish nothing from them."""
        return self._stores_suspect

    def _rewind_all(self, reason: str) -> None:
        """Forget the consumer's positions and re-plan every table from what its store holds, once the stores
        take writes again (nothing of a failed write was acknowledged, so nothing is lost)."""
        self._problems[STORE] = reason
        self._stores_suspect = True
        delay = self._backoff.failed(STORE)
        log.error("degraded: %s; re-reading from the stored offsets in %.1fs", reason, delay)
        for rt in self.tables.values():
            if self._consumer is not None:
                self._unassign(rt)
            rt.last_error = reason
            self._pending.add(rt.name)

    def _stores_ready(self) -> bool:
        if not self._stores_suspect:
            return True
        if not self._backoff.due(STORE):
            return False
        try:
            self.manager.recover_stores()
        except Exception as e:  # still full, still failing: try again later
            delay = self._backoff.failed(STORE)
            self._problems[STORE] = f"store unavailable: {e}"
            log.warning("stores still refuse writes (%s); next attempt in %.1fs", e, delay)
            return False
        self._stores_suspect = False
        return True

    def _store_healed(self) -> None:
        if STORE in self._problems:
            self._backoff.succeeded(STORE)
            self._resolved(STORE)

    def _refresh_metadata(self) -> None:
        """Pick up partitions added to a topic, and refresh end offsets for lag."""
        assert self._consumer is not None
        if KAFKA in self._problems:
            return
        for rt in self.tables.values():
            if not rt.assigned:
                continue
            try:  # short timeouts: a connected broker answers in milliseconds, and the loop waits meanwhile
                parts = partitions(self._consumer, rt.topic, timeout=_REFRESH_TIMEOUT_S)
                added = [p for p in parts if p not in rt.partitions]
                marks = {p: watermarks(self._consumer, rt.topic, p, timeout=_REFRESH_TIMEOUT_S) for p in added}
            except TopicUnavailableError as e:  # deleted, or not yet recreated: keep serving, keep waiting
                rt.last_error = str(e)
                self._problem(rt.name, f"table {rt.name}: {e}; waiting for it")
                continue
            except TransientKafkaError as e:  # the cluster did not answer: the other tables would not get one
                self._problem(KAFKA, f"kafka: metadata refresh failed: {e}")
                return
            self._resolved(KAFKA)
            if rt.name in self._problems:
                rt.last_error = None
                self._resolved(rt.name)
            if not added:
                continue
            log.info("table %s: partitions %s added to %s", rt.name, added, rt.topic)
            self.manager.add_partitions(rt, {p: low for p, (low, _) in marks.items()})
            for p, (low, high) in marks.items():
                rt.end_offsets[p] = high
                if low < high:
                    rt.ends[p] = high
                    rt.restored[p] = 0
                    self.listeners.restore_event("on_restore_start", rt.name, p, low, high)
            self._consumer.incremental_assign([TopicPartition(rt.topic, p, marks[p][0]) for p in added])
            if rt.ends and rt.machine.state == State.RUNNING:
                rt.machine.to(State.RESTORING, f"partitions {added} added")

    def _update_daemon_state(self) -> None:
        restoring = [rt.name for rt in self.tables.values() if rt.machine.state != State.RUNNING]
        if restoring:
            self.machine.to(State.RESTORING, f"restoring {', '.join(restoring)}")
        else:
            self.machine.to(State.RUNNING, "every table restored")

    # -- observation --------------------------------------------------------------------------------------------

    def end_offsets(self, rt: TableRuntime) -> dict[int, int]:
        """Latest known log ends: the consumer's cached high watermarks, else those from the restore plan."""
        ends = dict(rt.end_offsets)
        if self._consumer is not None and rt.assigned:
            for p in rt.partitions:
                try:
                    _, high = self._consumer.get_watermark_offsets(TopicPartition(rt.topic, p), cached=True)
                except Exception:
                    continue
                if high is not None and high >= 0:
                    ends[p] = max(high, ends.get(p, 0))
        return ends

    def status(self) -> dict[str, Any]:
        tables: dict[str, Any] = {}
        for rt in list(self.tables.values()):
            ends = self.end_offsets(rt)
            positions = dict(rt.positions)
            tables[rt.name] = {
                "state": rt.machine.state.value,
                "reason": rt.machine.reason,
                "topic": rt.topic,
                "offsets": {str(p): o for p, o in sorted(positions.items())},
                "end_offsets": {str(p): o for p, o in sorted(ends.items())},
                "lag": sum(max(0, ends.get(p, 0) - positions.get(p, 0)) for p in ends),
                "records": rt.records,
                "null_keys": rt.null_keys,
                "wipes": sum(n for (t, _), n in self.manager.wipes.items() if t == rt.name),
                "last_error": rt.last_error,
            }
        return {
            "state": self.machine.state.value,
            "reason": self.machine.reason,
            "pid": os.getpid(),
            "degraded": self.degraded,
            "tables": tables,
        }
