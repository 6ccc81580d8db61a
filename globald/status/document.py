"""The status document: what a daemon publishes in ``status.json`` and on ``/status``, as dataclasses.

This module is the one place that turns it into JSON and back. Offsets are next-offsets per partition (JSON keys
are partition numbers as strings); ``offsets`` are those applied to the live store, durable at the next commit.
A document read back from disk is parsed leniently: a field an older globald did not write is left at its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from globald.common.states import State
from globald.store.layout import offsets_from_json, offsets_to_json

if TYPE_CHECKING:
    from globald.engine.view import TableView


def _offsets_read_back(raw: Any) -> dict[int, int]:
    """Offsets of a document read back from disk: an older globald's missing or unreadable field reads as none."""
    try:
        return offsets_from_json(raw)
    except ValueError:
        return {}


@dataclass(frozen=True)
class RestoreStatus:
    percent: float
    records: int
    records_per_second: float
    eta_seconds: float | None


@dataclass(frozen=True)
class SnapshotStatus:
    current: str | None
    offsets: dict[int, int]
    created: float | None
    stale: bool
    stale_reason: str | None
    published: int = 0
    exact_built: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    last_publish_ms: float = 0.0
    last_error: str | None = None


@dataclass(frozen=True)
class DecodeStatus:
    """A typed table's snapshots decoded by the daemon into their columnar files (globald.ops.decoding): the newest
    one decoded, its figures (read from the file's metadata), and the decode runs of this process."""

    snapshot: str | None = None  # the newest snapshot whose columnar file the daemon wrote or found
    offsets: dict[int, int] = field(default_factory=dict)
    created: float | None = None  # that snapshot's creation (wall clock), for its age
    values: int = 0  # rows of the file: the snapshot's keys
    errors: int = 0  # of them, values that did not decode
    pending: int = 0  # of those, values whose writer schema was not fetched yet (a registry outage): redone later
    key_errors: int = 0  # typed keys: stored keys that did not decode, left out of the file
    decode_seconds: float | None = None  # how long decoding the file took (whoever wrote it)
    written: bool = False  # False: the file was already there (a reader on the host wrote it first)
    too_large: bool = False  # the snapshot does not fit one columnar file: readers decode per batch
    runs: int = 0  # decode processes that ended well since the daemon started
    failures: int = 0  # those that failed, timed out or were killed at stop
    running_pid: int | None = None  # the decode process in flight for this table, if any
    last_error: str | None = None  # why the last run failed (None once one succeeds)

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "offsets": offsets_to_json(self.offsets), "created": self.created,
                "values": self.values, "errors": self.errors, "pending": self.pending, "key_errors": self.key_errors,
                "decode_seconds": self.decode_seconds,
                "written": self.written, "too_large": self.too_large, "runs": self.runs, "failures": self.failures,
                "running_pid": self.running_pid, "last_error": self.last_error}

    @classmethod
    def from_json(cls, raw: Any) -> DecodeStatus | None:
        if not isinstance(raw, dict):
            return None

        def typed(key: str, kind: type | tuple[type, ...], default: Any) -> Any:
            # Read leniently: a figure of the wrong type (a damaged file) is left at its default, never shown.
            value = raw.get(key, default)
            if isinstance(value, bool) != (kind is bool):  # a bool is an int to Python, never a count here
                return default
            return value if isinstance(value, kind) else default

        return cls(snapshot=typed("snapshot", str, None), offsets=_offsets_read_back(raw.get("offsets")),
                   created=typed("created", (int, float), None), values=typed("values", int, 0),
                   errors=typed("errors", int, 0), pending=typed("pending", int, 0),
                   key_errors=typed("key_errors", int, 0),
                   decode_seconds=typed("decode_seconds", (int, float), None),
                   written=typed("written", bool, False), too_large=typed("too_large", bool, False),
                   runs=typed("runs", int, 0), failures=typed("failures", int, 0),
                   running_pid=typed("running_pid", int, None), last_error=typed("last_error", str, None))


@dataclass(frozen=True)
class TableStatus:
    state: str
    topic: str
    offsets: dict[int, int] = field(default_factory=dict)
    reason: str | None = None
    end_offsets: dict[int, int] | None = None
    lag: int | None = None
    records: int | None = None
    null_keys: int | None = None
    wipes: int | None = None
    last_error: str | None = None
    restore: RestoreStatus | None = None
    snapshot: SnapshotStatus | None = None
    source: str | None = None  # where a stopped daemon's offsets were read: store, checkpoint, none
    decode: DecodeStatus | None = None  # typed tables: the daemon's decodes into columnar files
    # [export] only (globald.export): where the store came from (export or topic, and why), and this host's exports
    origin: dict[str, Any] | None = None
    export: dict[str, Any] | None = None
    # versioned tables only (store.history): since (epoch ms; null while unproven or pending), versions, bytes,
    # window_ms, compaction_lag_ms, why as-of lookups are refused (null when answered), and why a resume after a gap
    # in reading last moved since (null when none did)
    history: dict[str, Any] | None = None

    @classmethod
    def of(cls, rt: TableView, positions: Mapping[int, int], ends: Mapping[int, int], records: int,
           null_keys: int, wipes: int, restore: RestoreStatus | None, snapshot: SnapshotStatus | None
           ) -> TableStatus:
        return cls(state=rt.state.value, reason=rt.reason, topic=rt.topic, offsets=dict(positions),
                   end_offsets=dict(ends), lag=sum(max(0, e - positions.get(p, 0)) for p, e in ends.items()),
                   records=records, null_keys=null_keys, wipes=wipes, last_error=rt.last_error, restore=restore,
                   snapshot=snapshot)


@dataclass(frozen=True)
class DiskStatus:
    """The state_dir's free bytes, and per table (each inode once): the live store, what its snapshots hold beyond
    it, leftovers (trash, abandoned builds), the bytes its next step needs, and, when short, the one line saying
    what holds the space and how much is missing (globald.snapshot.space)."""

    free_bytes: int | None
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"free_bytes": self.free_bytes, "tables": {n: dict(t) for n, t in self.tables.items()}}


@dataclass(frozen=True)
class HttpAddress:
    host: str
    port: int


@dataclass(frozen=True)
class ConfigStatus:
    """The config in force (``service.reload``): its generation (1 at start, +1 per applied reload), the sha256 of
    the file's bytes it was read from, and the last reload asked for: when (wall clock), ``applied`` or ``refused``,
    and the one line saying why when refused."""

    generation: int
    sha256: str | None
    path: str | None = None
    last_reload: dict[str, Any] | None = None  # {"time", "result", "error"}
    # Per part that makes Kafka clients, the generation of the config its clients were made from: the engine's
    # consumer, the cluster worker, the exact builds, the bootstraps ([export]). null: the part holds none now (it
    # makes them from the config in force when it needs them). Every one at ``generation`` (or null): the reload
    # reached every client.
    clients: dict[str, int | None] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "sha256": self.sha256, "path": self.path,
                "last_reload": None if self.last_reload is None else dict(self.last_reload),
                "clients": None if self.clients is None else dict(self.clients)}

    @classmethod
    def from_json(cls, raw: Any) -> ConfigStatus | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("generation"), int):
            return None
        last, sha, path, clients = raw.get("last_reload"), raw.get("sha256"), raw.get("path"), raw.get("clients")
        return cls(raw["generation"], sha if isinstance(sha, str) else None, path if isinstance(path, str) else None,
                   last if isinstance(last, dict) else None,
                   {str(k): v if isinstance(v, int) else None for k, v in clients.items()}
                   if isinstance(clients, dict) else None)


@dataclass(frozen=True)
class DaemonStatus:
    state: State
    pid: int | None
    tables: dict[str, TableStatus]
    reason: str | None = None
    degraded: str | None = None
    ready: bool | None = None
    ready_detail: str | None = None
    updated: float | None = None
    http: HttpAddress | None = None
    memory: dict[str, Any] | None = None  # RSS and each store's RocksDB memory (globald.ops.memory)
    # Exceptions globald caught that are not expected I/O, store or Kafka errors (common.swallowed): defects, shown
    # until the process ends, each {"where", "error", "count", "first", "last"}.
    bugs: list[dict[str, Any]] = field(default_factory=list)
    disk: DiskStatus | None = None
    config: ConfigStatus | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"state": self.state.value, "pid": self.pid,
                               "tables": {n: _table_json(t) for n, t in self.tables.items()}}
        if self.pid is not None:  # a running daemon's document; a stopped one's has only what the disk says
            doc.update(reason=self.reason, degraded=self.degraded)
        for key in ("ready", "ready_detail", "updated", "memory"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        if self.http is not None:
            doc["http"] = {"host": self.http.host, "port": self.http.port}
        if self.bugs:
            doc["bugs"] = [dict(b) for b in self.bugs]
        if self.disk is not None:
            doc["disk"] = self.disk.to_json()
        if self.config is not None:
            doc["config"] = self.config.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DaemonStatus:
        http = doc.get("http")
        return cls(state=State(doc.get("state", State.CREATED.value)), pid=doc.get("pid"),
                   tables={str(n): _table_from(t) for n, t in (doc.get("tables") or {}).items()},
                   reason=doc.get("reason"), degraded=doc.get("degraded"), ready=doc.get("ready"),
                   ready_detail=doc.get("ready_detail"), updated=doc.get("updated"),
                   http=HttpAddress(str(http["host"]), int(http["port"])) if isinstance(http, dict) else None,
                   memory=doc.get("memory"),
                   bugs=[b for b in doc.get("bugs") or [] if isinstance(b, dict)], disk=_disk_from(doc.get("disk")),
                   config=ConfigStatus.from_json(doc.get("config")))


def _disk_from(raw: Any) -> DiskStatus | None:
    if not isinstance(raw, dict):
        return None
    tables = raw.get("tables")
    tables = tables if isinstance(tables, dict) else {}
    free = raw.get("free_bytes")
    # Read leniently: a figure of the wrong type (a damaged file) is left out, never shown or computed with.
    return DiskStatus(free if isinstance(free, int) else None,
                      {str(n): {k: v for k, v in t.items() if isinstance(v, int) or (k == "short" and
                                                                                     (v is None or isinstance(v, str)))}
                       for n, t in tables.items() if isinstance(t, dict)})


def _table_json(t: TableStatus) -> dict[str, Any]:
    doc: dict[str, Any] = {"state": t.state, "topic": t.topic, "offsets": offsets_to_json(t.offsets)}
    if t.source is not None:
        doc["source"] = t.source
        return doc
    doc.update(reason=t.reason, end_offsets=offsets_to_json(t.end_offsets or {}), lag=t.lag, records=t.records,
               null_keys=t.null_keys, wipes=t.wipes, last_error=t.last_error)
    if t.restore is not None:
        r = t.restore
        doc["restore"] = {"percent": round(r.percent, 1), "records": r.records,
                          "records_per_second": round(r.records_per_second, 1),
                          "eta_seconds": None if r.eta_seconds is None else round(r.eta_seconds, 1)}
    if t.snapshot is not None:
        s = t.snapshot
        doc["snapshot"] = {"current": s.current, "offsets": offsets_to_json(s.offsets), "created": s.created,
                           "stale": s.stale, "stale_reason": s.stale_reason, "published": s.published,
                           "exact_built": s.exact_built, "refused": dict(s.refused),
                           "last_publish_ms": round(s.last_publish_ms, 3), "last_error": s.last_error}
    if t.decode is not None:
        doc["decode"] = t.decode.to_json()
    for key in ("origin", "export", "history"):
        if getattr(t, key) is not None:
            doc[key] = getattr(t, key)
    return doc


def _table_from(raw: Any) -> TableStatus:
    t: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    r, s = t.get("restore"), t.get("snapshot")
    return TableStatus(
        state=str(t.get("state", State.CREATED.value)), topic=str(t.get("topic", "")),
        offsets=_offsets_read_back(t.get("offsets")), reason=t.get("reason"),
        end_offsets=_offsets_read_back(t["end_offsets"]) if "end_offsets" in t else None, lag=t.get("lag"),
        records=t.get("records"), null_keys=t.get("null_keys"), wipes=t.get("wipes"), last_error=t.get("last_error"),
        restore=RestoreStatus(r.get("percent", 0.0), r.get("records", 0), r.get("records_per_second", 0.0),
                              r.get("eta_seconds")) if isinstance(r, dict) else None,
        snapshot=SnapshotStatus(s.get("current"), _offsets_read_back(s.get("offsets")), s.get("created"),
                                bool(s.get("stale")), s.get("stale_reason"), s.get("published", 0),
                                s.get("exact_built", 0), dict(s.get("refused") or {}), s.get("last_publish_ms", 0.0),
                                s.get("last_error")) if isinstance(s, dict) else None,
        source=t.get("source"), decode=DecodeStatus.from_json(t.get("decode")),
        origin=t["origin"] if isinstance(t.get("origin"), dict) else None,
        export=t["export"] if isinstance(t.get("export"), dict) else None,
        history=t["history"] if isinstance(t.get("history"), dict) else None)
