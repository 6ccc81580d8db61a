"""Topic administration for ``globald demo`` and ``globald dev``: create, delete and produce on the embedded brokers.

``JavaToolsAdmin`` drives the Java tools bundled with the 0.9 broker (through ZooKeeper), which has no modern Admin
API; ``ModernAdmin`` speaks the Admin API (``globald dev --broker tansu``). What only tests and benchmarks do to a
topic (other brokers' admins, added partitions, an advanced log start) is in ``tests/support/admin.py``, outside
the wheel.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

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
    """Common operations; subclasses provide create and delete."""

    # Seconds between two looks at a topic being created, and deleted: each look costs a client (and, for a
    # deletion on the 0.9 broker, a JVM), so globald demo looks seldom. Subclasses with cheaper looks look sooner.
    topic_poll_interval = 0.2
    delete_poll_interval = 0.5

    def __init__(self, client_settings: dict[str, Any]) -> None:
        # librdkafka's lines go through globald's filters (harmless 0.9 lines at DEBUG, repeats counted), not
        # straight to stderr, unless the caller brings its own logger.
        self.settings = {"logger": kafka_log, **client_settings}
        self._producer: Producer | None = None

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

    def wait_for_topic(self, topic: str, partitions: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if len(self.watermarks(topic)) == partitions:
                    return
            except Exception:
                pass
            time.sleep(self.topic_poll_interval)
        raise TimeoutError(f"topic {topic} did not get {partitions} partitions")

    def close(self) -> None:
        """Release what this admin holds; it stays usable (a later call opens what it needs again)."""
        self._drop_producer()

    def _drop_producer(self) -> None:
        """Flush and forget the producer, which would otherwise keep naming its topics in metadata requests."""
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


class JavaToolsAdmin(TopicAdmin):
    """Brokers without the modern Admin APIs (the embedded 0.9): Kafka's TopicCommand through ZooKeeper."""

    def __init__(self, client_settings: dict[str, Any], zookeeper: str) -> None:
        super().__init__(client_settings)
        self.zookeeper = zookeeper

    def _topic_command(self, *args: str) -> str:
        status, stdout, stderr = self._run_topic_tool(["--zookeeper", self.zookeeper, *args])
        if status != 0 or "Error" in stdout:
            raise RuntimeError(f"TopicCommand {' '.join(args)} failed: {stdout[-500:]} {stderr[-500:]}")
        return stdout

    def _run_topic_tool(self, args: list[str]) -> tuple[int, str, str]:
        """kafka.admin.TopicCommand ``args`` in a JVM of its own: (exit status, stdout, stderr). The tests run
        them in one long-lived JVM instead (tests/support/topic_server.py)."""
        home = kafka_home()
        cmd = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp", f"{home}/libs/*",
               f"-Dlog4j.configuration=file:{home}/config/tools-log4j.properties", "kafka.admin.TopicCommand", *args]
        # A session of its own, as every child of `globald demo`/`dev` (embedded/interrupts.py): a Ctrl-C that lands
        # while Popen is still starting it (before subprocess.run can kill it) left it running after the demo's
        # clean-up; in a group of its own, that clean-up's stop_groups(child_groups()) finds and stops it.
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True)
        return out.returncode, out.stdout, out.stderr

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
        self._drop_producer()
        self._topic_command("--delete", "--topic", topic)
        if not wait:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if topic not in self._topic_command("--list").split():
                return
            time.sleep(self.delete_poll_interval)
        raise TimeoutError(f"topic {topic} was not deleted")


class ModernAdmin(TopicAdmin):
    """Brokers with the CreateTopics/DeleteTopics APIs (Kafka ≥ 1.1): ``globald dev --broker tansu``'s."""

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
