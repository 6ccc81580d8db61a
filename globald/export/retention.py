"""Retention of a table's exports: the newest ``keep`` stay; older manifests are retired, and a file goes only once
no manifest references it and the grace period has passed, so a host downloading an older export is never cut off.

A retired manifest is moved to ``retired/<id>@<ms>.json``, ``ms`` the wall clock when it was retired: for
``grace_s`` after that its files stay. A file no live or retired manifest references is deleted only once it is
itself older than ``grace_s`` (it may be an upload whose manifest is not written yet: an exporter writes data
first). ``grace_s`` must exceed the longest download and the longest export, with room for the clocks of the hosts
sharing the storage to disagree. Any host may apply retention; two at once only fail to move or delete what the
other already did.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from globald.export.exporter import live_manifests, read_manifest, remove_quietly
from globald.export.manifest import ExportManifestError
from globald.export.target import EXPORTS_DIR, FILES_DIR, MANIFEST_SUFFIX, RETIRED_DIR, Target, TargetError

log = logging.getLogger(__name__)

_RETIRED_RE = re.compile(r"^(?P<id>[0-9]{16}-[0-9a-f]{8})@(?P<ms>[0-9]{1,16})\.json$")
_BLOB_RE = re.compile(r"^[0-9a-f]{64}-[0-9]{1,16}$")


@dataclass(frozen=True)
class Swept:
    retired: int = 0  # manifests moved out of exports/
    forgotten: int = 0  # retired manifests deleted after the grace period
    deleted_files: int = 0
    deleted_bytes: int = 0


def apply(target: Target, table: str, keep: int, grace_s: float, now: float | None = None) -> Swept:
    """Retire all but the newest ``keep`` exports of ``table`` and delete what the grace period no longer protects.
    Raises TargetError when the storage cannot be listed."""
    now = time.time() if now is None else now
    live, bad = live_manifests(target, table)
    retired = 0
    for m in live[keep:]:
        try:
            target.move((table, EXPORTS_DIR, m.id + MANIFEST_SUFFIX),
                        (table, RETIRED_DIR, f"{m.id}@{int(now * 1000)}{MANIFEST_SUFFIX}"))
            retired += 1
        except (FileNotFoundError, TargetError) as err:  # another host retired it first
            log.debug("table %s: export %s not retired here: %s", table, m.id, err)
    referenced = {f.blob for m in live[:keep] for f in m.files}
    forgotten = 0
    sure = not bad  # a live manifest that cannot be read may reference anything: no file is deleted then
    for r in target.list(table, RETIRED_DIR):
        found = _RETIRED_RE.match(r.name)
        if found is None:
            continue
        if now - int(found["ms"]) / 1000 >= grace_s:
            remove_quietly(target, table, RETIRED_DIR, r.name)
            forgotten += 1
            continue
        try:
            referenced |= {f.blob for f in read_manifest(target, table, RETIRED_DIR, r.name, found["id"]).files}
        except FileNotFoundError:
            continue
        except ExportManifestError:
            sure = False
    if grace_s > 0:  # retired just now (or by another host meanwhile): protected for the grace period
        referenced |= {f.blob for m in live[keep:] for f in m.files}
    deleted = deleted_bytes = 0
    if sure:
        for b in target.list(table, FILES_DIR):
            if b.name in referenced or not _BLOB_RE.match(b.name) or b.mtime is None or now - b.mtime < grace_s:
                continue
            remove_quietly(target, table, FILES_DIR, b.name)
            deleted += 1
            deleted_bytes += b.size
    else:
        log.warning("table %s: export manifests that cannot be read (%s): no file deleted this time", table,
                    "; ".join(bad) or "a retired one")
    swept = Swept(retired, forgotten, deleted, deleted_bytes)
    if retired or deleted:
        log.info("table %s: export retention: %d exports retired, %d files (%d bytes) deleted", table, retired,
                 deleted, deleted_bytes)
    return swept
