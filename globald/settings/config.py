"""Configuration: one TOML file parsed into frozen dataclasses, validated before anything is touched.

Each key is declared once, as a dataclass field with its default, type, bounds and help; see
``globald.settings.spec``. Every error names the offending key (``tables[1].name``, ``kafka.auto.offset.reset``) so
the CLI can print one line and exit 2. Loading a config never creates a file or a directory. The rules for the
[kafka] properties (managed ones, what may be printed) are ``globald.settings.kafka_properties``.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from globald.common.errors import ConfigError, UnknownTableError
from globald.settings.kafka_properties import MANAGED_KAFKA_PROPERTIES, consumer_settings
from globald.settings.registry import RegistryProperties
from globald.settings.spec import (
    Argv,
    Boolean,
    Choice,
    Directory,
    Duration,
    Integer,
    Section,
    Spec,
    Text,
    Url,
    build,
    client_property,
    declare,
)
from globald.settings.typed_spec import ValueFormat, check_format_keys

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Table names become directory names: keep them to a safe, portable alphabet and never '.' or '..'.
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Kafka's own rule for topic names.
TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class Name(Text):
    """A string that names something outside the config (a directory, a topic), hence a restricted alphabet."""

    pattern: re.Pattern[str]
    what: str
    rule: str

    def check(self, value: object, path: str) -> str:
        text: str = super().check(value, path)
        if not self.pattern.match(text) or text in {".", ".."}:
            raise ConfigError(path, f"{text!r} is not a valid {self.what} ({self.rule})")
        return text

    def kind(self) -> str:
        return f"{self.what}: {self.rule}"


@dataclass(frozen=True)
class Tables(Spec):
    """The [[tables]] array: at least one entry, no name or topic twice."""

    def check(self, value: object, path: str) -> tuple[TableConfig, ...]:
        if not isinstance(value, list) or not value:
            self.absent(path)  # raises
            raise AssertionError("unreachable")
        tables: list[TableConfig] = []
        for i, entry in enumerate(value):
            where = f"{path}[{i}]"
            if not isinstance(entry, dict):
                raise ConfigError(where, "must be a table with name and topic")
            table = build(TableConfig, entry, f"{where}.")
            if any(t.name == table.name for t in tables):
                raise ConfigError(f"{where}.name", f"duplicate table name {table.name!r}")
            if any(t.topic == table.topic for t in tables):
                raise ConfigError(f"{where}.topic", f"topic {table.topic!r} is already mirrored by another table")
            tables.append(table)
        return tuple(tables)

    def absent(self, path: str) -> Any:
        raise ConfigError(path, "at least one [[tables]] entry with name and topic is required")

    def kind(self) -> str:
        return "array of tables, one [[tables]] entry per table"

    def nested(self) -> tuple[str, type[DataclassInstance]] | None:
        return "[].", TableConfig


@dataclass(frozen=True)
class Properties(Spec):
    """librdkafka properties: free-form, since librdkafka itself knows which exist (check_kafka_properties)."""

    def check(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ConfigError(path, "must be a table")
        for key, v in value.items():
            client_property(path, key, v, "librdkafka properties")
            if key in MANAGED_KAFKA_PROPERTIES and v != MANAGED_KAFKA_PROPERTIES[key]:
                raise ConfigError(f"{path}.{key}",
                                  f"is managed by globald and must stay {MANAGED_KAFKA_PROPERTIES[key]!r}")
        if not value.get("bootstrap.servers"):
            # A misspelling (bootstrap.server) is named, as an unknown top-level key is answered with the known ones.
            near = difflib.get_close_matches("bootstrap.servers", [str(k) for k in value], n=1, cutoff=0.8)
            raise ConfigError(f"{path}.bootstrap.servers",
                              "is required" + (f" (is {near[0]!r} a misspelling of it?)" if near else ""))
        return dict(value)

    def absent(self, path: str) -> Any:
        return self.check({}, path)  # names bootstrap.servers, the one property that is required

    def kind(self) -> str:
        return "librdkafka properties (strings, numbers, booleans)"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a socket reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # any other name may resolve to a public address, today or after a DNS change
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # Python 3.11 does not count ::ffff:127.0.0.1 as loopback
    return ip.is_loopback


def _refuse_unauthenticated_exposure(http: HttpConfig, path: str) -> None:
    # /metrics and /status have no authentication: serving them beyond this host must be a decision in the config.
    if http.enabled and not http.allow_non_loopback and not is_loopback(http.host):
        raise ConfigError(f"{path}.host", f"{http.host!r} is not a loopback address, and /metrics and /status have "
                                          "no authentication: set [http] allow_non_loopback = true to serve them "
                                          "beyond this host")


@dataclass(frozen=True)
class TableConfig:
    name: str = field(metadata=declare(Name(
        TABLE_NAME_RE, "table name", "1 to 128 letters, digits, '.', '_', '-', the first a letter or digit",
        help="the table's directory under state_dir and the name commands take (--table)")))
    topic: str = field(metadata=declare(Name(
        TOPIC_NAME_RE, "Kafka topic name", "1 to 249 letters, digits, '.', '_', '-', not '.' or '..'",
        help="the compacted topic the table mirrors; one table per topic")))
    value: ValueFormat | None = field(default=None, metadata=declare(Section(
        ValueFormat, after=check_format_keys, help="optional: how the values are encoded, to decode them into typed "
        "columns (docs/typed-tables.md); without it they stay raw bytes. The store keeps the bytes as they came")))
    key: ValueFormat | None = field(default=None, metadata=declare(Section(
        ValueFormat, after=check_format_keys, help="optional: how the keys are encoded, with the same keys as "
        "[tables.value]; without it they are raw bytes (UTF-8 text for a string key)")))

    history: int | None = field(default=None, metadata=declare(Duration(
        1, 100 * 365 * 86_400_000, help="optional: make the table versioned, keeping every version whose validity "
        "ended within this long of record time (\"7d\", \"12h\", or milliseconds), for as-of lookups "
        "(get --as-of, dump --as-of; docs/as-of.md); without it the table keeps its latest values only")))

    @property
    def versioned(self) -> bool:
        """Declares ``history``: its store keeps versions for as-of lookups (``store.history``)."""
        return self.history is not None

    @property
    def typed(self) -> bool:
        """Declares a value or key format: its store then records each value's origin (``store.names.ORIGINS_CF``)."""
        return any(f is not None and f.typed for f in (self.value, self.key))

    def resolved(self, base: Path) -> TableConfig:
        """This table with the schema paths of its sections taken from ``base`` where relative."""
        return replace(self, value=self.value and self.value.resolved(base), key=self.key and self.key.resolved(base))


@dataclass(frozen=True)
class StoreConfig:
    block_cache_mb: int = field(default=64, metadata=declare(Integer(
        1, 1 << 20, help="MiB of RocksDB block cache per table store, index and filter blocks included")))
    write_buffer_mb: int = field(default=32, metadata=declare(Integer(
        1, 1 << 16, help="MiB per memtable of a table store's values")))
    max_write_buffers: int = field(default=3, metadata=declare(Integer(
        2, 64, help="memtables of that size a table store may hold before writes wait for a flush")))


@dataclass(frozen=True)
class SnapshotConfig:
    interval_ms: int = field(default=1000, metadata=declare(Integer(
        10, 86_400_000, help="tables whose offsets moved are snapshotted this often (hard links: cheap)")))
    retain: int = field(default=3, metadata=declare(Integer(
        1, 1000, help="newest snapshots kept per table, besides the current one and those a reader's lease pins")))
    serve_stale: bool = field(default=True, metadata=declare(Boolean(
        help="while a wiped table rebuilds, serve its last snapshot, marked stale (also to get and dump); "
             "false: refuse, exit 3, until it is RUNNING again")))
    build_timeout_ms: int = field(default=120_000, metadata=declare(Integer(
        100, 86_400_000, help="an exact-offset snapshot build taking longer is abandoned and answered 'timeout'")))
    decode_interval_ms: int = field(default=30_000, metadata=declare(Integer(
        0, 86_400_000, help="typed tables: the daemon decodes CURRENT into its columnar file in a separate "
                            "low-priority process, at most once per this long per table, counted from the end of the "
                            "previous decode and never sooner than it lasted; 0: never (the first reader decodes)")))


@dataclass(frozen=True)
class HttpConfig:
    enabled: bool = field(default=True, metadata=declare(Boolean(
        help="serve GET /metrics, /healthz, /readyz and /status")))
    host: str = field(default="127.0.0.1", metadata=declare(Text(
        help="address to bind; beyond loopback (127.0.0.0/8, ::1, localhost) only with allow_non_loopback")))
    port: int = field(default=9464, metadata=declare(Integer(
        0, 65535, help="0 picks a free port, published in status.json; one that cannot be bound is a config error")))
    allow_non_loopback: bool = field(default=False, metadata=declare(Boolean(
        help="allow a non-loopback host: the endpoint has no authentication, and the daemon warns at every start")))


@dataclass(frozen=True)
class HooksConfig:
    on_state_change: tuple[str, ...] = field(default=(), metadata=declare(Argv(
        help="run on every state change of the daemon or a table, with GLOBALD_STATE, GLOBALD_PREVIOUS_STATE, "
             "GLOBALD_TABLE, GLOBALD_REASON and GLOBALD_PID")))
    webhook_url: str | None = field(default=None, metadata=declare(Url(
        help="gets the same events as JSON POSTs, no proxy, no redirect followed")))
    timeout_ms: int = field(default=5000, metadata=declare(Integer(
        1, 600_000, help="bound of each command or POST; a command that overruns is killed")))


@dataclass(frozen=True)
class ExportConfig:
    """[export]: verified snapshots to shared storage, and empty stores bootstrapped from them (docs/operations/
    export.md). Off unless the section is present."""

    uri: str = field(metadata=declare(Text(
        help="any pyarrow filesystem URI (file://, s3://, gs://, hdfs://, abfs://); credentials come from the "
             "environment or the platform, never from here; shown and logged masked")))
    interval_s: int = field(default=300, metadata=declare(Integer(
        0, 604_800, help="how often this host exports each RUNNING table's newest verified snapshot; 0: never "
                         "(bootstrap only); `globald export` exports at once either way")))
    keep: int = field(default=3, metadata=declare(Integer(1, 1000, help="exports kept per table")))
    bootstrap: bool = field(default=True, metadata=declare(Boolean(
        help="a table whose store is empty at start starts from the newest usable export, then tails the topic")))
    grace_s: int = field(default=3600, metadata=declare(Integer(
        0, 604_800, help="files no export references any more are deleted only this long after; longer than the "
                         "slowest download, so a host downloading an older export is never cut off")))
    bootstrap_timeout_s: int = field(default=300, metadata=declare(Integer(
        1, 86_400, help="a bootstrap not done within this bound (storage slow or unreachable) is given up: the "
                        "table restores from the topic")))
    upload_timeout_s: int = field(default=3600, metadata=declare(Integer(
        1, 604_800, help="an export not written within this bound (storage that takes the upload and never "
                         "answers) is given up and counted failed, with no manifest; the next interval tries again")))


@dataclass(frozen=True)
class Config:
    state_dir: Path = field(metadata=declare(Directory(
        help="where the stores, snapshots, status.json and the lock live; a relative path is taken from the "
             "config file's directory")))
    kafka: dict[str, Any] = field(metadata=declare(Properties(
        help="librdkafka properties for every client; bootstrap.servers is required; globald sets "
             + ", ".join(f"{k} = {json.dumps(v)}" for k, v in MANAGED_KAFKA_PROPERTIES.items())
             + " and refuses other values for them")))
    tables: tuple[TableConfig, ...] = field(metadata=declare(Tables(help="the topics to mirror, at least one")))
    commit_interval_ms: int = field(default=1000, metadata=declare(Integer(
        10, 3_600_000, help="fsync, .checkpoint files and status.json, at most this often")))
    consume_batch_size: int = field(default=10_000, metadata=declare(Integer(
        1, 1_000_000, help="records per consume() call: one RocksDB WriteBatch per table per call")))
    poll_timeout_ms: int = field(default=200, metadata=declare(Integer(
        1, 60_000, help="longest wait of one poll while the topics are idle")))
    metadata_refresh_ms: int = field(default=30_000, metadata=declare(Integer(
        100, 86_400_000, help="how soon partitions added to a topic are picked up")))
    reload_on_change_ms: int = field(default=0, metadata=declare(Integer(
        0, 86_400_000, help="check the config file (the path run was given, symlinks followed anew: a Kubernetes "
                            "ConfigMap's swap) this often, and reload it when its bytes changed, as `globald reload` "
                            "does; 0: never, a reload happens when asked (docs/operations/reload.md)")))
    log_level: str = field(default="INFO", metadata=declare(Choice(
        ("DEBUG", "INFO", "WARNING", "ERROR"), fold_case=True, help="least severe level logged")))
    log_format: str = field(default="plain", metadata=declare(Choice(
        ("plain", "json"), help="log lines on stderr: text, or one JSON object each (ts, level, logger, msg, exc)")))
    allocator: str = field(default="auto", metadata=declare(Choice(
        ("auto", "jemalloc", "glibc"),
        help="the daemon's malloc: jemalloc when installed (auto), jemalloc or refuse to start, or glibc's, which "
             "fragments under catch-ups (docs/operations/memory.md)")))
    store: StoreConfig = field(default_factory=StoreConfig, metadata=declare(Section(
        StoreConfig, help="RocksDB tuning, for each table's store")))
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig, metadata=declare(Section(
        SnapshotConfig, help="the snapshots readers and Spark are served")))
    http: HttpConfig = field(default_factory=HttpConfig, metadata=declare(Section(
        HttpConfig, after=_refuse_unauthenticated_exposure, help="the read-only HTTP endpoint")))
    hooks: HooksConfig = field(default_factory=HooksConfig, metadata=declare(Section(
        HooksConfig, help="state-change hooks, run off the loop, in order; a failure is logged and counted")))
    export: ExportConfig | None = field(default=None, metadata=declare(Section(
        ExportConfig, help="exports to shared storage and bootstraps from them; off unless present")))
    registry: dict[str, Any] | None = field(default=None, metadata=declare(RegistryProperties(
        help="one Schema Registry for the daemon: url, then confluent-kafka SchemaRegistryClient settings "
             "(basic.auth.user.info, bearer.auth.*, ssl.*); a value \"env:NAME\" or \"file:/path\" is read from "
             "there; secrets are masked as [kafka]'s (docs/typed-tables.md)")))
    source: Path | None = None  # the file this config was loaded from, set by parse()

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise UnknownTableError(f"no table named {name!r} in the config "
                                f"(known: {', '.join(t.name for t in self.tables)})")

    def consumer_settings(self) -> dict[str, Any]:
        """The librdkafka properties of the daemon's consumer: the user's, then what globald needs."""
        return consumer_settings(self.kafka)


def parse(raw: dict[str, Any], source: Path | None = None) -> Config:
    """Validate a parsed TOML document. Raises ConfigError naming the first bad key."""
    config = build(Config, raw, "")
    state_dir = config.state_dir
    if source is not None and not state_dir.is_absolute():
        state_dir = source.parent / state_dir
    # Schema paths, like state_dir, are taken from the config file's directory, not from where globald started.
    tables = config.tables if source is None else tuple(t.resolved(source.parent) for t in config.tables)
    if config.registry is None:
        for i, t in enumerate(tables):
            for section, fmt in (("value", t.value), ("key", t.key)):
                if fmt is not None and fmt.uses_registry:
                    key = "subject" if fmt.subject is not None else "writer_schemas"
                    raise ConfigError(f"tables[{i}].{section}.{key}", "needs a [registry] table with its url")
    return replace(config, state_dir=state_dir, tables=tables, source=source)


def load(path: str | Path) -> Config:
    """Read and validate ``path``. Raises ConfigError; touches nothing on disk."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("--config", f"cannot read {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError("--config", f"{p} is not UTF-8 text") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{p} is not valid TOML: {e}") from None
    return parse(raw, p.resolve())
