"""Topic administration for tests and benchmarks: the product's admin (``globald.embedded.admin``, what ``globald
demo`` and ``globald dev`` need on the embedded 0.9 broker) plus what only tests do to a topic.

``TopicAdmin.for_broker`` picks the modern Admin API where the broker has it, or the Java tools bundled with
the embedded 0.9 broker (through ZooKeeper) where it does not; ``TansuAdmin`` is the modern path for the embedded
Tansu, whose offset answers are wrong. Callers never branch on the broker version. Not shipped in the wheel.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from globald.embedded import admin as product
from globald.embedded.admin import JavaToolsAdmin, Record, TimedRecord
from globald.embedded.oracle import CONSUME_WAIT_S
from tests.support.topic_server import TopicServer, TopicServerUnavailable

# The embedded broker's log.retention.check.interval.ms (globald.embedded.broker), in seconds.
_RETENTION_CHECK_S = 1.0

__all__ = ["ModernAdmin", "Record", "TansuAdmin", "TimedRecord", "TopicAdmin", "ZooKeeperAdmin"]


class TopicAdmin(product.TopicAdmin):
    """The product's operations, and the topology changes tests make; subclasses provide them per broker kind."""

    @staticmethod
    def for_broker(client_settings: dict[str, Any], zookeeper: str | None = None) -> TopicAdmin:
        if zookeeper:
            return ZooKeeperAdmin(client_settings, zookeeper)
        return ModernAdmin(client_settings)

    def add_partitions(self, topic: str, total: int) -> None:
        raise NotImplementedError

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        """Drop every record currently in ``topic`` (log start moves past the current end), as retention would, and
        return the new log starts; once it returns, nothing more is dropped. Records it writes itself (the 0.9
        broker's needs some) are b"__roll__": b"x"."""
        raise NotImplementedError


class ZooKeeperAdmin(JavaToolsAdmin, TopicAdmin):
    """The embedded 0.9 broker's admin (Kafka's TopicCommand through ZooKeeper), with the tests' topology changes.

    Its topic commands run in one long-lived JVM (``TopicServer``), started on first use and stopped by ``close``,
    or each in a JVM of its own, as ``globald demo`` runs them, where that server cannot run."""

    # A look at the metadata costs a client: a topic is ready 0.1-0.5 s after the command, and the tests wait for
    # hundreds of them.
    topic_poll_interval = 0.05

    def __init__(self, client_settings: dict[str, Any], zookeeper: str) -> None:
        super().__init__(client_settings, zookeeper)
        self.topic_server = TopicServer()

    @property
    def delete_poll_interval(self) -> float:  # type: ignore[override]
        """A --list through the server costs milliseconds; in a JVM of its own, seconds of CPU."""
        return 0.05 if self.topic_server.available else JavaToolsAdmin.delete_poll_interval

    def _run_topic_tool(self, args: list[str]) -> tuple[int, str, str]:
        try:
            return self.topic_server.run(args)
        except TopicServerUnavailable:
            return super()._run_topic_tool(args)

    def close(self) -> None:
        super().close()
        self.topic_server.stop()

    def add_partitions(self, topic: str, total: int) -> None:
        self._topic_command("--alter", "--topic", topic, "--partitions", str(total))
        self.wait_for_topic(topic, total)
        self._drop_producer()  # it would not learn of the new partitions before its next metadata refresh

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        """Switch the topic to time retention briefly so the broker deletes every closed segment, then back to
        compaction, and return once the broker is seen to apply compaction again (``_settle``): with
        retention.ms=1, a 0.9 broker deletes the active segment too at its next retention check (Log.deleteOldSegments
        rolls a new one first), so records produced before it applies the change would vanish. Each partition ends
        holding one or more b"__roll__" records."""
        before = self.end_offsets(topic)
        self._topic_command("--alter", "--topic", topic, "--config", "cleanup.policy=delete",
                            "--config", "retention.ms=1", "--config", "segment.ms=100")
        deadline = time.monotonic() + timeout
        try:
            while True:
                # A segment rolls only when a record arrives after segment.ms; retention then drops the old one.
                time.sleep(0.3)
                for p in before:
                    self.produce(topic, [(b"__roll__", b"x")], partition=p)
                marks = self.watermarks(topic)
                if all(marks[p][0] > before[p] for p in before):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"log start of {topic} did not advance past {before}")
        finally:
            self._topic_command("--alter", "--topic", topic, "--config", "cleanup.policy=compact",
                                "--delete-config", "retention.ms", "--delete-config", "segment.ms")
        return self._settle(topic, list(before), deadline)

    def _settle(self, topic: str, parts: list[int], deadline: float) -> dict[int, int]:
        """Wait until a retention check has passed the topic's records by (the broker applies a config change from
        ZooKeeper at a time of its own, slower on a loaded machine): a b"__roll__" record is produced to each
        partition, and none may be gone after two of the broker's retention checks (``_RETENTION_CHECK_S``).
        Returns the log starts then."""
        while True:
            for p in parts:
                self.produce(topic, [(b"__roll__", b"x")], partition=p)
            time.sleep(2 * _RETENTION_CHECK_S + 0.2)
            marks = self.watermarks(topic)
            if all(marks[p][0] < marks[p][1] for p in parts):
                return {p: marks[p][0] for p in parts}
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: the broker still applies retention.ms=1 after the change back: {marks}")


class ModernAdmin(product.ModernAdmin, TopicAdmin):
    """Brokers with the CreateTopics/DeleteTopics/DeleteRecords APIs (Kafka ≥ 1.1): the product's create and delete,
    and the topology changes tests make."""

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        self._admin().create_partitions([NewPartitions(topic, total)])[topic].result(30)
        self.wait_for_topic(topic, total)
        self.close()  # the producer would not learn of the new partitions before its next metadata refresh

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        ends = self.end_offsets(topic)
        fs = self._admin().delete_records([TopicPartition(topic, p, o) for p, o in ends.items()])
        for f in fs.values():
            f.result(30)
        return ends


class TansuAdmin(ModernAdmin):
    """The modern Admin API against the embedded Tansu, around what that broker gets wrong.

    Its ListOffsets answer is the start of a partition's last batch + 1, not the end: ends are read from the data
    (``read_ends``). DeleteRecords crashes it and CreatePartitions is missing: both are refused here, naming why."""

    def read_ends(self, topic: str, timeout: float = 60.0) -> dict[int, int]:
        """Each partition's end as the data shows it: the offset at which a consumer reading from the log start
        reaches end of partition. With librdkafka's default isolation.level (read_committed) that is the last stable
        offset. No watermark is asked: for brokers whose ListOffsets answer is wrong."""
        parts = sorted(self.watermarks(topic))
        c = Consumer({**self.settings, "group.id": "globald-admin", "log_level": 3, "enable.partition.eof": True,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        ends: dict[int, int] = {}
        try:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
            deadline = time.monotonic() + timeout
            while len(ends) < len(parts):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}: no end of partition for {sorted(set(parts) - set(ends))}")
                for m in c.consume(10000, CONSUME_WAIT_S):
                    err = m.error()
                    p, offset = m.partition(), m.offset()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF and p is not None \
                            and offset is not None:
                        ends[p] = offset
        finally:
            c.close()
        return ends

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self.read_ends(topic)

    def add_partitions(self, topic: str, total: int) -> None:
        raise NotImplementedError("Tansu lacks CreatePartitions (KIP-195): a 0.9 or external-broker test")

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        raise NotImplementedError("DeleteRecords crashes Tansu, which has no retention either: a 0.9 test")
