"""The names of librdkafka's configuration properties, to answer a misspelt one with the nearest real one.

librdkafka itself decides which properties exist (``check_kafka_properties`` lets it reject an unknown one); this
list only feeds the "did you mean" of that rejection, so a name missing here costs a suggestion, never a refusal.

Where the list comes from: the first column of librdkafka's CONFIGURATION.md (master at commit 0093671a, the 2.1x
line: global then topic properties), without the properties set through a dedicated C API rather than by name
(``*_cb``, ``opaque``, ``default_topic_conf``, ``interceptors``, ``ssl_key`` and the like), plus the properties the
installed librdkafka 2.16.0 reports (``rd_kafka_conf_dump``) that the page leaves out (``_INSTALLED_ONLY``).
tests/unit/test_config_hints.py checks every name against the installed librdkafka, and that the list covers every
property it reports: a librdkafka upgrade that adds or drops one fails there, and this list is updated from its
CONFIGURATION.md.
"""
from __future__ import annotations

import difflib

_GLOBAL = (
    "builtin.features", "client.id", "metadata.broker.list", "bootstrap.servers", "message.max.bytes",
    "message.copy.max.bytes", "receive.message.max.bytes", "max.in.flight.requests.per.connection", "max.in.flight",
    "metadata.recovery.strategy", "metadata.recovery.rebootstrap.trigger.ms", "topic.metadata.refresh.interval.ms",
    "metadata.max.age.ms", "topic.metadata.refresh.fast.interval.ms", "topic.metadata.refresh.fast.cnt",
    "topic.metadata.refresh.sparse", "topic.metadata.propagation.max.ms", "topic.blacklist", "debug",
    "socket.timeout.ms", "socket.blocking.max.ms", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
    "socket.keepalive.enable", "socket.nagle.disable", "socket.max.fails", "broker.address.ttl",
    "broker.address.family", "socket.connection.setup.timeout.ms", "connections.max.idle.ms",
    "reconnect.backoff.jitter.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms", "statistics.interval.ms",
    "enabled_events", "log_level", "log.queue", "log.thread.name", "enable.random.seed", "log.connection.close",
    "internal.termination.signal", "api.version.request", "api.version.request.timeout.ms", "api.version.fallback.ms",
    "broker.version.fallback", "allow.auto.create.topics", "security.protocol", "ssl.cipher.suites",
    "ssl.curves.list", "ssl.sigalgs.list", "ssl.key.location", "ssl.key.password", "ssl.key.pem",
    "ssl.certificate.location", "ssl.certificate.pem", "ssl.ca.location", "https.ca.location", "https.ca.pem",
    "ssl.ca.pem", "ssl.ca.certificate.stores", "ssl.crl.location", "ssl.keystore.location", "ssl.keystore.password",
    "ssl.providers", "ssl.engine.location", "ssl.engine.id", "enable.ssl.certificate.verification",
    "ssl.endpoint.identification.algorithm", "sasl.mechanisms", "sasl.mechanism", "sasl.kerberos.service.name",
    "sasl.kerberos.principal", "sasl.kerberos.kinit.cmd", "sasl.kerberos.keytab",
    "sasl.kerberos.min.time.before.relogin", "sasl.username", "sasl.password", "sasl.oauthbearer.config",
    "enable.sasl.oauthbearer.unsecure.jwt", "sasl.oauthbearer.method", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.credentials.client.id", "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.grant.type", "sasl.oauthbearer.assertion.algorithm",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.claim.aud", "sasl.oauthbearer.assertion.claim.exp.seconds",
    "sasl.oauthbearer.assertion.claim.iss", "sasl.oauthbearer.assertion.claim.jti.include",
    "sasl.oauthbearer.assertion.claim.nbf.seconds", "sasl.oauthbearer.assertion.claim.sub",
    "sasl.oauthbearer.assertion.jwt.template.file", "sasl.oauthbearer.metadata.authentication.type",
    "plugin.library.paths", "group.id", "group.instance.id", "partition.assignment.strategy", "session.timeout.ms",
    "heartbeat.interval.ms", "group.protocol.type", "group.protocol", "group.remote.assignor",
    "coordinator.query.interval.ms", "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms",
    "enable.auto.offset.store", "queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms",
    "fetch.queue.backoff.ms", "fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes",
    "fetch.min.bytes", "fetch.error.backoff.ms", "offset.store.method", "isolation.level", "enable.partition.eof",
    "check.crcs", "client.rack", "transactional.id", "transaction.timeout.ms", "enable.idempotence",
    "enable.gapless.guarantee", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "queue.buffering.max.ms", "linger.ms", "message.send.max.retries", "retries", "retry.backoff.ms",
    "retry.backoff.max.ms", "queue.buffering.backpressure.threshold", "compression.codec", "compression.type",
    "batch.num.messages", "batch.size", "delivery.report.only.error", "sticky.partitioning.linger.ms",
    "client.dns.lookup", "enable.metrics.push",
)
# Topic properties, which a client's configuration also takes (they become its default topic configuration).
_TOPIC = (
    "request.required.acks", "acks", "request.timeout.ms", "message.timeout.ms", "delivery.timeout.ms",
    "queuing.strategy", "produce.offset.report", "partitioner", "compression.level", "auto.commit.enable",
    "auto.offset.reset", "offset.store.path", "offset.store.sync.interval.ms", "consume.callback.max.messages",
)
_INSTALLED_ONLY = (
    "client.software.name", "metadata.request.timeout.ms", "enable.sparse.connections",
    "sasl.oauthbearer.sub.claim.name", "test.mock.num.brokers", "test.mock.broker.rtt", "max.poll.records",
    "share.acknowledgement.mode",
)

PROPERTY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(_GLOBAL + _TOPIC + _INSTALLED_ONLY))


def nearest_property(name: str) -> str | None:
    """The librdkafka property ``name`` most likely misspells (``fetch.wait.max.msec``: ``fetch.wait.max.ms``), or
    None when none is close enough to be worth suggesting."""
    near = difflib.get_close_matches(name, PROPERTY_NAMES, n=1, cutoff=0.75)
    return near[0] if near else None
