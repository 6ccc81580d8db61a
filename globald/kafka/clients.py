"""The daemon's single consumer and the metadata queries the loop makes through it.

Queries raise ``TransientKafkaError`` for anything that may heal by itself (broker down, leader moving, topic
missing for now); the loop retries those with backoff and never ends the process because of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from globald.config import Config, redact

log = logging.getLogger(__name__)
kafka_log = logging.getLogger("globald.librdkafka")


# Errors that mean no broker answered at all: asking again at once would only wait as long a second time.
_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}


class TransientKafkaError(Exception):
    """Kafka could not answer now (broker unreachable, topic missing, leader moving). Retried with backoff."""


class TopicUnavailableError(TransientKafkaError):
    """The brokers answered, but the topic is missing or has no partitions (deleted, not yet created). Retried."""


def make_consumer(config: Config, on_error: Callable[[KafkaError], None] | None = None) -> Consumer:
    """The consumer; ``on_error`` receives librdkafka's client-wide errors (all brokers down, ...) during polls."""
    settings = config.consumer_settings()
    log.info("consumer settings: %s", redact(settings))
    extra: dict[str, Any] = {"error_cb": on_error} if on_error is not None else {}
    return Consumer({**settings, "logger": kafka_log, **extra})


def partitions(consumer: Consumer, topic: str, timeout: float = 5.0) -> list[int]:
    try:
        md = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as e:
        if e.args[0].code() in _UNREACHABLE:
            raise TransientKafkaError(f"metadata for {topic}: {e}") from None
        # Asked about a topic that is gone, some brokers answer in a way librdkafka reports as a local error
        # (0.9: "Bad message format"); whether the cluster itself answers tells a missing topic from an outage.
        try:
            md = consumer.list_topics(timeout=timeout)
        except KafkaException:
            raise TransientKafkaError(f"metadata for {topic}: {e}") from None
    tm = md.topics.get(topic)
    if tm is None or tm.error is not None or not tm.partitions:
        err = tm.error if tm is not None else None
        raise TopicUnavailableError(f"topic {topic} unavailable: {err.str() if err else 'no partitions'}")
    return sorted(tm.partitions)


def watermarks(consumer: Consumer, topic: str, partition: int, timeout: float = 5.0) -> tuple[int, int]:
    """(log start, end) of a partition, asked of the broker (never cached)."""
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
    except KafkaException as e:
        raise TransientKafkaError(f"watermarks of {topic}[{partition}]: {e}") from None
    if low < 0 or high < 0:
        raise TransientKafkaError(f"watermarks of {topic}[{partition}] unknown ({low}, {high})")
    return low, high


def error_text(err: KafkaError | Any) -> str:
    return err.str() if hasattr(err, "str") else str(err)
