"""Wires operations into a daemon: restore progress, hooks, sd_notify, HTTP/metrics and operator requests.

Everything here runs on the loop thread through listeners and the after_poll/after_commit hooks, except the HTTP
handlers and the hook worker, which only read the last ``Sample`` or their own queue. Nothing here can stop the
loop: listener failures are counted by ``Listeners``, delivery failures by each component.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from globald import config as configmod
from globald.config import Config
from globald.engine.thread import GlobalThread
from globald.ops import operator_requests as requests
from globald.ops.health import Liveness, Readiness, SnapshotSource, liveness, readiness
from globald.ops.hooks import HookRunner
from globald.ops.http import Endpoints, HttpServer
from globald.ops.metrics import Metrics, Sample, SnapshotStats
from globald.ops.progress import ProgressDisplay, ProgressOptions, RestoreTracker
from globald.ops.sdnotify import Notifier
from globald.states import Listeners, State

log = logging.getLogger(__name__)

RESET_KIND = "operator_reset"
PROGRESS_STATUS_SECONDS = 5.0


class Operations:
    def __init__(self, config: Config, thread: GlobalThread, listeners: Listeners,
                 progress: ProgressOptions | None = None, notifier: Notifier | None = None) -> None:
        self.config = config
        self.thread = thread
        # The snapshot publisher plugs in here; until then a table is servable only while RUNNING.
        self.snapshots: SnapshotSource | None = None
        self.tracker = RestoreTracker()
        self.progress = ProgressDisplay(self.tracker, progress)
        self.hooks = HookRunner(config.hooks)
        self.notifier = notifier or Notifier.from_env()
        self.metrics = Metrics(self.sample, self._ages)
        self.http = HttpServer(config.http, Endpoints(self.metrics.render, self.status_doc, self.liveness)) \
            if config.http.enabled else None
        self.inbox = requests.RequestInbox(config.state_dir, {t.name for t in config.tables},
                                           lambda table, detail: thread.rebuild(table, RESET_KIND, detail))
        self._sample: Sample | None = None
        self._commits_seen = 0
        self._next_progress_status = 0.0
        listeners.restore += [self.tracker, self.progress]
        listeners.state += [self._on_state, self.hooks.on_state]
        listeners.table_state += [self._on_table_state, self.hooks.on_table_state]
        thread.after_poll.append(self._after_poll)
        thread.after_commit.append(self._observe_commits)

    # -- lifecycle (main thread) ------------------------------------------------------------------------------

    def start(self) -> None:
        requests.sweep(self.config.state_dir)
        self.inbox.open()
        if self.http is not None:
            self.http.start()
        self.hooks.start()
        if self.progress.tty:
            for handler in logging.getLogger().handlers:
                handler.addFilter(self.progress.log_filter)
        log.info("config %s: state_dir %s, tables %s, kafka %s, hooks: %s", self.config.source or "(in memory)",
                 self.config.state_dir, {t.name: t.topic for t in self.config.tables},
                 configmod.redact(self.config.kafka), self.hooks.describe())

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
        self.hooks.close()
        self.progress.clear()
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self.progress.log_filter)
        self.notifier.close()

    # -- loop thread ----------------------------------------------------------------------------------------

    def observe(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Extend the status document with what operations know, and keep it as the sample HTTP serves."""
        r = self._readiness(doc)
        doc["ready"], doc["ready_detail"] = r.ready, r.detail
        doc["updated"] = time.time()
        if self.http is not None and self.http.address is not None:
            host, port = self.http.address
            doc["http"] = {"host": host, "port": port}
        restores = self.tracker.stats()
        for name, t in doc.get("tables", {}).items():
            s = restores.get(name)
            if s is not None and s.active:
                t["restore"] = {"percent": round(s.percent, 1), "records": s.records,
                                "records_per_second": round(s.records_per_second, 1),
                                "eta_seconds": None if s.eta_seconds is None else round(s.eta_seconds, 1)}
        snapshots: dict[str, SnapshotStats] = {}
        if self.snapshots is not None:
            for name in doc.get("tables", {}):
                snapshots[name] = SnapshotStats(self.snapshots.age_seconds(name), self.snapshots.publish_seconds(name))
        failures = dict(self.hooks.failures)
        if self.notifier.failures:
            failures["sd_notify"] = self.notifier.failures
        self._sample = Sample(
            doc=doc, wipes=dict(self.thread.manager.wipes), commits=self.thread.manager.commits,
            callback_failures=self.thread.listeners.failures, hook_failures=failures,
            consumer_errors=self.thread.consumer_errors, restores=restores, snapshots=snapshots)
        return doc

    def _readiness(self, doc: dict[str, Any]) -> Readiness:
        return readiness(doc.get("state", State.CREATED.value),
                         {n: t.get("state", "") for n, t in doc.get("tables", {}).items()}, self.snapshots)

    def _live_readiness(self) -> Readiness:
        return readiness(self.thread.state.value, {n: rt.machine.state.value for n, rt in self.thread.tables.items()},
                         self.snapshots)

    def _status_line(self) -> str:
        restores = self.tracker.stats()
        tables = []
        for name, rt in self.thread.tables.items():
            s = restores.get(name)
            restoring = s is not None and s.active and rt.machine.state == State.RESTORING
            progress = f" {s.percent:.0f}%" if restoring and s is not None else ""
            tables.append(f"{name} {rt.machine.state.value}{progress}")
        return f"{self.thread.state.value} ({self.thread.machine.reason}); {', '.join(tables) or 'no tables open'}"

    def _notify(self) -> None:
        text = self._status_line()
        if self.thread.state == State.PENDING_SHUTDOWN:
            self.notifier.stopping(text)
        elif not self.notifier.ready_sent and self._live_readiness().ready:
            self.notifier.ready(text)
        else:
            self.notifier.status(text)

    def _on_state(self, new: State, old: State, reason: str) -> None:
        self._notify()

    def _on_table_state(self, table: str, new: State, old: State, reason: str) -> None:
        self._notify()

    def _after_poll(self) -> None:
        self.notifier.watchdog()
        now = time.monotonic()
        if self.notifier.enabled and now >= self._next_progress_status:
            self._next_progress_status = now + PROGRESS_STATUS_SECONDS
            if any(s.active for s in self.tracker.stats().values()):
                self.notifier.status(self._status_line())  # `systemctl status` shows the restore moving
        self._observe_commits()
        self.inbox.poll()
        if self.snapshots is not None and not self.notifier.ready_sent and self._live_readiness().ready:
            self.notifier.ready(self._status_line())

    def _observe_commits(self) -> None:
        commits = self.thread.manager.commits
        if commits != self._commits_seen:
            self._commits_seen = commits
            self.metrics.observe_commit(self.thread.manager.last_commit_seconds)

    # -- any thread -----------------------------------------------------------------------------------------

    def sample(self) -> Sample | None:
        return self._sample

    def status_doc(self) -> dict[str, Any] | None:
        s = self._sample
        return None if s is None else s.doc

    def _ages(self) -> tuple[float, float]:
        now = time.monotonic()
        return now - self.thread.last_loop, now - self.thread.last_progress

    def liveness(self) -> Liveness:
        loop_age, progress_age = self._ages()
        return liveness(self.thread.state.value, loop_age, progress_age)
