"""Bootstrap: a table whose store is empty starts from the newest export it can use, then tails the topic.

An export is usable when its manifest is of a format this release reads, names the table's topic, each partition's
offset is within the broker's log (at or above its start, so no record is missing between the export and the log,
and not past its end), the topic ID matches where both are known, and the newest fingerprint of each partition
names a record the broker still holds (``kafka.identity.verify``; a partition whose every rung compaction removed
is ``unverifiable`` and, as the daemon's own identity check counts it, does not refuse the export: the engine's
plan, which opens the installed store next, reads the older rungs back too). Anything else is refused, with one
line saying why, and the next older export is tried; with none left, the table restores from the topic as before.

A versioned table (``history``) uses only an export that carries history kept under the same window, with a
``since`` its source store proved at the export's offsets (``manifest.ExportHistory``); any other would have it
claim a ``since`` nothing proves. The installed store keeps the export's ``since`` when its tail, from the export's
offsets on, cannot have lost a version to compaction yet (``store.gaps.since_after_gap``: read from the topic's
``min.compaction.lag.ms``); otherwise ``since`` moves to what a replay begun now proves, and the log says why.

The download goes into ``tables/.bootstrap-<table>/`` (inside the state_dir, so the final move is a rename),
each file read at most to its manifest size, its SHA-256 computed while it is copied and checked, names checked to
be plain base names. ``DOWNLOADERS`` files are fetched at once (an object store's latency, not its bandwidth, bounds
one stream), each fsynced as soon as it is whole, so its write-back overlaps the next files' download instead of
waiting for the final sync, which then only syncs what the checks wrote (RocksDB syncs the table files it writes). The
database is then opened read-only and must hold exactly the manifest's offsets, topic and format. Only then is the
directory synced and renamed into place as ``tables/<table>/``. A power loss before that rename leaves a dot-named
leftover, removed by the next start, which bootstraps again; after it, a complete store. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.export.checks import BrokerChecks, Refused
from globald.export.exporter import live_manifests
from globald.export.manifest import ExportFile, ExportManifest
from globald.export.target import FILES_DIR, Target, TargetError
from globald.settings.config import Config, TableConfig
from globald.store import durable, gaps, history
from globald.store.layout import offsets_to_json
from globald.store.names import (
    BOOTSTRAP_PREFIX,
    DB_DIR,
    META_HISTORY_READ,
    META_HISTORY_SINCE,
    READABLE_FORMATS,
    db_dir,
    table_dir,
    tables_dir,
)
from globald.store.offline import StoreInfoError, open_offline, read_info
from globald.store.options import StoreOptions

log = logging.getLogger(__name__)

FREE_MARGIN = 64 << 20  # bytes left free on the state_dir after a download
DOWNLOADERS = 4  # files downloaded at once


class Abandoned(Exception):
    """The bootstrap stopped (the daemon is stopping, or its bound passed): nothing was installed."""


@dataclass
class Origin:
    """Where a table's store came from, as status shows it (``tables.<t>.origin``)."""

    kind: str  # "export": installed from an export at start; "topic": restored from the topic; "store": had one
    export: str | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    created: float | None = None  # when the exported snapshot was taken (epoch seconds)
    bytes_downloaded: int = 0
    seconds: float = 0.0
    fallback: str | None = None  # why no export was used, when one was looked for
    tail: int | None = None  # offsets replayed from the export's to the log end it reached RUNNING at
    uri: str | None = None  # masked
    # A versioned table's: the export's since, the one the installed store keeps (moved: why it differs)
    history: dict[str, Any] | None = None

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {"kind": self.kind, "export": self.export, "offsets": offsets_to_json(self.offsets),
                "created": self.created, "age_s": None if self.created is None else round(now - self.created, 3),
                "bytes_downloaded": self.bytes_downloaded, "seconds": round(self.seconds, 3),
                "fallback": self.fallback, "tail": self.tail, "uri": self.uri, "history": self.history}


def history_refusal(m: ExportManifest, window_ms: int | None) -> str | None:
    """Why export ``m`` cannot start a table whose window is ``window_ms`` (None: not versioned, which any export
    can start: a store opened as a plain table's drops the history it holds); None when it can."""
    if window_ms is None:
        return None
    if m.history is None:
        return ("it carries no history (exported from a plain table, or by a globald before exports carried it): a "
                "versioned table started from it could prove no since")
    if m.history.window_ms != window_ms:
        return (f"its history was kept under a window of {m.history.window_ms} ms, the table declares {window_ms} "
                "ms (a window change replays the topic, as a reload does)")
    if m.history.since is None:
        return "its store had proven no since at the export's offsets (pending, or held data before history)"
    return None


def needs_bootstrap(state_dir: Path, table: str) -> bool:
    """The table has no store at all (no database, so no offsets): first start, or a store wiped offline."""
    return not (db_dir(state_dir, table) / "CURRENT").exists()


def staging_dir(state_dir: Path, table: str) -> Path:
    return tables_dir(state_dir) / f"{BOOTSTRAP_PREFIX}{table}"


class Install:
    """The last step, taken at most once and never after the bootstrap was given up (``cancel``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "open"  # then "cancelled" or "installed", never changed again

    def cancel(self) -> bool:
        """Give up; False when the store is already in place (then it stays: it is complete)."""
        with self._lock:
            if self._state == "installed":
                return False
            self._state = "cancelled"
            return True

    def run(self, move: Callable[[], None]) -> None:
        with self._lock:
            if self._state != "open":
                raise Abandoned("given up before the store was moved into place")
            move()
            self._state = "installed"


class Staged(Install):
    """The last step for a store the daemon's loop puts in place itself (``engine.refill``, after a wipe while
    it runs): the checked stage is left where it is, ready, and the loop moves it at its next turn."""

    def run(self, move: Callable[[], None]) -> None:
        super().run(lambda: None)


class Bootstrap:
    """Bootstraps one table (on a worker thread: every call may block on the storage or the broker)."""

    def __init__(self, config: Config, table: TableConfig, target: Target, stop: threading.Event,
                 install: Install) -> None:
        self.config, self.table, self.target, self.stop, self.install = config, table, target, stop, install
        self.downloaded = 0
        self.lag_ms: int | None = None  # the topic's min.compaction.lag.ms as the broker checks read it (versioned)
        self.history: dict[str, Any] | None = None  # what _stamp_closed set the store's since to
        self._counted = threading.Lock()  # downloaded is added to by each downloader

    def run(self) -> Origin:
        """The origin of the table's store: an export installed, or the topic with the reasons none was."""
        started = time.monotonic()
        shown = self.target.shown
        stage = staging_dir(self.config.state_dir, self.table.name)
        shutil.rmtree(stage, ignore_errors=True)  # a download cut short by a crash or a power loss
        try:
            found, bad = live_manifests(self.target, self.table.name)
        except TargetError as e:
            return Origin("topic", fallback=f"export storage unreachable: {e}", uri=shown)
        reasons = [f"export {b}" for b in bad]
        if not found:
            reasons.append(f"no export of table {self.table.name} in {shown}")
        for m in found:
            halt = threading.Event()  # a refusal on either side: the other stops early
            try:
                self._usable(m)
                steps = [time.monotonic()]
                checks = BrokerChecks(self.config, self.table, m, self.stop, halt)
                try:
                    self._download(m, stage, halt)
                except BaseException:
                    halt.set()  # the checks end at their next wait
                    refused = checks.refusal()  # the broker's reason when it has one already: it used to come first
                    if refused is not None:
                        raise refused from None
                    raise
                steps.append(time.monotonic())
                checks.result()  # nothing is opened, stamped or installed before the broker's checks passed
                self.lag_ms = checks.lag_ms
                steps.append(time.monotonic())
                self._check(m, stage / DB_DIR)
                self._stamp_closed(m, stage / DB_DIR)
                steps.append(time.monotonic())
                # Downloaded files were synced whole (_fetch); RocksDB synced each table file it wrote since.
                durable.sync_tree(stage, synced_suffixes=(".sst",))
                self.install.run(lambda: self._move(stage))
                steps.append(time.monotonic())
                log.info("table %s: export %s: downloaded in %.2f s, the broker's checks took %.2f s beside it "
                         "(%.2f s waited for after), opened and checked in %.2f s, synced and installed in %.2f s",
                         self.table.name, m.id, steps[1] - steps[0], checks.seconds, steps[2] - steps[1],
                         steps[3] - steps[2], steps[4] - steps[3])
            except Refused as e:
                shutil.rmtree(stage, ignore_errors=True)
                reasons.append(f"export {m.id}: {e}")
                log.warning("table %s: export %s not used: %s", self.table.name, m.id, e)
                continue
            except TargetError as e:
                shutil.rmtree(stage, ignore_errors=True)
                reasons.append(f"export {m.id}: {e}")
                break
            return Origin("export", export=m.id, offsets=dict(m.offsets), created=m.created,
                          bytes_downloaded=self.downloaded, seconds=time.monotonic() - started, uri=shown,
                          fallback="; ".join(reasons) or None, history=self.history)
        return Origin("topic", bytes_downloaded=self.downloaded, seconds=time.monotonic() - started,
                      fallback="; ".join(reasons), uri=shown)

    # -- is it usable -------------------------------------------------------------------------------------------

    def _usable(self, m: ExportManifest) -> None:
        """What the manifest alone refuses; the broker's side runs beside the download (``checks.BrokerChecks``)."""
        if m.topic != self.table.topic:
            raise Refused(f"it mirrors topic {m.topic}, the table mirrors {self.table.topic}")
        refusal = history_refusal(m, self.table.history)
        if refusal is not None:
            raise Refused(refusal)
        if m.store_format not in READABLE_FORMATS:
            raise Refused(f"store format {m.store_format} is not one this globald reads {READABLE_FORMATS}")
        if m.typed != self.table.typed:
            raise Refused("exported from a typed table" if m.typed else "exported from a raw (untyped) table")

    # -- download and check -------------------------------------------------------------------------------------

    def _download(self, m: ExportManifest, stage: Path, halt: threading.Event | None = None) -> None:
        """Every file of ``m`` into ``stage``; ``halt`` (set elsewhere: the broker refused the export) stops it
        early, without an error of its own."""
        free = shutil.disk_usage(self.config.state_dir).free
        if m.total_bytes + FREE_MARGIN > free:
            raise Refused(f"{m.total_bytes} bytes to download, the state_dir has {free} free")
        db = stage / DB_DIR
        durable.make_dirs(db)
        for f in m.files:
            if (db / f.name).parent != db:  # a plain base name (manifest.FILE_NAME_RE): it cannot leave the directory
                raise Refused(f"file name {f.name!r} escapes the directory")
        # Largest first, so that the long downloads do not start last. Daemon threads, as the bootstrap's own: one
        # blocked on slow storage is abandoned with it (a stop or the bound), never waited for at exit.
        pending: queue.SimpleQueue[ExportFile] = queue.SimpleQueue()
        for f in sorted(m.files, key=lambda f: f.size, reverse=True):
            pending.put(f)
        halt = halt or threading.Event()  # one file failed: the others stop at their next chunk
        failed: list[Exception] = []

        def downloader() -> None:
            while not halt.is_set():
                try:
                    f = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    self._fetch(f, db / f.name, halt)
                except Exception as e:  # Refused, Abandoned, TargetError, OSError: run() tells them apart
                    failed.append(e)
                    halt.set()

        threads = [threading.Thread(target=downloader, name=f"globald-download-{self.table.name}-{i}", daemon=True)
                   for i in range(max(1, min(DOWNLOADERS, len(m.files))))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]

    def _fetch(self, f: ExportFile, dest: Path, halt: threading.Event) -> None:
        """Download one file into ``dest``, no larger than its manifest's size, checked against its SHA-256 as it is
        copied, and synced (on a downloader thread)."""
        h, n = hashlib.sha256(), 0
        try:
            with open(dest, "xb") as out:
                for chunk in self.target.chunks(self.table.name, FILES_DIR, f.blob):
                    if self.stop.is_set():
                        raise Abandoned("stopping")
                    if halt.is_set():
                        return  # another file failed: its error is the one reported
                    n += len(chunk)
                    with self._counted:
                        self.downloaded += len(chunk)
                    if n > f.size:
                        raise Refused(f"file {f.name} is larger than its manifest's {f.size} bytes")
                    h.update(chunk)
                    out.write(chunk)
                if n != f.size:
                    raise Refused(f"file {f.name} has {n} bytes, its manifest says {f.size}")
                if h.hexdigest() != f.sha256:
                    raise Refused(f"file {f.name}: checksum mismatch (damaged in the storage or in transit)")
                out.flush()
                os.fsync(out.fileno())
        except FileNotFoundError:
            raise Refused(f"file {f.name} ({f.blob}) is missing from the storage") from None

    def _check(self, m: ExportManifest, db: Path) -> None:
        try:
            info = read_info(db)
        except StoreInfoError as e:
            raise Refused(f"the downloaded database does not open: {e}") from None
        if info.offsets != m.offsets:
            raise Refused(f"the database holds offsets {info.offsets}, the manifest says {m.offsets}")
        if info.topic != self.table.topic:
            raise Refused(f"the database mirrors topic {info.topic!r}, not {self.table.topic!r}")
        if info.format != m.store_format:
            raise Refused(f"the database is of format {info.format}, the manifest says {m.store_format}")
        if info.topic_id != m.topic_id:
            raise Refused(f"the database's topic ID {info.topic_id} is not the manifest's {m.topic_id}")
        if m.history is not None and (info.history is None or info.history.since != m.history.since):
            held = "no history" if info.history is None else f"since {info.history.since}"
            raise Refused(f"the database holds {held}, the manifest says since {m.history.since}")

    def _stamp_closed(self, m: ExportManifest, db: Path) -> None:
        """The exporting host's store was open when its snapshot was taken: marked closed here, so the daemon that
        opens it does not report a crash that never happened on this host; a versioned table's ``since`` is set to
        what its tail keeps of the export's (``store.gaps.since_after_gap``). Writes of our own, after the checks."""
        options = StoreOptions.from_config(self.config.store)
        try:
            store = open_offline(db, options, create=False)
        except Exception as e:  # rocksdict raises bare Exceptions naming the file
            raise Refused(f"the downloaded database does not open for writing: {e}") from None
        with store:
            if self.table.versioned and m.history is not None and m.history.since is not None:
                exported, now = int(m.created * 1000), history.now_ms()
                since, moved = gaps.since_after_gap(m.history.since, exported, now, self.lag_ms, gaps.BOOTSTRAP)
                if moved is not None:
                    log.warning("table %s: export %s: since %d, not the export's %d: %s", self.table.name, m.id,
                                since, m.history.since, moved)
                # Read up to the export's snapshot, or (since moved) accounted up to now: where the daemon's gap
                # check (engine.reading) measures from, so that it does not count the same gap twice.
                read = exported if moved is None else now
                store.put_meta({META_HISTORY_SINCE: str(since).encode(), META_HISTORY_READ: str(read).encode()},
                               "export bootstrap: the history's since")
                self.history = {"since": since, "exported_since": m.history.since, "moved": moved}
            store.mark_closed("export bootstrap: mark the downloaded store closed")

    def _move(self, stage: Path) -> None:
        dest = table_dir(self.config.state_dir, self.table.name)
        if not needs_bootstrap(self.config.state_dir, self.table.name):
            raise Refused("a store appeared meanwhile")  # never replace a store
        durable.remove_tree(dest)  # what an empty table directory holds (a .checkpoint of nothing)
        durable.rename(stage, dest)
        log.info("table %s: store installed from the export storage", self.table.name)
