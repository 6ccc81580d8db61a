"""The tests' topic server (tests/support/topic_server.py): Kafka 0.9's TopicCommand in one long-lived JVM.

Against the real embedded broker; what the server answers is checked against the broker's metadata and against
TopicCommand run the way ``globald demo`` runs it (a JVM of its own), which stays the reference.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from globald.embedded.admin import JavaToolsAdmin
from tests.harness import REPO, Broker
from tests.support import topic_server
from tests.support.admin import ZooKeeperAdmin


@pytest.fixture
def admin(broker: Broker) -> Iterator[ZooKeeperAdmin]:
    """An admin of its own (its own server JVM) on the session's 0.9 broker."""
    if not isinstance(broker.admin, ZooKeeperAdmin):
        pytest.skip("the topic server is for brokers administered through ZooKeeper (the embedded 0.9)")
    a = ZooKeeperAdmin(broker.settings, broker.admin.zookeeper)
    try:
        yield a
    finally:
        a.close()


def _reference(admin: ZooKeeperAdmin, *args: str) -> tuple[int, str, str]:
    """TopicCommand in a JVM of its own, as globald demo runs it."""
    return JavaToolsAdmin._run_topic_tool(admin, ["--zookeeper", admin.zookeeper, *args])


def _broker_partitions(admin: ZooKeeperAdmin) -> dict[str, int]:
    """Every topic the broker's metadata has, with its partition count (the whole list: naming a topic in a
    metadata request could auto-create it)."""
    c = Consumer({**admin.settings, "group.id": "topic-server-test", "log_level": 3})
    try:
        return {t: len(m.partitions) for t, m in c.list_topics(timeout=10).topics.items()}
    finally:
        c.close()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited, and only waiting to be reaped by whoever adopted it


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_topic_operations_in_one_jvm_are_what_the_broker_and_topic_command_see(admin: ZooKeeperAdmin) -> None:
    t = f"ts{os.getpid()}-ops"
    admin.create(t, partitions=3, config={"segment.ms": "3600000"})
    pid = admin.topic_server.pid
    assert pid is not None, "the create did not go through the topic server"
    assert _broker_partitions(admin).get(t) == 3

    admin.add_partitions(t, 5)
    assert _broker_partitions(admin).get(t) == 5
    admin._topic_command("--alter", "--topic", t, "--config", "retention.ms=123456789")
    described = admin._topic_command("--describe", "--topic", t)
    status, reference, _ = _reference(admin, "--describe", "--topic", t)
    assert status == 0
    assert described == reference
    assert "retention.ms=123456789" in described and "segment.ms=3600000" in described
    assert "cleanup.policy=compact" in described and "PartitionCount:5" in described

    listed = admin._topic_command("--list").split()
    assert t in listed
    assert set(listed) == set(_reference(admin, "--list")[1].split())

    admin.delete(t)
    assert t not in admin._topic_command("--list").split()
    assert t not in _broker_partitions(admin)
    assert admin.topic_server.pid == pid, "the server JVM was restarted during plain operations"


def test_a_failing_command_raises_its_output_and_the_server_lives_on(admin: ZooKeeperAdmin) -> None:
    t = f"ts{os.getpid()}-fail"
    admin.create(t, partitions=1)
    pid = admin.topic_server.pid
    try:
        with pytest.raises(RuntimeError, match="already exists"):
            admin._topic_command("--create", "--topic", t, "--partitions", "1", "--replication-factor", "1")
        with pytest.raises(RuntimeError, match="does not exist"):
            admin._topic_command("--alter", "--topic", f"{t}-missing", "--config", "retention.ms=1")
        # A usage error: TopicCommand calls System.exit(1) on it, which the server turns into a reply.
        args = ["--create", "--topic", f"{t}-usage", "--replication-factor", "1"]
        with pytest.raises(RuntimeError, match="--zookeeper <urls>"):  # the end of the usage text
            admin._topic_command(*args)
        served = admin.topic_server.run(["--zookeeper", admin.zookeeper, *args])
        assert served == _reference(admin, *args)
        assert served[0] == 1 and "Missing required argument" in served[2]
        assert admin.topic_server.pid == pid
    finally:
        admin.delete(t)


def test_concurrent_commands_each_get_their_own_reply(admin: ZooKeeperAdmin) -> None:
    topics = [f"ts{os.getpid()}-conc{i}" for i in range(4)]
    errors: list[BaseException] = []

    def create_and_describe(t: str) -> None:
        try:
            admin._topic_command("--create", "--topic", t, "--partitions", "2", "--replication-factor", "1")
            for _ in range(5):
                out = admin._topic_command("--describe", "--topic", t)
                assert f"Topic:{t}\t" in out and "PartitionCount:2" in out, out
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=create_and_describe, args=(t,)) for t in topics]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    try:
        assert not errors, errors
    finally:
        for t in topics:
            admin.delete(t)


def test_a_dead_server_is_restarted_and_close_leaves_no_jvm(admin: ZooKeeperAdmin) -> None:
    admin._topic_command("--list")
    first = admin.topic_server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while admin.topic_server.pid is not None:  # reaped: a JVM's threads outlive its main one for a moment
        assert time.monotonic() < deadline
        time.sleep(0.05)
    admin._topic_command("--list")  # on a new JVM
    second = admin.topic_server.pid
    assert second is not None and second != first

    admin.close()
    assert _gone(second)
    assert admin.topic_server.last_exit == 0, "the JVM did not exit on its own when its stdin closed"


def test_a_test_process_that_dies_leaves_no_jvm(broker: Broker) -> None:
    if not isinstance(broker.admin, ZooKeeperAdmin):
        pytest.skip("the topic server is for brokers administered through ZooKeeper (the embedded 0.9)")
    script = ("import os, sys\n"
              "from tests.support.admin import ZooKeeperAdmin\n"
              f"a = ZooKeeperAdmin({{'bootstrap.servers': 'unused'}}, {broker.admin.zookeeper!r})\n"
              "a._topic_command('--list')\n"
              "print(a.topic_server.pid, flush=True)\n"
              "os._exit(0)  # no close, no atexit\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert _wait_gone(int(out.stdout.split()[-1])), "the topic server outlived its test process"


def test_commands_run_in_a_jvm_each_where_the_server_cannot_be_built(admin: ZooKeeperAdmin,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def no_javac() -> Path:
        raise topic_server.TopicServerUnavailable("no javac on PATH")

    monkeypatch.setattr(topic_server, "compiled_classes", no_javac)
    t = f"ts{os.getpid()}-fallback"
    admin.create(t, partitions=2)
    try:
        assert admin.topic_server.pid is None and not admin.topic_server.available
        assert admin.delete_poll_interval == JavaToolsAdmin.delete_poll_interval  # a JVM per look: look seldom
        assert _broker_partitions(admin).get(t) == 2
        with pytest.raises(RuntimeError, match="already exists"):
            admin._topic_command("--create", "--topic", t, "--partitions", "1", "--replication-factor", "1")
    finally:
        admin.delete(t)
