"""Read-only access to published snapshots: list them, open CURRENT or a given id, look keys up.

A snapshot is an immutable checkpoint of a table store, so an open snapshot always shows the fold of its topic
below its manifest's offsets, whatever the daemon does meanwhile. Only snapshots with a valid manifest are ever
listed or opened; a stale CURRENT is refused when the caller asks not to be served stale data.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from globald.common.errors import (
    ManifestError,
    SnapshotNotFoundError,
    SnapshotStaleError,
    StoreCorruptError,
    StoreUnavailableError,
)
from globald.snapshot import leases
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest, Offsets, valid_id
from globald.store.history import HistoryMeta, Version
from globald.store.names import SNAPSHOT_CURRENT, SNAPSHOT_DB_DIR, snapshots_dir
from globald.store.reader import Origin, StoreReader

log = logging.getLogger(__name__)

Value = tuple[bytes, int]  # (value, timestamp)


class ListedSnapshot(TypedDict):
    """One entry of ``globald snapshots --json``; offsets keyed by partition as a string, as in JSON."""

    id: str
    offsets: dict[str, int]
    created: float
    stale: bool
    current: bool


def current_id(state_dir: Path, table: str) -> str | None:
    """The id CURRENT points at, or None when there is none (or it is not a valid id)."""
    try:
        text = (snapshots_dir(state_dir, table) / SNAPSHOT_CURRENT).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if valid_id(text) else None


def manifests_of(state_dir: Path, table: str) -> list[Manifest]:
    """Valid manifests of every published snapshot of ``table``, newest first."""
    base = snapshots_dir(state_dir, table)
    try:
        names = [e.name for e in os.scandir(base) if valid_id(e.name)]
    except FileNotFoundError:
        return []
    out: list[Manifest] = []
    for name in sorted(names, reverse=True):
        try:
            out.append(manifests.read(base / name, table))
        except ManifestError as e:
            log.debug("skipping snapshot: %s", e)
    return out


def listing(state_dir: Path, table: str) -> list[ListedSnapshot]:
    """The ``globald snapshots --json`` document: newest first."""
    cur = current_id(state_dir, table)
    return [ListedSnapshot(id=m.id, offsets=manifests.offsets_to_json(m.offsets), created=m.created, stale=m.stale,
                           current=m.id == cur) for m in manifests_of(state_dir, table)]


def find_exact(state_dir: Path, table: str, offsets: Offsets, hint: str | None = None) -> Manifest | None:
    """A snapshot at exactly ``offsets``: ``hint`` if it matches (even stale), else the newest fresh one."""
    found = manifests_of(state_dir, table)
    for m in found:
        if m.id == hint and m.offsets == offsets:
            return m
    return next((m for m in found if not m.stale and m.offsets == offsets), None)


@dataclass(frozen=True)
class OpenOptions:
    serve_stale: bool = True
    lease_s: float = 0.0  # > 0: pin the snapshot with a lease for this long (renewed by ``renew``)
    holder: str | None = None  # lease holder; default: this host and process


class Snapshot:
    """An open, read-only snapshot. Values come back as (value, timestamp)."""

    def __init__(self, state_dir: Path, table: str, snapshot_id: str | None = None,
                 options: OpenOptions = OpenOptions()) -> None:
        sid = snapshot_id or current_id(state_dir, table)
        if sid is None:
            raise SnapshotNotFoundError(f"table {table} has no current snapshot under {state_dir}")
        if not valid_id(sid):
            raise SnapshotNotFoundError(f"{sid!r} is not a snapshot id")
        self.table_dir = snapshots_dir(state_dir, table)
        path = self.table_dir / sid
        if not path.is_dir():
            raise SnapshotNotFoundError(f"table {table} has no snapshot {sid}")
        self.manifest = manifests.read(path, table)
        if self.manifest.stale and not options.serve_stale:
            raise SnapshotStaleError(f"snapshot {sid} of {table} is stale ({self.manifest.stale_reason}) and "
                                     "serve_stale is off")
        self._options = options
        self._holder = options.holder or leases.default_holder(table)
        self._renewed: float | None = None  # this process's monotonic clock at the last lease write
        self.renew()
        try:
            self._reader = StoreReader(path / SNAPSHOT_DB_DIR, attempts=2)
        except (StoreUnavailableError, StoreCorruptError) as e:
            self.release()
            raise SnapshotNotFoundError(f"snapshot {sid} of {table} cannot be opened: {e}") from None

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def offsets(self) -> Offsets:
        return dict(self.manifest.offsets)

    def renew(self) -> None:
        """Renew this reader's lease once half of it has run out (cheap to call often). Timed on the monotonic
        clock, as the daemon times it: a wall-clock step neither hastens nor delays a renewal."""
        ttl = self._options.lease_s
        if ttl <= 0:
            return
        now = time.monotonic()
        if self._renewed is None or now - self._renewed >= ttl / 2:
            leases.take(self.table_dir, self._holder, self.manifest.id, ttl)
            self._renewed = now

    def release(self) -> None:
        if self._options.lease_s > 0:
            leases.release(self.table_dir, self._holder)
            self._renewed = None

    def close(self, release: bool = False) -> None:
        self._reader.close()
        if release:
            self.release()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(release=True)

    # -- lookups -------------------------------------------------------------------------------------------------

    def get(self, key: bytes) -> Value | None:
        return self._reader.get(key)

    def multi_get(self, keys: list[bytes]) -> list[Value | None]:
        """One batched RocksDB multi-get (it releases the GIL)."""
        return self._reader.multi_get(keys) if keys else []

    def multi_get_stored(self, keys: list[bytes]) -> list[bytes | None]:
        """Values as stored (8-byte big-endian timestamp, then the value), for batch decoders."""
        return self._reader.multi_get_stored(keys) if keys else []

    def items(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, timestamp) for keys in [start, end), in key order."""
        return self._reader.items(start, end)

    def prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes, int]]:
        return self._reader.prefix(prefix)

    def origins(self, keys: Sequence[bytes], values: Sequence[bytes], stamps: Sequence[int]) -> list[Origin | None]:
        """Where each (key, value, timestamp) read from this snapshot came from (see ``StoreReader.origins``)."""
        return self._reader.origins(keys, values, stamps)

    @property
    def history(self) -> HistoryMeta | None:
        """What the snapshot's store says of its versions; None when it holds none (``store.history``)."""
        return self._reader.history

    def as_of(self, key: bytes, t: int) -> Version | None:
        """The version of ``key`` in force at record time ``t`` (see ``StoreReader.as_of``)."""
        return self._reader.as_of(key, t)

    def history_entries(self, chunk: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """The history family's entries as stored, in chunks (``StoreReader.history_entries``)."""
        return self._reader.history_entries(chunk)

    def items_as_of(self, t: int) -> Iterator[tuple[bytes, bytes, int]]:
        return self._reader.items_as_of(t)

    def versions_as_of(self, t: int) -> Iterator[Version]:
        return self._reader.versions_as_of(t)

    def __iter__(self) -> Iterator[tuple[bytes, bytes, int]]:
        return self._reader.items()

    def to_dict(self) -> dict[bytes, Value]:
        return {k: (v, ts) for k, v, ts in self._reader.items()}


def open_snapshot(state_dir: Path, table: str, snapshot_id: str | None = None, *, serve_stale: bool = True,
                  lease_s: float = 0.0) -> Snapshot:
    """Open ``snapshot_id`` (default: CURRENT) of ``table`` read-only."""
    return Snapshot(state_dir, table, snapshot_id, OpenOptions(serve_stale=serve_stale, lease_s=lease_s))
