"""Waits on the monotonic clock, cut short by a stop: what the daemon uses instead of ``time.sleep``.

``threading.Event.wait`` times itself on the monotonic clock (CPython takes its lock with ``sem_clockwait`` on
CLOCK_MONOTONIC), so a wall-clock step neither stretches nor shortens it, and a stop event set meanwhile ends it at
once. ``time.sleep`` is ``clock_nanosleep``: it cannot be interrupted by a stop, and under libfaketime (the clock
tests) its wrapper fails with EINVAL, which an ``OSError`` handler then took for a disk fault.
"""

from __future__ import annotations

import threading
import time

# What a stop waits, in all, for every part's threads and the decode process once the loop has committed and closed
# the stores (the cluster worker's clients, the reload thread, the exact builds, the exporter, the decode process,
# the HTTP thread, the state hooks): a stop is over within a second of the signal on a loaded host (issue 40), and
# what is left behind then holds nothing the next start needs (a half-built snapshot is swept, an upload has no
# manifest, a reload not applied is answered as such, a cluster question's answer is dropped).
STOP_JOINS_S = 0.25
# When, after the stop was asked, a stop no longer waits for the state hooks to deliver what is queued (the stop's own
# PENDING_SHUTDOWN and NOT_RUNNING among them): a hook is the user's code, a command or a POST bounded only by its
# own timeout_ms, and the stop is over within a second with the process's end; a quick hook is delivered in full.
STOP_HOOKS_S = 0.5


def pause(seconds: float, stop: threading.Event | None = None) -> bool:
    """Wait ``seconds`` on the monotonic clock, or until ``stop`` is set; True when stopped."""
    return (stop if stop is not None else threading.Event()).wait(max(0.0, seconds))


class Deadline:
    """One bound shared by several waits in turn (a stop's joins): each gets what is left of it, never more than its
    own bound, so that their sum holds however many there are."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, bound: float | None = None) -> float:
        """Seconds left, at least 0, at most ``bound``."""
        left = max(0.0, self.end - time.monotonic())
        return left if bound is None else min(left, bound)
