"""Configuration: one TOML file parsed into frozen dataclasses, validated before anything is touched.

Every error names the offending key (``tables[1].name``, ``kafka.auto.offset.reset``) so the CLI can print one
line and exit 2. Loading a config never creates a file or a directory.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.errors import ConfigError

# Table names become directory names: keep them to a safe, portable alphabet and never '.' or '..'.
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Kafka's own rule for topic names.
TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# librdkafka properties whose value globald's correctness depends on; a user may not override them.
MANAGED_KAFKA_PROPERTIES: dict[str, object] = {
    "auto.offset.reset": "error",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
}

# Client defaults valid on every broker, which a user's [kafka] setting overrides. librdkafka 2.x stops fetching a
# partition for fetch.queue.backoff.ms (1 s by default) whenever its prefetch queue is full: a restore whose writer
# is a little slower than the fetcher then stalls a second at a time, cutting its throughput by 3x or more.
# queued.min.messages bounds the prefetch (100k messages per partition by default, ~45 MB for three partitions of
# small records): 20k per partition still keeps several polls queued, for 40 MB less peak memory in a restore.
CONSUMER_DEFAULTS: dict[str, object] = {
    "fetch.queue.backoff.ms": 20,
    "queued.min.messages": 20_000,
}

SECRET_MARKERS = ("password", "secret")


def is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def redact(props: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``props`` safe to log: any property whose name holds 'password' or 'secret' is masked."""
    return {k: ("***" if is_secret(k) else v) for k, v in props.items()}


@dataclass(frozen=True)
class TableConfig:
    name: str
    topic: str


@dataclass(frozen=True)
class SnapshotConfig:
    interval_ms: int = 1000
    retain: int = 3
    serve_stale: bool = True
    build_timeout_ms: int = 120_000  # an exact-offset snapshot build taking longer is abandoned and answered


@dataclass(frozen=True)
class HttpConfig:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9464


@dataclass(frozen=True)
class HooksConfig:
    on_state_change: tuple[str, ...] = ()
    webhook_url: str | None = None
    timeout_ms: int = 5000


@dataclass(frozen=True)
class StoreConfig:
    block_cache_mb: int = 64
    write_buffer_mb: int = 32
    max_write_buffers: int = 3


@dataclass(frozen=True)
class Config:
    state_dir: Path
    kafka: dict[str, Any]
    tables: tuple[TableConfig, ...]
    commit_interval_ms: int = 1000
    consume_batch_size: int = 10_000
    poll_timeout_ms: int = 200
    metadata_refresh_ms: int = 30_000
    log_level: str = "INFO"
    log_format: str = "plain"
    store: StoreConfig = field(default_factory=StoreConfig)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    source: Path | None = None

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise ConfigError("--table", f"no table named {name!r} in the config (known: {[t.name for t in self.tables]})")

    def consumer_settings(self) -> dict[str, Any]:
        """The librdkafka properties of the daemon's consumer: the user's, then what globald needs."""
        props: dict[str, Any] = {"group.id": "globald", "client.id": "globald", **CONSUMER_DEFAULTS}
        props.update(self.kafka)
        props.update(MANAGED_KAFKA_PROPERTIES)
        return props


def _int(section: dict[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(path, f"must be between {lo} and {hi}, got {value}")
    return value


def _bool(section: dict[str, Any], key: str, path: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(path, f"must be true or false, got {value!r}")
    return value


def _str(section: dict[str, Any], key: str, path: str, default: str | None = None) -> str:
    value = section.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"must be a non-empty string, got {value!r}")
    return value


def _only(section: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{prefix}{key}", f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _table(section: dict[str, Any] | None, name: str) -> dict[str, Any]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(name, "must be a table")
    return section


def _tables(raw: Any) -> tuple[TableConfig, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("tables", "at least one [[tables]] entry with name and topic is required")
    tables: list[TableConfig] = []
    for i, entry in enumerate(raw):
        where = f"tables[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, "must be a table with name and topic")
        _only(entry, {"name", "topic"}, f"{where}.")
        name = _str(entry, "name", f"{where}.name")
        if not TABLE_NAME_RE.match(name) or name in {".", ".."}:
            raise ConfigError(f"{where}.name", f"{name!r} is not a valid table name (letters, digits, '.', '_', '-')")
        topic = _str(entry, "topic", f"{where}.topic")
        if not TOPIC_NAME_RE.match(topic) or topic in {".", ".."}:
            raise ConfigError(f"{where}.topic", f"{topic!r} is not a valid Kafka topic name")
        if any(t.name == name for t in tables):
            raise ConfigError(f"{where}.name", f"duplicate table name {name!r}")
        if any(t.topic == topic for t in tables):
            raise ConfigError(f"{where}.topic", f"topic {topic!r} is already mirrored by another table")
        tables.append(TableConfig(name=name, topic=topic))
    return tuple(tables)


def _kafka(raw: Any) -> dict[str, Any]:
    kafka = _table(raw, "kafka")
    for key, value in kafka.items():
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(f"kafka.{key}", "librdkafka properties must be strings, numbers or booleans")
        if key in MANAGED_KAFKA_PROPERTIES and value != MANAGED_KAFKA_PROPERTIES[key]:
            raise ConfigError(f"kafka.{key}", f"is managed by globald and must stay {MANAGED_KAFKA_PROPERTIES[key]!r}")
    if not kafka.get("bootstrap.servers"):
        raise ConfigError("kafka.bootstrap.servers", "is required")
    return dict(kafka)


TOP_LEVEL = {
    "state_dir", "commit_interval_ms", "consume_batch_size", "poll_timeout_ms", "metadata_refresh_ms",
    "log_level", "log_format", "kafka", "tables", "store", "snapshots", "http", "hooks",
}


def parse(raw: dict[str, Any], source: Path | None = None) -> Config:
    """Validate a parsed TOML document. Raises ConfigError naming the first bad key."""
    _only(raw, TOP_LEVEL, "")
    state_dir = Path(_str(raw, "state_dir", "state_dir"))
    if source is not None and not state_dir.is_absolute():
        state_dir = source.parent / state_dir
    log_level = _str(raw, "log_level", "log_level", "INFO").upper()
    if log_level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError("log_level", f"must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    log_format = _str(raw, "log_format", "log_format", "plain")
    if log_format not in {"plain", "json"}:
        raise ConfigError("log_format", f"must be 'plain' or 'json', got {log_format!r}")

    store = _table(raw.get("store"), "store")
    _only(store, {"block_cache_mb", "write_buffer_mb", "max_write_buffers"}, "store.")
    snaps = _table(raw.get("snapshots"), "snapshots")
    _only(snaps, {"interval_ms", "retain", "serve_stale", "build_timeout_ms"}, "snapshots.")
    http = _table(raw.get("http"), "http")
    _only(http, {"enabled", "host", "port"}, "http.")
    hooks = _table(raw.get("hooks"), "hooks")
    _only(hooks, {"on_state_change", "webhook_url", "timeout_ms"}, "hooks.")
    argv = hooks.get("on_state_change", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) and a for a in argv):
        raise ConfigError("hooks.on_state_change", "must be a list of non-empty strings (an argv)")
    webhook = hooks.get("webhook_url")
    if webhook is not None and (not isinstance(webhook, str) or not webhook.startswith(("http://", "https://"))):
        raise ConfigError("hooks.webhook_url", f"must be an http:// or https:// URL, got {webhook!r}")

    return Config(
        state_dir=state_dir,
        kafka=_kafka(raw.get("kafka")),
        tables=_tables(raw.get("tables")),
        commit_interval_ms=_int(raw, "commit_interval_ms", "commit_interval_ms", 1000, 10, 3_600_000),
        consume_batch_size=_int(raw, "consume_batch_size", "consume_batch_size", 10_000, 1, 1_000_000),
        poll_timeout_ms=_int(raw, "poll_timeout_ms", "poll_timeout_ms", 200, 1, 60_000),
        metadata_refresh_ms=_int(raw, "metadata_refresh_ms", "metadata_refresh_ms", 30_000, 100, 86_400_000),
        log_level=log_level,
        log_format=log_format,
        store=StoreConfig(
            block_cache_mb=_int(store, "block_cache_mb", "store.block_cache_mb", 64, 1, 1 << 20),
            write_buffer_mb=_int(store, "write_buffer_mb", "store.write_buffer_mb", 32, 1, 1 << 16),
            max_write_buffers=_int(store, "max_write_buffers", "store.max_write_buffers", 3, 2, 64),
        ),
        snapshots=SnapshotConfig(
            interval_ms=_int(snaps, "interval_ms", "snapshots.interval_ms", 1000, 10, 86_400_000),
            retain=_int(snaps, "retain", "snapshots.retain", 3, 1, 1000),
            serve_stale=_bool(snaps, "serve_stale", "snapshots.serve_stale", True),
            build_timeout_ms=_int(snaps, "build_timeout_ms", "snapshots.build_timeout_ms", 120_000, 100, 86_400_000),
        ),
        http=HttpConfig(
            enabled=_bool(http, "enabled", "http.enabled", True),
            host=_str(http, "host", "http.host", "127.0.0.1"),
            port=_int(http, "port", "http.port", 9464, 0, 65535),
        ),
        hooks=HooksConfig(
            on_state_change=tuple(argv),
            webhook_url=webhook,
            timeout_ms=_int(hooks, "timeout_ms", "hooks.timeout_ms", 5000, 1, 600_000),
        ),
        source=source,
    )


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


def check_kafka_properties(config: Config) -> None:
    """Let librdkafka itself reject unknown or malformed properties, without connecting anywhere."""
    from confluent_kafka import Consumer, KafkaException

    try:
        # A consumer's constructor validates every property; a bootstrap address that is never used costs nothing.
        Consumer({**config.consumer_settings(), "bootstrap.servers": "127.0.0.1:9", "logger": _null_logger()}).close()
    except (KafkaException, ValueError, TypeError) as e:
        text = str(e.args[0].str() if e.args and hasattr(e.args[0], "str") else e)
        key = _property_in(text, config.kafka) or "kafka"
        raise ConfigError(key, text) from None


def _property_in(text: str, kafka: dict[str, Any]) -> str | None:
    for key in kafka:
        if f'"{key}"' in text or key in text.split():
            return f"kafka.{key}"
    return None


def _null_logger() -> Any:
    import logging

    log = logging.getLogger("globald.check-config")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    return log
