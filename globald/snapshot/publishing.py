"""Periodic publishing: a checkpoint of each RUNNING table's live store made CURRENT, and what a wipe or an
identity check changes about the published snapshots.

Contract: the loop thread only, between two polls (the store is not thread-safe, and nothing moves it meanwhile).
A snapshot is a RocksDB checkpoint of a RUNNING table, so it equals the fold of its topic below the offsets in its
manifest, which are read back from the checkpoint itself (a manifest never claims an offset its snapshot does not
hold); it appears by one rename and CURRENT moves by one rename. A publish happens when the live offsets moved,
after a wipe, or when the disk guard asks for one; a failed one (disk full, I/O error) leaves CURRENT as it was and
is tried again at the next interval. After a wipe, every earlier snapshot is marked stale with the reason (again at
every tick while the disk refuses) and CURRENT stays where it was until the rebuilt table is RUNNING again; nothing
is published from a table that is restoring, so readers never see a half-rebuilt table. A wipe for a recreated
topic also drops what may mix two topics (``recreated``).
"""

from __future__ import annotations

import logging
import shutil
import time

from globald.common import swallowed
from globald.common.errors import ManifestError
from globald.common.states import State
from globald.engine.view import EngineView, TableView
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.snapshot import manifest as manifests
from globald.snapshot import recreated
from globald.snapshot.manifest import Manifest, Offsets, snapshot_since
from globald.snapshot.reader import manifests_of
from globald.snapshot.retention import Retention
from globald.snapshot.table_state import Fingerprints, SnapshotIds, SnapshotTable
from globald.store import durable
from globald.store.failures import out_of_space
from globald.store.names import SNAPSHOT_CURRENT, SNAPSHOT_DB_DIR, SNAPSHOT_TMP_PREFIX

log = logging.getLogger(__name__)


class Publishing:
    def __init__(self, config: ConfigRef, engine: EngineView, tables: dict[str, SnapshotTable], ids: SnapshotIds,
                 retention: Retention) -> None:
        self._config = config  # a reload's interval applies from the next publish
        self.engine = engine
        self.daemon_state = State.CREATED
        self._tables = tables
        self._ids = ids
        self._retention = retention
        self._vouched: dict[str, tuple[Offsets, str | None]] = {}  # per table: what VERIFIED holds now
        self._next_publish = 0.0

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config.now

    @property
    def interval(self) -> float:
        return self.config.snapshots.interval_ms / 1000

    def forget(self, table: str) -> None:
        """A table dropped by a reload."""
        self._vouched.pop(table, None)

    def tick(self, now: float) -> None:
        """Publish every RUNNING table, once per interval, unless the stores are being recovered. The interval runs
        from a publish tried: with no table RUNNING (a start's restore) none is, and the first table to get there is
        published at the next turn instead of up to an interval later (what a start's readiness waited for)."""
        if now >= self._next_publish and not self.engine.store_fault:
            running = [t for t in self.engine.table_views() if t.state == State.RUNNING]
            if running:
                self._next_publish = now + self.interval
            for table in running:
                self._try_publish(table, self._tables[table.name])

    def _try_publish(self, rt: TableView, tab: SnapshotTable) -> None:
        try:
            offsets = self.live_offsets(rt)
            if offsets is not None and (tab.stale_reason is not None or offsets != tab.published_offsets
                                        or self._retention.disk.republish(rt.name, tab.current_id)):
                self.publish_live(rt)
            tab.publish_tried(None)
        except Exception as e:  # counted; a repeat logged at a bounded rate; a bug shows in status
            swallowed.record("snapshot_publish", e, log, "table %s: snapshot publish failed; CURRENT stays at %s",
                             rt.name, tab.current_id)
            tab.publish_tried(f"{type(e).__name__}: {e}", out_of_space(e))

    def live_offsets(self, rt: TableView) -> Offsets | None:
        """The offsets the live store holds now, which a checkpoint taken now holds too (this is the loop thread,
        between two polls); None while they do not cover every partition. Not the last commit's: a checkpoint is
        durable by itself, and waiting for the commit kept a refresh waiting up to commit_interval_ms for a build."""
        stored = self.engine.live_offsets(rt.name)
        return stored if set(stored) == set(rt.partitions) else None

    def publish_live(self, rt: TableView) -> Manifest:
        """Checkpoint the live store (loop thread only: the store is not thread-safe) and make it CURRENT."""
        tab = self._tables[rt.name]
        # The checkpoint flushes a memtable, which may start a compaction needing the live store's size free: the
        # guard measures the room before it, once the last compaction's output is whole and the snapshots it left
        # holding the replaced files can be seen (the sweep after the last publish ran while it was being written).
        self._retention.sweep(tab)
        with tab.locked():
            started = time.perf_counter()
            sid = self._ids.next()
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
                             daemon_state=self.daemon_state.value, table_state=rt.state.value,
                             records=taken.records, history_ms=tab.config.history,
                             since=snapshot_since(tab.config, tmp / SNAPSHOT_DB_DIR))
                manifests.write(tmp, m)
                durable.rename(tmp, tab.dir / sid)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            durable.replace_file(tab.dir / SNAPSHOT_CURRENT, sid + "\n")
            if tab.stale_reason is not None:
                log.info("table %s: fresh snapshot %s replaces stale %s", rt.name, sid, tab.current_id)
            tab.published_now(m, time.perf_counter() - started)
        self._retention.sweep(tab)
        return m

    # -- what the engine's events change (on_event) ---------------------------------------------------------------

    def verified(self, tab: SnapshotTable, offsets: Offsets, fingerprints: Fingerprints) -> None:
        """An identity check showed the store to hold its topic below ``offsets``: a build reads the fingerprints
        back first, and what it vouches for is persisted (``recreated.vouch``) when it changed."""
        with tab.locked():
            tab.verified(fingerprints)
            key = (offsets, tab.current_id)  # what it vouches for moves with CURRENT
            try:
                if self._vouched.get(tab.name) != key:
                    recreated.vouch(self.config.state_dir, tab, offsets)
                    self._vouched[tab.name] = key
            except OSError as e:  # a full or failing disk: the next check writes it again
                swallowed.record("snapshot_vouch", e, log, "table %s: cannot persist the verified offsets: %s",
                                 tab.name, e)

    def wiped(self, tab: SnapshotTable, reason: str, verified: Offsets | None) -> None:
        """A wipe: snapshots past the offsets last shown to be of the topic go (``recreated.keep_verified``, for a
        recreated topic), what was vouched is forgotten, and every snapshot is marked stale."""
        with tab.locked():  # no exact build may publish between these (it checks the generation)
            if verified is not None:
                tab.verified({})
                recreated.keep_verified(self.config.state_dir, tab, verified, reason, self._retention.held(tab))
            self._vouched.pop(tab.name, None)
            recreated.forget_vouched(tab)
            tab.wiped(reason)
            log.warning("table %s: snapshots marked stale (%s); CURRENT stays at %s until the table is RUNNING "
                        "again", tab.name, reason, tab.current_id or "nothing")
            self.write_stale_marks(tab)

    def write_stale_marks(self, tab: SnapshotTable) -> None:
        """Write a wipe's stale mark into every manifest; on a refusing disk, again at every tick until done."""
        reason = tab.unmarked
        if reason is None:
            return
        with tab.locked():
            try:
                for m in manifests_of(self.config.state_dir, tab.name):
                    if not m.stale:
                        manifests.write(tab.dir / m.id, m.marked_stale(reason))
            except OSError as e:
                swallowed.record("snapshot_stale_mark", e, log, "table %s: cannot mark snapshots stale on disk yet "
                                 "(%s); retrying", tab.name, e)
                tab.publish_tried(f"marking stale: {e}", out_of_space(e))
                return
            tab.marks_written()
