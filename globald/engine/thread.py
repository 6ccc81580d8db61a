"""The global thread: one consumer, every partition of every table, restore then tail (GlobalStreamThread).

What callers can rely on: the daemon is RESTORING while any table is restoring and RUNNING once every table has
reached the log end captured when its restore began and that restore is durable in its store. Faults that may heal
(broker down, topic missing, a full or failing disk, in any phase) are retried with backoff in-process; invalid
offsets wipe and rebuild the table in-process. Only a bug ends the loop, in state ERROR. The loop turns at least
every ``poll_timeout_ms`` (and every 50 ms when idle) whatever the wall clock does, so a stop request is acted on
within one turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from globald.common.states import Listeners, State, StateMachine
from globald.common.waits import STOP_JOINS_S, Deadline
from globald.engine import tables_change
from globald.engine.background_upgrade import BackgroundUpgrade
from globald.engine.events import (
    Emit,
    EventBus,
    RebuildRequests,
    StateChanged,
    Subscriber,
    deliver,
)
from globald.engine.identity import TopicIdentity
from globald.engine.loop import Loop, LoopParts, LoopService
from globald.engine.problems import Problems
from globald.engine.refill import Refills
from globald.engine.state_manager import StateManager
from globald.engine.tables import TableSet
from globald.engine.view import LoopStats
from globald.kafka.clients import make_consumer
from globald.kafka.worker import ClusterWorker
from globald.settings.changes import Delta
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.store.failures import STORE_FAULTS

log = logging.getLogger(__name__)

# librdkafka's client-wide error saying no broker can be reached. It also fires when the bootstrap connection
# is dropped for the brokers it announced ("0/2 brokers are down"), and nothing says when a broker is back, so
# it only makes the loop probe: a metadata request, bounded by this timeout, decides.
_CLUSTER_DOWN = KafkaError._ALL_BROKERS_DOWN

# A question to the cluster still out after this long is stuck (a wait librdkafka timed on the wall clock, say):
# the worker leaves it behind and answers the next ones with new clients. Above the longest question a healthy
# cluster can take (a plan: listing, watermarks, ID and three rounds of checks, 5 s each at most).
QUESTION_STUCK_S = 60.0


class GlobalThread:
    """Runs the loop on the calling thread until ``stop()``. Built with everything it drives, nothing added later."""

    def __init__(self, config: ConfigRef, manager: StateManager, emit: Emit, services: Sequence[LoopService] = (),
                 rebuilds: RebuildRequests | None = None, stats: LoopStats | None = None,
                 consumer_factory: Callable[..., Consumer] = make_consumer, refills: Refills | None = None) -> None:
        self._config = config  # the config in force, read at each use
        self.manager = manager
        self._emit = emit
        # Every question to the cluster, asked off the loop thread (kafka.worker), and the topics' identity, which
        # the state manager's plans and wipes consult.
        self.worker = ClusterWorker(config, stuck_after_s=QUESTION_STUCK_S)
        self.identity = manager.identity = TopicIdentity(self.worker, emit)
        self.machine = StateMachine(lambda table, new, old, reason: emit(StateChanged(table, new, old, reason)))
        self.problems = Problems()
        self.stats = stats or LoopStats()
        self._services = (BackgroundUpgrade(manager.tables), *services)
        self._rebuilds = rebuilds or RebuildRequests()
        self._consumer_factory = consumer_factory
        self._refills = refills
        self._stop = threading.Event()
        self._loop: Loop | None = None
        self.joins: Deadline | None = None  # the stop's shared bound, from the stores' close on (``_shutdown``)
        self.asked_at: float | None = None  # when a stop was first asked (monotonic)
        self._delta: Delta | None = None  # a reload prepared, not yet committed or aborted
        self._next_consumer: Consumer | None = None
        # The generation of the config the loop's consumer was made from (status: ``config.clients``): the start's,
        # then each reload's, whose commit replaces it when [kafka] changed and keeps one with the same settings else
        self.consumer_generation = config.generation

    @classmethod
    def standalone(cls, config: Config, listeners: Listeners | None = None, services: Sequence[LoopService] = (),
                   subscribers: Sequence[Subscriber] = ()) -> GlobalThread:
        """The engine alone, without snapshots or operations (benchmarks, tests): ``listeners`` get the user
        callbacks, ``subscribers`` every event."""
        bus = EventBus()
        ref = ConfigRef(config)
        thread = cls(ref, StateManager(ref, bus.emit), bus.emit, services)
        bus.connect(deliver(listeners or Listeners()), *subscribers)
        return thread

    @property
    def config(self) -> Config:
        return self._config.now

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def tables(self) -> TableSet:
        return self.manager.tables

    @property
    def degraded(self) -> str | None:
        """What keeps the daemon from mirroring its topics right now, or None."""
        return self.problems.degraded

    def positions(self, table: str) -> dict[int, int]:
        """The table's next-offsets as applied to its store (empty before the loop starts)."""
        return self._loop.task.positions(table) if self._loop is not None else {}

    def applied(self, table: str) -> tuple[int, int]:
        """(records, null keys) applied to the table since the daemon started."""
        if self._loop is None:
            return 0, 0
        totals = self._loop.task.applied[table]
        return totals.records, totals.null_keys

    def end_offsets(self, table: str) -> dict[int, int]:
        """Latest known log ends: the consumer's cached high watermarks, else those of the last plan."""
        rt = self.manager.tables[table]
        ends = dict(rt.end_offsets)
        if self._loop is not None and rt.assigned:
            for p in rt.partitions:
                try:
                    _, high = self._loop.consumer.get_watermark_offsets(TopicPartition(rt.topic, p), cached=True)
                except (KafkaException, RuntimeError):  # RuntimeError: a consumer the loop just replaced
                    continue
                if high is not None and high >= 0:
                    ends[p] = max(high, ends.get(p, 0))
        return ends

    # -- a reload, in two phases (``service.two_phase``), on the loop thread between two turns ----------------------

    def prepare(self, delta: Delta) -> None:
        """The engine's fallible step: when [kafka] changed, a new consumer made from the new properties (if
        librdkafka refuses them, this raises and nothing changed). The loop's other settings are read from the config
        in force at each use, and the cluster worker makes new clients when the generation moved
        (``ClusterWorker.follow``)."""
        assert self._loop is not None, "a reload is applied between two turns of the loop"
        self._delta, self._next_consumer = delta, None
        if delta.kafka_changed:
            self._next_consumer = self._consumer_factory(delta.config, on_error=self._on_kafka_error)

    def commit(self) -> list[Callable[[], None]]:
        """Take what ``prepare`` made: the new consumer replaces the loop's (every table re-planned from its store),
        then the tables change (``engine.tables_change``: the dropped ones stop being consumed at once, the added
        ones are restored while the others keep serving), each change an event on the bus."""
        assert self._loop is not None and self._delta is not None
        delta, consumer = self._delta, self._next_consumer
        self._delta, self._next_consumer = None, None
        if consumer is not None:
            self._loop.replace_consumer(consumer)
        self.consumer_generation = self._config.generation  # in force since two_phase set it, before the commits
        tables_change.apply(self.manager.tables, delta)
        return []

    def abort(self) -> None:
        """Another part refused the reload: the consumer made for it is closed (on the cluster worker, unused)."""
        consumer, self._delta, self._next_consumer = self._next_consumer, None, None
        if consumer is not None:
            self.worker.retire(consumer)

    def stop(self) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()  # when the stop's bounds began (``Daemon._shutdown``)
        self._stop.set()
        self.worker.wake.set()  # ends the loop's idle wait at once (``Loop._poll_one``)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_stop(self, seconds: float) -> None:
        """Sleep ``seconds`` on the monotonic clock, or until ``stop()``."""
        self._stop.wait(seconds)

    def run(self) -> None:
        """Run until ``stop()``; commit and close on the way out. Raises only on a bug, after entering ERROR."""
        clean = False
        try:
            self.machine.to(State.RESTORING, "starting")
            stored, refused = self.manager.open_all()
            parts = LoopParts(self._config, self.manager, self.worker, self.identity, self.problems, self.stats,
                              self._services, self._emit, self._rebuilds, self.machine, self._stop, self._refills)
            self._loop = Loop(parts, lambda: self._consumer_factory(self.config, on_error=self._on_kafka_error),
                              stored)
            if refused:
                self._loop.rewind_all("; ".join(f"table {name}: {why}" for name, why in sorted(refused.items())))
            while not self._stop.is_set():
                self._loop.turn()
            clean = True
        except BaseException as e:
            log.exception("global thread failed")
            if self.machine.state not in (State.ERROR, State.NOT_RUNNING):
                self.machine.to(State.ERROR, f"{type(e).__name__}: {e}")
            raise
        finally:
            self._shutdown(clean)

    def _on_kafka_error(self, err: KafkaError) -> None:
        """librdkafka's error callback, called from within a poll on the loop thread."""
        if err.code() == _CLUSTER_DOWN and self._loop is not None:
            self._loop.watch.probe_now = True

    def _shutdown(self, clean: bool) -> None:
        loop = self._loop
        if clean:
            self.machine.to(State.PENDING_SHUTDOWN, "stop requested")
            for rt in self.tables.values():
                rt.machine.to(State.PENDING_SHUTDOWN, "stop requested")
            if loop is not None:
                try:  # every table but those waiting for their plan (see ``Loop.committable``)
                    self.manager.commit({n: loop.task.positions(n) for n in self.tables if n not in loop.pending})
                except STORE_FAULTS as e:
                    log.warning("final commit failed (%s); the stores stay at their last durable commit", e)
                    clean = False
        self.manager.close(clean=clean, stopping=True)
        # The stop's shared bound starts here, once what was applied is durable: the cluster worker's wait is its
        # first share, every other part's the rest (``Daemon._shutdown``)
        self.joins = Deadline(STOP_JOINS_S)
        if loop is not None:
            loop.close(self.joins)  # the consumer is closed on the cluster worker, within the bound
        elif not self.worker.close(self.joins.left()):
            log.warning("the cluster worker was still inside a Kafka client call at the stop; stopping without it")
        if self.machine.state == State.PENDING_SHUTDOWN:
            for rt in self.tables.values():
                rt.machine.to(State.NOT_RUNNING, "stopped")
            self.machine.to(State.NOT_RUNNING, "stopped")


