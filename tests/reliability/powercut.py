"""Power loss on one machine, for the real daemon: a state_dir on a loop-mounted file system image, cut by copying it.

A SIGKILL keeps the page cache, so it proves nothing about fsync. ``LoopImage`` makes an ext4 image mounted
``commit=600,noauto_da_alloc`` (ext4 then, like XFS, keeps only what was fsynced across a rename; the journal
commits only when something fsyncs). After the daemon is SIGKILLed, ``cut`` copies the image at once: the copy
holds what had reached the block device, which is what a machine finds after losing power; what was only in the
page cache is gone. Mounting the copy replays its journal, as the reboot would.

``check_cut`` then inspects the copy before any daemon opens it: every live store equals the oracle fold at its own
offsets, every ``.checkpoint`` is whole and claims nothing beyond its store, every listed snapshot opens and equals
the fold at its manifest's offsets, and CURRENT names one of them. A check that could not compare is a problem,
never a pass. It also serves on a running daemon's state_dir (load paused): a snapshot retired while it is read is
skipped. Needs root (loop devices); every mount is unmounted and every loop device detached on the way out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from globald.embedded.oracle import Table, fold
from globald.snapshot import manifest as manifests
from globald.store import checkpoint_file
from globald.store.names import SNAPSHOT_CURRENT, SNAPSHOT_DB_DIR, checkpoint_path, db_dir, snapshots_dir
from tests.harness import Broker
from tests.reliability.checks import diff, explain, read_store

IMAGE_MB = 512
MOUNT_OPTIONS = {"ext4": "commit=600,noauto_da_alloc", "xfs": ""}


def _options(fs: str, options: str) -> str:
    # XFS refuses to mount a file system whose UUID it has seen mounted (the original, a cut of it); ext4 does not.
    return ",".join(o for o in (options, "nouuid" if fs == "xfs" else "") if o)


class ImageError(RuntimeError):
    """A command making, mounting or copying an image failed (its output is in the message)."""


def can_mount() -> str | None:
    """None when this process may make loop mounts, else why not."""
    if os.geteuid() != 0:
        return "loop devices and mounts need root"
    for tool in ("losetup", "mount", "umount", "mkfs.ext4"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def _run(*cmd: str, timeout: float = 120.0) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise ImageError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


class _Mounted:
    """An image file attached to a loop device and mounted; ``close`` unmounts and detaches, whatever happened."""

    def __init__(self, image: Path, mount: Path, fs: str, options: str) -> None:
        self.image, self.mount, self.fs = image, mount, fs
        self.device: str | None = None
        self.mounted = False
        mount.mkdir(parents=True, exist_ok=True)
        try:
            self.device = _run("losetup", "--find", "--show", str(image))
            _run("mount", "-t", fs, *(("-o", options) if options else ()), self.device, str(mount))
            self.mounted = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        errors: list[str] = []
        if self.mounted:
            deadline = time.monotonic() + 30
            while True:  # a process that just died may still hold a file for a moment
                r = subprocess.run(["umount", str(self.mount)], capture_output=True, text=True)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    errors.append(f"umount {self.mount}: {r.stderr.strip()}; detached lazily")
                    subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
                    break
                time.sleep(0.2)
            self.mounted = False
        if self.device is not None:
            r = subprocess.run(["losetup", "-d", self.device], capture_output=True, text=True)
            if r.returncode != 0:
                errors.append(f"losetup -d {self.device}: {r.stderr.strip()}")
            self.device = None
        if errors:
            raise ImageError("; ".join(errors))


class LoopImage:
    """A fresh file system image under ``work``, mounted at ``work/mnt`` for the life of the ``with`` block."""

    def __init__(self, work: Path, fs: str = "ext4", size_mb: int = IMAGE_MB) -> None:
        self.work, self.fs, self.size_mb = work, fs, size_mb
        self.image = work / f"disk.{fs}"
        self._mounted: _Mounted | None = None
        self.cuts = 0

    @property
    def mount(self) -> Path:
        return self.work / "mnt"

    def __enter__(self) -> LoopImage:
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size_mb << 20)
        _run(f"mkfs.{self.fs}", "-q", "-f" if self.fs == "xfs" else "-F", str(self.image))
        self._mounted = _Mounted(self.image, self.mount, self.fs, _options(self.fs, MOUNT_OPTIONS[self.fs]))
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._mounted is not None:
            self._mounted.close()
            self._mounted = None

    def power_cycle(self) -> None:
        """A power loss and a reboot, in place: the block device as it is now replaces the image, mounted again
        (with the same options) where it was, so the same state_dir path holds what survived.

        Call it at once after the last writer died: every moment in between lets writeback add to the device."""
        copy = self.image.with_name(self.image.name + ".cut")
        _run("cp", "--sparse=always", str(self.image), str(copy))
        self.cuts += 1
        if self._mounted is not None:
            self._mounted.close()
            self._mounted = None
        os.replace(copy, self.image)
        self._mounted = _Mounted(self.image, self.mount, self.fs, _options(self.fs, MOUNT_OPTIONS[self.fs]))

    @contextmanager
    def cut(self) -> Iterator[Path]:
        """The block device as it is now, mounted elsewhere (a power loss, then a reboot): yields its mount point.

        Call it at once after the last writer died: every moment in between lets writeback add to the device."""
        self.cuts += 1
        copy = self.work / f"cut-{self.cuts}.{self.fs}"
        _run("cp", "--sparse=always", str(self.image), str(copy))
        mounted = _Mounted(copy, self.work / f"cut-{self.cuts}", self.fs, _options(self.fs, ""))
        try:
            yield mounted.mount
        finally:
            try:
                mounted.close()
            finally:
                copy.unlink(missing_ok=True)


@dataclass
class CutReport:
    problems: list[str] = field(default_factory=list)
    stores: int = 0  # live stores compared with the oracle
    snapshots: int = 0  # snapshots compared with the oracle
    currents: int = 0  # CURRENT pointers found naming a snapshot that was compared

    def add(self, other: CutReport) -> None:
        self.problems += other.problems
        self.stores += other.stores
        self.snapshots += other.snapshots
        self.currents += other.currents


class _Oracle:
    """Folds of one topic, each computed once per set of offsets."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.marks = broker.admin.watermarks(topic)
        self._folds: dict[tuple[tuple[int, int], ...], Table] = {}

    def outside(self, offsets: dict[int, int]) -> bool:
        return any(p not in self.marks or not self.marks[p][0] <= o <= self.marks[p][1] for p, o in offsets.items())

    def fold(self, offsets: dict[int, int]) -> Table:
        key = tuple(sorted(offsets.items()))
        if key not in self._folds:
            self._folds[key] = fold(self.broker.settings, self.topic, offsets)
        return self._folds[key]


def check_cut(broker: Broker, state_dir: Path, table: str, topic: str, *, require_store: bool,
              require_current: bool) -> CutReport:
    """What a power loss left of ``table`` under ``state_dir`` (a mounted cut), before any daemon opened it.

    ``require_store``: the table's store must exist (its first durable commit happened before the cut).
    ``require_current``: CURRENT must exist (a publish had returned before the cut)."""
    out = CutReport()
    oracle = _Oracle(broker, topic)
    where = f"table {table}"
    stored: dict[int, int] | None = None
    path = db_dir(state_dir, table)
    if (path / "CURRENT").exists():
        try:
            stored, data = read_store(path)
        except Exception as e:  # RocksDB reports corruption as a plain Exception
            out.problems.append(f"{where}: live store does not open: {e}")
        else:
            _compare(out, oracle, f"{where}: live store", stored, data)
            out.stores += 1
    elif require_store:
        out.problems.append(f"{where}: no live store ({path}/CURRENT missing)")
    _check_checkpoint_file(out, checkpoint_path(state_dir, table), topic, stored, where)
    _check_snapshots(out, oracle, state_dir, table, require_current)
    return out


def _compare(out: CutReport, oracle: _Oracle, what: str, offsets: dict[int, int], data: Table) -> bool:
    if not offsets:
        if data:
            out.problems.append(f"{what}: {len(data)} keys but no offsets")
        return not data
    if oracle.outside(offsets):
        out.problems.append(f"{what}: offsets {offsets} outside the log {oracle.marks}")
        return False
    expected = oracle.fold(offsets)
    n = diff(data, expected)
    if n:
        out.problems.append(f"{what} at {offsets}: {n} keys differ from the oracle: {explain(data, expected)}")
    return n == 0


def _check_checkpoint_file(out: CutReport, path: Path, topic: str, stored: dict[int, int] | None,
                           where: str) -> None:
    if not path.exists():
        return
    try:
        found = checkpoint_file.read(path)
    except checkpoint_file.CheckpointFormatError as e:
        out.problems.append(f"{where}: .checkpoint is not whole: {e} (content {path.read_bytes()[:80]!r})")
        return
    claimed = {p: o for (t, p), o in found.items() if t == topic}
    held = stored or {}
    beyond = {p: (o, held.get(p)) for p, o in claimed.items() if o > held.get(p, 0)}
    if beyond:
        out.problems.append(f"{where}: .checkpoint claims beyond the store (claimed, held): {beyond}")


def _check_snapshot(out: CutReport, oracle: _Oracle, root: Path, table: str, sid: str) -> bool:
    """Whether snapshot ``sid`` is whole and equals the oracle at its manifest's offsets (problems into ``out``)."""
    what = f"table {table}: snapshot {sid}"
    try:
        m = manifests.read(root / sid, table)
        offsets, data = read_store(root / sid / SNAPSHOT_DB_DIR)
    except Exception as e:  # RocksDB reports a damaged database as a plain Exception
        if (root / sid).exists():  # else retired by a running daemon's retention while it was read
            out.problems.append(f"{what}: listed but its manifest or database is not whole: {e}")
        return False
    out.snapshots += 1
    if offsets != m.offsets:
        out.problems.append(f"{what}: database holds offsets {offsets}, its manifest says {m.offsets}")
        return False
    return _compare(out, oracle, what, m.offsets, data)


def _check_snapshots(out: CutReport, oracle: _Oracle, state_dir: Path, table: str, require_current: bool) -> None:
    root = snapshots_dir(state_dir, table)
    pointer = root / SNAPSHOT_CURRENT
    named_before = pointer.read_bytes() if pointer.exists() else None
    try:
        names = sorted(e.name for e in os.scandir(root) if manifests.valid_id(e.name))
    except FileNotFoundError:
        names = []
    compared = {sid for sid in names if _check_snapshot(out, oracle, root, table, sid)}
    if not pointer.exists():
        if require_current:
            out.problems.append(f"table {table}: no CURRENT, though a snapshot had been published before the cut")
        return
    text = pointer.read_bytes()
    sid = text.decode("ascii", errors="replace").strip()
    if not manifests.valid_id(sid):
        out.problems.append(f"table {table}: CURRENT holds {text[:40]!r}, not a snapshot id ({len(text)} bytes)")
    elif sid not in compared and not (text != named_before and _check_snapshot(out, oracle, root, table, sid)):
        # A running daemon may publish while the listing is read (a republish at the same offsets frees the files
        # a merge dropped): a CURRENT that moved meanwhile is checked on its own. One that did not move is not.
        out.problems.append(f"table {table}: CURRENT names {sid}, which is missing or did not check out")
    else:
        out.currents += 1
