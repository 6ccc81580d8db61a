"""Keeps room on the state_dir for a table's next step, by freeing what globald itself owns there.

The step that needs the most room is a compaction that rewrites the whole live store (the merge after a bulk
load, or an L0 compaction into a one-level table): RocksDB writes the new files before it deletes the old, so it
needs the live store's size free. Snapshots are hard links, free until such a compaction leaves
them holding the old files. When the room falls below that need (or the disk refused a write), the guard frees,
in this order, what no reader can hold: trash, abandoned builds, imports left over; then snapshots other than
CURRENT and the leased ones, oldest first. CURRENT that holds files the live store dropped is published again
at the same offsets (when no lease holds it), and a snapshot with the same offsets as a newer one is deleted at
the next sweep (whatever ``retain`` says: no reader can want it unless it holds a lease on it).

What it could not free, and what holds the space, is said in one line (``note``), in the log and in status; the
daemon keeps retrying as before, and resumes without a restart once an operator frees space.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from globald.common.errors import ManifestError
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest, Offsets
from globald.status.document import DiskStatus
from globald.store import space
from globald.store.names import SNAPSHOT_BUILD_PREFIX, SNAPSHOT_DB_DIR, db_dir
from globald.store.space import MB, TableSpace, mb

log = logging.getLogger(__name__)

# Republish CURRENT at the same offsets once it alone holds this share of the live store's size (the merge after
# a bulk load leaves it holding the whole pre-merge pile).
REPUBLISH_SHARE = 0.25
# Below this, what CURRENT holds alone is RocksDB's small copied files (MANIFEST, OPTIONS), not a rewritten table.
REPUBLISH_MIN_BYTES = 1 * MB
# A full disk is said again at most this often while it stays the same.
NOTE_EVERY_S = 60.0
# Bytes per record an exact build assumes when neither its base nor the newest snapshot has any record to tell.
DEFAULT_RECORD_BYTES = 1024


@dataclass(frozen=True)
class BuildNeed:
    """The room an exact build needs on the state_dir, at most. Its base is hard-linked (no new bytes), the records
    it reads are written into new files, and a compaction of the build's database may rewrite the base and those
    files together while its inputs still exist: base + 2 x the records read. Without a base, the build reads the
    topic from its log start: about the table's live size."""

    base: int  # bytes of the base snapshot's database (0: no base)
    records: int  # records between the base and the target, at most (0: no base)
    record_bytes: int  # estimated bytes per record
    table: int  # the live store's bytes: the need when there is no base
    has_base: bool

    @property
    def total(self) -> int:
        return self.base + 2 * self.records * self.record_bytes if self.has_base else self.table

    def describe(self) -> str:
        if not self.has_base:
            return f"{mb(self.total)}: no base snapshot, the table read from the log start (its live store's size)"
        return (f"{mb(self.total)}: base snapshot {mb(self.base)} + up to {self.records} records of ~"
                f"{self.record_bytes} bytes, written twice (the records, then a compaction)")


def build_need(state_dir: Path, table: str, target: Offsets, base: Manifest | None, base_dir: Path | None,
               newest_records: int) -> BuildNeed:
    """What an exact build of ``table`` at ``target`` from ``base`` (in ``base_dir``) needs; ``newest_records``: the
    records of the newest snapshot, to size a record when the base has none."""
    live = _bytes(db_dir(state_dir, table))
    if base is None or base_dir is None:
        return BuildNeed(0, 0, 0, live, has_base=False)
    base_bytes = _bytes(base_dir / SNAPSHOT_DB_DIR)
    if base.records > 0:
        per = base_bytes // base.records
    elif newest_records > 0:
        per = live // newest_records
    else:
        per = DEFAULT_RECORD_BYTES
    records = sum(max(0, o - base.offsets.get(p, 0)) for p, o in target.items())
    return BuildNeed(base_bytes, records, max(1, per), live, has_base=True)


def _bytes(root: Path) -> int:
    return sum({(st.st_dev, st.st_ino): st.st_blocks * 512 for st in space.files(root)}.values())


@dataclass(frozen=True)
class Figures:
    """One table's space, and the bytes its next step needs: a compaction that rewrites the whole live store (its
    output is never larger than its input; memtable flushes are small beside it and land in that input)."""

    space: TableSpace
    free: int | None
    need: int

    @property
    def missing(self) -> int:
        return 0 if self.free is None else max(0, self.need - self.free)


class DiskGuard:
    """Loop thread only. ``doomed`` is asked at every retention sweep, ``republish`` before every publish."""

    def __init__(self, state_dir: Path, build_timeout_s: float = 120.0) -> None:
        self.state_dir = state_dir
        self.build_timeout_s = build_timeout_s
        self.figures: dict[str, Figures] = {}
        self.notes: dict[str, str] = {}
        self.held: dict[str, set[str]] = {}  # per table, the snapshots leases and builds held at the last sweep
        self._said: dict[str, tuple[str, float]] = {}

    def measure(self, table: str) -> Figures:
        s = space.measure(self.state_dir, table)
        f = Figures(s, space.free_bytes(self.state_dir), s.live)
        self.figures[table] = f
        return f

    def doomed(self, table: str, table_dir: Path, found: list[str], held: set[str], current: str | None,
               refused: bool) -> list[str]:
        """Snapshots to delete beyond retention, because the disk lacks room for the next step (or, ``refused``,
        it refused a write): every one but CURRENT and those ``held`` (leased, busy), oldest first. Leftovers
        (trash, abandoned builds and imports) are deleted here at once."""
        self.held[table] = held
        keep = held | ({current} if current else set())
        f = self.measure(table)
        superseded = [i for i in _superseded(table_dir, table, found) if i not in keep]
        if not f.missing and not refused:
            self._clear(table)
            return superseded
        freed = self._drop_leftovers(table, table_dir)
        doomed = sorted(i for i in found if i not in keep)
        freed += sum(f.space.by_snapshot.get(i, 0) for i in doomed)
        self._say(table, f, freed, keep)
        return doomed

    def republish(self, table: str, current: str | None) -> bool:
        """True when CURRENT holds enough bytes the live store no longer has, and no lease holds it: a snapshot of
        the same offsets frees them at the next sweep."""
        f = self.figures.get(table)
        if f is None or current is None or current in self.held.get(table, set()):
            return False
        held = f.space.by_snapshot.get(current, 0)
        return held >= REPUBLISH_MIN_BYTES and (held >= REPUBLISH_SHARE * f.space.live or f.missing > 0)

    def room_for_build(self, table: str, table_dir: Path, missing: int, found: list[str], keep: set[str]) -> tuple[
            int, list[str]]:
        """An exact build lacks ``missing`` bytes: leftovers are deleted here (bytes freed returned), and the
        snapshots to delete are returned, oldest first, until what they hold alone covers what is still missing.
        Never CURRENT, a leased or busy snapshot, or the build's base (all in ``keep``)."""
        freed = self._drop_leftovers(table, table_dir)
        own = space.measure(self.state_dir, table).by_snapshot
        doomed: list[str] = []
        for sid in sorted(found):
            if freed >= missing:
                break
            if sid not in keep and own.get(sid, 0) > 0:  # one whose files the live store shares frees nothing
                doomed.append(sid)
                freed += own[sid]
        return freed, doomed

    def _drop_leftovers(self, table: str, table_dir: Path) -> int:
        # .tmp-: only the loop thread (this one) writes them, so none is in progress now.
        paths = [Path(e.path) for e in _scan(table_dir) if e.name.startswith(space.LEFTOVER_PREFIXES)]
        paths += space.leftover_table_dirs(self.state_dir, table)
        freed = 0
        for p in paths:
            if p.name.startswith(SNAPSHOT_BUILD_PREFIX) and time.time() - _mtime(p) < self.build_timeout_s + 10:
                continue  # an exact build the worker may still be writing: past its deadline it is abandoned
            if p.is_dir():
                freed += sum(st.st_blocks * 512 for st in space.files(p))
                shutil.rmtree(p, ignore_errors=True)
            else:  # an atomic replace's temporary file
                with contextlib.suppress(OSError):
                    p.unlink()
        return freed

    def _say(self, table: str, f: Figures, freed: int, keep: set[str]) -> None:
        held = ", ".join(f"{i} {mb(n)}" for i, n in sorted(f.space.by_snapshot.items()) if n and i in keep)
        line = (f"disk: table {table} needs {mb(f.need)} free for its next step (a compaction of its live store), "
                f"{mb(f.free or 0)} free, {mb(f.missing)} missing; live store {mb(f.space.live)}, snapshots beyond "
                f"it {mb(f.space.snapshots)} (kept, CURRENT or leased: {held or 'none'}), leftovers "
                f"{mb(f.space.leftovers)}; freeing {mb(freed)}")
        if f.missing and freed < f.missing:
            line += f"; still missing {mb(f.missing - freed)}: free space on the state_dir's filesystem"
        self.notes[table] = line
        last = self._said.get(table)
        now = time.monotonic()
        key = f"{f.missing // MB}:{freed // MB}"
        if last is None or last[0] != key or now - last[1] >= NOTE_EVERY_S:
            self._said[table] = (key, now)
            log.warning("%s", line)

    def _clear(self, table: str) -> None:
        if self.notes.pop(table, None) is not None:
            log.info("disk: table %s has room again for its next step", table)
        self._said.pop(table, None)


def _superseded(table_dir: Path, table: str, found: list[str]) -> list[str]:
    """Snapshots with the same offsets (and staleness) as a newer one: a republish of CURRENT leaves the older one
    holding the files the live store dropped, and no reader can want it (a reader that does holds a lease)."""
    seen: set[tuple[tuple[tuple[int, int], ...], bool]] = set()
    out = []
    for sid in sorted(found, reverse=True):
        try:
            m = manifests.read(table_dir / sid, table)
        except (ManifestError, OSError):
            continue
        key = (tuple(sorted(m.offsets.items())), m.stale)
        if key in seen:
            out.append(sid)
        seen.add(key)
    return out


def _scan(path: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(path))
    except OSError:
        return []


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def disk_status(guard: DiskGuard) -> DiskStatus:
    """The status document's ``disk``, from the guard's last sweep (at most a second old) and free bytes now."""
    tables = {name: {"live_bytes": f.space.live, "snapshot_bytes": f.space.snapshots,
                     "leftover_bytes": f.space.leftovers, "need_bytes": f.need, "short": guard.notes.get(name)}
              for name, f in guard.figures.items()}
    return DiskStatus(space.free_bytes(guard.state_dir), tables)
