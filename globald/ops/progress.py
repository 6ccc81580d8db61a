"""Restore progress: per-table counts, rate and ETA from the restore callbacks, shown as a bar or as log lines.

``RestoreTracker`` only follows the callbacks (it never reads the store or the consumer), so its numbers are
what the loop has applied. Progress is measured in offsets (compaction leaves gaps, so offsets, not records,
say how far a restore is); rates count records. A new restore of a table (after a wipe) starts from zero.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

log = logging.getLogger(__name__)

RATE_WINDOW_SECONDS = 5.0


@dataclass
class TableRestore:
    """One restore of one table: partitions from ``start`` to ``end`` (next-offsets)."""

    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    records: int = 0
    began: float = field(default_factory=time.monotonic)
    ended: float | None = None
    window: deque[tuple[float, int, int]] = field(default_factory=deque)  # (time, records, offsets done)

    @property
    def total_offsets(self) -> int:
        return sum(self.end[p] - self.start[p] for p in self.end)

    @property
    def done_offsets(self) -> int:
        return sum(min(self.position[p], self.end[p]) - self.start[p] for p in self.end)

    @property
    def active(self) -> bool:
        return self.ended is None

    def rate(self, now: float) -> tuple[float, float]:
        """(records/s, offsets/s) over the last few seconds, or over the whole restore once it ended."""
        if self.ended is not None:
            took = max(self.ended - self.began, 1e-6)
            return self.records / took, self.total_offsets / took
        first = self.window[0] if self.window else (self.began, 0, 0)
        dt = now - first[0]
        if dt <= 0:
            return 0.0, 0.0
        return (self.records - first[1]) / dt, (self.done_offsets - first[2]) / dt

    def eta(self, now: float) -> float | None:
        _, offsets_rate = self.rate(now)
        remaining = self.total_offsets - self.done_offsets
        if remaining <= 0:
            return 0.0
        return remaining / offsets_rate if offsets_rate > 0 else None


@dataclass(frozen=True)
class RestoreStats:
    """A read-only view of a table's restore, safe to hand to another thread."""

    active: bool
    records: int  # records restored in the current (or last) restore
    records_total: int  # records restored since the daemon started, over every restore
    done_offsets: int
    total_offsets: int
    records_per_second: float
    eta_seconds: float | None
    seconds: float

    @property
    def percent(self) -> float:
        return 100.0 if self.total_offsets <= 0 else 100.0 * self.done_offsets / self.total_offsets


class RestoreTracker:
    """A RestoreListener keeping every table's current restore. Called on the loop thread."""

    def __init__(self) -> None:
        self.restores: dict[str, TableRestore] = {}
        self.lifetime: dict[str, int] = {}
        self._lock = threading.Lock()

    def on_restore_start(self, table: str, partition: int, start: int, end: int) -> None:
        with self._lock:
            r = self.restores.get(table)
            if r is None or not r.active or partition in r.end:
                r = self.restores[table] = TableRestore()
            r.start[partition], r.end[partition], r.position[partition] = start, end, start

    def on_batch_restored(self, table: str, partition: int, batch_end: int, count: int) -> None:
        with self._lock:
            r = self.restores.get(table)
            if r is None or partition not in r.end:
                return
            r.position[partition] = batch_end
            r.records += count
            self.lifetime[table] = self.lifetime.get(table, 0) + count
            now = time.monotonic()
            r.window.append((now, r.records, r.done_offsets))
            while len(r.window) > 1 and now - r.window[0][0] > RATE_WINDOW_SECONDS:
                r.window.popleft()

    def on_restore_end(self, table: str, partition: int, total: int) -> None:
        with self._lock:
            r = self.restores.get(table)
            if r is None or partition not in r.end:
                return
            r.position[partition] = max(r.position[partition], r.end[partition])
            r.finished.add(partition)
            if r.finished >= set(r.end):
                r.ended = time.monotonic()

    def stats(self) -> dict[str, RestoreStats]:
        now = time.monotonic()
        out: dict[str, RestoreStats] = {}
        with self._lock:
            for table, r in self.restores.items():
                rps, _ = r.rate(now)
                out[table] = RestoreStats(
                    active=r.active, records=r.records, records_total=self.lifetime.get(table, 0),
                    done_offsets=r.done_offsets, total_offsets=r.total_offsets, records_per_second=rps,
                    eta_seconds=r.eta(now) if r.active else 0.0, seconds=(r.ended or now) - r.began)
        return out


def human_count(n: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "?"
    n = round(s)
    return f"{n // 3600}:{n % 3600 // 60:02d}:{n % 60:02d}" if n >= 3600 else f"{n // 60}:{n % 60:02d}"


def describe(table: str, s: RestoreStats) -> str:
    """One line for people: ``customers 42% 120.0k records 48.1k rec/s ETA 0:05``."""
    if not s.active:
        return (f"{table}: restored {s.records:,} records in {s.seconds:.1f}s "
                f"({human_count(s.records_per_second)} rec/s)")
    return (f"{table}: {s.percent:3.0f}% {s.records:,} records, {human_count(s.records_per_second)} rec/s, "
            f"ETA {human_seconds(s.eta_seconds)}")


@dataclass(frozen=True)
class ProgressOptions:
    """Where progress goes: ``stream`` (stderr by default) gets the bar if it is a terminal (or ``tty``);
    otherwise ``emit`` (the log by default) gets a line per restoring table every ``interval`` seconds."""

    stream: TextIO | None = None
    tty: bool | None = None
    interval: float = 10.0
    emit: Callable[[str], None] | None = None


class ProgressDisplay:
    """Shows the tracker's restores as a redrawn bar on a terminal, else as periodic lines.

    Register it after the tracker in ``Listeners.restore``. On a terminal, ``log_filter`` clears the bar
    before another log line is written to the same stream, so the two never mix on one line.
    """

    BAR_WIDTH = 24

    def __init__(self, tracker: RestoreTracker, options: ProgressOptions | None = None) -> None:
        o = options or ProgressOptions()
        self.tracker = tracker
        self.stream = o.stream or sys.stderr
        self.tty = self.stream.isatty() if o.tty is None else o.tty
        self.interval = o.interval if not self.tty else 0.1
        self.emit = o.emit or log.info
        self._last = 0.0
        self._shown = False
        self._lock = threading.RLock()
        self.log_filter = _ClearBar(self)

    def on_restore_start(self, table: str, partition: int, start: int, end: int) -> None:
        self._last = 0.0 if self.tty else time.monotonic()  # first line after one interval, not at once

    def on_batch_restored(self, table: str, partition: int, batch_end: int, count: int) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.render()

    def on_restore_end(self, table: str, partition: int, total: int) -> None:
        s = self.tracker.stats().get(table)
        if s is not None and not s.active:
            self.clear()
            self.emit(describe(table, s))
        elif self.tty:
            self.render()

    def render(self) -> None:
        self._last = time.monotonic()
        active = {t: s for t, s in self.tracker.stats().items() if s.active}
        if not active:
            return
        if not self.tty:
            for table, s in active.items():
                self.emit("restoring " + describe(table, s))
            return
        done = sum(s.done_offsets for s in active.values())
        total = sum(s.total_offsets for s in active.values()) or 1
        records = sum(s.records for s in active.values())
        rate = sum(s.records_per_second for s in active.values())
        etas = [s.eta_seconds for s in active.values()]
        eta = None if any(e is None for e in etas) else max(e for e in etas if e is not None)
        filled = int(self.BAR_WIDTH * done / total)
        bar = "#" * filled + "-" * (self.BAR_WIDTH - filled)
        line = (f"restoring {', '.join(sorted(active))} [{bar}] {100 * done / total:3.0f}% "
                f"{records:,} records {human_count(rate)} rec/s ETA {human_seconds(eta)}")
        with self._lock:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self._shown = True

    def clear(self) -> None:
        with self._lock:
            if self._shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._shown = False


class _ClearBar(logging.Filter):
    def __init__(self, display: ProgressDisplay) -> None:
        super().__init__()
        self.display = display

    def filter(self, record: logging.LogRecord) -> bool:
        self.display.clear()
        return True
