"""Reader leases and snapshot retention.

A lease is a JSON file ``leases/<holder>.json`` naming one snapshot and an expiry (epoch seconds); a holder pins at
most one snapshot per table and renews by rewriting its file. Retention keeps the newest K snapshots, the one
CURRENT points at, every snapshot an unexpired lease names and any the daemon is still using; nothing else.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from globald.snapshot.manifest import read_json, valid_id, write_json
from globald.store.names import SNAPSHOT_LEASES_DIR

HOLDER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
MAX_LEASE_S = 7 * 24 * 3600.0
GARBAGE_GRACE_S = 60.0  # unreadable lease files are deleted once this old (a writer renames, never truncates)


@dataclass(frozen=True)
class Lease:
    holder: str
    snapshot: str
    expires: float


def default_holder(tag: str = "") -> str:
    """This process on this host: ``<host>-<pid>[-<tag>]``, reduced to the holder alphabet."""
    raw = f"{socket.gethostname()}-{os.getpid()}" + (f"-{tag}" if tag else "")
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", raw).lstrip(".-")[:128]
    return clean or f"pid{os.getpid()}"


def _path(table_dir: Path, holder: str) -> Path:
    if not HOLDER_RE.match(holder):
        raise ValueError(f"lease holder {holder!r} is not a valid name")
    return table_dir / SNAPSHOT_LEASES_DIR / f"{holder}.json"


def take(table_dir: Path, holder: str, snapshot: str, ttl_s: float) -> Lease:
    """Pin ``snapshot`` for ``ttl_s`` seconds (replacing what ``holder`` pinned before)."""
    if not valid_id(snapshot):
        raise ValueError(f"{snapshot!r} is not a snapshot id")
    lease = Lease(holder, snapshot, time.time() + min(max(ttl_s, 0.0), MAX_LEASE_S))
    path = _path(table_dir, holder)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json(path, {"holder": holder, "snapshot": snapshot, "expires": lease.expires})
    return lease


def release(table_dir: Path, holder: str) -> None:
    _path(table_dir, holder).unlink(missing_ok=True)


def parse(doc: dict[str, object], holder: str) -> Lease:
    snapshot, expires = doc.get("snapshot"), doc.get("expires")
    if doc.get("holder") != holder:
        raise ValueError("holder does not match the file name")
    if not valid_id(snapshot):
        raise ValueError(f"snapshot {snapshot!r} is not a snapshot id")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise ValueError("expires must be a number")
    return Lease(holder, str(snapshot), float(expires))


def read_all(table_dir: Path) -> tuple[list[Lease], list[Path]]:
    """(valid leases, paths of files that are not valid leases)."""
    leases: list[Lease] = []
    garbage: list[Path] = []
    folder = table_dir / SNAPSHOT_LEASES_DIR
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return leases, garbage
    for e in entries:
        if e.name.startswith(".") or not e.name.endswith(".json"):
            continue
        path = Path(e.path)
        try:
            leases.append(parse(read_json(path), e.name[: -len(".json")]))
        except (OSError, ValueError):
            garbage.append(path)
    return leases, garbage


def pinned(leases: Iterable[Lease], now: float) -> set[str]:
    return {lease.snapshot for lease in leases if lease.expires > now}


def sweep(table_dir: Path, now: float) -> int:
    """Delete expired leases and old unreadable lease files; returns how many were deleted."""
    leases, garbage = read_all(table_dir)
    doomed = [_path(table_dir, lease.holder) for lease in leases if lease.expires <= now]
    for path in garbage:
        try:
            if now - path.stat().st_mtime > GARBAGE_GRACE_S:
                doomed.append(path)
        except OSError:
            continue
    n = 0
    for path in doomed:
        try:
            path.unlink()
            n += 1
        except OSError:
            pass
    return n


def doomed(ids: Iterable[str], retain: int, keep: set[str]) -> list[str]:
    """Snapshot ids retention deletes: all but the newest ``retain`` and those in ``keep`` (current, leased, busy)."""
    newest_first = sorted((i for i in ids if valid_id(i)), reverse=True)
    return [i for i in newest_first[retain:] if i not in keep]
