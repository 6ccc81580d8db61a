"""Exceptions the daemon catches and goes on from: counted per place, logged at a bounded rate, bugs kept for status.

The daemon keeps running through a failing disk, a broker away or a user callback that raises, so many ``except``
blocks swallow what they catch. Each goes through ``record``, whose contract is:

- every call counts once under its ``where`` (a short fixed name, a metric label: never built from data), exported
  as ``globald_swallowed_failures_total{where}``;
- the log gets the first failure of a place, then at most one line per ``LOG_EVERY_S`` saying how many happened
  meanwhile and the latest one: a failure that repeats stays visible without flooding the log. An expected error is
  one line with its text (a full disk is no reason for a traceback); a bug comes with its traceback;
- an exception that is not an expected I/O, store or Kafka error is a bug: it is also counted in
  ``globald_bugs_total{where}`` and kept (type, message, count, first and last time) for the status document's
  ``bugs``, so a bug retried on every tick shows in ``globald status`` instead of being retried silently forever.

The registry is per process (like ``store.stalls.STALLS``): one daemon runs per process.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import KafkaException

from globald.common.errors import GlobaldError

LOG_EVERY_S = 60.0
MESSAGE_LIMIT = 300

# What a daemon expects to meet and rides out: the disk (OSError, and globald's store errors, which wrap RocksDB's),
# the broker (librdkafka), time limits. Anything else raised inside globald is a defect of globald or of a callback.
EXPECTED: tuple[type[BaseException], ...] = (OSError, GlobaldError, KafkaException, TimeoutError)


def is_bug(error: BaseException) -> bool:
    """True when ``error`` is not an expected I/O, store or Kafka error.

    rocksdict raises a bare ``Exception`` carrying RocksDB's status text (see ``store.failures``): that exact type
    is RocksDB speaking about its disk or files, not a bug; a subclass of Exception is someone's code."""
    return not isinstance(error, EXPECTED) and type(error) is not Exception


@dataclass
class Bug:
    where: str
    error: str  # "TypeError: message", cut to MESSAGE_LIMIT
    count: int
    first: float  # wall-clock times, for people
    last: float

    def to_json(self) -> dict[str, object]:
        return {"where": self.where, "error": self.error, "count": self.count, "first": self.first, "last": self.last}


@dataclass
class _Place:
    count: int = 0
    bugs: int = 0
    next_log: float = 0.0  # monotonic: when this place may log again
    unlogged: int = 0  # failures since the last line logged


class Swallowed:
    """The process's record of swallowed exceptions; ``record`` may be called from any thread."""

    def __init__(self, log_every_s: float = LOG_EVERY_S) -> None:
        self.log_every_s = log_every_s
        self._lock = threading.Lock()
        self._places: dict[str, _Place] = {}
        self._bugs: dict[str, Bug] = {}

    def record(self, where: str, error: BaseException, logger: logging.Logger, message: str, *args: object) -> None:
        """Count ``error``, swallowed at ``where``; log ``message % args`` if this place has not logged lately."""
        now = time.monotonic()
        bug = is_bug(error)
        with self._lock:
            place = self._places.setdefault(where, _Place())
            place.count += 1
            place.unlogged += 1
            if bug:
                place.bugs += 1
                text = f"{type(error).__name__}: {error}"[:MESSAGE_LIMIT]
                wall = time.time()
                kept = self._bugs.get(where)
                if kept is None:
                    self._bugs[where] = Bug(where, text, 1, wall, wall)
                else:
                    kept.error, kept.count, kept.last = text, kept.count + 1, wall
            if now < place.next_log:
                return
            first, total = place.count == 1, place.count
            skipped = place.unlogged - 1
            place.unlogged = 0
            place.next_log = now + self.log_every_s
        suffix = "" if first else f" ({skipped} more since the last report; {total} in all)"
        if bug:  # what a developer needs to fix it
            logger.error(f"{message} [bug at {where}]{suffix}", *args, exc_info=error)
        else:
            logger.error(f"{message} [failure at {where}: %s: %s]{suffix}", *args, type(error).__name__, error)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {w: p.count for w, p in self._places.items()}

    def bug_counts(self) -> dict[str, int]:
        with self._lock:
            return {w: p.bugs for w, p in self._places.items() if p.bugs}

    def bugs(self) -> list[Bug]:
        with self._lock:
            return [Bug(b.where, b.error, b.count, b.first, b.last) for b in self._bugs.values()]

    def reset(self) -> None:
        """Forget everything (a daemon starting in a process that ran another one: tests, the demo)."""
        with self._lock:
            self._places.clear()
            self._bugs.clear()


SWALLOWED = Swallowed()


def record(where: str, error: BaseException, logger: logging.Logger, message: str, *args: object) -> None:
    SWALLOWED.record(where, error, logger, message, *args)
