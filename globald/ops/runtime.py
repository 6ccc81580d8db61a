"""Operations of a running daemon: restore progress, hooks, sd_notify, HTTP/metrics, operator requests and the
processes decoding typed tables' snapshots (``decoding``).

It learns what happens from the engine's events and acts between polls as a loop service; the HTTP handlers and
the hook worker only read the last ``Sample`` or their own queue. Nothing here can stop the loop: event and tick
failures are counted by the engine, delivery failures by each component.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from globald.common import swallowed
from globald.common.states import State
from globald.common.waits import Deadline
from globald.engine.events import (
    BatchRestored,
    Committed,
    Event,
    RebuildRequests,
    RestoreEnded,
    RestoreStarted,
    StateChanged,
    TableAdded,
    TableDropped,
)
from globald.engine.view import EngineView, LoopStats
from globald.kafka.clients import on_statistics
from globald.ops import operator_requests as requests
from globald.ops.decoding import SnapshotDecodes
from globald.ops.health import Liveness, Readiness, SnapshotSource, liveness, readiness
from globald.ops.hooks import HookRunner
from globald.ops.http import Endpoints, HttpServer
from globald.ops.memory import KAFKA_STATS, HeapTrimmer, TracemallocRecorder, memory_doc
from globald.ops.metrics import Metrics, Sample, SnapshotStats, callback_failures, disk_free_bytes
from globald.ops.progress import ProgressDisplay, ProgressOptions, RestoreTracker
from globald.ops.sdnotify import Notifier
from globald.settings import registry as registry_settings
from globald.settings.changes import Delta
from globald.settings.config import Config
from globald.settings.kafka_properties import redact
from globald.settings.ref import ConfigRef
from globald.status.document import DaemonStatus, HttpAddress, RestoreStatus
from globald.store.stalls import STALLS

log = logging.getLogger(__name__)

PROGRESS_STATUS_SECONDS = 5.0


class Operations:
    def __init__(self, ref: ConfigRef, engine: EngineView, stats: LoopStats, rebuilds: RebuildRequests,
                 snapshots: SnapshotSource | None, progress: ProgressOptions | None = None,
                 notifier: Notifier | None = None) -> None:
        self._config = ref
        config = ref.now
        self.engine = engine
        self.stats = stats
        # With a snapshot source a table is servable once it has a snapshot; without, while RUNNING.
        self.snapshots = snapshots
        self.tracker = RestoreTracker()
        self.progress = ProgressDisplay(self.tracker, progress)
        self.hooks = HookRunner(config.hooks)
        self.tracemalloc = TracemallocRecorder.from_env()  # None unless a soak asks for a profile
        self.trimmer = HeapTrimmer()
        self.notifier = notifier or Notifier.from_env()
        self.metrics = Metrics(self.sample, self._ages)
        self.http = HttpServer(config.http, Endpoints(self.metrics.render, self.status_doc, self.liveness)) \
            if config.http.enabled else None
        self.decodes = SnapshotDecodes(config)  # typed tables' CURRENT into columnar files, in a child process
        self.inbox = requests.RequestInbox(config.state_dir, engine, rebuilds.put)
        self._http_next: HttpServer | None = None  # a reload's listener, bound by ``prepare``
        self._sample: Sample | None = None
        self._state, self._reason = State.CREATED, "created"
        self._commits = 0
        self._next_progress_status = 0.0
        on_statistics(KAFKA_STATS)  # the consumer's buffers in the status's memory, when the operator turns them on

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config.now

    # -- lifecycle (main thread) ------------------------------------------------------------------------------

    def start(self) -> None:
        requests.sweep(self.config.state_dir)
        self.inbox.open()
        if self.http is not None:
            self.http.start()
            self.http.announce()
        self.hooks.start()
        if self.tracemalloc is not None:
            self.tracemalloc.start()
        if self.progress.tty:
            for handler in logging.getLogger().handlers:
                handler.addFilter(self.progress.log_filter)
        log.info("config %s: state_dir %s, tables %s, kafka %s, hooks: %s", self.config.source or "(in memory)",
                 self.config.state_dir, {t.name: t.topic for t in self.config.tables},
                 redact(self.config.kafka), self.hooks.describe())
        if self.config.registry is not None:
            log.info("registry: %s", registry_settings.redact(self.config.registry))

    @contextmanager
    def listening(self) -> Iterator[None]:
        """The HTTP address taken before the daemon writes its state_dir (a port in use is a config error, exit 2,
        with nothing created or bootstrapped), and served at once: while the daemon starts (waiting for its disk,
        bootstrapping from an export) /status and /readyz answer 503 CREATED rather than leave a probe hanging on a
        socket nobody accepts from. Closed on the way out (``stop`` closes it first on a normal stop)."""
        if self.http is not None:
            self.http.start()
        try:
            yield
        finally:
            if self.http is not None:
                self.http.stop()

    # -- a reload (loop thread, ``service.two_phase``) -------------------------------------------------------------

    def prepare(self, delta: Delta) -> None:
        """A reload's [http], bound before anything of the reload is applied: a new listener when the address
        changed (raises ConfigError, refusing the reload, when it cannot be bound)."""
        self._http_next = None
        old, new = self.http.config if self.http is not None else None, delta.config.http  # None: not listening
        if old == new or not new.enabled or (old is not None and (old.host, old.port) == (new.host, new.port)):
            return  # unchanged, turned off, or the same address: the listener in place serves on
        server = HttpServer(new, Endpoints(self.metrics.render, self.status_doc, self.liveness))
        server.start()
        server.announce()
        self._http_next = server

    def abort(self) -> None:
        """Another part refused the reload: the listener bound for it is stopped, the one in place serves on."""
        server, self._http_next = self._http_next, None
        if server is not None:
            server.stop()

    def commit(self) -> list[Callable[[], None]]:
        """A reload's settings, once in force: when [hooks] changed, a new hook runner (started; every event from
        now on goes to it); the listener ``prepare`` bound serves from now on, or [http] turned off stops the
        listener. Returns what the caller must run off the loop thread: the replaced runner's close (it delivers
        what is queued, bounded by the hooks' timeout) and the replaced listener's stop."""
        config, http, self._http_next = self.config, self._http_next, None
        later: list[Callable[[], None]] = []
        if config.hooks != self.hooks.config:
            old, self.hooks = self.hooks, HookRunner(config.hooks)
            self.hooks.failures.update(old.failures)  # the counters are the process's, not one runner's
            self.hooks.start()
            later.append(old.close)
        if http is not None or not config.http.enabled:
            if self.http is not None:
                later.append(self.http.stop)
            self.http = http
        elif self.http is not None:
            self.http.config = config.http  # the same address: allow_non_loopback, checked when loaded
        self.decodes.reconfigure(config)  # the config file in force
        return later

    def stop(self, joins: Deadline | None = None, hooks: Deadline | None = None) -> None:
        """``joins``: the stop's shared bound on waiting for the decode process and the HTTP thread; ``hooks``: when
        the state hooks are no longer waited for (``common.waits.STOP_HOOKS_S``), never before ``joins`` ends."""
        self.decodes.close(joins)  # first: a decode process never outlives the daemon
        self.inbox.close()  # the loop has ended: a reset it never ran is answered, not left to time out
        if self.http is not None:
            self.http.stop(joins.left() if joins is not None else 5.0)
        # the user's code: not waited for past the stop's bound
        self.hooks.close(None if joins is None else max(joins.left(), hooks.left() if hooks is not None else 0.0))
        if self.tracemalloc is not None:
            self.tracemalloc.close()
        self.progress.clear()
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self.progress.log_filter)
        self.notifier.close()

    # -- loop thread ----------------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        match event:
            case TableAdded() | TableDropped():  # a reload's tables (the inbox asks the engine which it has)
                self.decodes.on_event(event)
            case StateChanged(table=None):
                self._state, self._reason = event.new, event.reason
                self.hooks.on_state(event.new, event.old, event.reason)
                self._notify()
            case StateChanged(table=str(table)):
                self.hooks.on_table_state(table, event.new, event.old, event.reason)
                self._notify()
                if event.new == State.RUNNING:
                    self.trimmer.soon()
            case Committed():
                self._commits += 1
                self.metrics.observe_commit(event.seconds)
            case RestoreStarted():
                for listener in (self.tracker, self.progress):
                    listener.on_restore_start(event.table, event.partition, event.start, event.end)
            case BatchRestored():
                for listener in (self.tracker, self.progress):
                    listener.on_batch_restored(event.table, event.partition, event.batch_end, event.count)
            case RestoreEnded():
                for listener in (self.tracker, self.progress):
                    listener.on_restore_end(event.table, event.partition, event.total)

    def tick(self) -> None:
        self.notifier.watchdog()
        now = time.monotonic()
        self.trimmer.maybe_trim(now)
        if self.notifier.enabled and now >= self._next_progress_status:
            self._next_progress_status = now + PROGRESS_STATUS_SECONDS
            if any(s.active for s in self.tracker.stats().values()):
                self.notifier.status(self._status_line())  # `systemctl status` shows the restore moving
        self.inbox.poll()
        self.decodes.tick(self._sample.doc if self._sample is not None else None)
        if self.snapshots is not None and not self.notifier.ready_sent and self._live_readiness().ready:
            self.notifier.ready(self._status_line())

    def restore_status(self, table: str) -> RestoreStatus | None:
        s = self.tracker.stats().get(table)
        if s is None or not s.active:
            return None
        return RestoreStatus(s.percent, s.records, s.records_per_second, s.eta_seconds)

    def observe(self, doc: DaemonStatus) -> DaemonStatus:
        """Complete the status document with what operations know, and keep it as the sample HTTP serves."""
        doc = self.decodes.observe(doc)
        versioned = {n: h for n in doc.tables if (h := self.engine.history_status(n)) is not None}
        if versioned:
            doc = dataclasses.replace(doc, tables={n: dataclasses.replace(t, history=versioned[n]) if n in versioned
                                                   else t for n, t in doc.tables.items()})
        r = readiness(doc.state.value, {n: t.state for n, t in doc.tables.items()}, self.snapshots)
        address = self.http.address if self.http is not None else None
        doc = dataclasses.replace(
            doc, ready=r.ready, ready_detail=r.detail, updated=time.time(),
            bugs=[b.to_json() for b in swallowed.SWALLOWED.bugs()],
            # RSS next to RocksDB's own accounting: a long run can tell caches filling to their bound from a leak.
            memory=memory_doc(self.engine.memory_usage()),
            http=HttpAddress(address[0], address[1]) if address is not None else None)
        snapshots: dict[str, SnapshotStats] = {}
        replaced = 0 if self.snapshots is None else self.snapshots.build_workers_replaced()
        if self.snapshots is not None:
            for name in doc.tables:
                snapshots[name] = SnapshotStats(self.snapshots.age_seconds(name), self.snapshots.publish_seconds(name))
        failures = dict(self.hooks.failures)
        if self.notifier.failures:
            failures["sd_notify"] = self.notifier.failures
        self._sample = Sample(
            doc=doc, wipes=self.engine.wipe_counts(), commits=self._commits,
            callback_failures=callback_failures(swallowed.SWALLOWED.counts()), hook_failures=failures,
            consumer_errors=self.stats.consumer_errors, consumer_renewals=self.stats.consumer_renewals,
            build_workers_replaced=replaced, restores=self.tracker.stats(), snapshots=snapshots,
            write_stalls=dataclasses.replace(STALLS), swallowed=swallowed.SWALLOWED.counts(),
            bugs=swallowed.SWALLOWED.bug_counts(), disk_free_bytes=disk_free_bytes(self.config.state_dir))
        return doc

    def _live_readiness(self) -> Readiness:
        return readiness(self._state.value, {t.name: t.state.value for t in self.engine.table_views()},
                         self.snapshots)

    def _status_line(self) -> str:
        restores = self.tracker.stats()
        tables = []
        for t in self.engine.table_views():
            s = restores.get(t.name)
            restoring = s is not None and s.active and t.state == State.RESTORING
            progress = f" {s.percent:.0f}%" if restoring and s is not None else ""
            tables.append(f"{t.name} {t.state.value}{progress}")
        return f"{self._state.value} ({self._reason}); {', '.join(tables) or 'no tables open'}"

    def _notify(self) -> None:
        text = self._status_line()
        if self._state == State.PENDING_SHUTDOWN:
            self.notifier.stopping(text)
        elif not self.notifier.ready_sent and self._live_readiness().ready:
            self.notifier.ready(text)
        else:
            self.notifier.status(text)

    # -- any thread -----------------------------------------------------------------------------------------

    def sample(self) -> Sample | None:
        return self._sample

    def status_doc(self) -> DaemonStatus | None:
        s = self._sample
        return None if s is None else s.doc

    def _ages(self) -> tuple[float, float]:
        now = time.monotonic()
        return now - self.stats.last_loop, now - self.stats.last_progress

    def liveness(self) -> Liveness:
        loop_age, progress_age = self._ages()
        return liveness(self._state.value, loop_age, progress_age)
