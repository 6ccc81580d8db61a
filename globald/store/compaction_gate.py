"""Compactions run only while the disk has room for them; a store that holds a table opens and serves without.

A compaction writes its output before it deletes its input, and an L0 compaction of a one-level table (the merge
after a bulk load, or any later one: every flush overlaps the whole key range) rewrites the whole table: it needs
the live store's size free. Started on a disk without that room, it fails with "No space left on device", and
RocksDB then keeps the failure as a background error (no SstFileManager, so no automatic recovery): every later
flush, checkpoint and write fails with it, and after a restart the compaction RocksDB schedules at open failed
the same way before the store could serve (issue 33, item 2).

So the large families (values, a typed table's origins) are opened with automatic compactions off whenever the
room free on the state_dir is below the store's table files, and switched on and off at most once a second
(``CompactionGate.apply``) as the room for the largest compaction RocksDB may pick next (``largest_compaction``,
from the files per level) comes and goes. Compactions off, a flush still writes its memtable into L0 (a snapshot
flushes at most what was written since the previous one) and reads stay exact: only the files add up, and writes
slow down once L0 holds as many as its slowdown trigger (``StoreOptions.rocksdb``). Once the room is back,
RocksDB compacts what piled up, in the background, and the disk guard (``globald.snapshot.space``) republishes a
CURRENT left holding the old files.

The gate also scales leveled compaction's shape with the table (``shape``), so that a compaction rewrites a slice
of a small table rather than all of it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rocksdict import Rdict

from globald.store import space

log = logging.getLogger(__name__)

GATE_EVERY_S = 1.0  # how often the room is looked at again (a statvfs and a scan of the store's directory)
_RUNNING = "rocksdb.num-running-compactions"
MIB = 1 << 20
# Leveled compaction's shape, scaled with the table (``shape``): the base level about an eighth of it and files
# about a thirty-second, within these bounds (the upper ones are RocksDB's defaults, which a large table keeps).
BASE_MB = (8, 256)
TARGET_FILE_MB = (2, 64)


def shape(table_bytes: int) -> tuple[int, int]:
    """(max_bytes_for_level_base, target_file_size_base) in MiB for a store of ``table_bytes``: powers of two, so
    that a table changes shape only when it doubles or halves.

    RocksDB's defaults (256 and 64 MiB) keep a table under 256 MiB in one file of one level: every L0 compaction
    then rewrites the whole table (15.1 x the user bytes under churn, and a copy of it on disk while snapshots
    still link the old one). A base level of an eighth of the table, in files of a thirty-second, makes each
    compaction rewrite a slice (measured in docs/operations/disk-space.md)."""
    def pow2(n: int, bounds: tuple[int, int]) -> int:
        mb = max(1, n // MIB)
        return max(bounds[0], min(bounds[1], 1 << (mb - 1).bit_length()))

    return pow2(table_bytes // 8, BASE_MB), pow2(table_bytes // 32, TARGET_FILE_MB)


def table_bytes(db_path: Path) -> int:
    """Bytes of the store's table files at ``db_path`` (what a compaction of all of it would write again)."""
    total = 0
    try:
        entries = list(os.scandir(db_path))
    except OSError:
        return 0
    for e in entries:
        if e.name.endswith(".sst"):
            try:
                total += e.stat(follow_symlinks=False).st_blocks * 512
            except OSError:  # deleted by a compaction meanwhile
                continue
    return total


def largest_compaction(files: list[dict[str, Any]]) -> int:
    """Input bytes of the largest compaction RocksDB may pick next among ``files`` (``Rdict.live_files()``), which
    its output needs free at most: all of L0 with the files of the level below that overlap them, or one file of
    a lower level with those of the next level that overlap it. A bulk load's pile, all in L0 over a one-level
    table, is the whole table; a table in several levels, a slice of it."""
    levels: dict[int, list[tuple[bytes, bytes, int]]] = {}
    for f in files:
        levels.setdefault(int(f["level"]), []).append((bytes(f["start_key"]), bytes(f["end_key"]), int(f["size"])))
    order = sorted(levels)

    def below(level: int, lo: bytes, hi: bytes) -> int:
        nxt = next((n for n in order if n > level), None)
        return 0 if nxt is None else sum(size for a, b, size in levels[nxt] if a <= hi and b >= lo)

    need = 0
    l0 = levels.get(0, [])
    if l0:
        need = sum(size for _, _, size in l0) + below(0, min(a for a, _, _ in l0), max(b for _, b, _ in l0))
    for level in order:
        if level > 0:
            need = max([need] + [size + below(level, a, b) for a, b, size in levels[level]])
    return need


def has_room(db_path: Path, state_dir: Path, db: Rdict | None = None) -> tuple[bool, int, int | None]:
    """(room for the store's largest next compaction, the bytes it needs, the bytes free); unknown free counts as
    room. Without the open database (before it is opened) the need is the whole store's table files."""
    need = table_bytes(db_path) if db is None else largest_compaction(db.live_files())
    free = space.free_bytes(state_dir)
    return free is None or free >= need, need, free


class CompactionGate:
    """Whether one table's automatic compactions are on; the store's owner thread asks it (``apply``)."""

    def __init__(self, table: str, db_path: Path, state_dir: Path, scale: bool = True) -> None:
        self.table = table
        self.db_path = db_path
        self.state_dir = state_dir
        self.scale = scale  # the shape follows the table's size (else the options' own, set explicitly, stay)
        self.on = True
        self.shape = shape(0)
        self._next = 0.0

    def at_open(self) -> bool:
        """Whether the store is opened with automatic compactions on (said in the log when not); sets ``shape``."""
        room, need, free = has_room(self.db_path, self.state_dir)
        if not room and self.on:
            self._say(False, need, free)
        self.on = room
        self.shape = shape(table_bytes(self.db_path))
        self._next = time.monotonic() + GATE_EVERY_S
        return room

    def apply(self, db: Rdict, families: Iterable[Rdict], force: bool = False, scale: bool = True) -> None:
        """Switch automatic compactions of ``families`` on or off as the room says, at most once a second. Never
        while a compaction runs: it takes the room it needs meanwhile, and gives it back when it ends. Without
        ``scale`` (a bulk load, whose families set their own base level so that its flushes wait in L0) the shape
        is left alone: a base level scaled to the table there set off compactions in the middle of the load (a
        versioned table, whose twice the bytes crossed a doubling, restored at half a plain one's rate)."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + GATE_EVERY_S
        try:
            if int(db.property_int_value(_RUNNING) or 0) > 0:
                return
            room, need, free = has_room(self.db_path, self.state_dir, db)
            fits = shape(table_bytes(self.db_path))
            if self.scale and scale and fits != self.shape:
                for f in families:
                    f.set_options({"max_bytes_for_level_base": str(fits[0] * MIB),
                                   "target_file_size_base": str(fits[1] * MIB)})
                log.info("table %s: compaction shape for %s: base level %d MiB, files of %d MiB", self.table,
                         space.mb(need), *fits)
                self.shape = fits
            if room == self.on:
                return
            for f in families:
                f.set_options({"disable_auto_compactions": "false" if room else "true"})
        except Exception as e:  # a store being closed: the next look has it
            log.debug("table %s: compaction gate: %s", self.table, e)
            return
        self.on = room
        self._say(room, need, free)

    def _say(self, room: bool, need: int, free: int | None) -> None:
        if room:
            log.info("table %s: room for compactions again (%s free, %s needed): compacting what piled up",
                     self.table, space.mb(free or 0), space.mb(need))
        else:
            log.warning("table %s: compactions paused: the next compaction may write %s and only %s is free; the "
                        "table is served meanwhile, flushes pile up in L0 until room returns",
                        self.table, space.mb(need), space.mb(free or 0))
