"""Snapshots of the tables a reload dropped (``service.reload``): kept while a reader's lease holds one of them,
deleted once none does.

A Spark job that opened a version of a dropped table finishes reading it: its lease keeps the snapshot, as
retention would. Once no lease holds any snapshot of the table (``leases.LeaseClock``, the publisher's own clock),
its snapshot directory is deleted (``durable.remove_tree``). A table added again under the same name never sees
those files: a directory still held then is first moved aside, to ``snapshots/.dropped-<name>-<n>`` (a reader
already reading keeps its open files; its lease's renewals then fail, as for any snapshot deleted under it), and the
new table starts with an empty one. Runs on the loop thread, at most once a second.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from globald.snapshot.leases import LeaseClock
from globald.store import durable
from globald.store.names import SNAPSHOT_DROPPED_PREFIX, snapshots_dir

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0


class DroppedSnapshots:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._held: dict[Path, LeaseClock] = {}  # snapshot directories of dropped tables, not yet deleted
        self._next = 0.0

    def drop(self, table: str) -> None:
        """``table`` was dropped: its snapshots go once no lease holds them."""
        folder = snapshots_dir(self.state_dir, table)
        if folder.exists():
            self._held[folder] = LeaseClock(folder)
        self._next = 0.0

    def before_add(self, table: str) -> None:
        """``table`` is added (again): whatever is under its snapshot directory belongs to a dropped table."""
        folder = snapshots_dir(self.state_dir, table)
        if not folder.exists():
            return
        aside = folder.with_name(f"{SNAPSHOT_DROPPED_PREFIX}{table}-{time.time_ns()}")
        durable.rename(folder, aside)  # durable: after a crash, the re-added table never finds the old snapshots
        self._held.pop(folder, None)
        self._held[aside] = LeaseClock(aside)
        log.info("table %s: the snapshots of its earlier, dropped, definition moved to %s until no lease holds them",
                 table, aside.name)

    def tick(self) -> None:
        now = time.monotonic()
        if not self._held or now < self._next:
            return
        self._next = now + CHECK_EVERY_S
        for folder, clock in list(self._held.items()):
            try:
                if clock.refresh():
                    continue  # a reader still holds one
                durable.remove_tree(folder)
            except OSError as e:  # a full or failing disk: tried again at the next tick
                log.warning("cannot delete %s, the snapshots of a dropped table (%s); retrying", folder, e)
                continue
            del self._held[folder]
            log.info("deleted %s: the snapshots of a dropped table, no longer leased", folder)

    @property
    def pending(self) -> list[Path]:
        return sorted(self._held)
