"""Topic administration for the demo, tests and benchmarks: create, delete, advance the log start, produce.

``TopicAdmin.for_broker`` picks the modern Admin API where the broker has it, or the Java tools bundled with
the embedded 0.9 broker (through ZooKeeper) where it does not; ``TansuAdmin`` is the modern path for the embedded
Tansu, whose offset answers are wrong. Callers never branch on the broker version.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from globald.embedded.broker import kafka_home
from globald.kafka.client_log import kafka_log

Record = tuple[bytes | None, bytes | None]  # (key, value); a None value is a tombstone
Headers = list[tuple[str, bytes]]
# (key, value, CreateTime in ms or None for the producer's clock, headers or None), for brokers that keep them
TimedRecord = tuple[bytes | None, bytes | None, int | None, Headers | None]

# What a broker answers while it is (re)starting or moving leadership; worth asking again.
# UNKNOWN: a 0.9 broker answers an offsets request that races the deletion of a segment (retention) with it.
_SETTLING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
             KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError.UNKNOWN}


class TopicAdmin:
    """Common operations; subclasses provide create/delete/advance."""

    def __init__(self, client_settings: dict[str, Any]) -> None:
        # librdkafka's lines go through globald's filters (harmless 0.9 lines at DEBUG, repeats counted), not
        # straight to stderr, unless the caller brings its own logger.
        self.settings = {"logger": kafka_log, **client_settings}
        self._producer: Producer | None = None

    @staticmethod
    def for_broker(client_settings: dict[str, Any], zookeeper: str | None = None) -> TopicAdmin:
        if zookeeper:
            return JavaToolsAdmin(client_settings, zookeeper)
        return ModernAdmin(client_settings)

    # -- data ---------------------------------------------------------------------------------------------

    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer({**self.settings, "log_level": 3, "linger.ms": 20, "batch.num.messages": 10000,
                                       "queue.buffering.max.messages": 500000})
        return self._producer

    def produce(self, topic: str, records: Iterable[Record | TimedRecord], partition: int | None = None,
                timestamp: int | None = None, partition_of: Callable[[bytes | None], int] | None = None) -> int:
        """Produce and flush; returns how many records were sent. Raises if any delivery failed.

        A ``TimedRecord`` carries its own timestamp and headers; ``timestamp`` applies to the others.
        ``partition_of`` picks each record's partition from its key (one flush for them all)."""
        p = self.producer()
        failures: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        n = 0
        for record in records:
            kwargs: dict[str, Any] = {"key": record[0], "value": record[1], "on_delivery": on_delivery}
            if partition_of is not None:
                kwargs["partition"] = partition_of(record[0])
            elif partition is not None:
                kwargs["partition"] = partition
            ts, headers = (record[2], record[3]) if len(record) == 4 else (timestamp, None)
            if ts is not None:
                kwargs["timestamp"] = ts
            if headers:
                kwargs["headers"] = headers
            while True:
                try:
                    p.produce(topic, **kwargs)
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
        remaining = p.flush(60)
        if remaining or failures:
            raise RuntimeError(f"produce to {topic}: {remaining} undelivered, failures: {failures[:3]}")
        return n

    def watermarks(self, topic: str, timeout: float = 60.0) -> dict[int, tuple[int, int]]:
        """(log start, end) per partition. Retries while a restarted broker takes its partitions' leadership."""
        deadline = time.monotonic() + timeout
        c = Consumer({**self.settings, "group.id": "globald-admin", "log_level": 3})
        try:
            while True:
                try:
                    # The whole cluster's list: a 0.9 broker that auto-creates topics would recreate a deleted
                    # topic named in a metadata request, and tests check that nothing brings one back.
                    md = c.list_topics(timeout=10)
                    parts = sorted(md.topics[topic].partitions) if topic in md.topics else []
                    return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                            for p in parts}
                except KafkaException as e:
                    if time.monotonic() >= deadline or e.args[0].code() not in _SETTLING:
                        raise
                    time.sleep(0.5)
        finally:
            c.close()

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: hi for p, (_, hi) in self.watermarks(topic).items()}

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
                for m in c.consume(10000, 0.5):
                    err = m.error()
                    p, offset = m.partition(), m.offset()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF and p is not None \
                            and offset is not None:
                        ends[p] = offset
        finally:
            c.close()
        return ends

    def wait_for_topic(self, topic: str, partitions: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if len(self.watermarks(topic)) == partitions:
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"topic {topic} did not get {partitions} partitions")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    # -- topology (per broker kind) -----------------------------------------------------------------------

    def create(self, topic: str, partitions: int = 3, compact: bool = True,
               config: dict[str, str] | None = None) -> None:
        """Create ``topic``; ``config`` adds topic configs (message.timestamp.type, ...)."""
        raise NotImplementedError

    def delete(self, topic: str, wait: bool = True) -> None:
        """Delete ``topic``; with ``wait``, return once it is gone. A client that recreates it at once (librdkafka
        fetching it, on a broker that auto-creates topics) would make that wait time out."""
        raise NotImplementedError

    def add_partitions(self, topic: str, total: int) -> None:
        raise NotImplementedError

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        """Drop every record currently in ``topic`` (log start moves past the current end), as retention would."""
        raise NotImplementedError


class ModernAdmin(TopicAdmin):
    """Brokers with the CreateTopics/DeleteTopics/DeleteRecords APIs (Kafka ≥ 1.1)."""

    def __init__(self, client_settings: dict[str, Any]) -> None:
        super().__init__(client_settings)
        self._admin_client: Any = None

    def _admin(self) -> Any:
        """One AdminClient for this admin's life: a client destroyed while its futures are pending fails them
        (_DESTROY), so a temporary one per call would lose every answer."""
        if self._admin_client is None:
            from confluent_kafka.admin import AdminClient

            self._admin_client = AdminClient({**self.settings, "log_level": 3})
        return self._admin_client

    def create(self, topic: str, partitions: int = 3, compact: bool = True,
               config: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import NewTopic

        configs = {**(config or {}), "cleanup.policy": "compact" if compact else "delete"}
        fs = self._admin().create_topics([NewTopic(topic, partitions, 1, config=configs)])
        fs[topic].result(30)
        self.wait_for_topic(topic, partitions)

    def delete(self, topic: str, wait: bool = True) -> None:
        self.close()  # a producer that knows the topic would name it in its metadata refreshes
        self._admin().delete_topics([topic])[topic].result(30)
        deadline = time.monotonic() + (60 if wait else 0)
        while time.monotonic() < deadline and topic in self._admin().list_topics(timeout=10).topics:
            time.sleep(0.2)

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

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self.read_ends(topic)

    def add_partitions(self, topic: str, total: int) -> None:
        raise NotImplementedError("Tansu lacks CreatePartitions (KIP-195): a 0.9 or external-broker test")

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        raise NotImplementedError("DeleteRecords crashes Tansu, which has no retention either: a 0.9 test")


class JavaToolsAdmin(TopicAdmin):
    """Brokers without the modern Admin APIs (the embedded 0.9): Kafka's TopicCommand through ZooKeeper."""

    def __init__(self, client_settings: dict[str, Any], zookeeper: str) -> None:
        super().__init__(client_settings)
        self.zookeeper = zookeeper

    def _topic_command(self, *args: str) -> str:
        home = kafka_home()
        cmd = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp", f"{home}/libs/*",
               f"-Dlog4j.configuration=file:{home}/config/tools-log4j.properties",
               "kafka.admin.TopicCommand", "--zookeeper", self.zookeeper, *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0 or "Error" in out.stdout:
            raise RuntimeError(f"TopicCommand {' '.join(args)} failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        return out.stdout

    def create(self, topic: str, partitions: int = 3, compact: bool = True,
               config: dict[str, str] | None = None) -> None:
        args = ["--create", "--topic", topic, "--partitions", str(partitions), "--replication-factor", "1"]
        configs = {**(config or {}), "cleanup.policy": "compact" if compact else "delete"}
        for k, v in configs.items():
            args += ["--config", f"{k}={v}"]
        deadline = time.monotonic() + 60
        while True:
            try:
                self._topic_command(*args)
                break
            except RuntimeError as e:
                # A broker that was just restarted takes a moment to register in ZooKeeper again.
                if "available brokers: 0" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(1)
        self.wait_for_topic(topic, partitions)

    def delete(self, topic: str, wait: bool = True) -> None:
        # A producer that knows the topic names it in its metadata refreshes, which recreate it on a broker with
        # auto.create.topics.enable; the wait below asks ZooKeeper, not the broker, for the same reason.
        self.close()
        self._topic_command("--delete", "--topic", topic)
        if not wait:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if topic not in self._topic_command("--list").split():
                return
            time.sleep(0.5)
        raise TimeoutError(f"topic {topic} was not deleted")

    def add_partitions(self, topic: str, total: int) -> None:
        self._topic_command("--alter", "--topic", topic, "--partitions", str(total))
        self.wait_for_topic(topic, total)
        self.close()  # the producer would not learn of the new partitions before its next metadata refresh

    def advance_log_start(self, topic: str, timeout: float = 90.0) -> dict[int, int]:
        """Switch the topic to time retention briefly so the broker deletes every closed segment."""
        before = self.end_offsets(topic)
        self._topic_command("--alter", "--topic", topic, "--config", "cleanup.policy=delete",
                            "--config", "retention.ms=1", "--config", "segment.ms=100")
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                # A segment rolls only when a record arrives after segment.ms; retention then drops the old one.
                time.sleep(0.3)
                for p in before:
                    self.produce(topic, [(b"__roll__", b"x")], partition=p)
                marks = self.watermarks(topic)
                if all(marks[p][0] > before[p] for p in before):
                    return {p: marks[p][0] for p in before}
            raise TimeoutError(f"log start of {topic} did not advance past {before}")
        finally:
            self._topic_command("--alter", "--topic", topic, "--config", "cleanup.policy=compact",
                                "--delete-config", "retention.ms", "--delete-config", "segment.ms")
