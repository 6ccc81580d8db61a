"""Wall-clock steps (libfaketime) on an idle topic: the loop keeps turning, records keep arriving, SIGTERM is acted on.

librdkafka times blocking waits on the wall clock (librdkafka#2145): stepped forward and back, a blocking poll on an
idle topic sleeps through the step. The daemon must not: it polls without blocking and waits on the monotonic
clock, which a step (NTP, an operator's ``date -s``) leaves alone.
"""

from __future__ import annotations

import glob
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.ci import unavailable
from tests.harness import Broker, DaemonProcess, random_records
from tests.reliability.checks import check_store, same_process
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        unavailable("libfaketime is not installed (Debian package faketime; `make sysdeps` installs it)")
    return found[0]


def faketime_env(control: Path) -> dict[str, str]:
    """The daemon sees the wall clock shifted by the offset written in ``control`` (re-read at every call)."""
    control.write_text("+0\n")
    return {"LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(control), "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return dict(json.loads(r.read()))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_clock_stepped_forward_then_back(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                                         fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("wall clock stepped +1 h, then back, idle topic",
                "loop keeps turning, new records applied, SIGTERM acted on (exit 0 within 15 s), same PID")
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=500, seed=80))
    port = free_port()
    control = tmp_path / "faketime"
    d = daemon({"tbl": t}, start=False, http={"enabled": True, "port": port})
    d.env = faketime_env(control)
    d.start()
    pid = d.pid
    d.wait_running({"tbl": broker.admin.end_offsets(t)})
    time.sleep(2)  # idle: the loop sits in its poll
    control.write_text("+3600\n")
    time.sleep(3)
    control.write_text("+0\n")
    row.injected += 1
    time.sleep(3)
    ages = [healthz(port)["loop_age_seconds"] for _ in range(5) if time.sleep(0.5) is None]
    assert max(ages) < 2.0, f"the loop stopped turning after the clock step: loop ages {ages}; log:\n{d.tail()}"
    broker.admin.produce(t, random_records(50, keys=500, seed=81))
    ends = broker.admin.end_offsets(t)
    d.wait_for(lambda s: all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
               timeout=20, what="records produced after the clock step applied")
    row.pid_changes += same_process(d, pid)
    assert row.diverged(check_store(broker, d.state_dir, "tbl", t).divergences) == 0
    # Stepped back again while idle, then asked to stop: acted on within the documented bound.
    control.write_text("+3600\n")
    time.sleep(2)
    control.write_text("+0\n")
    time.sleep(1)
    started = time.monotonic()
    assert d.stop(timeout=30) == 0, d.tail()
    took = time.monotonic() - started
    # A loop waiting on the stepped wall clock would sit out the hour; the bound leaves room for the final commit and
    # the teardown on a loaded machine (about 1 s idle).
    assert took < 15.0, f"SIGTERM took {took:.1f}s to act on after a clock step; log:\n{d.tail()}"
