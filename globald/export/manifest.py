"""An export's manifest: what one export holds, as versioned JSON, validated field by field on every read.

It names the table, the topic, the topic ID where the broker has one, each partition's fingerprint ladder (the
records the export holds at its newest offsets, read back at bootstrap to show the broker still has that topic),
the offsets, the store format version, a versioned table's history (``history``: the window its versions were kept
under and the ``since`` its store proved at the export's offsets; absent from a plain table's export, and from an
export an older globald wrote), and every file of the RocksDB database with its size and SHA-256. A file's
name must be a plain base name (it becomes a path on the downloading host) and its content lives under a
content-addressed name (``blob``). Everything read is untrusted input: sizes and counts are bounded, JSON only,
never unpickled.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from globald.store.fingerprint import Fingerprint
from globald.store.layout import offsets_from_json, offsets_to_json

EXPORT_FORMAT = 1
MAX_MANIFEST_BYTES = 16 << 20
MAX_FILES = 100_000
MAX_FILE_BYTES = 1 << 40  # one RocksDB file of a table; larger is garbage
MAX_RUNGS = 16
# Export ids: creation time in microseconds (16 digits, sortable as text), then a random tag, so that two hosts
# exporting the same table at the same microsecond never pick one name.
EXPORT_ID_RE = re.compile(r"^[0-9]{16}-[0-9a-f]{8}$")
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Kafka's topic IDs (KIP-516) as librdkafka spells them: standard base64 ("+", "/"), where Kafka's own tools
# use the URL-safe alphabet ("-", "_"); both are accepted. Compared only, never a path.
TOPIC_ID_RE = re.compile(r"^[A-Za-z0-9_+/=-]{1,64}$")
UNTIMED_RE = re.compile(r"^[0-9]{1,10}/[0-9]{1,19}$")


class ExportManifestError(Exception):
    """An export's manifest is not one this globald can use (damaged, foreign or of a newer format): the export is
    skipped; an older one, or the topic, is used instead."""


def new_export_id(now_us: int | None = None) -> str:
    now = time.time_ns() // 1000 if now_us is None else now_us
    return f"{now:016d}-{secrets.token_hex(4)}"


def valid_export_id(value: object) -> bool:
    return isinstance(value, str) and bool(EXPORT_ID_RE.match(value))


def blob_name(sha256: str, size: int) -> str:
    """Where a file's content lives in the export storage: by content, so never rewritten with other bytes."""
    return f"{sha256}-{size}"


@dataclass(frozen=True)
class ExportFile:
    name: str  # base name in the database directory
    size: int
    sha256: str

    @property
    def blob(self) -> str:
        return blob_name(self.sha256, self.size)


@dataclass(frozen=True)
class ExportHistory:
    """What an export of a versioned table holds of its history (``store.history``), as its database says at the
    export's offsets: the window (ms) the exporting table kept versions under, ``since`` (epoch ms; None: none
    proven there), the newest record time applied (``clock``) and the first record without a timestamp
    (``untimed``, "partition/offset")."""

    window_ms: int
    since: int | None
    clock: int | None = None
    untimed: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"window_ms": self.window_ms, "since": self.since, "clock": self.clock, "untimed": self.untimed}


@dataclass(frozen=True)
class ExportManifest:
    id: str
    table: str
    topic: str
    topic_id: str | None
    offsets: dict[int, int]
    ladders: dict[int, tuple[Fingerprint, ...]]  # newest first
    store_format: int
    files: tuple[ExportFile, ...]
    created: float  # epoch seconds of the snapshot exported
    snapshot: str  # the exporting host's snapshot id
    host: str
    records: int = 0
    typed: bool = False
    history: ExportHistory | None = None  # a versioned table's export: it carries the history family and its marks
    extra: dict[str, Any] = field(default_factory=dict)  # never read: room for later versions' fields

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": EXPORT_FORMAT, "id": self.id, "table": self.table, "topic": self.topic,
            "topic_id": self.topic_id, "offsets": offsets_to_json(self.offsets),
            "ladders": {str(p): [[f.offset, f.digest.hex()] for f in rungs]
                        for p, rungs in sorted(self.ladders.items())},
            "store_format": self.store_format, "created": self.created, "snapshot": self.snapshot,
            "host": self.host, "records": self.records, "typed": self.typed,
            "history": None if self.history is None else self.history.to_json(),
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, export_id: str | None = None) -> ExportManifest:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ExportManifestError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            return _parse(doc, export_id)
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:
            raise ExportManifestError(f"manifest {export_id or ''} is invalid: {e}") from None


def _text(doc: dict[str, Any], key: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not v or len(v) > 4096:
        raise ValueError(f"{key} must be a non-empty string")
    return v


def _int(v: object, what: str, hi: int = 1 << 63) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
        raise ValueError(f"{what} must be an integer in [0, {hi})")
    return v


def _signed(v: object, what: str) -> int:
    """An epoch-ms ``since``, which a topic's huge ``min.compaction.lag.ms`` can take below 0."""
    if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 63) <= v < 1 << 63:
        raise ValueError(f"{what} must be a 64-bit integer")
    return v


def _parse(doc: dict[str, Any], export_id: str | None) -> ExportManifest:
    if doc.get("format") != EXPORT_FORMAT:
        raise ValueError(f"format {doc.get('format')!r} is not {EXPORT_FORMAT} (written by another globald release)")
    eid = _text(doc, "id")
    if not valid_export_id(eid) or (export_id is not None and eid != export_id):
        raise ValueError(f"id {eid!r} does not match its name {export_id!r}")
    topic_id = doc.get("topic_id")
    if topic_id is not None and not (isinstance(topic_id, str) and TOPIC_ID_RE.match(topic_id)):
        raise ValueError("topic_id must be a topic ID or null")
    offsets = offsets_from_json(doc.get("offsets"))
    raw_ladders = doc.get("ladders")
    if not isinstance(raw_ladders, dict):
        raise ValueError("ladders must be an object")
    ladders: dict[int, tuple[Fingerprint, ...]] = {}
    for k, rungs in raw_ladders.items():
        p = int(k) if isinstance(k, str) and k.isdigit() and len(k) < 10 else -1
        if p not in offsets:
            raise ValueError(f"ladder of partition {k!r}, which the offsets do not name")
        if not isinstance(rungs, list) or len(rungs) > MAX_RUNGS:
            raise ValueError(f"ladder of partition {k} must be a list of at most {MAX_RUNGS} rungs")
        out = []
        for r in rungs:
            if not (isinstance(r, list) and len(r) == 2 and isinstance(r[1], str) and len(r[1]) == 16):
                raise ValueError(f"ladder of partition {k}: a rung is not [offset, 16 hex digits]")
            offset = _int(r[0], f"ladder {k} offset")
            if offset >= offsets[p]:
                raise ValueError(f"ladder of partition {k}: rung {offset} is not below the offset {offsets[p]}")
            out.append(Fingerprint(offset, bytes.fromhex(r[1])))
        ladders[p] = tuple(out)
    raw_files = doc.get("files")
    if not isinstance(raw_files, list) or not raw_files or len(raw_files) > MAX_FILES:
        raise ValueError(f"files must be a non-empty list of at most {MAX_FILES}")
    files, names = [], set()
    for f in raw_files:
        if not isinstance(f, dict):
            raise ValueError("a file entry is not an object")
        name = f.get("name")
        if not isinstance(name, str) or not FILE_NAME_RE.match(name) or name in names:
            raise ValueError(f"file name {name!r} is not a plain, unique base name")
        sha = f.get("sha256")
        if not isinstance(sha, str) or not SHA256_RE.match(sha):
            raise ValueError(f"file {name}: sha256 is not 64 hex digits")
        names.add(name)
        files.append(ExportFile(name, _int(f.get("size"), f"file {name} size", MAX_FILE_BYTES + 1), sha))
    if "CURRENT" not in names:
        raise ValueError("files do not include the database's CURRENT file")
    created = doc.get("created")
    if isinstance(created, bool) or not isinstance(created, int | float) or not math.isfinite(created):
        raise ValueError("created must be a number")
    typed = doc.get("typed", False)
    if not isinstance(typed, bool):
        raise ValueError("typed must be true or false")
    return ExportManifest(
        id=eid, table=_text(doc, "table"), topic=_text(doc, "topic"), topic_id=topic_id, offsets=offsets,
        ladders=ladders, store_format=_int(doc.get("store_format"), "store_format", 1 << 16), files=tuple(files),
        created=float(created), snapshot=_text(doc, "snapshot"), host=_text(doc, "host"),
        records=_int(doc.get("records", 0), "records"), typed=typed, history=_history(doc.get("history")))


def _history(raw: object) -> ExportHistory | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("history must be an object or null")
    since, clock, untimed = raw.get("since"), raw.get("clock"), raw.get("untimed")
    if untimed is not None and not (isinstance(untimed, str) and UNTIMED_RE.match(untimed)):
        raise ValueError("history.untimed must be \"partition/offset\" or null")
    return ExportHistory(window_ms=_int(raw.get("window_ms"), "history.window_ms"),
                         since=None if since is None else _signed(since, "history.since"),
                         clock=None if clock is None else _int(clock, "history.clock"), untimed=untimed)
