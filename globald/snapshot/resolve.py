"""Resolving target offsets to a local snapshot: a local exact match, else a request to the local daemon, else
the caller's policy (fail, or take the newest snapshot and say so).

An exact resolution names a snapshot whose manifest offsets equal the target, so every host resolving the same
target reads the same content. Anything else is marked ``exact=False`` with a note saying what was wanted and
why it could not be had; it is never silent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from globald.common.errors import SnapshotStaleError, SnapshotUnavailableError
from globald.snapshot import exact_requests
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest, Offsets
from globald.snapshot.reader import current_id, find_exact
from globald.store.names import snapshots_dir

log = logging.getLogger(__name__)


class Policy(StrEnum):
    FAIL = "fail"  # raise SnapshotUnavailableError
    NEWEST = "newest"  # use CURRENT, flagged as not exact


@dataclass(frozen=True)
class Resolution:
    snapshot: str
    offsets: Offsets
    exact: bool
    stale: bool
    note: str | None = None


def _found(m: Manifest, exact: bool, note: str | None = None) -> Resolution:
    return Resolution(m.id, dict(m.offsets), exact, m.stale, note)


def resolve(state_dir: Path, table: str, target: Offsets, *, hint: str | None = None, timeout: float = 30.0,
            policy: Policy = Policy.FAIL, serve_stale: bool = True,
            lease_s: float = exact_requests.DEFAULT_LEASE_S) -> Resolution:
    """The local snapshot to read for ``target``; waits at most ``timeout`` seconds for the daemon."""
    m = find_exact(state_dir, table, target, hint)
    if m is not None:
        return _found(m, True)
    resp = exact_requests.request(state_dir, table, target, timeout, lease_s)
    if resp.ok and resp.snapshot is not None:
        return _found(manifests.read(snapshots_dir(state_dir, table) / resp.snapshot, table), True)
    if policy == Policy.FAIL:
        raise SnapshotUnavailableError(resp.code.value, f"table {table} at {target}: {resp.message}")
    newest = newest_snapshot(state_dir, table, serve_stale)
    if newest is None:
        raise SnapshotUnavailableError(resp.code.value, f"table {table} at {target}: {resp.message}; "
                                                        "and there is no snapshot to fall back to")
    note = (f"table {table}: no snapshot at {target} ({resp.code.value}: {resp.message}); using the newest, "
            f"{newest.id} at {newest.offsets}" + (f", which is stale ({newest.stale_reason})" if newest.stale else ""))
    log.warning("%s", note)
    return _found(newest, False, note)


def newest_snapshot(state_dir: Path, table: str, serve_stale: bool = True) -> Manifest | None:
    """CURRENT's manifest; None when there is none. Raises SnapshotStaleError when stale and not to be served."""
    sid = current_id(state_dir, table)
    if sid is None:
        return None
    m = manifests.read(snapshots_dir(state_dir, table) / sid, table)
    if m.stale and not serve_stale:
        raise SnapshotStaleError(f"snapshot {sid} of {table} is stale ({m.stale_reason}) and serve_stale is off")
    return m
