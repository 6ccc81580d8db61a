"""Configuration: one TOML file parsed into frozen dataclasses, validated before anything is touched.

Each key is declared once, as a dataclass field with its default, type, bounds and help; see ``Spec``. Every
error names the offending key (``tables[1].name``, ``kafka.auto.offset.reset``) so the CLI can print one line and
exit 2. Loading a config never creates a file or a directory.
"""

from __future__ import annotations

import ipaddress
import json
import re
import tomllib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from globald.errors import ConfigError, UnknownTableError
from globald.logs import MASK, Redactor

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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


# Each config key is declared once, as a field of the frozen dataclasses below: the field holds its default, and
# its metadata under _KEY holds a Spec (type, bounds, help). Validation, the keys each section allows and the
# reference `globald check-config --keys` prints all walk these fields, so none of them can drift from another.
# A field without _KEY (Config.source) is not a key of the file.
_KEY = "globald.config.key"


@dataclass(frozen=True)
class Spec(ABC):
    """What one config key accepts and what it is for. Its default is that of the dataclass field declaring it."""

    help: str = field(kw_only=True)  # keyword-only, so that each kind's own fields come first and positional

    @abstractmethod
    def check(self, value: object, path: str) -> Any:
        """``value`` as the typed config holds it, or ConfigError naming ``path``."""

    @abstractmethod
    def kind(self) -> str:
        """The type and bounds, as the reference shows them."""

    def absent(self, path: str) -> Any:
        """The value of a key that has no default and that the file leaves out."""
        raise ConfigError(path, "is required")


def _k(spec: Spec) -> dict[str, Spec]:
    """The field metadata that makes a dataclass field the config key ``spec`` describes."""
    return {_KEY: spec}


@dataclass(frozen=True)
class Integer(Spec):
    lo: int
    hi: int

    def check(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):  # bool is an int to Python, never to a reader
            raise ConfigError(path, f"must be an integer, got {value!r}")
        if not self.lo <= value <= self.hi:
            raise ConfigError(path, f"must be between {self.lo} and {self.hi}, got {value}")
        return value

    def kind(self) -> str:
        return f"integer, {self.lo} to {self.hi}"


@dataclass(frozen=True)
class Boolean(Spec):
    def check(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value

    def kind(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Text(Spec):
    """A non-empty string."""

    def check(self, value: object, path: str) -> Any:
        if not isinstance(value, str) or not value:
            raise ConfigError(path, f"must be a non-empty string, got {value!r}")
        return value

    def kind(self) -> str:
        return "string"


@dataclass(frozen=True)
class Choice(Text):
    choices: tuple[str, ...]
    fold_case: bool = False  # the value is taken in upper case, so "info" and "INFO" are the same level

    def check(self, value: object, path: str) -> str:
        text: str = super().check(value, path)
        chosen = text.upper() if self.fold_case else text
        if chosen not in self.choices:
            raise ConfigError(path, f"must be one of {', '.join(self.choices)}, got {value!r}")
        return chosen

    def kind(self) -> str:
        return " | ".join(f'"{c}"' for c in self.choices) + (" (any case)" if self.fold_case else "")


@dataclass(frozen=True)
class Directory(Text):
    def check(self, value: object, path: str) -> Path:
        return Path(super().check(value, path))

    def kind(self) -> str:
        return "path"


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
class Argv(Spec):
    def check(self, value: object, path: str) -> tuple[str, ...]:
        if not isinstance(value, list | tuple) or not all(isinstance(a, str) and a for a in value):
            raise ConfigError(path, "must be a list of non-empty strings (an argv)")
        return tuple(value)

    def kind(self) -> str:
        return "list of strings (an argv, run without a shell)"


@dataclass(frozen=True)
class Url(Spec):
    def check(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ConfigError(path, f"must be an http:// or https:// URL, got {value!r}")
        return value

    def kind(self) -> str:
        return "http:// or https:// URL"


@dataclass(frozen=True)
class Section(Spec):
    """A TOML table whose keys are the declared fields of the dataclass ``of``."""

    of: type[DataclassInstance]
    # A rule that involves several keys of the section, run on the parsed section with its path.
    after: Callable[[Any, str], None] | None = None

    def check(self, value: object, path: str) -> Any:
        if not isinstance(value, dict):
            raise ConfigError(path, "must be a table")
        section = _build(self.of, value, f"{path}.")
        if self.after is not None:
            self.after(section, path)
        return section

    def kind(self) -> str:
        return "section"


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
            table = _build(TableConfig, entry, f"{where}.")
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


@dataclass(frozen=True)
class Properties(Spec):
    """librdkafka properties: free-form, since librdkafka itself knows which exist (check_kafka_properties)."""

    def check(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ConfigError(path, "must be a table")
        for key, v in value.items():
            if not isinstance(v, str | int | float | bool):
                raise ConfigError(f"{path}.{key}", "librdkafka properties must be strings, numbers or booleans")
            if key in MANAGED_KAFKA_PROPERTIES and v != MANAGED_KAFKA_PROPERTIES[key]:
                raise ConfigError(f"{path}.{key}",
                                  f"is managed by globald and must stay {MANAGED_KAFKA_PROPERTIES[key]!r}")
        if not value.get("bootstrap.servers"):
            raise ConfigError(f"{path}.bootstrap.servers", "is required")
        return dict(value)

    def absent(self, path: str) -> Any:
        return self.check({}, path)  # names bootstrap.servers, the one property that is required

    def kind(self) -> str:
        return "librdkafka properties (strings, numbers, booleans)"


_D = TypeVar("_D", bound="DataclassInstance")


def _build(cls: type[_D], raw: dict[str, Any], prefix: str) -> _D:
    """An instance of ``cls`` from one TOML table, its keys named ``prefix + key`` in errors."""
    declared = {f.name: f for f in fields(cls) if _KEY in f.metadata}
    for name in raw:
        if name not in declared:
            raise ConfigError(f"{prefix}{name}", f"unknown key (allowed: {', '.join(sorted(declared))})")
    values: dict[str, Any] = {}
    for name, f in declared.items():
        spec: Spec = f.metadata[_KEY]
        if name in raw:
            values[name] = spec.check(raw[name], prefix + name)
        elif f.default is MISSING and f.default_factory is MISSING:
            values[name] = spec.absent(prefix + name)
        # otherwise the dataclass supplies the declared default
    return cls(**values)


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
    name: str = field(metadata=_k(Name(
        TABLE_NAME_RE, "table name", "1 to 128 letters, digits, '.', '_', '-', the first a letter or digit",
        help="the table's directory under state_dir and the name commands take (--table)")))
    topic: str = field(metadata=_k(Name(
        TOPIC_NAME_RE, "Kafka topic name", "1 to 249 letters, digits, '.', '_', '-', not '.' or '..'",
        help="the compacted topic the table mirrors; one table per topic")))


@dataclass(frozen=True)
class StoreConfig:
    block_cache_mb: int = field(default=64, metadata=_k(Integer(
        1, 1 << 20, help="MiB of RocksDB block cache per table store, index and filter blocks included")))
    write_buffer_mb: int = field(default=32, metadata=_k(Integer(
        1, 1 << 16, help="MiB per memtable of a table store's values")))
    max_write_buffers: int = field(default=3, metadata=_k(Integer(
        2, 64, help="memtables of that size a table store may hold before writes wait for a flush")))


@dataclass(frozen=True)
class SnapshotConfig:
    interval_ms: int = field(default=1000, metadata=_k(Integer(
        10, 86_400_000, help="tables whose offsets moved are snapshotted this often (hard links: cheap)")))
    retain: int = field(default=3, metadata=_k(Integer(
        1, 1000, help="newest snapshots kept per table, besides the current one and those a reader's lease pins")))
    serve_stale: bool = field(default=True, metadata=_k(Boolean(
        help="while a wiped table rebuilds, serve its last snapshot, marked stale (also to get and dump); "
             "false: refuse, exit 3, until it is RUNNING again")))
    build_timeout_ms: int = field(default=120_000, metadata=_k(Integer(
        100, 86_400_000, help="an exact-offset snapshot build taking longer is abandoned and answered 'timeout'")))


@dataclass(frozen=True)
class HttpConfig:
    enabled: bool = field(default=True, metadata=_k(Boolean(
        help="serve GET /metrics, /healthz, /readyz and /status")))
    host: str = field(default="127.0.0.1", metadata=_k(Text(
        help="address to bind; beyond loopback (127.0.0.0/8, ::1, localhost) only with allow_non_loopback")))
    port: int = field(default=9464, metadata=_k(Integer(
        0, 65535, help="0 picks a free port, published in status.json; one that cannot be bound is a config error")))
    allow_non_loopback: bool = field(default=False, metadata=_k(Boolean(
        help="allow a non-loopback host: the endpoint has no authentication, and the daemon warns at every start")))


@dataclass(frozen=True)
class HooksConfig:
    on_state_change: tuple[str, ...] = field(default=(), metadata=_k(Argv(
        help="run on every state change of the daemon or a table, with GLOBALD_STATE, GLOBALD_PREVIOUS_STATE, "
             "GLOBALD_TABLE, GLOBALD_REASON and GLOBALD_PID")))
    webhook_url: str | None = field(default=None, metadata=_k(Url(
        help="gets the same events as JSON POSTs, no proxy, no redirect followed")))
    timeout_ms: int = field(default=5000, metadata=_k(Integer(
        1, 600_000, help="bound of each command or POST; a command that overruns is killed")))


@dataclass(frozen=True)
class Config:
    state_dir: Path = field(metadata=_k(Directory(
        help="where the stores, snapshots, status.json and the lock live; a relative path is taken from the "
             "config file's directory")))
    kafka: dict[str, Any] = field(metadata=_k(Properties(
        help="librdkafka properties for every client; bootstrap.servers is required; globald sets "
             + ", ".join(f"{k} = {json.dumps(v)}" for k, v in MANAGED_KAFKA_PROPERTIES.items())
             + " and refuses other values for them")))
    tables: tuple[TableConfig, ...] = field(metadata=_k(Tables(help="the topics to mirror, at least one")))
    commit_interval_ms: int = field(default=1000, metadata=_k(Integer(
        10, 3_600_000, help="fsync, .checkpoint files and status.json, at most this often")))
    consume_batch_size: int = field(default=10_000, metadata=_k(Integer(
        1, 1_000_000, help="records per consume() call: one RocksDB WriteBatch per table per call")))
    poll_timeout_ms: int = field(default=200, metadata=_k(Integer(
        1, 60_000, help="longest wait of one poll while the topics are idle")))
    metadata_refresh_ms: int = field(default=30_000, metadata=_k(Integer(
        100, 86_400_000, help="how soon partitions added to a topic are picked up")))
    log_level: str = field(default="INFO", metadata=_k(Choice(
        ("DEBUG", "INFO", "WARNING", "ERROR"), fold_case=True, help="least severe level logged")))
    log_format: str = field(default="plain", metadata=_k(Choice(
        ("plain", "json"), help="log lines on stderr: text, or one JSON object each (ts, level, logger, msg, exc)")))
    store: StoreConfig = field(default_factory=StoreConfig, metadata=_k(Section(
        StoreConfig, help="RocksDB tuning, for each table's store")))
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig, metadata=_k(Section(
        SnapshotConfig, help="the snapshots readers and Spark are served")))
    http: HttpConfig = field(default_factory=HttpConfig, metadata=_k(Section(
        HttpConfig, after=_refuse_unauthenticated_exposure, help="the read-only HTTP endpoint")))
    hooks: HooksConfig = field(default_factory=HooksConfig, metadata=_k(Section(
        HooksConfig, help="state-change hooks, run off the loop, in order; a failure is logged and counted")))
    source: Path | None = None  # the file this config was loaded from, set by parse()

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise UnknownTableError(f"no table named {name!r} in the config "
                                f"(known: {', '.join(t.name for t in self.tables)})")

    def consumer_settings(self) -> dict[str, Any]:
        """The librdkafka properties of the daemon's consumer: the user's, then what globald needs."""
        props: dict[str, Any] = {"group.id": "globald", "client.id": "globald", **CONSUMER_DEFAULTS}
        props.update(self.kafka)
        props.update(MANAGED_KAFKA_PROPERTIES)
        return props


def parse(raw: dict[str, Any], source: Path | None = None) -> Config:
    """Validate a parsed TOML document. Raises ConfigError naming the first bad key."""
    config = _build(Config, raw, "")
    state_dir = config.state_dir
    if source is not None and not state_dir.is_absolute():
        state_dir = source.parent / state_dir
    return replace(config, state_dir=state_dir, source=source)


@dataclass(frozen=True)
class Key:
    """One config key, as the reference lists it."""

    path: str  # as errors name it, "[]" standing for any entry of an array: "tables[].name"
    spec: Spec
    default: Any  # dataclasses.MISSING for a key the file must set

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def default_value(self) -> Any:
        """The default as JSON (and TOML) writes it; None for a required key, an unset one and a section."""
        if isinstance(self.default, tuple):
            return list(self.default)
        return self.default if isinstance(self.default, bool | int | str) else None

    def default_text(self) -> str:
        if self.required:
            return "required"
        if self.default is None:
            return "unset"
        value = self.default_value()
        return "" if value is None else json.dumps(value)  # JSON's scalars and lists are TOML's too

    def as_json(self) -> dict[str, Any]:
        return {"key": self.path, "type": self.spec.kind(), "required": self.required,
                "default": self.default_value(), "help": self.spec.help}


def declared_keys() -> list[Key]:
    """Every declared key, sections before their own keys, in the order of the dataclasses' fields."""
    found: list[Key] = []

    def walk(cls: type[DataclassInstance], prefix: str) -> None:
        for f in fields(cls):
            spec = f.metadata.get(_KEY)
            if spec is None:
                continue
            default = (f.default if f.default is not MISSING else
                       f.default_factory() if f.default_factory is not MISSING else MISSING)
            found.append(Key(prefix + f.name, spec, default))
            if isinstance(spec, Section):
                walk(spec.of, f"{prefix}{f.name}.")
            elif isinstance(spec, Tables):
                walk(TableConfig, f"{prefix}{f.name}[].")

    walk(Config, "")
    return found


def reference() -> str:
    """Every key with its type, bounds, default and help: what ``globald check-config --keys`` prints."""
    lines = []
    for k in declared_keys():
        default = k.default_text()
        lines.append(f"{k.path}: {k.spec.kind()}" + (f", {default}" if k.required else
                                                       f", default {default}" if default else ""))
        lines.append(f"    {k.spec.help}")
    return "\n".join(lines)


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
