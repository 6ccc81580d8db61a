"""When each versioned table was last known reading its topic, and what resuming after a gap does to its ``since``
(``store.gaps.since_after_gap``): issue 45's "never a since earlier than provable" across a restart after
downtime, a broker outage, a paused topic, a frozen daemon.

A table counts as reading at a turn when it is assigned, its topic is not paused (vanished), the cluster answers
(no Kafka problem) and the stores take writes. The marks are checked once a turn, after the plans and before the
poll, so a since moved by a gap is durable before any record read past the gap is written; the store writes the
last mark with the offsets of every batch and at a clean close (``TableStore.put_read_mark``), which is what the
next start measures its downtime from. Loop thread only; reads the wall clock, never waits on it.

While the loop runs, a gap is measured on ``history.elapsed_ms``, which a step of the wall clock does not move: a
table that tails without a gap keeps its since whatever the wall clock does (a +1 day step was once taken as a
day-long stall, and since moved a day past every record time). Across a restart only the wall clock spans the
downtime (the stored mark's), so that one is measured on it (docs/limitations.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from globald.engine.table import TableRuntime
from globald.store import history

log = logging.getLogger(__name__)

# While the loop runs, a gap between two turns that saw a table reading of up to this long is taken as tailing
# (the "a table that tails without a gap keeps its since"): a turn may hold the loop thread for seconds
# (a large batch, a snapshot's checkpoint), and with the lag unknown (0) any gap at all would move since. A longer
# gap, or one longer than the lag, is a stall: since moves. At a restart the downtime is held to the lag alone.
STALL_TOLERANCE_MS = 10_000


class ReadingMarks:
    """See the module docstring."""

    def __init__(self) -> None:
        # table -> when the loop last saw it reading: (wall clock, epoch ms; history.elapsed_ms)
        self._at: dict[str, tuple[int, int]] = {}

    def turn(self, tables: Mapping[str, TableRuntime], reading: Callable[[TableRuntime], bool]) -> None:
        now: int | None = None
        ticks = 0
        for rt in tables.values():
            if not _versioned(rt) or not reading(rt):
                continue
            if now is None:
                now, ticks = history.now_ms(), history.elapsed_ms()
            store, name = rt.store, rt.name
            last = self._at.get(name)
            if last is None:  # first seen reading in this run: a restart, measured from the store's mark (which
                # no batch has overwritten: put_read_mark writes nothing before this sets history_read_at)
                self._resumed(rt, now, store.history_read_mark(), 0, "restart")
            elif not 0 <= ticks - last[1] <= STALL_TOLERANCE_MS:  # a stall: it began this long ago, in wall time
                began = now - (ticks - last[1])  # now; from the store's mark when later: a store refilled
                stored = store.history_read_mark()  # from an export meanwhile carries its own
                self._resumed(rt, now, began if stored is None else max(began, stored), STALL_TOLERANCE_MS, "stall")
            else:
                store.history_read_at = now
            self._at[name] = (now, ticks)

    @staticmethod
    def _resumed(rt: TableRuntime, now: int, last: int | None, tolerance_ms: int, kind: str) -> None:
        moved = rt.store.history_resumed(now, last, tolerance_ms)
        if moved is not None:
            log.warning("table %s: since moved at a resume after a %s: %s", rt.name, kind, moved)


def _versioned(rt: TableRuntime) -> bool:
    return rt.config.versioned and rt.store.is_open
