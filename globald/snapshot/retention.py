"""Retention: which snapshots stay on disk, and freeing room for what the daemon must write next.

Contract: the loop thread only (the lease clocks are not thread-safe). A snapshot that CURRENT names, that a held
lease names (``leases.LeaseClock``: held on the daemon's monotonic clock) or that a build is copying from
(``SnapshotTable.busy``) is never deleted here. Everything else goes when it is beyond the newest
``[snapshots] retain`` valid ones, when its manifest is invalid, when it may mix two topics (``recreated``), or
when the disk is short of room for the next step (``space.DiskGuard``). A deletion is one durable rename to a
trash name first, so a reader never sees a half-deleted snapshot, even after a power loss; a deletion the disk
refuses is tried again at the next sweep. A manifest the disk cannot read (an I/O error) says nothing about its
snapshot: it is kept, and not counted towards retention.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from globald.common.errors import ManifestError, ManifestIOError
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.snapshot import exact_requests as requests
from globald.snapshot import leases, recreated
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import valid_id
from globald.snapshot.space import DiskGuard
from globald.snapshot.table_state import SnapshotTable
from globald.store import durable
from globald.store.names import SNAPSHOT_TRASH_PREFIX

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, config: ConfigRef, disk: DiskGuard) -> None:
        self._config = config  # a reload's retain and interval apply from the next sweep
        self.disk = disk
        self._leases: dict[str, leases.LeaseClock] = {}  # per table, from its first use (a clock starts empty)
        self._next_sweep = 0.0

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config.now

    @property
    def _every(self) -> float:
        return max(self.config.snapshots.interval_ms / 1000, 1.0)

    def forget(self, table: str) -> None:
        """A table dropped by a reload: its lease clock goes with it (``snapshot.dropped`` keeps its files)."""
        self._leases.pop(table, None)

    def held(self, tab: SnapshotTable) -> set[str]:
        """Snapshots a lease or a build holds now."""
        return self._clock(tab).refresh() | tab.busy()

    def due(self, now: float) -> bool:
        """Whether a sweep of every table is due (at most once per interval, at least a second apart)."""
        if now < self._next_sweep:
            return False
        self._next_sweep = now + self._every
        return True

    def sweep(self, tab: SnapshotTable) -> None:
        """Newest K valid snapshots, CURRENT, leased and busy ones stay; everything else goes."""
        name = tab.name
        with tab.locked():
            found: list[str] = []
            held, cur = self.held(tab), tab.current_id
            keep = held | ({cur} if cur else set())
            doomed = []
            for e in os.scandir(tab.dir):
                if not valid_id(e.name):
                    continue
                try:
                    m = manifests.read(Path(e.path), name)
                    found.append(e.name)
                    if recreated.unverified(m) and e.name not in keep:  # may mix two topics: kept only while held
                        doomed.append(e.name)
                except ManifestIOError as err:  # kept, and not counted towards retention: read again next sweep
                    log.warning("table %s: keeping snapshot %s for now: %s", name, e.name, err)
                except ManifestError as err:
                    if e.name in keep:  # a leased or CURRENT snapshot is never deleted by the sweep
                        log.warning("table %s: snapshot %s is pinned but its manifest is invalid: %s", name, e.name,
                                    err)
                        continue
                    log.warning("table %s: deleting snapshot %s: %s", name, e.name, err)
                    doomed.append(e.name)
            doomed += [i for i in leases.doomed(found, self.config.snapshots.retain, keep) if i not in doomed]
            # A disk short of room for the next step: all but CURRENT and the held go.
            short = self.disk.doomed(name, tab.dir, found, held, cur, tab.short_of_space)
            doomed += [i for i in short if i not in doomed]
            self._remove(tab, doomed)
        self._clock(tab).sweep()
        requests.sweep_responses(self.config.state_dir, name, time.time())

    def free(self, tab: SnapshotTable, missing: int, found: list[str], keep: set[str]) -> tuple[int, int]:
        """Free ``missing`` bytes for a build if globald may (``DiskGuard.room_for_build``), never deleting ``keep``
        nor what is held; returns the bytes freed and the number of snapshots deleted."""
        with tab.locked():
            freed, doomed = self.disk.room_for_build(tab.name, tab.dir, missing, found, keep | self.held(tab))
            self._remove(tab, doomed)
        return freed, len(doomed)

    def _clock(self, tab: SnapshotTable) -> leases.LeaseClock:
        clock = self._leases.get(tab.name)
        if clock is None:
            clock = self._leases[tab.name] = leases.LeaseClock(tab.dir)
        return clock

    @staticmethod
    def _remove(tab: SnapshotTable, doomed: list[str]) -> None:
        for sid in doomed:
            with contextlib.suppress(OSError):  # kept for now: the next sweep tries again
                # One durable rename first: readers, even after a power loss, never see a half-deleted snapshot.
                durable.remove_tree(tab.dir / sid, tab.dir / f"{SNAPSHOT_TRASH_PREFIX}{sid}")
