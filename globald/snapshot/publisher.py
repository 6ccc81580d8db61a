"""Publishes snapshots of every table from the daemon's loop thread, and admits exact-offset requests: answered
at once from a snapshot at those offsets (or the live store when it is there), else built by ``exact_builds``.

A snapshot is a RocksDB checkpoint of a RUNNING table taken between two polls, so it equals the fold of its topic
below the offsets in its manifest, which are read back from the checkpoint itself (a manifest never claims an
offset its snapshot does not hold); it appears by one rename and CURRENT moves by one rename. After a wipe, every
earlier snapshot is marked stale with the reason and CURRENT stays where it was until the rebuilt table is RUNNING
again; nothing is published from a table that is restoring, so readers never see a half-rebuilt table.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from globald.common import swallowed
from globald.common.errors import ManifestError, ManifestIOError
from globald.common.states import State
from globald.engine.events import Event, StateChanged, Verified, Wiped
from globald.engine.view import EngineView, TableView
from globald.ops.status import SnapshotStatus
from globald.settings.config import Config, TableConfig
from globald.snapshot import exact_requests as requests
from globald.snapshot import leases, recreated
from globald.snapshot import manifest as manifests
from globald.snapshot.exact_builds import ExactBuilds, SnapshotTable, base_for, no_room
from globald.snapshot.exact_requests import Code, Request, Response
from globald.snapshot.manifest import Manifest, Offsets, valid_id
from globald.snapshot.reader import current_id, find_exact, manifests_of
from globald.snapshot.space import DiskGuard, build_need
from globald.store import durable, space
from globald.store.failures import out_of_space
from globald.store.names import (
    SNAPSHOT_CURRENT,
    SNAPSHOT_DB_DIR,
    SNAPSHOT_TMP_PREFIX,
    SNAPSHOT_TRASH_PREFIX,
    snapshots_dir,
)
from globald.store.space import mb

log = logging.getLogger(__name__)

NO_ROOM_EVERY_S = 60.0  # a build refused for room is logged at most this often per table (each one is counted)


class SnapshotPublisher:
    def __init__(self, config: Config, engine: EngineView) -> None:
        self.config = config
        self.engine = engine
        self._daemon_state = State.CREATED
        self.interval = config.snapshots.interval_ms / 1000
        self.build_timeout = config.snapshots.build_timeout_ms / 1000
        self._lock = threading.RLock()
        self._tables = {t.name: SnapshotTable(t, snapshots_dir(config.state_dir, t.name)) for t in config.tables}
        self._vouched: dict[str, tuple[Offsets, str | None]] = {}  # per table: what VERIFIED holds now
        self._builds = ExactBuilds(config, self._tables, self._lock, self)
        self._leases = {name: leases.LeaseClock(tab.dir) for name, tab in self._tables.items()}  # loop thread only
        self._last_id: str | None = None
        self._next_publish = 0.0
        self._next_sweep = 0.0
        self.disk = DiskGuard(config.state_dir, self.build_timeout)

    # -- lifecycle (daemon's main thread) ---------------------------------------------------------------------

    def reconfigure(self, config: Config) -> None:
        """A reload's [snapshots] settings, on the loop thread: the interval from the next publish, retention from
        the next sweep, build_timeout_ms for builds asked from now on (``service.reload``)."""
        self.config = config
        self.interval = config.snapshots.interval_ms / 1000
        self.build_timeout = config.snapshots.build_timeout_ms / 1000

    def add_table(self, tc: TableConfig) -> None:
        """A table a reload added (``snapshot.dropped`` cleared its directory first): published once RUNNING."""
        folder = snapshots_dir(self.config.state_dir, tc.name)
        durable.make_dirs(folder)  # raises on a failing disk: the reload is refused before anything changed
        with self._lock:
            self._tables[tc.name] = SnapshotTable(tc, folder)
            self._leases[tc.name] = leases.LeaseClock(folder)

    def drop_table(self, name: str) -> None:
        """A table a reload dropped: nothing more is published for it (its files are ``snapshot.dropped``'s)."""
        with self._lock:
            self._tables.pop(name, None)
            self._leases.pop(name, None)
            self._vouched.pop(name, None)

    def start(self) -> None:
        """Sweep what a crash left behind, load each table's CURRENT, start the exact-build worker."""
        for tab in self._tables.values():
            try:
                durable.make_dirs(tab.dir)
            except OSError as e:  # a full or failing disk: the first publish makes it once the disk heals
                log.warning("table %s: cannot create %s (%s); snapshots follow once the disk takes writes",
                            tab.config.name, tab.dir, e)
                continue
            space.remove_leftovers(tab.dir)  # what a crash left: nothing else runs yet
            found = manifests_of(self.config.state_dir, tab.config.name)
            if found and (self._last_id is None or found[0].id > self._last_id):
                self._last_id = found[0].id
            cur = current_id(self.config.state_dir, tab.config.name)
            tab.current = next((m for m in found if m.id == cur), None)
            if tab.current is not None and recreated.unverified(tab.current):  # a crash inside _keep_verified
                recreated.point_current(tab, None, {})
            if tab.current is not None:
                tab.stale_reason = tab.current.stale_reason if tab.current.stale else None
                tab.published_offsets = None if tab.current.stale else tab.current.offsets
        self._builds.start()

    def close(self) -> None:
        self._builds.close()

    # -- loop thread ------------------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        match event:
            case Verified():
                tab = self._tables.get(event.table)
                if tab is not None:
                    with self._lock:
                        tab.fingerprints = dict(event.fingerprints)
                        self._vouch(tab, dict(event.offsets))
            case Wiped():
                tab = self._tables.get(event.table)
                if tab is not None:
                    reason = f"table wiped ({event.kind}) and rebuilding: {event.reason}"
                    with self._lock:  # no exact build may publish between the two (it checks the generation)
                        if event.verified is not None:
                            self._keep_verified(tab, dict(event.verified), reason)
                        self._vouched.pop(tab.config.name, None)
                        recreated.forget_vouched(tab)
                        self._mark_stale(tab, reason)
            case StateChanged(table=None):
                self._daemon_state = event.new

    def tick(self) -> None:
        for tab in self._tables.values():
            self._write_stale_marks(tab)
            self._take_requests(tab)
        now = time.monotonic()
        if now >= self._next_publish and not self.engine.store_fault:  # the stores are being recovered
            self._next_publish = now + self.interval
            for table in self.engine.table_views():
                if table.state == State.RUNNING:
                    self._try_publish(table, self._tables[table.name])
        if now >= self._next_sweep:
            self._next_sweep = now + max(self.interval, 1.0)
            for tab in self._tables.values():
                self._gc(tab)

    def _try_publish(self, rt: TableView, tab: SnapshotTable) -> None:
        """A failed publish (disk full, I/O error) leaves CURRENT as it was; the next interval tries again."""
        try:
            offsets = self._live_offsets(rt)
            cur = tab.current.id if tab.current else None
            if offsets is not None and (tab.stale_reason is not None or offsets != tab.published_offsets
                                        or self.disk.republish(rt.name, cur)):
                self._publish_live(rt)
            tab.last_error, tab.short_of_space = None, False
        except Exception as e:  # counted; a repeat logged at a bounded rate; a bug shows in status
            swallowed.record("snapshot_publish", e, log, "table %s: snapshot publish failed; CURRENT stays at %s",
                             rt.name, tab.current.id if tab.current else None)
            tab.last_error, tab.short_of_space = f"{type(e).__name__}: {e}", out_of_space(e)

    def _mark_stale(self, tab: SnapshotTable, reason: str) -> None:
        with self._lock:
            tab.generation += 1
            tab.published_offsets = None
            tab.unmarked = reason
            if tab.current is not None:
                tab.current = tab.current.marked_stale(tab.current.stale_reason or reason)
                tab.stale_reason = tab.current.stale_reason
        log.warning("table %s: snapshots marked stale (%s); CURRENT stays at %s until the table is RUNNING again",
                    tab.config.name, reason, tab.current.id if tab.current else "nothing")
        self._write_stale_marks(tab)

    def _vouch(self, tab: SnapshotTable, shown: Offsets) -> None:
        """Persist what a check showed, with the snapshots it vouches for (``recreated.vouch``), when it changed."""
        name = tab.config.name
        key = (shown, tab.current.id if tab.current else None)  # what it vouches for moves with CURRENT
        try:
            if self._vouched.get(name) != key:
                recreated.vouch(self.config.state_dir, tab, shown)
                self._vouched[name] = key
        except OSError as e:  # a full or failing disk: the next check writes it again
            swallowed.record("snapshot_vouch", e, log, "table %s: cannot persist the verified offsets: %s", name, e)

    def _keep_verified(self, tab: SnapshotTable, shown: Offsets, why: str) -> None:
        """Snapshots past the offsets last shown to be of the table's topic go (``recreated.keep_verified``)."""
        with self._lock:
            tab.fingerprints = {}
            held = self._leases[tab.config.name].refresh() | tab.busy
            recreated.keep_verified(self.config.state_dir, tab, shown, why, held)

    def _write_stale_marks(self, tab: SnapshotTable) -> None:
        """Write a wipe's stale mark into every manifest; on a refusing disk, again at every tick until done."""
        reason = tab.unmarked
        if reason is None:
            return
        with self._lock:
            try:
                for m in manifests_of(self.config.state_dir, tab.config.name):
                    if not m.stale:
                        manifests.write(tab.dir / m.id, m.marked_stale(reason))
            except OSError as e:
                swallowed.record("snapshot_stale_mark", e, log, "table %s: cannot mark snapshots stale on disk yet "
                                 "(%s); retrying", tab.config.name, e)
                tab.last_error, tab.short_of_space = f"marking stale: {e}", out_of_space(e)
                return
            tab.unmarked = None

    def next_id(self) -> str:
        self._last_id = manifests.new_id(self._last_id)
        return self._last_id

    def _live_offsets(self, rt: TableView) -> Offsets | None:
        """The offsets the live store holds now, which a checkpoint taken now holds too (this is the loop thread,
        between two polls); None while they do not cover every partition. Not the last commit's: a checkpoint is
        durable by itself, and waiting for the commit kept a refresh waiting up to commit_interval_ms for a build."""
        stored = self.engine.live_offsets(rt.name)
        return stored if set(stored) == set(rt.partitions) else None

    def _publish_live(self, rt: TableView) -> Manifest:
        """Checkpoint the live store (loop thread only: the store is not thread-safe) and make it CURRENT."""
        tab = self._tables[rt.name]
        with self._lock:
            started = time.perf_counter()
            sid = self.next_id()
            tmp = tab.dir / f"{SNAPSHOT_TMP_PREFIX}{sid}"
            if not tab.dir.is_dir():  # start() could not make it on a full disk
                durable.make_dirs(tab.dir)
            tmp.mkdir(mode=0o700)
            try:
                taken = self.engine.checkpoint(rt.name, tmp / SNAPSHOT_DB_DIR)
                offsets = taken.offsets
                # RocksDB's copies and links (not all of them synced) are on disk before a manifest names them.
                durable.sync_tree(tmp, synced_suffixes=(".sst",))
                if set(offsets) != set(rt.partitions):
                    raise ManifestError(f"checkpoint holds offsets {offsets}, "
                                        f"not of every partition {list(rt.partitions)}")
                m = Manifest(table=rt.name, topic=rt.topic, id=sid, offsets=dict(offsets), created=time.time(),
                             daemon_state=self._daemon_state.value, table_state=rt.state.value,
                             records=taken.records)
                manifests.write(tmp, m)
                durable.rename(tmp, tab.dir / sid)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            durable.replace_file(tab.dir / SNAPSHOT_CURRENT, sid + "\n")
            if tab.stale_reason is not None:
                log.info("table %s: fresh snapshot %s replaces stale %s", rt.name, sid,
                         tab.current.id if tab.current else None)
            tab.current, tab.published_offsets, tab.stale_reason = m, dict(offsets), None
            tab.published += 1
            tab.last_publish_s = time.perf_counter() - started
        self._gc(tab)
        return m

    def _take_requests(self, tab: SnapshotTable) -> None:
        for item in requests.take_pending(self.config.state_dir, tab.config.name):
            try:
                if isinstance(item, Response):
                    self.answer(tab, item)
                else:
                    self._admit(tab, item)
            except Exception as e:  # never leave a reader waiting: answer, log, go on with the next request
                swallowed.record("snapshot_request", e, log, "table %s: snapshot request failed", tab.config.name)
                self.answer(tab, Response(item.request if isinstance(item, Response) else item.id, Code.FAILED,
                                          f"{type(e).__name__}: {e}"))

    def _admit(self, tab: SnapshotTable, req: Request) -> None:
        rt = self.engine.table_view(tab.config.name)
        if rt is None or rt.state != State.RUNNING:
            state = rt.state.value if rt else "CREATED"
            reason = rt.reason if rt else "not started"
            self.answer(tab, Response(req.id, Code.REBUILDING,
                                      f"table {tab.config.name} is {state} ({reason}); ask again once it is RUNNING"))
            return
        if set(req.offsets) != set(rt.partitions):
            self.answer(tab, Response(req.id, Code.INVALID, f"offsets name partitions {sorted(req.offsets)}, "
                                                            f"topic {rt.topic} has {sorted(rt.partitions)}"))
            return
        found = find_exact(self.config.state_dir, tab.config.name, req.offsets)
        live = None if self.engine.store_fault else self._live_offsets(rt)
        if found is None and live == req.offsets:
            found = self._publish_live(rt)
            if found.offsets != req.offsets:  # the loop thread publishes: nothing can move between, but be sure
                found = None
        if found is not None:
            self.ready(tab, req, found)
            return
        if live is not None and live != tab.published_offsets and all(live[p] <= o for p, o in req.offsets.items()):
            self._publish_live(rt)  # the closest possible base: the build reads only what is still ahead
        short = self._room_for_build(tab, req)
        if short is not None:  # refused before anything is written: nothing half-built is left
            self.answer(tab, Response(req.id, Code.NO_ROOM, short))
            return
        self._builds.submit(tab.config.name, req, tab.generation, time.monotonic() + self.build_timeout)

    def _room_for_build(self, tab: SnapshotTable, req: Request) -> str | None:
        """None when the state_dir has room for building ``req`` (``snapshot.space.BuildNeed``), after freeing what
        globald may (leftovers, snapshots nobody holds beyond CURRENT and the build's base); else why not."""
        name = tab.config.name
        with self._lock:
            found = manifests_of(self.config.state_dir, name)
            base = base_for(found, req.offsets)
            need = build_need(self.config.state_dir, name, req.offsets, base, tab.dir / base.id if base else None,
                              found[0].records if found else 0)
            free = space.free_bytes(self.config.state_dir)
            if free is None or free >= need.total:
                return None
            keep = self._leases[name].refresh() | tab.busy | {m.id for m in (tab.current, base) if m is not None}
            freed, doomed = self.disk.room_for_build(name, tab.dir, need.total - free, [m.id for m in found], keep)
            for sid in doomed:
                with contextlib.suppress(OSError):
                    durable.remove_tree(tab.dir / sid, tab.dir / f"{SNAPSHOT_TRASH_PREFIX}{sid}")
            free = space.free_bytes(self.config.state_dir) or 0
            if free >= need.total:
                log.info("table %s: freed %s (%d snapshots nobody held) for an exact build at %s", name, mb(freed),
                         len(doomed), req.offsets)
                return None
            return no_room(name, req.offsets, need, free, freed)

    # -- answers (loop thread, and the exact-build worker: exact_builds.BuildHost) --------------------------------

    def manifest_states(self, table: str) -> tuple[str, str]:
        """The daemon's and ``table``'s state, as a manifest written now records them."""
        rt = self.engine.table_view(table)
        return self._daemon_state.value, rt.state.value if rt else State.RUNNING.value

    def ready(self, tab: SnapshotTable, req: Request, m: Manifest) -> None:
        # The daemon pins the snapshot for the reader until the reader's own lease takes over.
        leases.take(tab.dir, f"req-{req.id}", m.id, req.lease_s)
        self.answer(tab, Response(req.id, Code.READY, f"snapshot {m.id} at the requested offsets", m.id))

    def answer(self, tab: SnapshotTable, resp: Response) -> None:
        if not resp.ok:
            with self._lock:
                tab.refused[resp.code.value] += 1
                # A disk that stays short refuses every request alike: said at a bounded rate (all are counted).
                loud = resp.code != Code.NO_ROOM or time.monotonic() >= tab.no_room_said + NO_ROOM_EVERY_S
                if loud and resp.code == Code.NO_ROOM:
                    tab.no_room_said = time.monotonic()
            if loud:
                log.log(logging.WARNING if resp.code == Code.NO_ROOM else logging.INFO,
                        "table %s: snapshot request %s refused: %s: %s (%d refused so far)", tab.config.name,
                        resp.request, resp.code.value, resp.message, tab.refused[resp.code.value])
        try:
            requests.respond(self.config.state_dir, tab.config.name, resp)
        except OSError as e:  # a full or failing disk: the reader times out and may ask again once it heals
            swallowed.record("snapshot_reply", e, log, "table %s: no reply to %s: %s", tab.config.name, resp.request, e)

    def _gc(self, tab: SnapshotTable) -> None:
        """Retention: newest K valid snapshots, CURRENT, leased and busy ones stay; everything else goes."""
        with self._lock:
            found: list[str] = []
            held, cur = self._leases[tab.config.name].refresh() | tab.busy, tab.current.id if tab.current else None
            keep = held | ({cur} if cur else set())
            doomed = []
            for e in os.scandir(tab.dir):
                if not valid_id(e.name):
                    continue
                try:
                    m = manifests.read(Path(e.path), tab.config.name)
                    found.append(e.name)
                    if recreated.unverified(m) and e.name not in keep:  # may mix two topics: kept only while held
                        doomed.append(e.name)
                except ManifestIOError as err:  # kept, and not counted towards retention: read again next sweep
                    log.warning("table %s: keeping snapshot %s for now: %s", tab.config.name, e.name, err)
                except ManifestError as err:
                    if e.name in keep:  # a leased or CURRENT snapshot is never deleted by the sweep
                        log.warning("table %s: snapshot %s is pinned but its manifest is invalid: %s",
                                    tab.config.name, e.name, err)
                        continue
                    log.warning("table %s: deleting snapshot %s: %s", tab.config.name, e.name, err)
                    doomed.append(e.name)
            doomed += [i for i in leases.doomed(found, self.config.snapshots.retain, keep) if i not in doomed]
            # A disk short of room for the next step: all but CURRENT and the held go.
            short = self.disk.doomed(tab.config.name, tab.dir, found, held, cur, tab.short_of_space)
            doomed += [i for i in short if i not in doomed]
            for sid in doomed:
                with contextlib.suppress(OSError):  # kept for now: the next sweep tries again
                    # One durable rename first: readers, even after a power loss, never see a half-deleted snapshot.
                    durable.remove_tree(tab.dir / sid, tab.dir / f"{SNAPSHOT_TRASH_PREFIX}{sid}")
        self._leases[tab.config.name].sweep()
        requests.sweep_responses(self.config.state_dir, tab.config.name, time.time())

    # -- operations (globald.ops.health.SnapshotSource) -------------------------------------------------------

    def servable(self, table: str) -> bool:
        tab = self._tables[table]
        return tab.current is not None and (tab.stale_reason is None or self.config.snapshots.serve_stale)

    def age_seconds(self, table: str) -> float | None:
        cur = self._tables[table].current
        return None if cur is None else max(0.0, time.time() - cur.created)

    def publish_seconds(self, table: str) -> float | None:
        tab = self._tables[table]
        return tab.last_publish_s if tab.published else None

    # -- status -------------------------------------------------------------------------------------------------

    def status(self, table: str) -> SnapshotStatus:
        with self._lock:
            tab = self._tables[table]
            cur = tab.current
            return SnapshotStatus(
                current=cur.id if cur else None, offsets=dict(cur.offsets) if cur else {},
                created=cur.created if cur else None, stale=tab.stale_reason is not None,
                stale_reason=tab.stale_reason, published=tab.published, exact_built=tab.exact_built,
                refused=dict(tab.refused), last_publish_ms=tab.last_publish_s * 1000, last_error=tab.last_error)

