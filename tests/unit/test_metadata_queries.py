"""globald's metadata queries never name a topic: a broker with auto.create.topics.enable creates any topic a
Metadata v0-v3 request names, so asking about a deleted one would bring it back (tests/reliability/test_auto_create.py
shows it on a real 0.9 broker; these pin the request shape without one)."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from globald.common.errors import ConfigError
from globald.kafka.clients import TopicUnavailableError, TransientKafkaError, partitions
from globald.settings.config import parse


class ListingConsumer:
    """Answers list_topics like librdkafka; records which topic each call named (None: the whole cluster)."""

    def __init__(self, topics: dict[str, Any] | None = None, fail: KafkaError | None = None) -> None:
        self.topics = topics or {}
        self.fail = fail
        self.named: list[str | None] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.named.append(topic)
        if self.fail is not None:
            raise KafkaException(self.fail)
        return SimpleNamespace(topics=self.topics)


def _topic(parts: int, error: KafkaError | None = None) -> Any:
    return SimpleNamespace(error=error, partitions={p: object() for p in range(parts)})


def test_partitions_come_from_a_cluster_listing() -> None:
    c = ListingConsumer({"orders": _topic(3), "other": _topic(1)})
    assert partitions(c, "orders") == [0, 1, 2]  # type: ignore[arg-type]
    assert c.named == [None]


def test_a_missing_topic_is_unavailable_without_being_named() -> None:
    c = ListingConsumer({"other": _topic(1)})
    with pytest.raises(TopicUnavailableError, match="orders unavailable: not in the cluster's topic list"):
        partitions(c, "orders")  # type: ignore[arg-type]
    assert c.named == [None]


def test_a_listed_topic_with_an_error_or_no_partitions_is_unavailable() -> None:
    leaderless = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    with pytest.raises(TopicUnavailableError, match="Leader not available"):
        partitions(ListingConsumer({"orders": _topic(0, leaderless)}), "orders")  # type: ignore[arg-type]
    with pytest.raises(TopicUnavailableError, match="no partitions"):
        partitions(ListingConsumer({"orders": _topic(0)}), "orders")  # type: ignore[arg-type]


def test_an_unanswered_listing_is_transient_not_a_missing_topic() -> None:
    c = ListingConsumer(fail=KafkaError(KafkaError._TRANSPORT))
    with pytest.raises(TransientKafkaError) as e:
        partitions(c, "orders")  # type: ignore[arg-type]
    assert not isinstance(e.value, TopicUnavailableError)


def _raw(kafka: dict[str, Any]) -> dict[str, Any]:
    return {"state_dir": "/tmp/unused", "kafka": {"bootstrap.servers": "127.0.0.1:9092", **kafka},
            "tables": [{"name": "t", "topic": "orders"}]}


def test_the_consumer_never_asks_brokers_to_create_topics() -> None:
    assert parse(_raw({})).consumer_settings()["allow.auto.create.topics"] is False
    with pytest.raises(ConfigError, match=re.escape("kafka.allow.auto.create.topics")):
        parse(_raw({"allow.auto.create.topics": True}))


def test_the_consumer_reads_committed_records_only() -> None:
    """Records of aborted or open transactions never reach a table, and a restore ends at the last stable offset."""
    assert parse(_raw({})).consumer_settings()["isolation.level"] == "read_committed"
    assert parse(_raw({"isolation.level": "read_committed"})).kafka["isolation.level"] == "read_committed"
    with pytest.raises(ConfigError, match=re.escape("kafka.isolation.level")):
        parse(_raw({"isolation.level": "read_uncommitted"}))


def test_known_harmless_librdkafka_lines_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """The 0.9 compatibility settings make librdkafka warn at every start and every metadata request."""
    from globald.kafka.clients import kafka_log

    with caplog.at_level(logging.INFO, logger="globald.librdkafka"):
        kafka_log.warning("AUTOCREATE [globald#consumer-2] 127.0.0.1:1/0: allow.auto.create.topics=false not "
                          "supported by broker: requires broker version >= 0.11.0.0")
        kafka_log.warning("CONFWARN [globald#consumer-2] Configuration property api.version.request is deprecated")
        kafka_log.warning("FAIL [globald#consumer-2] 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed")
    assert [r.getMessage()[:4] for r in caplog.records] == ["FAIL"]
