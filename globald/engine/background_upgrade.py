"""The background pass of the plain-value upgrade, run on the loop thread after each poll (a loop service).

Contract: it writes only from the loop thread, between polls, for a bounded slice of time, so it never races the
update task and never holds up readers (they read RocksDB directly). Tables still restoring are left alone until they
are RUNNING: catching up with the topic comes first.

For tests only: with ``GLOBALD_UPGRADE_HOLD_FILE`` naming a file, no step is taken while that file exists, so a test
can hold an upgrade in its mixed layout for as long as it needs and release it by removing the file, instead of
racing a pass whose speed depends on the machine.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from globald.common.states import State
from globald.engine.table import TableRuntime
from globald.store.failures import STORE_FAULTS

log = logging.getLogger(__name__)

UPGRADE_SLICE_SECONDS = 0.02  # per poll: at a 200 ms poll timeout an idle daemon spends ~10% of its time on it
RETRY_AFTER_SECONDS = 10.0  # after a failed slice (disk error): the next poll would most likely fail the same way
HOLD_ENV = "GLOBALD_UPGRADE_HOLD_FILE"


class BackgroundUpgrade:
    """Moves plain values of one upgrading table per call, for about ``slice_s`` seconds."""

    def __init__(self, tables: Mapping[str, TableRuntime], slice_s: float = UPGRADE_SLICE_SECONDS) -> None:
        self._tables = tables  # the engine's set of tables (``engine.tables``): tables added later are seen too
        self.slice_s = slice_s
        self._not_before = 0.0
        self._hold = os.environ.get(HOLD_ENV) or None  # read once: a daemon's environment does not change

    def tick(self) -> None:
        if time.monotonic() < self._not_before or (self._hold is not None and os.path.exists(self._hold)):
            return
        for rt in self._tables.values():
            if not rt.store.upgrading or rt.machine.state != State.RUNNING:
                continue
            try:
                rt.store.upgrade_step(self.slice_s)
            except STORE_FAULTS as e:  # nothing was lost: each move is one batch, and readers merge both layouts
                self._not_before = time.monotonic() + RETRY_AFTER_SECONDS
                log.warning("table %s: upgrade of plain values paused for %.0fs: %s", rt.name, RETRY_AFTER_SECONDS, e)
            return
