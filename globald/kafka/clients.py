"""The daemon's single consumer and the metadata queries the loop makes through it.

Queries raise ``TransientKafkaError`` for anything that may heal by itself (broker down, leader moving, topic
missing for now); the loop retries those with backoff and never ends the process because of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from globald.kafka.client_log import kafka_log
from globald.settings.config import Config
from globald.settings.kafka_properties import redact

log = logging.getLogger(__name__)

# Who reads librdkafka's statistics: operations registers its memory accounting here (on_statistics), since the
# Kafka layer sits below operations and imports nothing of theirs.
_statistics_sink: Callable[[str], None] | None = None


def on_statistics(sink: Callable[[str], None] | None) -> None:
    """Sends the statistics of every consumer made from now on to ``sink`` (librdkafka's stats_cb); None: nowhere."""
    global _statistics_sink
    _statistics_sink = sink


class TransientKafkaError(Exception):
    """Kafka could not answer now (broker unreachable, topic missing, leader moving). Retried with backoff."""


class TopicUnavailableError(TransientKafkaError):
    """The brokers answered, but the topic is missing or has no partitions (deleted, not yet created). Retried."""


def make_consumer(config: Config, on_error: Callable[[KafkaError], None] | None = None) -> Consumer:
    """The consumer; ``on_error`` receives librdkafka's client-wide errors (all brokers down, ...) during polls."""
    settings = config.consumer_settings()
    log.info("consumer settings: %s", redact(settings))
    extra: dict[str, Any] = {"error_cb": on_error} if on_error is not None else {}
    if int(settings.get("statistics.interval.ms") or 0) > 0 and _statistics_sink is not None:
        extra["stats_cb"] = _statistics_sink  # the operator asked: its buffers go in the status's memory
    return Consumer({**settings, "logger": kafka_log, **extra})


def partitions(consumer: Consumer, topic: str, timeout: float = 5.0) -> list[int]:
    """The topic's partitions, read from a listing of the whole cluster.

    The request never names the topic: a broker answering Metadata v0-v3 (Kafka < 0.11, or any broker spoken to
    with api.version.request=false) creates every topic a metadata request names when its
    auto.create.topics.enable is on, so asking about a deleted topic would bring it back empty, and the table
    would then be wiped to match. allow.auto.create.topics=false only reaches brokers speaking Metadata v4+.
    """
    try:
        md = consumer.list_topics(timeout=timeout)
    except KafkaException as e:
        raise TransientKafkaError(f"metadata for {topic}: {e}") from None
    tm = md.topics.get(topic)
    if tm is None:
        # A listing leaves out the topics this client may not describe, too: say so rather than "deleted".
        raise TopicUnavailableError(f"topic {topic} unavailable: not in the cluster's topic list "
                                    "(deleted, not created yet, or not authorized)")
    if tm.error is not None or not tm.partitions:
        raise TopicUnavailableError(f"topic {topic} unavailable: {tm.error.str() if tm.error else 'no partitions'}")
    return sorted(tm.partitions)


def watermarks(consumer: Consumer, topic: str, partition: int, timeout: float = 5.0) -> tuple[int, int]:
    """(log start, end) of a partition, asked of the broker (never cached).

    Only for partitions ``partitions()`` has just listed: librdkafka finds the leader in the metadata that listing
    cached, whereas for a topic it has not seen it would ask for the topic by name (see ``partitions``)."""
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
    except KafkaException as e:
        raise TransientKafkaError(f"watermarks of {topic}[{partition}]: {e}") from None
    if low < 0 or high < 0:
        raise TransientKafkaError(f"watermarks of {topic}[{partition}] unknown ({low}, {high})")
    return low, high


def log_bounds(consumer: Consumer, topic: str) -> dict[int, tuple[int, int]]:
    """(log start, end) of every partition of ``topic``, listed then asked of the broker; the consumer is closed
    after, whatever happens (a one-off check's). TransientKafkaError when the broker does not answer."""
    try:
        return {p: watermarks(consumer, topic, p) for p in partitions(consumer, topic)}
    finally:
        consumer.close()
