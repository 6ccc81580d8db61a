"""What the daemon knows about one table's snapshots, in one object whose methods take its lock themselves.

Contract: a ``SnapshotTable`` is the one place its fields change (``__slots__``, no public setters;
tests/unit/test_architecture_claims.py checks that no other module assigns them). It is read and changed from two
threads: the loop thread (periodic publishing, the request desk, retention, the engine's events) and the
exact-build worker. Each method is atomic under the table's own re-entrant lock; a sequence that must not
interleave with the other thread (a wipe's keep-verified, forget and stale mark; a build's generation check,
manifest and rename; a retention sweep against the builds' bases) runs inside ``with tab.locked():``. Nothing
here touches the disk: the modules around it write files, then record here what they wrote.

The fields, and who moves them:

- ``current``: the manifest CURRENT names (publishing, ``recreated.point_current``), and ``stale_reason``: why it is
  stale, None while fresh;
- ``published_offsets``: the offsets of the newest fresh periodic snapshot (None after a wipe: publish again);
- ``generation``: new at every wipe, drop or replacement by a reload, and unique in the process (a table added
  again under a name never takes up an old one's); a build admitted in another generation is discarded
  (``exact_builds``);
- ``busy``: snapshots a build is copying from, kept from retention;
- ``unmarked``: a wipe's reason not yet written into every manifest (the disk refused);
- ``fingerprints``: the last identity check (``engine.events.Verified``), which a build reads back first;
- counters and the last publish's error for status (``published``, ``exact_built``, ``refused``, ``last_error``,
  ``short_of_space``: that error was a full disk, so retention frees room).

``SnapshotIds`` hands out snapshot ids, increasing across all tables and both threads.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from globald.settings.config import TableConfig
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest, Offsets
from globald.status.document import SnapshotStatus
from globald.store.fingerprint import Fingerprint

Fingerprints = dict[int, tuple[Fingerprint, ...]]


_GENERATIONS = itertools.count(1)  # shared by every table: a generation is never reused in the process

class SnapshotTable:
    """One table's snapshot state (see the module docstring)."""

    __slots__ = ("_busy", "_current", "_exact_built", "_fingerprints", "_generation", "_last_error", "_last_publish_s",
                 "_lock", "_no_room_said", "_published", "_published_offsets", "_refused", "_short_of_space",
                 "_stale_reason", "_unmarked", "config", "dir")

    def __init__(self, config: TableConfig, table_dir: Path) -> None:
        self.config = config
        self.dir = table_dir
        self._lock = threading.RLock()
        self._current: Manifest | None = None
        self._published_offsets: Offsets | None = None
        self._stale_reason: str | None = None
        self._generation = next(_GENERATIONS)
        self._busy: set[str] = set()
        self._published = 0
        self._exact_built = 0
        self._refused: Counter[str] = Counter()
        self._last_publish_s = 0.0
        self._last_error: str | None = None
        self._short_of_space = False
        self._unmarked: str | None = None
        self._fingerprints: Fingerprints = {}
        self._no_room_said = float("-inf")  # when a refusal for room was last logged (monotonic)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table for a sequence the other thread must not interleave with (the module docstring)."""
        with self._lock:
            yield

    # -- reads ---------------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def current(self) -> Manifest | None:
        return self._current

    @property
    def current_id(self) -> str | None:
        cur = self._current
        return cur.id if cur else None

    @property
    def stale_reason(self) -> str | None:
        return self._stale_reason

    @property
    def published_offsets(self) -> Offsets | None:
        return self._published_offsets

    @property
    def publications(self) -> int:
        """How many publishes made a snapshot CURRENT in this run."""
        with self._lock:
            return self._published

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def unmarked(self) -> str | None:
        return self._unmarked

    @property
    def short_of_space(self) -> bool:
        return self._short_of_space

    def busy(self) -> set[str]:
        with self._lock:
            return set(self._busy)

    def fingerprints(self) -> Fingerprints:
        with self._lock:
            return dict(self._fingerprints)

    def refused(self, code: str) -> int:
        with self._lock:
            return self._refused[code]

    def servable(self, serve_stale: bool) -> bool:
        with self._lock:
            return self._current is not None and (self._stale_reason is None or serve_stale)

    def publish_seconds(self) -> float | None:
        with self._lock:
            return self._last_publish_s if self._published else None

    def status(self) -> SnapshotStatus:
        with self._lock:
            cur = self._current
            return SnapshotStatus(
                current=cur.id if cur else None, offsets=dict(cur.offsets) if cur else {},
                created=cur.created if cur else None, stale=self._stale_reason is not None,
                stale_reason=self._stale_reason, published=self._published, exact_built=self._exact_built,
                refused=dict(self._refused), last_publish_ms=self._last_publish_s * 1000, last_error=self._last_error)

    # -- changes ---------------------------------------------------------------------------------------------------

    def loaded(self, current: Manifest | None) -> None:
        """At start: CURRENT as found on disk (a stale one keeps its reason, and a fresh one is the last published)."""
        with self._lock:
            self._current = current
            if current is not None:
                self._stale_reason = current.stale_reason if current.stale else None
                self._published_offsets = None if current.stale else current.offsets

    def pointed(self, current: Manifest | None, stale_reason: str | None) -> None:
        """CURRENT now names ``current`` (or nothing), for ``stale_reason`` (``recreated.point_current``)."""
        with self._lock:
            self._current, self._stale_reason = current, stale_reason

    def published_now(self, m: Manifest, seconds: float) -> None:
        """A periodic (or desk) publish made ``m`` CURRENT in ``seconds``."""
        with self._lock:
            self._current, self._published_offsets, self._stale_reason = m, dict(m.offsets), None
            self._published += 1
            self._last_publish_s = seconds

    def publish_tried(self, error: str | None, short_of_space: bool = False) -> None:
        """The outcome of a publish attempt (or of writing stale marks): None when it went through."""
        with self._lock:
            self._last_error, self._short_of_space = error, short_of_space

    def redeclared(self, config: TableConfig) -> None:
        """A reload changed the table's declared format in place (``settings.changes``): the next publish makes a
        new version even if no record arrived, the first one readers decode with the new declaration."""
        with self._lock:
            self.config = config
            self._published_offsets = None

    def wiped(self, reason: str) -> None:
        """A wipe: builds of the older generation are discarded, CURRENT is stale until the table is RUNNING, and
        ``reason`` is owed to every manifest on disk (``unmarked``)."""
        with self._lock:
            self._generation = next(_GENERATIONS)
            self._published_offsets = None
            self._unmarked = reason
            if self._current is not None:
                self._current = self._current.marked_stale(self._current.stale_reason or reason)
                self._stale_reason = self._current.stale_reason

    def retired(self) -> None:
        """Dropped or replaced by a reload: a build still running for it is discarded (its generation moves on),
        never renamed into the directory a table added again under its name owns."""
        with self._lock:
            self._generation = next(_GENERATIONS)

    def marks_written(self) -> None:
        with self._lock:
            self._unmarked = None

    def verified(self, fingerprints: Fingerprints) -> None:
        """The engine's last identity check (``engine.events.Verified``); {} forgets it."""
        with self._lock:
            self._fingerprints = dict(fingerprints)

    def hold_base(self, snapshot: str) -> None:
        with self._lock:
            self._busy.add(snapshot)

    def release_base(self, snapshot: str) -> None:
        with self._lock:
            self._busy.discard(snapshot)

    def built(self) -> None:
        with self._lock:
            self._exact_built += 1

    def refusal(self, code: str, loud_after: float, now: float, quiet_code: str) -> tuple[int, bool]:
        """Count a refused request; returns the count of its code and whether to log it. ``quiet_code`` (no room,
        which a disk that stays short answers to every request) is logged once per ``loud_after`` seconds."""
        with self._lock:
            self._refused[code] += 1
            loud = code != quiet_code or now >= self._no_room_said + loud_after
            if loud and code == quiet_code:
                self._no_room_said = now
            return self._refused[code], loud


class SnapshotIds:
    """Snapshot ids, each newer than every earlier one of this state_dir (both threads, all tables)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: str | None = None

    def seen(self, sid: str) -> None:
        """At start: an id found on disk; new ids follow it."""
        with self._lock:
            if self._last is None or sid > self._last:
                self._last = sid

    def next(self) -> str:
        with self._lock:
            self._last = manifests.new_id(self._last)
            return self._last
