"""What a newcomer sees of Kafka problems (issue 14): quiet logs and a status that does not mislead.

The real daemon (``python -m globald run``) against a port where no broker listens yet, then a real Kafka 0.9 broker
started on that port; and against the suite's broker with a topic that does not exist yet.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.embedded.broker import CLIENT_SETTINGS_09, free_port
from tests.harness import Broker, DaemonProcess, globald, random_records, write_config
from tests.support.broker import EmbeddedKafka

pytestmark = pytest.mark.kafka

UNREACHABLE_S = 8.0


def _wait_log(d: DaemonProcess, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = d.log.read_text(errors="replace")
        if re.search(pattern, text):
            return text
        assert d.alive(), d.tail()
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not logged within {timeout}s:\n{d.tail()}")


def test_an_unreachable_broker_is_logged_once_counted_and_cleared(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path / "globald.toml", tmp_path / "state",
                       {"bootstrap.servers": f"127.0.0.1:{port}", **CLIENT_SETTINGS_09}, {"tbl": "customers"},
                       http={"enabled": False}, commit_interval_ms=200)
    d = DaemonProcess(cfg, tmp_path / "daemon.log").start()
    kafka = EmbeddedKafka(tmp_path / "kafka", port=port)
    try:
        time.sleep(UNREACHABLE_S)  # librdkafka retries the connection every few ms meanwhile
        log = d.log.read_text(errors="replace").splitlines()
        errors = [line for line in log if " ERROR " in line]
        # Before: 388 ERROR lines in 20 s (101 in the first second), one per connection attempt.
        assert 1 <= len(errors) <= 2, errors[:10]
        assert "Connection refused" in errors[0]
        assert not [line for line in log if "deprecated" in line]  # the 0.9 settings' warnings are at DEBUG
        kafka.start()
        text = _wait_log(d, r"librdkafka problem cleared after \d+s \(\d+ time\(s\) in all\): .*Connection refused",
                         90)
        total = int(re.search(r"cleared after \d+s \((\d+) time", text).group(1))  # type: ignore[union-attr]
        assert total > len(errors), text[-3000:]  # the repeats were counted, not logged
        assert d.stop() == 0
        # Lines librdkafka had queued before the problem cleared are not logged as the problem coming back.
        after = [line for line in d.log.read_text(errors="replace").splitlines() if " ERROR " in line]
        assert after == errors, after
    finally:
        if d.alive():
            d.stop()
        kafka.stop()


def test_status_says_a_missing_topic_is_missing(broker: Broker, daemon: Callable[..., DaemonProcess]) -> None:
    topic = f"newcomer-missing-{time.monotonic_ns()}"
    d = daemon({"tbl": topic}, metadata_refresh_ms=500)
    d.wait_for(lambda doc: bool(doc["tables"]["tbl"].get("last_error")), 60, "the table's problem in status")
    r = globald("status", "--config", str(d.config))
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.lstrip().startswith("tbl "))
    assert "no offsets, lag unknown" in row and "lag 0" not in r.stdout, r.stdout
    assert re.search(rf"problem: .*topic {topic} unavailable", r.stdout), r.stdout

    broker.admin.create(topic, partitions=1)
    broker.admin.produce(topic, random_records(50, keys=10, seed=14, tombstones=0))
    d.wait_running({"tbl": broker.admin.end_offsets(topic)}, timeout=90)
    r = globald("status", "--config", str(d.config))
    assert "problem:" not in r.stdout and re.search(r"tbl\s+RUNNING\s+p0=50, lag 0", r.stdout), r.stdout
