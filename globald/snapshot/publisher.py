"""The snapshot service the daemon runs: the one object the daemon, operations and status talk to (a facade).

Contract: ``start`` (main thread, before the loop) sweeps what a crash left behind, loads each table's CURRENT and
starts the exact-build worker; ``close`` stops it. On the loop thread, ``on_event`` takes the engine's events (a
reload's tables among them: ``TableAdded``, ``TableDropped``, ``TableRedeclared``), ``prepare`` makes the folders
of the tables a reload adds (``service.two_phase``), and ``tick`` runs, between two polls, the jobs it delegates:

- periodic publishing (``publishing``): a checkpoint of each RUNNING table's live store, made CURRENT; what a wipe
  or an identity check changes about the published snapshots;
- the request desk (``desk``): exact-offset requests admitted, checked for room, built by the worker
  (``exact_builds``) and answered;
- retention (``retention``): the snapshots kept (retain, CURRENT, leases, builds' bases) and room freed on a short
  disk (``space.DiskGuard``);
- the snapshots of dropped tables (``dropped``), deleted once no lease holds them.

Each table's snapshot state is a ``table_state.SnapshotTable``, which alone changes its fields under its own lock.
The reads for operations (``servable``, ``age_seconds``, ``publish_seconds``: ``ops.health.SnapshotSource``) and
``status`` may run on any thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from globald.common.waits import Deadline
from globald.engine.events import Event, StateChanged, TableAdded, TableDropped, TableRedeclared, Verified, Wiped
from globald.engine.view import EngineView
from globald.settings.changes import Delta
from globald.settings.config import Config, TableConfig
from globald.settings.ref import ConfigRef
from globald.snapshot import recreated
from globald.snapshot.desk import RequestDesk
from globald.snapshot.dropped import DroppedSnapshots
from globald.snapshot.publishing import Publishing
from globald.snapshot.reader import current_id, manifests_of
from globald.snapshot.retention import Retention
from globald.snapshot.space import DiskGuard
from globald.snapshot.table_state import SnapshotIds, SnapshotTable
from globald.status.document import SnapshotStatus
from globald.store import durable, space
from globald.store.names import snapshots_dir

log = logging.getLogger(__name__)


class SnapshotPublisher:
    def __init__(self, config: ConfigRef, engine: EngineView) -> None:
        self._config = config
        now = config.now
        # Each table's snapshot versions and folder: this part's state, not which tables exist (the engine's
        # TableSet), made on TableAdded, handed to DroppedSnapshots on TableDropped (they outlive it for leases).
        self._tables = {t.name: SnapshotTable(t, snapshots_dir(now.state_dir, t.name)) for t in now.tables}
        self._ids = SnapshotIds()
        self.disk = DiskGuard(now.state_dir, now.snapshots.build_timeout_ms / 1000)
        self._retention = Retention(config, self.disk)
        self._publishing = Publishing(config, engine, self._tables, self._ids, self._retention)
        self._desk = RequestDesk(config, engine, self._tables, self._ids, self._publishing, self._retention)
        self._dropped = DroppedSnapshots(now.state_dir)  # the snapshots of tables a reload dropped
        self._prepared: dict[str, SnapshotTable] = {}  # tables a reload adds, their folder made (``prepare``)

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config.now

    # -- lifecycle (daemon's main thread) ---------------------------------------------------------------------

    def start(self) -> None:
        """Sweep what a crash left behind, load each table's CURRENT, start the exact-build worker."""
        for tab in self._tables.values():
            self._open(tab)
        self._desk.start()

    def _open(self, tab: SnapshotTable) -> None:
        """Make ``tab``'s directory, sweep what a crash left in it, and load its CURRENT."""
        try:
            durable.make_dirs(tab.dir)
        except OSError as e:  # a full or failing disk: the first publish makes it once the disk heals
            log.warning("table %s: cannot create %s (%s); snapshots follow once the disk takes writes",
                        tab.name, tab.dir, e)
            return
        space.remove_leftovers(tab.dir)  # what a crash left: nothing else runs in it yet
        found = manifests_of(self.config.state_dir, tab.name)
        if found:
            self._ids.seen(found[0].id)
        cur = current_id(self.config.state_dir, tab.name)
        tab.loaded(next((m for m in found if m.id == cur), None))
        if tab.current is not None and recreated.unverified(tab.current):  # a crash inside keep_verified
            recreated.point_current(tab, None, {})

    def close(self, joins: Deadline | None = None) -> None:
        """A stop: the exact-build worker's end waited for within ``joins`` (``ExactBuilds.close``)."""
        self._desk.close(joins)

    # -- a reload (loop thread, ``service.two_phase``) -------------------------------------------------------------

    def prepare(self, delta: Delta) -> None:
        """Make the snapshot folder of each table ``delta`` adds; raises on a failing disk, and the reload is
        refused. What a dropped table of the same name left there is moved aside first (``snapshot.dropped``),
        refused or not: those files were going anyway."""
        self._prepared = {}
        for tc in delta.added:
            self._dropped.before_add(tc.name)
            tab = SnapshotTable(tc, snapshots_dir(self.config.state_dir, tc.name))
            durable.make_dirs(tab.dir)
            self._prepared[tc.name] = tab

    def commit(self) -> list[Callable[[], None]]:
        """Nothing to take here: the tables follow the engine's events (``on_event``)."""
        return []

    def abort(self) -> None:
        self._prepared = {}

    def _added(self, tc: TableConfig) -> None:
        """A table a reload added (its folder made by ``prepare``) or replaced (its old snapshots moved aside now,
        once the engine dropped the old declaration; kept while leased): published once RUNNING."""
        tab = self._prepared.pop(tc.name, None)
        if tab is None:
            try:
                self._dropped.before_add(tc.name)
            except OSError as e:  # a failing disk: the new declaration starts from what the folder holds
                log.error("table %s: cannot move the snapshots of its replaced declaration aside (%s)", tc.name, e)
            tab = SnapshotTable(tc, snapshots_dir(self.config.state_dir, tc.name))
        self._tables[tc.name] = tab
        self._open(tab)

    def _dropped_table(self, name: str, replaced: bool) -> None:
        """A table a reload dropped: nothing more is published for it; its files are ``snapshot.dropped``'s, kept
        while leased (a replaced one's are moved aside when it is added again)."""
        tab = self._tables.pop(name, None)
        if tab is not None:
            tab.retired()
        self._publishing.forget(name)
        self._retention.forget(name)
        if not replaced:
            self._dropped.drop(name)

    # -- loop thread ------------------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        match event:
            case TableAdded(config=tc):
                self._added(tc)
            case TableDropped(table=name, replaced=replaced):
                self._dropped_table(name, replaced)
            case TableRedeclared(config=tc):  # a new version at the next publish, decoded with the new declaration
                self._tables[tc.name].redeclared(tc)
            case Verified():
                tab = self._tables.get(event.table)
                if tab is not None:
                    self._publishing.verified(tab, dict(event.offsets), dict(event.fingerprints))
            case Wiped():
                tab = self._tables.get(event.table)
                if tab is not None:
                    reason = f"table wiped ({event.kind}) and rebuilding: {event.reason}"
                    verified = dict(event.verified) if event.verified is not None else None
                    self._publishing.wiped(tab, reason, verified)
            case StateChanged(table=None):
                self._publishing.daemon_state = event.new

    def tick(self) -> None:
        self._dropped.tick()
        for tab in self._tables.values():
            self._publishing.write_stale_marks(tab)
            self._desk.take(tab)
        now = time.monotonic()
        self._desk.watch(now)
        self._publishing.tick(now)
        if self._retention.due(now):
            for tab in self._tables.values():
                self._retention.sweep(tab)

    # -- operations (globald.ops.health.SnapshotSource) and status ------------------------------------------------

    def publications(self) -> int:
        """Snapshots made CURRENT in this run, every table's: the daemon writes its status when this moves."""
        return sum(tab.publications for tab in self._tables.values())

    def servable(self, table: str) -> bool:
        return self._tables[table].servable(self.config.snapshots.serve_stale)

    def age_seconds(self, table: str) -> float | None:
        cur = self._tables[table].current
        return None if cur is None else max(0.0, time.time() - cur.created)

    def publish_seconds(self, table: str) -> float | None:
        return self._tables[table].publish_seconds()

    def build_workers_replaced(self) -> int:
        """Exact-build workers left behind inside a stuck client and replaced (``ExactBuilds.watch``)."""
        return self._desk.build_workers_replaced()

    def builds_generation(self) -> int | None:
        """The generation of the config the exact builds' clients were made under (None: none held now)."""
        return self._desk.builds_generation()

    def status(self, table: str) -> SnapshotStatus:
        return self._tables[table].status()
