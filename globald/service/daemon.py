"""``globald run``: owns the state_dir, runs the global thread in the foreground, publishes status.

One daemon per state_dir, enforced with an advisory lock. SIGTERM and SIGINT commit, close and exit 0; a stop
that has not finished ``STOP_GRACE_S`` later prints every thread's stack and exits 1 (the stores stay at their last
durable commit, which is all a stop ever adds to). The
state_dir is created private (0700) and a second daemon is refused without touching the first one's files. A
state_dir on a full or failing disk is waited for (degraded, logged), never a reason to exit. Everything the
daemon runs is built and connected in ``__init__``, in one place and one order; ``run`` has three phases:
startup, the main loop, shutdown.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

from globald.common import swallowed
from globald.common.states import Listeners, State
from globald.common.waits import STOP_HOOKS_S, STOP_JOINS_S, Deadline
from globald.engine.events import Committed, Event, EventBus, RebuildRequests, StateChanged, Subscriber, deliver
from globald.engine.state_manager import StateManager
from globald.engine.thread import GlobalThread
from globald.engine.view import LoopStats
from globald.ops import allocator
from globald.ops.progress import ProgressOptions
from globald.ops.runtime import Operations
from globald.service import signals, two_phase
from globald.service.reload import Reloader
from globald.settings.changes import Delta
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.snapshot.publisher import SnapshotPublisher
from globald.snapshot.space import disk_status
from globald.status import statusfile
from globald.status.document import DaemonStatus, TableStatus
from globald.store.statedir import DiskNotReady, lock_state_dir, prepare_state_dir

if TYPE_CHECKING:
    from globald.export.service import ExportService

log = logging.getLogger(__name__)

_DISK_RETRY_MAX_S = 10.0
_STATUS_EVERY_S = 1.0
# Below systemd's TimeoutStopSec (120 s in systemd/), so that a stop stuck in a library call says where it is stuck
# before the service manager's SIGKILL, which says nothing.
STOP_GRACE_S = 60.0
_STEP_POLL_S = 0.05


def _guarded(fn: Subscriber) -> Subscriber:
    """``fn``, with what it raises counted and logged at a bounded rate (``common.swallowed``), never raised: the
    bus would log each failure of a subscriber that fails on every event with its traceback."""

    def call(event: Event) -> None:
        try:
            fn(event)
        except Exception as e:
            swallowed.record("event_subscriber", e, log, "subscriber %s raised on %s; ignored",
                             getattr(fn, "__qualname__", fn), type(event).__name__)

    return call


class Daemon:
    def __init__(self, config: Config, listeners: Listeners | None = None,
                 progress: ProgressOptions | None = None, subscribers: Sequence[Subscriber] = (),
                 config_path: Path | None = None) -> None:
        """``listeners`` are a user's callbacks; ``subscribers`` receive every engine event after globald's own;
        ``config_path``: the config file as named on the command line (symlinks unresolved), read again by a
        SIGHUP (default: the file the config was loaded from)."""
        self.listeners = listeners or Listeners()
        self.bus = EventBus()
        self.stats = LoopStats()
        rebuilds = RebuildRequests()
        # The config in force, one for every part: set once by a reload applied (``_reconfigure``); a part that
        # makes Kafka clients reads it when it makes one, and makes new ones when its generation moved
        self.config_ref = ConfigRef(config)
        self.manager = StateManager(self.config_ref, self.bus.emit)
        self.snapshots = SnapshotPublisher(self.config_ref, self.manager)
        self.ops = Operations(self.config_ref, self.manager, self.stats, rebuilds, self.snapshots, progress)
        self.exports = _exports(self.config_ref, self.manager)  # None unless [export] is configured
        self.thread = GlobalThread(self.config_ref, self.manager, self.bus.emit, services=(
                                       (self.snapshots, self.ops, self) if self.exports is None else
                                       (self.snapshots, self.ops, self, self.exports)),
                                   rebuilds=rebuilds, stats=self.stats,
                                   refills=self.exports.refills if self.exports else None)
        # The order matters and is fixed here: user callbacks first (as registered), the publisher before status
        # (a status written on a wipe shows the stale mark), operations and exports before status (readiness,
        # metrics, the origin's tail). A reload's tables arrive the same way (``TableAdded`` before the table's
        # first ``StateChanged``, ``TableDropped`` after its last), so each part has the table when status asks.
        self.bus.connect(*(_guarded(s) for s in (deliver(self.listeners), self.snapshots.on_event,
                                                  self.ops.on_event,
                                                  *([self.exports.on_event] if self.exports else []),
                                                  self.on_event, *subscribers)))
        self.reloader = Reloader(self.config_ref, config_path or config.source, self._reconfigure, self.publish_status)
        # the decode processes read the config file in force, and only its bytes in force (a reload's, once applied)
        self.ops.decodes.in_force = lambda: (self.reloader.status.path, self.reloader.status.sha256)
        self._last_status = 0.0
        self._last_degraded: str | None = None
        self._last_publications = 0
        self._status_failing = False

    @property
    def config(self) -> Config:
        """The config in force."""
        return self.config_ref.now

    # -- status (loop thread) -----------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if isinstance(event, StateChanged | Committed):
            self.publish_status()

    def tick(self) -> None:
        self.reloader.tick()  # a checked reload is applied between two turns, here
        # A fault starting or ending, and a snapshot made CURRENT (readiness, what readers are served) are news at
        # once; the rest (offsets, lag) at most once a second.
        if time.monotonic() - self._last_status >= _STATUS_EVERY_S or self.thread.degraded != self._last_degraded \
                or self.snapshots.publications() != self._last_publications:
            self.publish_status()

    def status(self) -> DaemonStatus:
        """The status document, built in this one place from what each part owns."""
        tables = {}
        for table in self.manager.table_views():
            name = table.name
            records, null_keys = self.thread.applied(name)
            tables[name] = TableStatus.of(
                table, self.thread.positions(name), self.thread.end_offsets(name), records, null_keys,
                wipes=sum(n for (t, _), n in self.manager.wipe_counts().items() if t == name),
                restore=self.ops.restore_status(name), snapshot=self.snapshots.status(name))
            if self.exports is not None:
                tables[name] = replace(tables[name], origin=self.exports.origin(name), export=self.exports.status(name))
        doc = DaemonStatus(state=self.thread.state, reason=self.thread.machine.reason, pid=os.getpid(),
                           degraded=self.thread.degraded, tables=tables, disk=disk_status(self.snapshots.disk),
                           config=replace(self.reloader.status, clients=self._clients()))
        return self.ops.observe(doc)

    def _clients(self) -> dict[str, int | None]:
        """Per part that makes Kafka clients, the generation of the config they were made from (``ConfigStatus``)."""
        clients = {"consumer": self.thread.consumer_generation, "cluster_worker": self.thread.worker.generation,
                   "exact_builds": self.snapshots.builds_generation()}
        if self.exports is not None and self.exports.refills is not None:
            clients["bootstrap"] = self.exports.refills.generation
        return clients

    def publish_status(self) -> None:
        self._last_status = time.monotonic()
        self._last_publications = self.snapshots.publications()
        doc = self.status()
        self._last_degraded = doc.degraded
        try:
            statusfile.write(self.config.state_dir, doc)
        except OSError as e:  # a full or failing disk: the loop handles its own writes; counted, retried
            swallowed.record("status_file", e, log, "cannot publish status.json: %s; retrying with every update", e)
            self._status_failing = True
            return
        if self._status_failing:
            log.info("status.json published again")
        self._status_failing = False

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def _reconfigure(self, delta: Delta) -> list[Callable[[], None]]:
        """Apply a checked reload (``service.reload``), on the loop thread, in two phases (``service.two_phase``):
        each part prepares what can fail (the publisher an added table's folder, the engine a new consumer,
        operations a new listener) and a refusal aborts them all; then each commits, the engine's table changes
        reaching every subscriber as events (``TableAdded``, ``TableDropped``, ``TableRedeclared``) in the bus's
        order. Every kind of table change (delta.added, delta.dropped, delta.replaced, delta.redeclared) is the
        engine's (``engine.tables_change``)."""
        return two_phase.apply(delta, self.config_ref, (self.snapshots, self.thread, self.ops))

    def _on_signal(self, signum: int) -> None:
        """On the signal relay's thread (``service.signals``): the main thread may hold any lock at that moment."""
        if signum == signal.SIGHUP:  # queued for the reload thread; never a stop
            log.info("SIGHUP received; reading the config again")
            self.reloader.request(None, "SIGHUP")
            return
        log.info("%s received; committing and stopping", signal.Signals(signum).name)
        if not self.thread.stopping:
            faulthandler.dump_traceback_later(STOP_GRACE_S, exit=True)
        self.thread.stop()

    def stop(self) -> None:
        self.thread.stop()

    def run(self, handle_signals: bool = True) -> int:
        """Run in the foreground. ``handle_signals=False`` when not on the main thread (the demo): stop() then."""
        # The HTTP address is taken first: every config check before anything is written to the state_dir
        with self._signals(handle_signals), self.ops.listening():
            lock = self._startup()
            if lock is None:  # stopped while waiting for the disk
                return 0
            try:
                self.thread.run()  # the main loop, until stop()
                return 0
            finally:
                self._shutdown(lock)

    @contextmanager
    def _signals(self, handle: bool) -> Iterator[None]:
        if not handle:
            yield
            return
        # SIGUSR2 prints every thread's stack to stderr: what a daemon that does not stop is waiting on
        faulthandler.register(signal.SIGUSR2, all_threads=True)
        try:
            with signals.relayed(self._on_signal, (*signals.STOP_SIGNALS, signal.SIGHUP)):
                yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            faulthandler.unregister(signal.SIGUSR2)

    def _startup(self) -> IO[str] | None:
        """Own the state_dir (waiting while its disk is full or failing), then start the services."""
        lock = self._own_state_dir()
        if lock is None:
            return None
        if not self._unless_stopped(self._take_reader_schemas, "globald-registry-start"):
            lock.close()
            return None
        if self.exports is not None:  # before the engine plans: a store bootstrapped now is planned as any other
            from globald.export.startup import bootstrap_empty_tables

            origins = bootstrap_empty_tables(self.config, self._wait_stop)
            if self.thread.stopping:
                lock.close()
                return None
            self.exports.start(origins)
            self.ops.inbox.export = self.exports.request
        self.snapshots.start()
        self.ops.start()
        self.ops.inbox.reload = self.reloader.from_operator
        self.reloader.start()
        log.info("globald %d starting on %s's malloc: %d table(s), state_dir %s", os.getpid(), allocator.active(),
                 len(self.config.tables), self.config.state_dir)
        return lock

    def _unless_stopped(self, step: Callable[[], None], name: str) -> bool:
        """Run ``step`` (a wait on the network, bounded only by its client's timeout) on a thread of its own, and
        wait for it or a stop, whichever comes first: False when stopped first (the thread is left behind, and the
        process ends without it: ``cli.main``)."""
        done = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                step()
            except BaseException as e:  # raised where the step was called, as it would have been
                failed.append(e)
            finally:
                done.set()

        threading.Thread(target=run, name=name, daemon=True).start()
        while not done.wait(_STEP_POLL_S):  # a stop is seen within this
            if self.thread.stopping:
                log.info("stopped while %s waited on the network; not waiting for it", name)
                return False
        if failed:
            raise failed[0]
        return True

    def _wait_stop(self, seconds: float) -> bool:
        self.thread.wait_stop(seconds)
        return self.thread.stopping

    def _take_reader_schemas(self) -> None:
        """Pin each registry subject's latest version, the reader schema until a reload (``typed.registry``); a
        registry that does not answer leaves the pins already taken, and the daemon starts anyway, saying so.
        Bounded by the client's timeout and retries ([registry] timeout, max.retries), before the loop starts."""
        if not any(f is not None and f.uses_registry for t in self.config.tables for f in (t.value, t.key)):
            return  # the registry client stays out of the daemon
        from globald.typed.registry import probe, take_reader_schemas

        down = probe(self.config)
        if down is not None:
            log.warning("%s", down)
        for taken, line in take_reader_schemas(self.config, reachable=down is None):
            (log.info if taken else log.warning)("reader schema: %s", line)

    def _shutdown(self, lock: IO[str]) -> None:
        """After the loop's final commit and the stores' close: every other part stops, their waits for their threads
        and the decode process sharing ``STOP_JOINS_S`` (a thread still inside a network or client call is left
        behind: ``globald run`` then ends the process without waiting for any thread, ``cli.main``)."""
        joins = self.thread.joins or Deadline(STOP_JOINS_S)  # begun by the loop's stop, the cluster worker's share
        self.reloader.close(joins)
        self.snapshots.close(joins)
        if self.exports is not None:
            self.exports.close(joins)
        if self.thread.state in (State.NOT_RUNNING, State.ERROR):
            self.publish_status()
        asked = self.thread.asked_at
        self.ops.stop(joins, hooks=joins if asked is None else Deadline(STOP_HOOKS_S - (time.monotonic() - asked)))
        lock.close()

    def _own_state_dir(self) -> IO[str] | None:
        """The state_dir's lock, waiting (degraded) while its disk is full or failing; None if stopped meanwhile."""
        delay = 0.5
        said = False
        while not self.thread.stopping:
            try:
                prepare_state_dir(self.config.state_dir)
                lock = lock_state_dir(self.config.state_dir)
            except DiskNotReady as e:
                if not said:
                    log.warning("degraded: %s; waiting for the disk, retrying every %.0fs at most", e,
                                _DISK_RETRY_MAX_S)
                    said = True
                self.thread.wait_stop(delay)
                delay = min(delay * 2, _DISK_RETRY_MAX_S)
                continue
            if said:
                log.info("recovered: state_dir %s takes writes again", self.config.state_dir)
            return lock
        return None


def _exports(config: ConfigRef, engine: StateManager) -> ExportService | None:
    """The exporter when [export] is configured (imported only then: pyarrow is needed only then)."""
    if config.now.export is None:
        return None
    from globald.export.service import ExportService

    return ExportService(config, engine)
