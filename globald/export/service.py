"""The daemon's exporter: the loop picks a table's newest verified snapshot and leases it; a worker thread of its
own uploads it (``exporter``) and applies retention (``retention``); status and metrics read what it did.

Only a snapshot the engine's identity checks vouch for is exported: one that is not stale, was taken after the
table's last wipe, and lies at or below, in every partition, the offsets a check last showed to hold the table's
topic's records (``engine.events.Verified``). The lease (``snapshot.leases``) keeps retention from deleting the
snapshot while it uploads. The loop never waits on the storage: it only hands over a snapshot id.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.common import swallowed
from globald.common.requests import EXPORT, OperatorRequest
from globald.common.states import State
from globald.common.waits import Deadline
from globald.engine.events import Event, StateChanged, TableAdded, TableDropped, Verified, Wiped
from globald.engine.view import EngineView
from globald.export import retention
from globald.export.bootstrap import Origin
from globald.export.exporter import Exported, ExportStopped, export_snapshot
from globald.export.refill import ExportRefills
from globald.export.target import Target, TargetError, masked
from globald.settings.config import ExportConfig
from globald.settings.ref import ConfigRef
from globald.snapshot import leases
from globald.snapshot.manifest import Manifest
from globald.snapshot.reader import manifests_of
from globald.snapshot.recreated import within
from globald.store.layout import offsets_to_json
from globald.store.names import snapshots_dir

log = logging.getLogger(__name__)

LEASE_S = 6 * 3600.0  # an upload holds its snapshot at most this long (released as soon as it ends)
LOOK_S = 1.0
REQUEST_WAIT_S = 600.0  # `globald export` waits this long at most for a verified snapshot to export
_STOP_JOIN_S = 1.0
_WATCH_S = 0.2  # how often the worker looks at its upload's bound and at the stop


class _GivenUp(Exception):
    """An export not written within ``[export] upload_timeout_s``: the storage took the upload and did not answer.
    Check the storage and the network; the daemon keeps serving and the next interval tries again."""


class ExportRequest(OperatorRequest):
    """One `globald export`, handed over by the operator inbox; settled once a manifest is written or it failed.
    Settled from the worker (or the loop), read from the loop."""

    action = EXPORT
    stopped = "the daemon stopped before the export; nothing was exported"

    def __init__(self, table: str, detail: str) -> None:
        super().__init__(table, detail)
        self.asked = time.monotonic()

    def failure(self) -> str:
        # As the inbox has always answered a failed table request, in a reset's words (to reword apart).
        return f"the wipe of table {self.table} failed: {self.error}"


@dataclass
class _Job:
    table: str
    snapshot: Manifest
    requests: list[ExportRequest]


def exportable(found: Iterable[Manifest], shown: dict[int, int], wiped_at: float) -> Manifest | None:
    """The newest of ``found`` (newest first) an export may take: fresh, taken after the last wipe, at offsets last
    shown to be of the topic. Never an exact build of a versioned table: built on request at past offsets, its
    ``created`` is not when those offsets were the log end, and a bootstrap dates the export's tail from it
    (``store.gaps.since_after_gap``): it would keep a ``since`` the tail cannot prove."""
    for m in found:
        if m.stale or m.created <= wiped_at or not set(m.offsets) <= set(shown) or not within(m.offsets, shown):
            continue
        if m.kind == "exact" and m.history_ms is not None:
            continue
        return m
    return None


@dataclass
class _Table:
    shown: dict[int, int] | None = None  # offsets last shown to be of the topic (None: none since the last wipe)
    wiped_at: float = 0.0  # wall clock of the last wipe: snapshots taken before it are never exported
    next_at: float = 0.0  # monotonic: when the next periodic export is due
    next_look: float = 0.0  # monotonic: snapshots are looked through at most once a LOOK_S (they are read from disk)
    busy: bool = False
    last_snapshot: str | None = None
    waiting: list[ExportRequest] = field(default_factory=list)
    exports: int = 0
    failures: int = 0
    last: dict[str, Any] | None = None
    uploaded_total: int = 0
    last_error: str | None = None
    origin: Origin | None = None


class ExportService:
    def __init__(self, config: ConfigRef, engine: EngineView) -> None:
        now = config.now
        assert now.export is not None
        self.state_dir = now.state_dir  # state_dir and [export] need a restart
        self.export: ExportConfig = now.export
        self.engine = engine
        # Each table's export schedule, origin and waiting requests: this part's state, not which tables exist (the
        # engine's TableSet), made on TableAdded and forgotten on TableDropped.
        self._tables = {t.name: _Table() for t in now.tables}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._done: queue.Queue[tuple[str, dict[str, Any] | None, str | None]] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # status reads the tables from the HTTP thread
        self._worker = threading.Thread(target=self._work, name="globald-export", daemon=True)
        self._looked_at_start: dict[str, bool] = {}
        # A store a wipe empties while the daemon runs starts again from an export too (``engine.refill``).
        self.refills = ExportRefills(config, self._set_origin, lambda t: self._looked_at_start.get(t, False)) \
            if self.export.bootstrap else None

    # -- lifecycle (main thread) --------------------------------------------------------------------------------

    def start(self, origins: dict[str, Origin]) -> None:
        for name, origin in origins.items():
            self._tables[name].origin = origin
            self._looked_at_start[name] = origin.kind != "store"
        first = time.monotonic() + (self.export.interval_s if self.export.interval_s else 0)
        for name, tab in self._tables.items():
            tab.next_at = first
            with contextlib.suppress(OSError):  # left by a daemon killed mid-upload: it would pin for LEASE_S
                leases.release(snapshots_dir(self.state_dir, name), self._lease_holder(name))
        self._worker.start()

    def close(self, joins: Deadline | None = None) -> None:
        """A stop: the worker's end waited for ``_STOP_JOIN_S`` at most (what is left of ``joins``, a stop's shared
        bound); an upload blocked in the storage is abandoned: no manifest was written."""
        self._stop.set()
        self._jobs.put(None)
        self._worker.join((joins or Deadline(_STOP_JOIN_S)).left(_STOP_JOIN_S))
        for name, tab in self._tables.items():
            if tab.busy:
                with contextlib.suppress(OSError):
                    leases.release(snapshots_dir(self.state_dir, name), self._lease_holder(name))
            for r in tab.waiting:
                r.settle(r.stopped)
            tab.waiting = []

    # -- loop thread --------------------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        match event:
            case TableAdded(table=name):
                self._added(name)
            case TableDropped(table=name):
                self._dropped(name)
            case Verified(table=name) if name in self._tables:
                self._tables[name].shown = dict(event.offsets)
            case Wiped(table=name) if name in self._tables:
                tab = self._tables[name]
                tab.shown, tab.wiped_at, tab.next_at = None, time.time(), 0.0  # export again once rebuilt
                with self._lock:  # until a refill (``refills``) looks for an export, when it does
                    tab.origin = Origin("topic", fallback=f"wiped ({event.kind}): restored from the topic")
            case StateChanged(table=str() as name, new=State.RUNNING) if name in self._tables:
                tab = self._tables[name]
                if tab.origin is not None and tab.origin.kind == "export" and tab.origin.tail is None:
                    live = self.engine.live_offsets(name)
                    with self._lock:
                        tab.origin.tail = sum(max(0, o - tab.origin.offsets.get(p, 0)) for p, o in live.items())

    def _added(self, name: str) -> None:
        """A table a reload added (``TableAdded``, before its store opens): exported like the others, from its first
        verified snapshot; its store, empty, starts from an export when one is usable (``refills``, as at a first
        start)."""
        with self._lock:
            self._tables[name] = _Table(next_at=time.monotonic() + self.export.interval_s)
        self._looked_at_start[name] = False

    def _dropped(self, name: str) -> None:
        """A table a reload dropped (``TableDropped``): no more exports of it; those in its storage stay."""
        with self._lock:
            tab = self._tables.pop(name, None)
        self._looked_at_start.pop(name, None)
        if self.refills is not None:
            self.refills.cancel(name)
        for r in tab.waiting if tab is not None else ():
            r.settle(f"table {name} was dropped by a reload; nothing was exported")

    def request(self, table: str, detail: str) -> ExportRequest:
        """A `globald export` (operator inbox, loop thread): exported at the next tick that finds a verified
        snapshot, within REQUEST_WAIT_S."""
        r = ExportRequest(table, detail)
        log.info("table %s: export %s", table, detail)
        self._tables[table].waiting.append(r)
        return r

    def tick(self) -> None:
        while not self._done.empty():
            self._finished(*self._done.get_nowait())
        now = time.monotonic()
        for name, tab in self._tables.items():
            if tab.busy:
                continue
            periodic = self.export.interval_s > 0 and now >= tab.next_at
            if not (periodic or tab.waiting) or now < tab.next_look:
                continue
            tab.next_look = now + LOOK_S
            snap = self._verified_snapshot(name, tab)
            if snap is None or (not tab.waiting and snap.id == tab.last_snapshot):
                for r in [r for r in tab.waiting if now - r.asked > REQUEST_WAIT_S]:
                    r.settle(f"no verified snapshot of table {name} within {REQUEST_WAIT_S:.0f}s; is it RUNNING?")
                tab.waiting = [r for r in tab.waiting if not r.settled]
                continue
            try:  # pinned before the worker sees it: retention runs on this thread, so nothing deletes it between
                leases.take(snapshots_dir(self.state_dir, name), self._lease_holder(name), snap.id, LEASE_S)
            except OSError as e:
                swallowed.record("export_lease", e, log, "table %s: cannot lease snapshot %s for its export: %s",
                                 name, snap.id, e)
                continue
            tab.busy, tab.next_at = True, now + self.export.interval_s
            self._jobs.put(_Job(name, snap, tab.waiting))
            tab.waiting = []

    def _verified_snapshot(self, name: str, tab: _Table) -> Manifest | None:
        if tab.shown is None:
            return None
        return exportable(manifests_of(self.state_dir, name), tab.shown, tab.wiped_at)

    @staticmethod
    def _lease_holder(table: str) -> str:
        """One name per table: one daemon owns the state_dir, so a lease a killed daemon left is its own to drop."""
        return f"globald-export-{table}"[:128]

    def _finished(self, table: str, last: dict[str, Any] | None, error: str | None) -> None:
        tab = self._tables.get(table)
        if tab is None:  # dropped by a reload while it uploaded
            return
        with self._lock:
            tab.busy = False
            if last is not None:
                tab.exports += 1
                tab.last, tab.last_snapshot, tab.last_error = last, last["snapshot"], None
                tab.uploaded_total += last["uploaded_bytes"]
            else:
                tab.failures += 1
                tab.last_error = error

    # -- worker thread ------------------------------------------------------------------------------------------

    def _work(self) -> None:
        target: Target | None = None
        while not self._stop.is_set():
            job = self._jobs.get()
            if job is None:
                return
            snap_dir = snapshots_dir(self.state_dir, job.table)
            try:
                if target is None:
                    target = Target(self.export.uri)
                done = self._bounded(target, snap_dir, job)
                m = done.manifest
                last = {"export": m.id, "snapshot": job.snapshot.id, "offsets": offsets_to_json(m.offsets),
                        "bytes": m.total_bytes, "uploaded_bytes": done.uploaded_bytes,
                        "shared_bytes": done.shared_bytes, "seconds": round(done.seconds, 3), "at": time.time()}
                log.info("table %s: exported snapshot %s as %s to %s: %d bytes uploaded, %d shared, %.1f s",
                         job.table, job.snapshot.id, m.id, target.shown, done.uploaded_bytes, done.shared_bytes,
                         done.seconds)
                for r in job.requests:
                    r.settle(None, export=m.id, uploaded_bytes=done.uploaded_bytes)
                self._done.put((job.table, last, None))
                self._retain(target, job.table)
            except ExportStopped:
                for r in job.requests:
                    r.settle("the daemon stopped during the export; no manifest was written")
                return
            except Exception as e:  # TargetError, a snapshot gone or damaged, a defect: counted, retried next time
                self._failed(job, e)
            finally:
                leases.release(snap_dir, self._lease_holder(job.table))

    def _failed(self, job: _Job, e: Exception) -> None:
        why = f"{type(e).__name__}: {e}"
        if not isinstance(e, TargetError | OSError | _GivenUp):
            swallowed.record("export", e, log, "table %s: export failed", job.table)
        else:
            log.warning("table %s: export of snapshot %s to %s failed: %s", job.table, job.snapshot.id,
                        masked(self.export.uri), why)
        for r in job.requests:
            r.settle(f"the export failed: {why}")
        self._done.put((job.table, None, why))

    def _bounded(self, target: Target, snap_dir: Path, job: _Job) -> Exported:
        """``export_snapshot`` in a thread of its own, given up past ``upload_timeout_s``: storage that takes the
        upload and never answers holds a storage call without end (the SDK retries its timeouts), which would hold
        this worker, and every table's exports, with nothing reported. Given up, the upload is told to stop (it
        ends at its next chunk, before its manifest, and deletes what it cut short) and abandoned; its files are
        named by no manifest unless it was already writing its manifest, whole, after every file. The next export
        shares ``target`` with it: a pyarrow filesystem may be used from several threads and Target keeps no state
        of its own, while a new S3 filesystem made while a call of another is in flight waited ~95 s (measured)."""
        stop = threading.Event()
        result: list[Exported | BaseException] = []

        def upload() -> None:
            try:
                result.append(export_snapshot(target, snap_dir / job.snapshot.id, job.snapshot, stop))
            except BaseException as e:  # handed to the worker, which reports it
                result.append(e)

        thread = threading.Thread(target=upload, name=f"globald-export-{job.table}"[:64], daemon=True)
        thread.start()
        deadline = time.monotonic() + self.export.upload_timeout_s
        while thread.is_alive():
            thread.join(_WATCH_S)
            if self._stop.is_set():
                stop.set()
                raise ExportStopped("stopping")
            if thread.is_alive() and time.monotonic() >= deadline:
                stop.set()
                raise _GivenUp(f"no answer from the export storage within upload_timeout_s = "
                               f"{self.export.upload_timeout_s}; given up, no manifest written (the next interval "
                               "tries again)")
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def _retain(self, target: Target, table: str) -> None:
        try:
            retention.apply(target, table, self.export.keep, self.export.grace_s)
        except (TargetError, OSError) as e:
            log.warning("table %s: export retention failed (the next export tries again): %s", table, e)

    # -- status (any thread) -------------------------------------------------------------------------------------

    def _set_origin(self, table: str, origin: Origin) -> None:
        with self._lock:
            self._tables[table].origin = origin

    def origin(self, table: str) -> dict[str, Any] | None:
        with self._lock:
            origin = self._tables[table].origin
            return None if origin is None else origin.to_json()

    def status(self, table: str) -> dict[str, Any]:
        with self._lock:
            tab = self._tables[table]
            return {"uri": masked(self.export.uri), "exports": tab.exports, "failures": tab.failures,
                    "uploaded_bytes_total": tab.uploaded_total, "last": dict(tab.last) if tab.last else None,
                    "last_error": tab.last_error, "busy": tab.busy}
