"""Reader leases and snapshot retention.

A lease is a JSON file ``leases/<holder>.json`` naming one snapshot; a holder pins at most one snapshot per table
and renews by rewriting its file. The file is a heartbeat, not a deadline: the daemon times each lease on its own
monotonic clock from the moment it first saw the current version of the file (taken or renewed), and holds it while
less than the lease's ``ttl_s`` has passed since. No two wall clocks are compared, so a wall-clock step (NTP, a VM
resumed, ``date -s``) in the daemon or in a reader neither expires a lease early nor keeps it for ever. A daemon
that starts knows no history: it treats every lease it finds as just renewed (it keeps snapshots longer, never
shorter).

The file also carries ``expires`` (the writer's wall clock plus ``ttl_s``), which is all a reader before this
format wrote and all a daemon before it reads. Such a legacy lease, lacking ``ttl_s``, holds for what was left of
it on the daemon's wall clock when the daemon saw it, counted from then on the monotonic clock. Every write carries
a fresh ``renewal`` token, so a renewal is a change the daemon notices even when the writer's clock went back.

Retention keeps the newest K snapshots, the one CURRENT points at, every snapshot a held lease names and any the
daemon is still using; nothing else.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from globald.snapshot.manifest import read_json, valid_id, write_json
from globald.store.names import SNAPSHOT_LEASES_DIR

HOLDER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
RENEWAL_RE = re.compile(r"^[0-9a-f]{1,64}$")
MAX_LEASE_S = 7 * 24 * 3600.0
GARBAGE_GRACE_S = 60.0  # unreadable lease files are deleted once seen unchanged this long (writers rename)


@dataclass(frozen=True)
class Lease:
    holder: str
    snapshot: str
    expires: float  # the writer's wall clock + ttl_s: read only by daemons before the ttl_s format
    ttl_s: float | None = None  # None: written by a reader before this format (see the module docstring)
    renewal: str | None = None  # a fresh token per write: any renewal changes the file


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
    """Pin ``snapshot`` for ``ttl_s`` seconds of the daemon's time from when it sees this write (replacing what
    ``holder`` pinned before). Renew by calling again before ``ttl_s`` has passed on the caller's monotonic clock."""
    if not valid_id(snapshot):
        raise ValueError(f"{snapshot!r} is not a snapshot id")
    ttl = min(max(ttl_s, 0.0), MAX_LEASE_S)
    lease = Lease(holder, snapshot, time.time() + ttl, ttl, secrets.token_hex(8))
    path = _path(table_dir, holder)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Not durable: the readers a lease protects run on this machine and do not outlive a power loss with it.
    write_json(path, {"holder": holder, "snapshot": snapshot, "expires": lease.expires, "ttl_s": ttl,
                      "renewal": lease.renewal}, durable=False)
    return lease


def release(table_dir: Path, holder: str) -> None:
    _path(table_dir, holder).unlink(missing_ok=True)


def _number(doc: dict[str, object], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    return float(value)


def parse(doc: dict[str, object], holder: str) -> Lease:
    snapshot, renewal = doc.get("snapshot"), doc.get("renewal")
    if doc.get("holder") != holder:
        raise ValueError("holder does not match the file name")
    if not valid_id(snapshot):
        raise ValueError(f"snapshot {snapshot!r} is not a snapshot id")
    expires = _number(doc, "expires")
    ttl = None if doc.get("ttl_s") is None else _number(doc, "ttl_s")
    if ttl is not None and not 0.0 <= ttl <= MAX_LEASE_S:
        raise ValueError(f"ttl_s must be within [0, {MAX_LEASE_S:.0f}] seconds")
    if renewal is not None and not (isinstance(renewal, str) and RENEWAL_RE.match(renewal)):
        raise ValueError("renewal must be a short hex token")
    return Lease(holder, str(snapshot), expires, ttl, renewal)


Scanned = tuple[Path, int, Lease | OSError | None]


def _scan(table_dir: Path) -> list[Scanned]:
    """(path, inode, what it holds) of every lease file: a lease, None when it is not one, or the error reading it."""
    out: list[Scanned] = []
    try:
        entries = list(os.scandir(table_dir / SNAPSHOT_LEASES_DIR))
    except FileNotFoundError:
        return out
    for e in entries:
        if e.name.startswith(".") or not e.name.endswith(".json"):
            continue
        path = Path(e.path)
        try:
            out.append((path, e.inode(), parse(read_json(path), e.name[: -len(".json")])))
        except ValueError:
            out.append((path, e.inode(), None))
        except OSError as err:  # gone meanwhile, or a failing disk: not known to be garbage
            out.append((path, e.inode(), err))
    return out


def read_all(table_dir: Path) -> tuple[list[Lease], list[Path]]:
    """(valid leases, paths of files that are not valid leases)."""
    found = _scan(table_dir)
    return ([lease for _, _, lease in found if isinstance(lease, Lease)],
            [path for path, _, lease in found if not isinstance(lease, Lease)])


@dataclass(frozen=True)
class _Seen:
    version: tuple[int, Lease | None]  # inode and content: a writer renames a new file in, so any write changes it
    at: float  # the daemon's monotonic clock when it first saw this version
    hold_s: float  # how long this version holds from ``at`` (for garbage: the grace before it is deleted)


class LeaseClock:
    """The daemon's view of one table's leases, timed on its monotonic clock (see the module docstring).

    ``refresh`` reads the lease files and returns the snapshots held now; ``sweep`` deletes the lease files that
    expired (and unreadable ones seen unchanged for GARBAGE_GRACE_S). One thread uses an instance at a time.
    """

    def __init__(self, table_dir: Path, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.table_dir = table_dir
        self._monotonic = monotonic
        self._wall = wall
        self._seen: dict[Path, _Seen] = {}

    def refresh(self) -> set[str]:
        """The snapshot ids held by a lease now."""
        now = self._monotonic()
        seen: dict[Path, _Seen] = {}
        for path, inode, lease in _scan(self.table_dir):
            before = self._seen.get(path)
            if isinstance(lease, OSError):  # unreadable this once: as it was (a file never read holds nothing yet)
                if before is not None:
                    seen[path] = before
                continue
            version = (inode, lease)
            if before is not None and before.version == version:
                seen[path] = before
            else:
                seen[path] = _Seen(version, now, self._hold_s(lease))
        self._seen = seen  # files gone (released, deleted) are forgotten
        return {s.version[1].snapshot for s in seen.values() if s.version[1] is not None and now - s.at < s.hold_s}

    def _hold_s(self, lease: Lease | None) -> float:
        if lease is None:
            return GARBAGE_GRACE_S
        if lease.ttl_s is not None:
            return lease.ttl_s
        # A legacy lease: its remaining time, read once on this host's wall clock, then counted monotonically.
        return min(max(lease.expires - self._wall(), 0.0), MAX_LEASE_S)

    def sweep(self) -> int:
        """Delete lease files whose version expired (and garbage past its grace); returns how many were deleted."""
        now = self._monotonic()
        n = 0
        for path, s in list(self._seen.items()):
            if now - s.at < s.hold_s:
                continue
            try:
                # A writer that renewed since refresh renamed a new file in: leave it for the next refresh.
                if path.stat().st_ino != s.version[0]:
                    continue
                path.unlink()
                n += 1
            except OSError:
                continue
            del self._seen[path]
        return n


def doomed(ids: Iterable[str], retain: int, keep: set[str]) -> list[str]:
    """Snapshot ids retention deletes: all but the newest ``retain`` and those in ``keep`` (current, leased, busy)."""
    newest_first = sorted((i for i in ids if valid_id(i)), reverse=True)
    return [i for i in newest_first[retain:] if i not in keep]
