"""The request desk: exact-offset snapshot requests (``exact_requests``) admitted, checked for room, built and
answered.

Contract: every request taken is answered exactly once (READY with a snapshot id, or a refusal whose code says
why), even when handling it raised. Admission runs on the loop thread: a table that is not RUNNING is answered
REBUILDING, a request naming other partitions INVALID; a snapshot at the requested offsets (or the live store,
published at once when it is exactly there) is answered READY at once. Otherwise the live store is published first
when it is at or below the target (the closest possible base) and the build goes to the exact-build worker
(``exact_builds``), unless the state_dir lacks room for it after retention freed what it may: NO_ROOM, refused
before anything is written. A READY answer comes with a daemon lease ``req-<id>`` that holds the snapshot until the
reader's own lease takes over. Refusals are counted per code; NO_ROOM, which a disk that stays short answers to
every request, is logged at a bounded rate. The desk is the build worker's host (``exact_builds.BuildHost``):
``ready`` and ``answer`` run on either thread.
"""

from __future__ import annotations

import logging
import time

from globald.common import swallowed
from globald.common.states import State
from globald.common.waits import Deadline
from globald.engine.view import EngineView
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.snapshot import exact_requests as requests
from globald.snapshot import leases
from globald.snapshot.exact_builds import ExactBuilds, base_for, no_room
from globald.snapshot.exact_requests import Code, Request, Response
from globald.snapshot.manifest import Manifest
from globald.snapshot.publishing import Publishing
from globald.snapshot.reader import find_exact, manifests_of
from globald.snapshot.retention import Retention
from globald.snapshot.space import build_need
from globald.snapshot.table_state import SnapshotIds, SnapshotTable
from globald.store import space
from globald.store.space import mb

log = logging.getLogger(__name__)

NO_ROOM_EVERY_S = 60.0  # a build refused for room is logged at most this often per table (each one is counted)


class RequestDesk:
    def __init__(self, config: ConfigRef, engine: EngineView, tables: dict[str, SnapshotTable], ids: SnapshotIds,
                 publishing: Publishing, retention: Retention) -> None:
        self._config = config
        self.engine = engine
        self._tables = tables
        self._ids = ids
        self._publishing = publishing
        self._retention = retention
        self._builds = ExactBuilds(config, tables, self)

    @property
    def config(self) -> Config:
        """The config in force (a reload's build_timeout_ms holds for builds asked from then on)."""
        return self._config.now

    def start(self) -> None:
        self._builds.start()

    def close(self, joins: Deadline | None = None) -> None:
        self._builds.close(joins)

    def watch(self, now: float) -> None:
        """Replace a build worker stuck inside a client (loop thread, every tick; ``ExactBuilds.watch``)."""
        self._builds.watch(now)

    def build_workers_replaced(self) -> int:
        return self._builds.replaced

    def builds_generation(self) -> int | None:
        return self._builds.generation

    def take(self, tab: SnapshotTable) -> None:
        """Admit (or answer) every request waiting for ``tab`` (loop thread)."""
        for item in requests.take_pending(self.config.state_dir, tab.name):
            try:
                if isinstance(item, Response):
                    self.answer(tab, item)
                else:
                    self._admit(tab, item)
            except Exception as e:  # never leave a reader waiting: answer, log, go on with the next request
                swallowed.record("snapshot_request", e, log, "table %s: snapshot request failed", tab.name)
                self.answer(tab, Response(item.request if isinstance(item, Response) else item.id, Code.FAILED,
                                          f"{type(e).__name__}: {e}"))

    def _admit(self, tab: SnapshotTable, req: Request) -> None:
        rt = self.engine.table_view(tab.name)
        if rt is None or rt.state != State.RUNNING:
            state = rt.state.value if rt else "CREATED"
            reason = rt.reason if rt else "not started"
            self.answer(tab, Response(req.id, Code.REBUILDING,
                                      f"table {tab.name} is {state} ({reason}); ask again once it is RUNNING"))
            return
        if set(req.offsets) != set(rt.partitions):
            self.answer(tab, Response(req.id, Code.INVALID, f"offsets name partitions {sorted(req.offsets)}, "
                                                            f"topic {rt.topic} has {sorted(rt.partitions)}"))
            return
        found = find_exact(self.config.state_dir, tab.name, req.offsets)
        live = None if self.engine.store_fault else self._publishing.live_offsets(rt)
        if found is None and live == req.offsets:
            found = self._publishing.publish_live(rt)
            if found.offsets != req.offsets:  # the loop thread publishes: nothing can move between, but be sure
                found = None
        if found is not None:
            self.ready(tab, req, found)
            return
        if live is not None and live != tab.published_offsets and all(live[p] <= o for p, o in req.offsets.items()):
            self._publishing.publish_live(rt)  # the closest possible base: the build reads only what is still ahead
        short = self._room_for_build(tab, req)
        if short is not None:  # refused before anything is written: nothing half-built is left
            self.answer(tab, Response(req.id, Code.NO_ROOM, short))
            return
        timeout = self.config.snapshots.build_timeout_ms / 1000
        self._builds.submit(tab.name, req, tab.generation, time.monotonic() + timeout, rt.compaction_lag_ms)

    def _room_for_build(self, tab: SnapshotTable, req: Request) -> str | None:
        """None when the state_dir has room for building ``req`` (``snapshot.space.BuildNeed``), after freeing what
        globald may (leftovers, snapshots nobody holds beyond CURRENT and the build's base); else why not."""
        name = tab.name
        with tab.locked():
            found = manifests_of(self.config.state_dir, name)
            base = base_for(found, req.offsets)
            need = build_need(self.config.state_dir, name, req.offsets, base, tab.dir / base.id if base else None,
                              found[0].records if found else 0)
            free = space.free_bytes(self.config.state_dir)
            if free is None or free >= need.total:
                return None
            keep = {m.id for m in (tab.current, base) if m is not None}
            freed, deleted = self._retention.free(tab, need.total - free, [m.id for m in found], keep)
            free = space.free_bytes(self.config.state_dir) or 0
            if free >= need.total:
                log.info("table %s: freed %s (%d snapshots nobody held) for an exact build at %s", name, mb(freed),
                         deleted, req.offsets)
                return None
            return no_room(name, req.offsets, need, free, freed)

    # -- the build worker's host (exact_builds.BuildHost): loop thread and worker ---------------------------------

    def next_id(self) -> str:
        return self._ids.next()

    def manifest_states(self, table: str) -> tuple[str, str]:
        """The daemon's and ``table``'s state, as a manifest written now records them."""
        rt = self.engine.table_view(table)
        return self._publishing.daemon_state.value, rt.state.value if rt else State.RUNNING.value

    def ready(self, tab: SnapshotTable, req: Request, m: Manifest) -> None:
        # The daemon pins the snapshot for the reader until the reader's own lease takes over.
        leases.take(tab.dir, f"req-{req.id}", m.id, req.lease_s)
        self.answer(tab, Response(req.id, Code.READY, f"snapshot {m.id} at the requested offsets", m.id))

    def answer(self, tab: SnapshotTable, resp: Response) -> None:
        if not resp.ok:
            count, loud = tab.refusal(resp.code.value, NO_ROOM_EVERY_S, time.monotonic(), Code.NO_ROOM.value)
            if loud:
                log.log(logging.WARNING if resp.code == Code.NO_ROOM else logging.INFO,
                        "table %s: snapshot request %s refused: %s: %s (%d refused so far)", tab.name,
                        resp.request, resp.code.value, resp.message, count)
        try:
            requests.respond(self.config.state_dir, tab.name, resp)
        except OSError as e:  # a full or failing disk: the reader times out and may ask again once it heals
            swallowed.record("snapshot_reply", e, log, "table %s: no reply to %s: %s", tab.name, resp.request, e)
