"""The config in force, held in one place: the daemon makes one ``ConfigRef`` and hands it to every part that reads
the config after it was built (a part that makes Kafka clients, above all). A reload applied (``service.reload``)
sets it once; a part reads ``now`` when it needs a setting, and a part that keeps a client compares the
``generation`` it made the client under with the current one, and makes a new client when it moved.

A private copy of the config taken at construction goes stale at the first reload: that is how a ``[kafka]``
reload once missed the exact builds' and the bootstraps' clients (issue 40 item 1).
"""

from __future__ import annotations

import threading

from globald.settings.config import Config


class ConfigRef:
    """The ``Config`` in force and its generation (1 at start, one more at each reload applied). Thread-safe: set on
    the loop thread, read from any (the exact-build worker, a bootstrap's thread, the HTTP thread)."""

    def __init__(self, config: Config) -> None:
        self._lock = threading.Lock()
        self._config = config
        self._generation = 1

    @property
    def now(self) -> Config:
        with self._lock:
            return self._config

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def get(self) -> tuple[Config, int]:
        """The config in force and its generation, read together (a reload may land between two reads)."""
        with self._lock:
            return self._config, self._generation

    def set(self, config: Config) -> int:
        """A reload applied: ``config`` is in force from now on; returns its generation."""
        with self._lock:
            self._config = config
            self._generation += 1
            return self._generation
