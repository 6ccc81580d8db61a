"""``globald dev --run`` as a user runs it: the installed command, a local Kafka, the daemon, and a clean exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from globald.cli.dev import READY_LINE

pytestmark = pytest.mark.kafka

GLOBALD = str(Path(sys.executable).parent / "globald")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_dev_run_starts_kafka_and_the_daemon_and_cleans_up_on_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "dev.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([GLOBALD, "dev", "--run", "--dir", "sandbox", "--customers", "100"], cwd=tmp_path,
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while READY_LINE not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        text = out.read_text()
        assert "topic customers: compacted, 3 partitions, 200 records (100 customers" in text, text
        daemon_pid = int(re.search(r"daemon: globald run --config sandbox/globald.toml \(pid (\d+)\)", text)[1])
        assert "globald run --config" not in text.split("Try, in another terminal")[1]  # already running
        key = re.search(r"--table customers (customer-\d+)", text)[1]
        config = str(tmp_path / "sandbox" / "globald.toml")
        deadline = time.monotonic() + 90
        while True:  # the daemon restores the seeded topic; get answers once its store is complete
            r = subprocess.run([GLOBALD, "get", "--config", config, "--table", "customers", key],
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.returncode == 0 and f'"name":"Customer {int(key[-5:])}"' in r.stdout, (r.stdout, r.stderr)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, out.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(90)
    text = out.read_text()
    assert text.splitlines()[-1] == "globald dev: stopped; sandbox removed", text[-2000:]
    assert "daemon state PENDING_SHUTDOWN -> NOT_RUNNING (stopped)" in text  # the daemon stopped cleanly first
    assert not (tmp_path / "sandbox").exists() and not _alive(daemon_pid)
    assert " ERROR " not in text and "librdkafka" not in text, text


def test_dev_refuses_a_directory_in_use(tmp_path: Path) -> None:
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "globald.toml").write_text("# someone's\n")
    r = subprocess.run([GLOBALD, "dev", "--dir", "sandbox"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and r.stderr.count("\n") == 1 and "sandbox exists" in r.stderr, r.stderr
    assert (tmp_path / "sandbox" / "globald.toml").read_text() == "# someone's\n"


@pytest.mark.parametrize("name", ["bad/name", "..", "customers", "x" * 250])
def test_dev_refuses_a_topic_name_kafka_would_not_take(tmp_path: Path, name: str) -> None:
    r = subprocess.run([GLOBALD, "dev", "--dir", "sandbox", "--topic", name], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--topic" in r.stderr, r.stderr
    assert not (tmp_path / "sandbox").exists()
