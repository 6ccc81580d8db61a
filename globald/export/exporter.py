"""One export: a published, verified snapshot's database uploaded to the export storage, incrementally.

SST files are immutable, and every file's content is stored under its SHA-256 and size (``manifest.blob_name``),
as RocksDB's BackupEngine shares table files: a file another live export already references is not uploaded
again; any other is (the same bytes under the same name, so nothing is ever overwritten with other bytes, and two
hosts exporting the same table at once write the same content or none). Data first, then the manifest under a
fresh export id, written whole under a dot-name and moved to its name: an export without a manifest does not
exist. Runs off the loop thread; a snapshot is read through its lease, never changed.

A versioned table's snapshot holds its history family and marks like any other, so its export carries them; the
manifest's ``history`` says so, with the ``since`` read from the exported database itself (``read_info``, in the
view that gives the offsets): the ``since`` the source store proved at exactly the export's offsets, never more.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from globald.export.manifest import (
    ExportFile,
    ExportHistory,
    ExportManifest,
    ExportManifestError,
    new_export_id,
    valid_export_id,
)
from globald.export.target import CHUNK, EXPORTS_DIR, FILES_DIR, MANIFEST_SUFFIX, Target, TargetError
from globald.snapshot.manifest import Manifest
from globald.store.names import SNAPSHOT_DB_DIR
from globald.store.offline import StoreInfo, StoreInfoError, read_info

log = logging.getLogger(__name__)

# Not part of a database's state: RocksDB's lock and its human-readable info logs.
_SKIPPED = ("LOCK", "LOG")


class ExportStopped(Exception):
    """The daemon is stopping: the export was abandoned before its manifest; nothing half-done is visible."""


@dataclass(frozen=True)
class Exported:
    manifest: ExportManifest
    uploaded_bytes: int  # written to the storage by this export
    shared_bytes: int  # referenced from earlier exports instead
    seconds: float


def _files(db: Path) -> list[Path]:
    out = []
    for e in os.scandir(db):
        if e.is_file(follow_symlinks=False) and not e.name.startswith(_SKIPPED):
            out.append(Path(e.path))
    return sorted(out)


def sha256_of(path: Path, stop: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            if stop is not None and stop.is_set():
                raise ExportStopped("stopping")
            h.update(chunk)
    return h.hexdigest()


def _read(path: Path, stop: threading.Event) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            if stop.is_set():
                raise ExportStopped("stopping")
            yield chunk


def live_manifests(target: Target, table: str) -> tuple[list[ExportManifest], list[str]]:
    """The table's valid export manifests, newest first, and one line per one that is not valid."""
    found, bad = [], []
    for e in target.list(table, EXPORTS_DIR):
        eid = e.name[: -len(MANIFEST_SUFFIX)] if e.name.endswith(MANIFEST_SUFFIX) else ""
        if not valid_export_id(eid):
            continue
        try:
            found.append(read_manifest(target, table, EXPORTS_DIR, e.name, eid))
        except (ExportManifestError, FileNotFoundError) as err:  # a retention moved it away meanwhile, or garbage
            bad.append(f"{eid}: {err}")
    found.sort(key=lambda m: m.id, reverse=True)
    return found, bad


def read_manifest(target: Target, table: str, where: str, name: str, export_id: str) -> ExportManifest:
    from globald.export.manifest import MAX_MANIFEST_BYTES

    try:
        raw = target.read(table, where, name, limit=MAX_MANIFEST_BYTES)
    except TargetError as e:
        if "larger than" in str(e):
            raise ExportManifestError(str(e)) from None
        raise
    m = ExportManifest.decode(raw, export_id)
    if m.table != table:
        raise ExportManifestError(f"manifest {export_id} names table {m.table!r}, lives under {table!r}")
    return m


def export_snapshot(target: Target, snapshot_dir: Path, snap: Manifest, stop: threading.Event) -> Exported:
    """Upload the snapshot at ``snapshot_dir`` (its manifest ``snap``); raises TargetError, ExportStopped."""
    started = time.monotonic()
    db = snapshot_dir / SNAPSHOT_DB_DIR
    info = read_info(db)
    if info.offsets != snap.offsets:  # the snapshot's manifest never claims more than its database holds
        raise StoreInfoError(f"snapshot {snap.id} holds offsets {info.offsets}, its manifest says {snap.offsets}")
    files = [ExportFile(p.name, p.stat().st_size, sha256_of(p, stop)) for p in _files(db)]
    live, _ = live_manifests(target, snap.table)
    shared = {f.blob for m in live for f in m.files}
    uploaded = reused = 0
    for f in files:
        if f.blob in shared and target.size(snap.table, FILES_DIR, f.blob) == f.size:
            reused += f.size
            continue
        uploaded += target.put(_read(db / f.name, stop), snap.table, FILES_DIR, f.blob, size=f.size)
    m = ExportManifest(id=new_export_id(), table=snap.table, topic=snap.topic, topic_id=info.topic_id,
                       offsets=dict(info.offsets), ladders={p: r for p, r in info.ladders.items() if p in info.offsets},
                       store_format=info.format, files=tuple(files), created=snap.created, snapshot=snap.id,
                       host=socket.gethostname()[:255] or "unknown", records=snap.records, typed=info.typed,
                       history=history_of(snap, info))
    if stop.is_set():
        raise ExportStopped("stopping")
    target.put(iter([m.encode()]), snap.table, EXPORTS_DIR, m.id + MANIFEST_SUFFIX)
    # A file skipped as shared may have been deleted meanwhile by another host's retention (its last reference
    # retired long ago): it is uploaded again, the same bytes under the same name.
    for f in files:
        if target.size(snap.table, FILES_DIR, f.blob) != f.size:
            log.info("table %s: export %s: %s was gone after its manifest; uploaded again", snap.table, m.id, f.blob)
            uploaded += target.put(_read(db / f.name, stop), snap.table, FILES_DIR, f.blob, size=f.size)
    return Exported(m, uploaded, reused, time.monotonic() - started)


def history_of(snap: Manifest, info: StoreInfo) -> ExportHistory | None:
    """What the export of ``snap`` (its database says ``info``) carries of a history: None for a plain table's, or
    one whose snapshot manifest names no window (written by a globald before exports carried history): a
    bootstrap of a versioned table does not use such an export."""
    marks = info.history
    if marks is None or snap.history_ms is None:
        return None
    return ExportHistory(window_ms=snap.history_ms, since=marks.since, clock=marks.clock, untimed=marks.untimed)


def remove_quietly(target: Target, *parts: str) -> None:
    with contextlib.suppress(FileNotFoundError, TargetError):
        target.delete(*parts)
