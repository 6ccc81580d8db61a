"""Exceptions the daemon rides out are counted, logged at a bounded rate, and a bug shows in status.

The daemon runs in-process on a real broker with user callbacks that raise on every state change: one with an
I/O error (expected: counted, not a bug), one with a TypeError (a defect: counted as a bug and named in status).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.common import swallowed
from globald.common.states import Listeners, State
from globald.service.daemon import Daemon
from globald.settings import config as configmod
from globald.status import statusfile
from globald.status.document import DaemonStatus
from globald.store.names import STATUS_FILE
from tests.harness import Broker, random_records, write_config

pytestmark = pytest.mark.kafka


def metric(text: str, name: str, where: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{where="{where}"}} '):
            return float(line.split()[-1])
    return 0.0


def read_status(state_dir: Path) -> DaemonStatus | None:
    """status.json as ``globald status`` parses it (``read_live`` would also ask whether the pid is a globald
    command line, which this test process is not)."""
    try:
        return DaemonStatus.from_json(json.loads((state_dir / STATUS_FILE).read_text()))
    except (OSError, ValueError):
        return None


def test_caught_exceptions_are_counted_and_bugs_reach_status(broker: Broker, topic: Callable[..., str],
                                                             tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(200, keys=50, seed=31))
    cfg = configmod.load(write_config(tmp_path / "g.toml", tmp_path / "state", broker.settings, {"tbl": t}))
    before = swallowed.SWALLOWED.counts()
    listeners = Listeners()

    def disk_says_no(*args: object) -> None:
        raise OSError(28, "No space left on device")

    def broken(*args: object) -> None:
        raise TypeError("a callback with a bug")

    listeners.table_state += [disk_says_no, broken]
    daemon = Daemon(cfg, listeners)
    runner = threading.Thread(target=daemon.run, kwargs={"handle_signals": False})
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while daemon.thread.state != State.RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.thread.state == State.RUNNING
        # The status file is written on state changes and once a second: wait for one that carries the bug.
        deadline = time.monotonic() + 30
        doc = read_status(cfg.state_dir)
        while (doc is None or not doc.bugs) and time.monotonic() < deadline:
            time.sleep(0.1)
            doc = read_status(cfg.state_dir)
        text = daemon.ops.metrics.render().decode()
    finally:
        daemon.stop()
        runner.join(60)
    assert not runner.is_alive()
    # Two table transitions at least (CREATED -> RESTORING -> RUNNING), each failing both callbacks.
    caught = metric(text, "globald_swallowed_failures_total", "user_callback") - before.get("user_callback", 0)
    assert caught >= 4, text
    assert metric(text, "globald_bugs_total", "user_callback") >= 2, text
    assert doc is not None and doc.bugs, "the bug is not in status.json"
    bug = next(b for b in doc.bugs if b["where"] == "user_callback")
    assert bug["error"] == "TypeError: a callback with a bug" and bug["count"] >= 2, bug
    assert any(line.startswith("  BUG at user_callback: TypeError") for line in statusfile.status_lines(doc)), doc
    callbacks = [x for x in text.splitlines() if x.startswith("globald_callback_failures_total ")]
    assert callbacks and float(callbacks[0].split()[-1]) >= caught, text  # user callbacks count as callbacks now
    free = [x for x in text.splitlines() if x.startswith("globald_state_dir_free_bytes ")]
    assert free and float(free[0].split()[-1]) > 0, text


def test_a_repeating_failure_is_logged_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    """The first failure of a place is logged with its traceback; repeats within LOG_EVERY_S are counted, not
    logged; the next line says how many were not."""
    record = swallowed.Swallowed()
    log = logging.getLogger("test.swallowed")
    with caplog.at_level(logging.ERROR, logger="test.swallowed"):
        for _ in range(1000):
            record.record("place", OSError(5, "Input/output error"), log, "write failed")
    assert record.counts() == {"place": 1000}
    assert record.bug_counts() == {} and record.bugs() == []
    # An expected error: one line with its text, no traceback (a full disk is no defect).
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None
    assert "[failure at place: OSError: [Errno 5] Input/output error]" in caplog.records[0].getMessage()
    # A bare Exception is RocksDB's status text (not a bug); a subclass of it someone's code (a bug).
    record.record("rocks", Exception("IO error: No space left on device"), log, "flush")
    with caplog.at_level(logging.ERROR, logger="test.swallowed"):
        record.record("code", KeyError("x"), log, "lookup")
    assert caplog.records[-1].exc_info is not None  # a bug: with its traceback
    assert record.bug_counts() == {"code": 1}
    assert [b.error for b in record.bugs()] == ["KeyError: 'x'"]


def test_a_failure_that_keeps_repeating_is_logged_again_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    record = swallowed.Swallowed(log_every_s=0.2)
    log = logging.getLogger("test.swallowed")
    deadline = time.monotonic() + 30
    with caplog.at_level(logging.ERROR, logger="test.swallowed"):
        while len(caplog.records) < 2 and time.monotonic() < deadline:
            record.record("place", OSError(5, "Input/output error"), log, "write failed")
            time.sleep(0.01)
    assert len(caplog.records) == 2, "a repeating failure was never logged again"
    n = record.counts()["place"]
    assert f"more since the last report; {n} in all" in caplog.records[1].getMessage()
