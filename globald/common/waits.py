"""Waits on the monotonic clock, cut short by a stop: what the daemon uses instead of ``time.sleep``.

``threading.Event.wait`` times itself on the monotonic clock (CPython takes its lock with ``sem_clockwait`` on
CLOCK_MONOTONIC), so a wall-clock step neither stretches nor shortens it, and a stop event set meanwhile ends it at
once. ``time.sleep`` is ``clock_nanosleep``: it cannot be interrupted by a stop, and under libfaketime (the clock
tests) its wrapper fails with EINVAL, which an ``OSError`` handler then took for a disk fault.
"""

from __future__ import annotations

import threading


def pause(seconds: float, stop: threading.Event | None = None) -> bool:
    """Wait ``seconds`` on the monotonic clock, or until ``stop`` is set; True when stopped."""
    return (stop if stop is not None else threading.Event()).wait(max(0.0, seconds))
