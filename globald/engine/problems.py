"""What keeps the daemon from mirroring its topics right now, by source, and when to try each source again.

A source (the cluster, the disk, one table) has at most one problem at a time; the first success of the thing that
failed clears it, so ``degraded`` always describes the present (for the disk, the first durable write: the loop
decides). A problem is logged when it starts and when it ends; clearing it also resets its backoff.
"""

from __future__ import annotations

import logging
import time

from globald.kafka.client_log import repeated as repeated_client_problems
from globald.kafka.retry import Backoff

log = logging.getLogger(__name__)

KAFKA, STORE = "kafka", "store"  # the sources that are not a table's


class Problems:
    def __init__(self, backoff: Backoff | None = None) -> None:
        self._backoff = backoff or Backoff()
        self._now: dict[str, str] = {}
        self._since: dict[str, float] = {}  # monotonic time each present problem started

    @property
    def degraded(self) -> str | None:
        return "; ".join(self._now[k] for k in sorted(self._now)) or None

    def has(self, source: str) -> bool:
        return source in self._now

    def lasted(self, source: str) -> float:
        """Seconds since ``source``'s present problem started (0 without one)."""
        since = self._since.get(source)
        return 0.0 if since is None else time.monotonic() - since

    def report(self, source: str, text: str) -> None:
        """A problem of ``source`` that is retried on a schedule of its own (or not at all)."""
        if source not in self._now:
            log.warning("degraded: %s", text)
        self._set(source, text)

    def _set(self, source: str, text: str) -> None:
        self._since.setdefault(source, time.monotonic())
        self._now[source] = text

    def failed(self, source: str, text: str, quiet: bool = False) -> float:
        """An attempt of ``source`` failed: the problem, and the delay before its next attempt."""
        if quiet:  # the caller logged it in its own words
            self._set(source, text)
        else:
            self.report(source, text)
        return self._backoff.failed(source)

    def resolved(self, source: str) -> None:
        self._backoff.succeeded(source)
        text = self._now.pop(source, None)
        self._since.pop(source, None)
        if text is not None:
            log.info("recovered: %s", text)
            if source == KAFKA:  # librdkafka's own repeated complaints (connection refused...) end with it
                repeated_client_problems.cleared()

    def due(self, source: str) -> bool:
        return self._backoff.due(source)

    def failures(self, source: str) -> int:
        return self._backoff.failures(source)
