"""Disk space a table takes, measured the way the disk counts it: each inode once, however many hard links name it.

A snapshot is a RocksDB checkpoint, so its table files are hard links to the live store's until a compaction
rewrites them; only then does a snapshot cost space of its own. ``measure`` splits a table's bytes into the live
store, what its snapshots hold beyond the live store, and work left behind (trash, builds, imports), so an operator
sees what holds the disk and globald can decide what it may free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from globald.store.names import (
    COLUMNAR_PREFIX,
    COLUMNAR_SUFFIX,
    IMPORT_PREFIX,
    REPLACED_PREFIX,
    SNAPSHOT_BUILD_PREFIX,
    SNAPSHOT_TMP_PREFIX,
    SNAPSHOT_TRASH_PREFIX,
    db_dir,
    snapshots_dir,
    tables_dir,
)
from globald.store.options import StoreOptions

log = logging.getLogger(__name__)

# Names under snapshots/<table>/ and tables/ that only ever hold work in progress or work to delete.
LEFTOVER_PREFIXES = (SNAPSHOT_TMP_PREFIX, SNAPSHOT_BUILD_PREFIX, SNAPSHOT_TRASH_PREFIX)
TABLE_LEFTOVER_PREFIXES = (IMPORT_PREFIX, REPLACED_PREFIX)

MB = 1 << 20


@dataclass(frozen=True)
class TableSpace:
    """Bytes of one table on disk, each inode counted once.

    ``snapshots`` is what the snapshots hold that the live store does not (what deleting them all would free);
    ``by_snapshot`` the store data each holds that the live store lacks, each counted against the live store only,
    without the files derived from it (``derived``: a typed table's columnar file, which publishing the snapshot
    again would only make again, so it never makes CURRENT worth republishing); ``leftovers`` the bytes of trash
    and abandoned builds."""

    live: int
    snapshots: int
    leftovers: int
    by_snapshot: dict[str, int]
    derived: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.live + self.snapshots + self.leftovers


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still write on ``path``'s filesystem; None when it cannot be asked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def files(root: Path) -> Iterator[os.stat_result]:
    """Every regular file under ``root`` (not following links); a file vanishing meanwhile is skipped."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                yield from files(Path(e.path))
            elif e.is_file(follow_symlinks=False):
                yield e.stat(follow_symlinks=False)
        except OSError:
            continue


def _inodes(root: Path) -> dict[tuple[int, int], int]:
    return {(st.st_dev, st.st_ino): st.st_blocks * 512 for st in files(root)}


def measure(state_dir: Path, table: str) -> TableSpace:
    """The space ``table`` takes now. Racing a compaction or a publish, the figures are a moment's, not exact."""
    live = _inodes(db_dir(state_dir, table))
    snaps_root = snapshots_dir(state_dir, table)
    by_snapshot: dict[str, int] = {}
    held: dict[tuple[int, int], int] = {}
    leftovers: dict[tuple[int, int], int] = {}
    try:
        entries = [e for e in os.scandir(snaps_root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        entries = []
    derived: dict[str, int] = {}
    for e in entries:
        files = _inodes(Path(e.path))
        own = {k: v for k, v in files.items() if k not in live}
        if e.name.startswith(LEFTOVER_PREFIXES):
            leftovers.update(own)
        elif e.name[:1].isdigit():
            made = {k: v for k, v in _derived(Path(e.path)).items() if k in own}
            by_snapshot[e.name] = sum(v for k, v in own.items() if k not in made)
            derived[e.name] = sum(made.values())
            held.update(own)
    for path in leftover_table_dirs(state_dir, table):
        leftovers.update(_inodes(path))
    return TableSpace(live=sum(live.values()), snapshots=sum(held.values()),
                      leftovers=sum(v for k, v in leftovers.items() if k not in held), by_snapshot=by_snapshot,
                      derived=derived)


def _derived(snapshot: Path) -> dict[tuple[int, int], int]:
    """The files a reader derived from the snapshot in its directory (columnar files), by inode."""
    found = {}
    try:
        entries = list(os.scandir(snapshot))
    except OSError:
        return {}
    for e in entries:
        if e.name.startswith(COLUMNAR_PREFIX) and e.name.endswith(COLUMNAR_SUFFIX):
            with contextlib.suppress(OSError):
                st = e.stat(follow_symlinks=False)
                found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return found


def remove_leftovers(snapshots_root: Path) -> int:
    """Delete work in progress and trash under a table's snapshots directory (the caller knows none is running);
    returns the bytes freed."""
    freed = 0
    for e in list(os.scandir(snapshots_root)):
        if not e.name.startswith(LEFTOVER_PREFIXES):
            continue
        if e.is_dir(follow_symlinks=False):
            freed += sum(st.st_blocks * 512 for st in files(Path(e.path)))
            shutil.rmtree(e.path, ignore_errors=True)
        else:  # an atomic replace's temporary file
            with contextlib.suppress(OSError):
                freed += e.stat(follow_symlinks=False).st_blocks * 512
                os.unlink(e.path)
    return freed


def leftover_table_dirs(state_dir: Path, table: str) -> list[Path]:
    """An import or a replaced store of ``table`` left under tables/ (the daemon holds the state_dir's lock, so
    no offline command is building them)."""
    root = tables_dir(state_dir)
    return [p for p in (root / f"{prefix}{table}" for prefix in TABLE_LEFTOVER_PREFIXES) if p.exists()]


def minimum_state_dir(live: int, write_buffer_mb: int, rebuild_while_serving: bool = False) -> int:
    """The documented sizing rule (docs/operations/disk-space.md), in bytes, for one table whose live store (about its
    compacted topic's size) is ``live``: a restore holds the bulk load's pile while the merge after it writes the
    table again (2x); later, a compaction rewriting the whole table needs as much free (2x); a memtable being
    flushed and the WAL take up to two write buffers. A KIP-406 rebuild that serves the stale snapshot keeps a
    third copy until it is RUNNING (3x)."""
    return (3 if rebuild_while_serving else 2) * live + 2 * (write_buffer_mb << 20)


def fit_bulk_load(options: StoreOptions, state_dir: Path) -> StoreOptions:
    """A bulk load's options with its L0 pile bounded by the room on the disk: at most a quarter of the free bytes.

    The pile holds every record read, overwrites included, until the merge after the load writes the table again
    beside it: on a disk without room for that, a pile past its bound is merged during the load (RocksDB's usual
    leveled compaction, which drops the overwrites early), so the load never starts what the disk cannot finish.
    On a roomy disk nothing changes (``bulk_l0_mb``, 2 GiB by default, keeps the load's speed)."""
    free = free_bytes(state_dir)
    if free is None or free // (4 * MB) >= options.bulk_l0_mb:
        return options
    bound = max(2 * options.bulk_buffer_mb, free // (4 * MB))
    log.info("bulk load: L0 pile bounded to %d MiB (a quarter of the %s free on the state_dir, not %d MiB)", bound,
             mb(free), options.bulk_l0_mb)
    return replace(options, bulk_l0_mb=bound)


def mb(n: int) -> str:
    return f"{n / MB:.1f} MB"
