"""Publishes snapshots of every table from the daemon's loop thread, and serves exact-offset requests.

A snapshot is a RocksDB checkpoint of a RUNNING table taken between two polls, so it equals the fold of its topic
below the offsets in its manifest, which are read back from the checkpoint itself (a manifest never claims an
offset its snapshot does not hold); it appears by one rename and CURRENT moves by one rename. After a wipe, every
earlier snapshot is marked stale with the reason and CURRENT stays where it was until the rebuilt table is RUNNING
again; nothing is published from a table that is restoring, so readers never see a half-rebuilt table.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.config import Config, TableConfig
from globald.engine.state_manager import TableRuntime
from globald.engine.thread import GlobalThread
from globald.errors import ManifestError
from globald.snapshot import exact_requests as requests
from globald.snapshot import leases
from globald.snapshot import manifest as manifests
from globald.snapshot.builder import Builder, BuildRefused
from globald.snapshot.exact_requests import Code, Request, Response
from globald.snapshot.manifest import Manifest, Offsets, valid_id
from globald.snapshot.reader import current_id, find_exact, manifests_of
from globald.states import State
from globald.store.checkpoint_file import fsync_dir
from globald.store.names import (
    SNAPSHOT_BUILD_PREFIX,
    SNAPSHOT_CURRENT,
    SNAPSHOT_DB_DIR,
    SNAPSHOT_TMP_PREFIX,
    SNAPSHOT_TRASH_PREFIX,
    SNAPSHOTS_DIR,
    snapshots_dir,
)
from globald.store.reader import StoreReader

log = logging.getLogger(__name__)


@dataclass
class _Table:
    """What the publisher knows about one table's snapshots (guarded by the publisher's lock)."""

    config: TableConfig
    dir: Path
    current: Manifest | None = None
    published_offsets: Offsets | None = None  # offsets of the newest fresh periodic snapshot
    stale_reason: str | None = None
    wipes_seen: Counter[str] = field(default_factory=Counter)
    generation: int = 0  # bumped by every wipe; builds started in an older generation are discarded
    busy: set[str] = field(default_factory=set)  # snapshots a build is copying from
    published: int = 0
    exact_built: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    last_publish_s: float = 0.0
    last_error: str | None = None  # why the last periodic publish failed, until one succeeds
    unmarked: str | None = None  # a wipe's reason not yet written into every manifest (the disk refused)


@dataclass(frozen=True)
class _Job:
    table: str
    request: Request
    generation: int
    deadline: float


class SnapshotPublisher:
    def __init__(self, config: Config, thread: GlobalThread) -> None:
        self.config = config
        self.thread = thread
        self.interval = config.snapshots.interval_ms / 1000
        self.build_timeout = config.snapshots.build_timeout_ms / 1000
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._tables = {t.name: _Table(t, snapshots_dir(config.state_dir, t.name)) for t in config.tables}
        self._last_id: str | None = None
        self._next_publish = 0.0
        self._next_sweep = 0.0
        thread.after_poll.append(self.tick)
        thread.listeners.table_state.append(self._on_table_state)

    # -- lifecycle (daemon's main thread) ---------------------------------------------------------------------

    def start(self) -> None:
        """Sweep what a crash left behind, load each table's CURRENT, start the exact-build worker."""
        for ts in self._tables.values():
            try:
                (self.config.state_dir / SNAPSHOTS_DIR).mkdir(mode=0o700, exist_ok=True)
                ts.dir.mkdir(mode=0o700, exist_ok=True)
            except OSError as e:  # a full or failing disk: the first publish makes it once the disk heals
                log.warning("table %s: cannot create %s (%s); snapshots follow once the disk takes writes",
                            ts.config.name, ts.dir, e)
                continue
            for e in os.scandir(ts.dir):
                if e.name.startswith((SNAPSHOT_TMP_PREFIX, SNAPSHOT_BUILD_PREFIX, SNAPSHOT_TRASH_PREFIX)):
                    shutil.rmtree(e.path, ignore_errors=True)
            found = manifests_of(self.config.state_dir, ts.config.name)
            if found and (self._last_id is None or found[0].id > self._last_id):
                self._last_id = found[0].id
            cur = current_id(self.config.state_dir, ts.config.name)
            ts.current = next((m for m in found if m.id == cur), None)
            if ts.current is not None:
                ts.stale_reason = ts.current.stale_reason if ts.current.stale else None
                ts.published_offsets = None if ts.current.stale else ts.current.offsets
        self._worker = threading.Thread(target=self._work, name="globald-snapshots", daemon=True)
        self._worker.start()

    def close(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=30)

    # -- loop thread ------------------------------------------------------------------------------------------

    def tick(self) -> None:
        self._check_wipes()
        for ts in self._tables.values():
            self._write_stale_marks(ts)
            self._take_requests(ts)
        now = time.monotonic()
        if now >= self._next_publish and not self.thread.store_fault:  # the stores are being recovered
            self._next_publish = now + self.interval
            for rt in list(self.thread.tables.values()):
                if rt.machine.state == State.RUNNING:
                    ts = self._tables[rt.name]
                    self._try_publish(rt, ts)
        if now >= self._next_sweep:
            self._next_sweep = now + max(self.interval, 1.0)
            for ts in self._tables.values():
                self._gc(ts)

    def _try_publish(self, rt: TableRuntime, ts: _Table) -> None:
        """A failed publish (disk full, I/O error) leaves CURRENT as it was; the next interval tries again."""
        try:
            offsets = self._live_offsets(rt)
            if offsets is not None and (ts.stale_reason is not None or offsets != ts.published_offsets):
                self._publish_live(rt)
            ts.last_error = None
        except Exception as e:
            if ts.last_error is None:
                log.exception("table %s: snapshot publish failed; CURRENT stays at %s", rt.name,
                              ts.current.id if ts.current else None)
            ts.last_error = f"{type(e).__name__}: {e}"

    def _on_table_state(self, table: str, new: State, old: State, reason: str) -> None:
        if new == State.RESTORING:
            self._check_wipes()

    @staticmethod
    def _live_offsets(rt: TableRuntime) -> Offsets | None:
        """The live store's offsets, or None while they do not cover every partition (nothing to publish)."""
        stored = rt.store.offsets()
        return stored if set(stored) == set(rt.partitions) else None

    def _check_wipes(self) -> None:
        for (table, kind), n in list(self.thread.manager.wipes.items()):
            ts = self._tables.get(table)
            if ts is None or n <= ts.wipes_seen[kind]:
                continue
            ts.wipes_seen[kind] = n
            rt = self.thread.tables.get(table)
            detail = rt.machine.reason if rt is not None else "wiped"
            self._mark_stale(ts, f"table wiped ({kind}) and rebuilding: {detail}")

    def _mark_stale(self, ts: _Table, reason: str) -> None:
        with self._lock:
            ts.generation += 1
            ts.published_offsets = None
            ts.unmarked = reason
            if ts.current is not None:
                ts.current = ts.current.marked_stale(ts.current.stale_reason or reason)
                ts.stale_reason = ts.current.stale_reason
        log.warning("table %s: snapshots marked stale (%s); CURRENT stays at %s until the table is RUNNING again",
                    ts.config.name, reason, ts.current.id if ts.current else "nothing")
        self._write_stale_marks(ts)

    def _write_stale_marks(self, ts: _Table) -> None:
        """Write a wipe's stale mark into every manifest; on a refusing disk, again at every tick until done."""
        reason = ts.unmarked
        if reason is None:
            return
        with self._lock:
            try:
                for m in manifests_of(self.config.state_dir, ts.config.name):
                    if not m.stale:
                        manifests.write(ts.dir / m.id, m.marked_stale(reason))
            except OSError as e:
                if ts.last_error is None:
                    log.warning("table %s: cannot mark snapshots stale on disk yet (%s); retrying", ts.config.name, e)
                ts.last_error = f"marking stale: {e}"
                return
            ts.unmarked = None

    def _next_id(self) -> str:
        self._last_id = manifests.new_id(self._last_id)
        return self._last_id

    def _publish_live(self, rt: TableRuntime) -> Manifest:
        """Checkpoint the live store (loop thread only: the store is not thread-safe) and make it CURRENT."""
        ts = self._tables[rt.name]
        with self._lock:
            started = time.perf_counter()
            sid = self._next_id()
            tmp = ts.dir / f"{SNAPSHOT_TMP_PREFIX}{sid}"
            ts.dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # start() could not make it on a full disk
            tmp.mkdir(mode=0o700)
            try:
                records = rt.store.estimate_keys()
                rt.store.checkpoint(tmp / SNAPSHOT_DB_DIR)
                with StoreReader(tmp / SNAPSHOT_DB_DIR) as copy:
                    offsets = copy.offsets()
                if set(offsets) != set(rt.partitions):
                    raise ManifestError(f"checkpoint holds offsets {offsets}, not of every partition {rt.partitions}")
                m = Manifest(table=rt.name, topic=rt.topic, id=sid, offsets=dict(offsets), created=time.time(),
                             daemon_state=self.thread.state.value, table_state=rt.machine.state.value,
                             records=records)
                manifests.write(tmp, m)
                os.rename(tmp, ts.dir / sid)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            pointer = ts.dir / SNAPSHOT_CURRENT
            tmp_pointer = ts.dir / f"{SNAPSHOT_TMP_PREFIX}{SNAPSHOT_CURRENT}"
            tmp_pointer.write_text(sid + "\n", encoding="ascii")
            os.replace(tmp_pointer, pointer)
            fsync_dir(ts.dir)
            if ts.stale_reason is not None:
                log.info("table %s: fresh snapshot %s replaces stale %s", rt.name, sid,
                         ts.current.id if ts.current else None)
            ts.current, ts.published_offsets, ts.stale_reason = m, dict(offsets), None
            ts.published += 1
            ts.last_publish_s = time.perf_counter() - started
        self._gc(ts)
        return m

    def _take_requests(self, ts: _Table) -> None:
        for item in requests.take_pending(self.config.state_dir, ts.config.name):
            try:
                if isinstance(item, Response):
                    self._answer(ts, item)
                else:
                    self._admit(ts, item)
            except Exception as e:  # never leave a reader waiting: answer, log, go on with the next request
                log.exception("table %s: snapshot request failed", ts.config.name)
                self._answer(ts, Response(item.request if isinstance(item, Response) else item.id, Code.FAILED,
                                          f"{type(e).__name__}: {e}"))

    def _admit(self, ts: _Table, req: Request) -> None:
        rt = self.thread.tables.get(ts.config.name)
        if rt is None or rt.machine.state != State.RUNNING:
            state = rt.machine.state.value if rt else "CREATED"
            reason = rt.machine.reason if rt else "not started"
            self._answer(ts, Response(req.id, Code.REBUILDING,
                                      f"table {ts.config.name} is {state} ({reason}); ask again once it is RUNNING"))
            return
        if set(req.offsets) != set(rt.partitions):
            self._answer(ts, Response(req.id, Code.INVALID, f"offsets name partitions {sorted(req.offsets)}, "
                                                            f"topic {rt.topic} has {sorted(rt.partitions)}"))
            return
        found = find_exact(self.config.state_dir, ts.config.name, req.offsets)
        live = self._live_offsets(rt)
        if found is None and live == req.offsets:
            found = self._publish_live(rt)
            if found.offsets != req.offsets:  # the loop thread publishes: nothing can move between, but be sure
                found = None
        if found is not None:
            self._ready(ts, req, found)
            return
        if live is not None and live != ts.published_offsets and all(live[p] <= o for p, o in req.offsets.items()):
            self._publish_live(rt)  # the closest possible base: the build reads only what is still ahead
        self._jobs.put(_Job(ts.config.name, req, ts.generation, time.monotonic() + self.build_timeout))

    def _ready(self, ts: _Table, req: Request, m: Manifest) -> None:
        # The daemon pins the snapshot for the reader until the reader's own lease takes over.
        leases.take(ts.dir, f"req-{req.id}", m.id, req.lease_s)
        self._answer(ts, Response(req.id, Code.READY, f"snapshot {m.id} at the requested offsets", m.id))

    def _answer(self, ts: _Table, resp: Response) -> None:
        if not resp.ok:
            with self._lock:
                ts.refused[resp.code.value] += 1
            log.info("table %s: snapshot request %s refused: %s: %s", ts.config.name, resp.request, resp.code.value,
                     resp.message)
        requests.respond(self.config.state_dir, ts.config.name, resp)

    def _gc(self, ts: _Table) -> None:
        """Retention: newest K valid snapshots, CURRENT, leased and busy ones stay; everything else goes."""
        with self._lock:
            now = time.time()
            found, leased = [], leases.read_all(ts.dir)[0]
            keep = leases.pinned(leased, now) | ts.busy | ({ts.current.id} if ts.current else set())
            doomed = []
            for e in os.scandir(ts.dir):
                if not valid_id(e.name):
                    continue
                try:
                    manifests.read(Path(e.path), ts.config.name)
                    found.append(e.name)
                except ManifestError as err:
                    log.warning("table %s: deleting snapshot %s: %s", ts.config.name, e.name, err)
                    if e.name not in ts.busy:
                        doomed.append(e.name)
            doomed += leases.doomed(found, self.config.snapshots.retain, keep)
            for sid in doomed:
                trash = ts.dir / f"{SNAPSHOT_TRASH_PREFIX}{sid}"
                try:
                    os.rename(ts.dir / sid, trash)  # one rename: readers never see a half-deleted snapshot
                except OSError:
                    continue
                shutil.rmtree(trash, ignore_errors=True)
        leases.sweep(ts.dir, now)
        requests.sweep_responses(self.config.state_dir, ts.config.name, now)

    # -- exact builds (worker thread) ---------------------------------------------------------------------------

    def _work(self) -> None:
        builder = Builder(self.config, self._stop)
        try:
            while not self._stop.is_set():
                try:
                    job = self._jobs.get(timeout=0.2)
                except queue.Empty:
                    continue
                self._serve(builder, job)
        finally:
            builder.close()
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                self._answer(self._tables[job.table], Response(job.request.id, Code.STOPPING, "the daemon is stopping"))

    def _serve(self, builder: Builder, job: _Job) -> None:
        ts = self._tables[job.table]
        try:
            m = self._build(builder, ts, job)
            self._ready(ts, job.request, m)
        except BuildRefused as e:
            self._answer(ts, Response(job.request.id, e.code, str(e)))
        except Exception as e:
            log.exception("table %s: exact snapshot build failed", job.table)
            self._answer(ts, Response(job.request.id, Code.FAILED, f"{type(e).__name__}: {e}"))

    def _build(self, builder: Builder, ts: _Table, job: _Job) -> Manifest:
        name, target = ts.config.name, job.request.offsets
        if job.generation != ts.generation:
            raise BuildRefused(Code.REBUILDING, f"table {name} was wiped after the request; it is rebuilding")
        done = find_exact(self.config.state_dir, name, target)
        if done is not None:  # an earlier request for the same offsets built it
            return done
        work = ts.dir / f"{SNAPSHOT_BUILD_PREFIX}{job.request.id}"
        with self._lock:
            candidates = [m for m in manifests_of(self.config.state_dir, name) if not m.stale
                          and set(m.offsets) == set(target) and all(m.offsets[p] <= o for p, o in target.items())]
            base = candidates[0] if candidates else None
            if base is not None:
                ts.busy.add(base.id)
        try:
            started = time.perf_counter()
            built = builder.build(ts.config, target, base.offsets if base else None,
                                  ts.dir / base.id if base else None, work, job.deadline)
            with self._lock:
                if job.generation != ts.generation:
                    raise BuildRefused(Code.REBUILDING, f"table {name} was wiped during the build; it is rebuilding")
                rt = self.thread.tables.get(name)
                sid = self._next_id()
                m = Manifest(table=name, topic=ts.config.topic, id=sid, offsets=dict(target), created=time.time(),
                             daemon_state=self.thread.state.value,
                             table_state=rt.machine.state.value if rt else State.RUNNING.value,
                             records=built.records, kind="exact", request=job.request.id)
                manifests.write(work, m)
                os.rename(work, ts.dir / sid)
                ts.exact_built += 1
            log.info("table %s: exact snapshot %s at %s built from %s with %d records in %.3fs", name, sid, target,
                     base.id if base else "the log start", built.consumed, time.perf_counter() - started)
            return m
        finally:
            with self._lock:
                if base is not None:
                    ts.busy.discard(base.id)
            shutil.rmtree(work, ignore_errors=True)

    # -- operations (globald.ops.health.SnapshotSource) -------------------------------------------------------

    def servable(self, table: str) -> bool:
        ts = self._tables[table]
        return ts.current is not None and (ts.stale_reason is None or self.config.snapshots.serve_stale)

    def age_seconds(self, table: str) -> float | None:
        cur = self._tables[table].current
        return None if cur is None else max(0.0, time.time() - cur.created)

    def publish_seconds(self, table: str) -> float | None:
        ts = self._tables[table]
        return ts.last_publish_s if ts.published else None

    # -- status -------------------------------------------------------------------------------------------------

    def annotate(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Add each table's snapshot state to a status document."""
        with self._lock:
            for name, ts in self._tables.items():
                t = doc.get("tables", {}).get(name)
                if t is None:
                    continue
                cur = ts.current
                t["snapshot"] = {
                    "current": cur.id if cur else None,
                    "offsets": manifests.offsets_to_json(cur.offsets) if cur else {},
                    "created": cur.created if cur else None,
                    "stale": ts.stale_reason is not None,
                    "stale_reason": ts.stale_reason,
                    "published": ts.published,
                    "exact_built": ts.exact_built,
                    "refused": dict(ts.refused),
                    "last_publish_ms": round(ts.last_publish_s * 1000, 3),
                    "last_error": ts.last_error,
                }
        return doc
