"""The rules globald applies to librdkafka properties, in one place.

Guarantees: ``consumer_settings`` always gives the properties globald's correctness depends on
(``MANAGED_KAFKA_PROPERTIES``) globald's value, whatever the user set; a property's value is printed only if
``printable`` allows it (an allowlist: anything else, a credential-bearing property nobody listed included, is shown
as ``***`` and its value is among ``secret_values``, which the log masker hides); ``check_kafka_properties`` lets
librdkafka reject a bad property without connecting anywhere, masks its message like a log line, and names the real
property an unknown one most likely misspells (``globald.settings.librdkafka_names``). Imports nothing of
``globald.settings.config``, which imports this module; it sits in the settings so that the Kafka clients above read
them without a cycle.
"""
from __future__ import annotations

from typing import Any, Protocol

from globald.common.errors import ConfigError
from globald.common.logs import MASK, Redactor
from globald.settings.librdkafka_names import nearest_property

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
    # A table is the fold of committed records only: records of aborted or still open transactions must never be
    # stored. read_committed is also librdkafka's default; with it the end a restore aims at (ListOffsets, which
    # carries the consumer's isolation level) and the end of partition the fetcher reports are both the last stable
    # offset, so a restore completes where committed data ends. Brokers older than 0.11 ignore it.
    "isolation.level": "read_committed",
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


class _Hooks(Protocol):
    @property
    def webhook_url(self) -> str | None: ...


class Configured(Protocol):
    """What these rules read of a ``globald.settings.config.Config``; a protocol, since that module imports this one."""

    @property
    def kafka(self) -> dict[str, Any]: ...

    @property
    def hooks(self) -> _Hooks: ...

    @property
    def registry(self) -> dict[str, Any] | None: ...


def consumer_settings(kafka: dict[str, Any]) -> dict[str, Any]:
    """The librdkafka properties of the daemon's consumer: the user's ``kafka``, then what globald needs."""
    props: dict[str, Any] = {"group.id": "globald", "client.id": "globald", **CONSUMER_DEFAULTS}
    props.update(kafka)
    props.update(MANAGED_KAFKA_PROPERTIES)
    return props


_CHECK_WAIT_S = 10.0


def secret_values(config: Configured) -> list[str]:
    """Every configured value a log line must never show: the values of the [kafka] properties that are not
    ``printable``, the webhook URL's password and the [registry] secrets (``globald.settings.registry``). The log
    masker decides which are long enough to look for."""
    from urllib.parse import urlsplit

    from globald.settings import registry

    values = [str(v) for k, v in config.kafka.items() if not printable(k)]
    if config.hooks.webhook_url:
        values.append(urlsplit(config.hooks.webhook_url).password or "")
    return values + registry.secret_values(config.registry)


def check_kafka_properties(config: Configured) -> None:
    """Let librdkafka itself reject unknown or malformed properties, without connecting anywhere.

    The client is made and closed on a thread of its own, waited for ``_CHECK_WAIT_S`` at most: a client's close
    joins threads that may sit in a wait timed on the wall clock (see the architecture page), and a clock stepped
    back at that moment must not hold the daemon's start. A check that does not finish in time decides nothing (the
    consumer's own creation reports a bad property then)."""
    import threading

    from confluent_kafka import Consumer, KafkaException

    failure: list[BaseException] = []

    def check() -> None:
        try:
            # A consumer's constructor validates every property; a bootstrap address never used costs nothing.
            settings = {**consumer_settings(config.kafka), "bootstrap.servers": "127.0.0.1:9",
                        "logger": _null_logger()}
            Consumer(settings).close()
        except (KafkaException, ValueError, TypeError) as e:
            failure.append(e)

    worker = threading.Thread(target=check, name="globald-kafka-properties", daemon=True)
    worker.start()
    worker.join(_CHECK_WAIT_S)
    if failure:
        e = failure[0]
        text = str(e.args[0].str() if e.args and hasattr(e.args[0], "str") else e)
        key = _property_in(text, config.kafka) or "kafka"
        # librdkafka quotes some rejected values; the CLI prints this line before any log masking is set up.
        text = Redactor(secret_values(config))(text)
        raise ConfigError(key, text + _suggestion(text, key)) from None


def _suggestion(text: str, key: str) -> str:
    """' (did you mean "x"?)' after librdkafka's "No such configuration property" about ``key``, naming the real
    property it most likely misspells; empty otherwise."""
    if not text.startswith("No such configuration property") or not key.startswith("kafka."):
        return ""
    near = nearest_property(key.removeprefix("kafka."))
    return f' (did you mean "{near}"?)' if near else ""


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
