"""Configuration: one TOML file parsed into frozen dataclasses, validated before anything is touched.

Every error names the offending key (``tables[1].name``, ``kafka.auto.offset.reset``) so the CLI can print one
line and exit 2. Loading a config never creates a file or a directory.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.errors import ConfigError
from globald.logs import MASK, Redactor

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
    # A mirror must never make a topic exist: one deleted under it would come back empty and its table be wiped to
    # match. Also librdkafka's consumer default; sent in Metadata v4+ (Kafka >= 0.11), ignored by older brokers,
    # for which globald's own queries list the cluster instead of naming a topic (kafka/clients.py).
    "allow.auto.create.topics": False,
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

# The librdkafka properties whose value may be printed (config echo in the log, check-config --json). Every other
# property is shown as "***" and its value masked in every log line. An allowlist rather than a list of secret
# names, because a credential-bearing property nobody listed (ssl.key.pem, sasl.oauthbearer.config, one a future
# librdkafka adds) must stay hidden by default: forgetting a harmless property here costs a "***", forgetting a
# secret one would cost a leaked key.
# Printed on purpose although they concern authentication: identities (sasl.username, sasl.kerberos.principal,
# sasl.oauthbearer.client.id), which brokers log and ACLs name and without which an authentication failure cannot
# be diagnosed; and file paths (*.location, sasl.kerberos.keytab), which say where a credential is, not what it
# is. Still masked: passwords, passphrases, client secrets, inline PEM (keys and certificates alike),
# sasl.oauthbearer.config/.extensions (free-form, may embed tokens), token endpoint URLs (may embed user:password)
# and sasl.kerberos.kinit.cmd (a shell command that may embed anything).
PRINTABLE_KAFKA_PROPERTIES = frozenset({
    "bootstrap.servers", "metadata.broker.list", "client.id", "client.rack", "builtin.features",
    "group.id", "group.instance.id", "group.protocol", "group.protocol.type", "group.remote.assignor",
    "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms",
    "coordinator.query.interval.ms", "auto.commit.interval.ms", "auto.offset.reset", "isolation.level",
    "check.crcs", "allow.auto.create.topics", "offset.store.method",
    "api.version.request", "api.version.request.timeout.ms", "api.version.fallback.ms", "broker.version.fallback",
    "broker.address.family", "broker.address.ttl", "connections.max.idle.ms", "internal.termination.signal",
    "metadata.max.age.ms", "metadata.recovery.strategy", "metadata.recovery.rebootstrap.trigger.ms",
    "message.max.bytes", "message.copy.max.bytes", "receive.message.max.bytes", "max.partition.fetch.bytes",
    "max.in.flight", "max.in.flight.requests.per.connection", "statistics.interval.ms", "enabled_events",
    "debug", "log_level", "log.queue", "log.thread.name", "log.connection.close", "topic.blacklist",
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username",
    "sasl.kerberos.service.name", "sasl.kerberos.principal", "sasl.kerberos.keytab",
    "sasl.kerberos.min.time.before.relogin",
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.scope", "sasl.oauthbearer.grant.type", "sasl.oauthbearer.assertion.algorithm",
    "sasl.oauthbearer.metadata.authentication.type",
    "ssl.endpoint.identification.algorithm", "ssl.cipher.suites", "ssl.curves.list", "ssl.sigalgs.list",
    "ssl.providers", "ssl.ca.certificate.stores",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.keystore.location", "ssl.crl.location",
    "https.ca.location",
})
# Families of tuning properties (sizes, timeouts, backoffs, booleans): no librdkafka property in them carries a
# credential, and listing each one would only make the allowlist lag behind librdkafka.
PRINTABLE_KAFKA_PREFIXES = ("fetch.", "queued.", "socket.", "reconnect.backoff", "retry.backoff", "topic.metadata.",
                            "enable.")


def printable(name: str) -> bool:
    """Whether the value of librdkafka property ``name`` may be printed: the one place that decides it.

    Exact, case-sensitive names, as librdkafka matches them."""
    return name in PRINTABLE_KAFKA_PROPERTIES or name.startswith(PRINTABLE_KAFKA_PREFIXES)


def redact(props: dict[str, Any]) -> dict[str, Any]:
    """A copy of librdkafka properties ``props`` safe to print: a value not ``printable`` becomes ``***``."""
    return {k: (v if printable(k) else MASK) for k, v in props.items()}


def secret_values(config: Config) -> list[str]:
    """Every configured value a log line must never show: the values of the [kafka] properties that are not
    ``printable`` and the webhook URL's password. The log masker decides which are long enough to look for."""
    from urllib.parse import urlsplit

    values = [str(v) for k, v in config.kafka.items() if not printable(k)]
    if config.hooks.webhook_url:
        values.append(urlsplit(config.hooks.webhook_url).password or "")
    return values


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
    # /metrics and /status have no authentication: serving them beyond this host must be a decision in the config.
    allow_non_loopback: bool = False


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


def _http(http: dict[str, Any]) -> HttpConfig:
    config = HttpConfig(
        enabled=_bool(http, "enabled", "http.enabled", True),
        host=_str(http, "host", "http.host", "127.0.0.1"),
        port=_int(http, "port", "http.port", 9464, 0, 65535),
        allow_non_loopback=_bool(http, "allow_non_loopback", "http.allow_non_loopback", False),
    )
    if config.enabled and not config.allow_non_loopback and not is_loopback(config.host):
        raise ConfigError("http.host", f"{config.host!r} is not a loopback address, and /metrics and /status have no "
                                       "authentication: set [http] allow_non_loopback = true to serve them beyond "
                                       "this host")
    return config


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
    _only(http, {"enabled", "host", "port", "allow_non_loopback"}, "http.")
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
        http=_http(http),
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
        # librdkafka quotes some rejected values; the CLI prints this line before any log masking is set up.
        text = Redactor(secret_values(config))(text)
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
