"""Snapshot manifests: what one snapshot holds, as JSON beside its database, validated on every read.

A manifest is written durably, after the database beside it is durable and before its snapshot directory is renamed
into place, so a visible snapshot always has one, even after a power loss; afterwards only its stale mark is ever
rewritten, atomically and durably. Anything read from disk is checked field by field: a truncated, foreign or
garbage manifest raises ManifestError and is never trusted.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from globald.common.errors import ManifestError, ManifestIOError
from globald.common.states import State
from globald.settings.config import TableConfig
from globald.store.durable import replace_file

# Offsets in JSON have one encoding and one validation (store.layout); imported from here by snapshot readers.
from globald.store.layout import offsets_from_json as offsets_from_json
from globald.store.layout import offsets_to_json as offsets_to_json
from globald.store.names import SNAPSHOT_MANIFEST
from globald.store.offline import since_of

MANIFEST_FORMAT = 1
# Snapshot ids are creation times in microseconds, 16 digits, strictly increasing per daemon: sortable as text.
SNAPSHOT_ID_RE = re.compile(r"^[0-9]{16}$")
KINDS = ("periodic", "exact")
MAX_JSON_BYTES = 1 << 20  # manifests, leases and requests are tiny; anything bigger is garbage

Offsets = dict[int, int]


def valid_id(value: object) -> bool:
    return isinstance(value, str) and bool(SNAPSHOT_ID_RE.match(value))


def new_id(after: str | None) -> str:
    """A fresh id: now in microseconds, and always greater than ``after``."""
    now = time.time_ns() // 1000
    if after is not None:
        now = max(now, int(after) + 1)
    return f"{now:016d}"


def read_json(path: Path) -> dict[str, Any]:
    """A small JSON object from ``path``; ValueError (or OSError) for anything else."""
    with open(path, "rb") as f:
        raw = f.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_JSON_BYTES} bytes")
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return doc


def write_json(path: Path, doc: dict[str, Any], *, durable: bool = True) -> None:
    """Replace ``path`` atomically with ``doc``; ``durable`` as in ``durable.replace_file``."""
    replace_file(path, json.dumps(doc, sort_keys=True), durable=durable)


@dataclass(frozen=True)
class Manifest:
    table: str
    topic: str
    id: str
    offsets: Offsets  # next-offset of every partition: the snapshot equals the topic's fold below these
    created: float  # epoch seconds
    daemon_state: str
    table_state: str
    records: int  # RocksDB's estimate of the number of keys
    kind: str = "periodic"  # "exact" when built on request at given offsets
    request: str | None = None
    stale: bool = False
    stale_reason: str | None = None
    # A versioned table's (store.history): the window it was kept under (ms; None: not versioned) and the ``since``
    # its database proved at these offsets (epoch ms; None: none proven), read from it when it was published
    # (``offline.since_of``). Absent from older manifests: read as None.
    history_ms: int | None = None
    since: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["offsets"] = offsets_to_json(self.offsets)
        doc["format"] = MANIFEST_FORMAT
        return doc

    def marked_stale(self, reason: str) -> Manifest:
        return replace(self, stale=True, stale_reason=reason)

    @classmethod
    def from_json(cls, doc: dict[str, Any], table: str | None = None, snapshot_id: str | None = None) -> Manifest:
        """Validate ``doc``; ``table``/``snapshot_id`` are what the manifest's location says it must name."""
        try:
            return cls._parse(doc, table, snapshot_id)
        except (ValueError, TypeError, KeyError) as e:
            where = f"{table}/{snapshot_id}" if table else "snapshot"
            raise ManifestError(f"manifest of {where} is invalid: {e}") from None

    @classmethod
    def _parse(cls, doc: dict[str, Any], table: str | None, snapshot_id: str | None) -> Manifest:
        if doc.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format {doc.get('format')!r} is not {MANIFEST_FORMAT}")

        def text(key: str, optional: bool = False) -> Any:
            v = doc.get(key)
            if v is None and optional:
                return None
            if not isinstance(v, str) or not v or len(v) > 4096:
                raise ValueError(f"{key} must be a non-empty string")
            return v

        m = cls(
            table=text("table"), topic=text("topic"), id=text("id"),
            offsets=offsets_from_json(doc.get("offsets")),
            created=doc["created"], daemon_state=text("daemon_state"), table_state=text("table_state"),
            records=doc["records"], kind=text("kind"), request=text("request", optional=True),
            stale=doc["stale"], stale_reason=text("stale_reason", optional=True),
            history_ms=doc.get("history_ms"), since=doc.get("since"),
        )
        if not valid_id(m.id) or (snapshot_id is not None and m.id != snapshot_id):
            raise ValueError(f"id {m.id!r} does not match its directory {snapshot_id!r}")
        if table is not None and m.table != table:
            raise ValueError(f"names table {m.table!r}, lives under {table!r}")
        if isinstance(m.created, bool) or not isinstance(m.created, int | float) or not math.isfinite(m.created):
            raise ValueError("created must be a number")
        if isinstance(m.records, bool) or not isinstance(m.records, int) or m.records < 0:
            raise ValueError("records must be a non-negative integer")
        for name, v in (("history_ms", m.history_ms), ("since", m.since)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or abs(v) >= 1 << 63):
                raise ValueError(f"{name} must be an integer or null")
        if not isinstance(m.stale, bool):
            raise ValueError("stale must be true or false")
        if m.kind not in KINDS:
            raise ValueError(f"kind {m.kind!r} is not one of {KINDS}")
        states = {s.value for s in State}
        if m.daemon_state not in states or m.table_state not in states:
            raise ValueError("daemon_state/table_state is not a globald state")
        return m


def snapshot_since(table: TableConfig, db: Path) -> int | None:
    """The manifest's ``since`` of a snapshot of ``table`` whose database is at ``db``: for a versioned table, what
    the database proves (``offline.since_of``: read from it, never from the live store, so it is the ``since`` at
    the snapshot's offsets); None for another table (which opens nothing)."""
    return None if table.history is None else since_of(db)


def read(snapshot_dir: Path, table: str | None = None) -> Manifest:
    """The validated manifest of ``snapshot_dir`` (whose name is the snapshot id)."""
    path = snapshot_dir / SNAPSHOT_MANIFEST
    try:
        doc = read_json(path)
    except FileNotFoundError:
        raise ManifestError(f"{snapshot_dir} has no manifest") from None
    except OSError as e:  # the disk, not the manifest: nothing says the snapshot is bad
        raise ManifestIOError(f"manifest {path} cannot be read now: {e}") from None
    except ValueError as e:
        raise ManifestError(f"manifest {path} is unreadable: {e}") from None
    return Manifest.from_json(doc, table, snapshot_dir.name)


def write(snapshot_dir: Path, manifest: Manifest) -> None:
    write_json(snapshot_dir / SNAPSHOT_MANIFEST, manifest.to_json())
