"""A stop within a second of SIGTERM, exit 0, whatever the daemon waits on (issue 40: the chaos campaign's typed
table's daemon took 1.58 s on a loaded host, a Schema Registry answering 429 with ``Retry-After`` at a reload).

Measured as the campaign measures it (``tests/chaos/registry_faults.py``, ``RegistryEvent._stop``): from the
SIGTERM to the process's exit, against the same ``STOP_S``. Each case holds the daemon where a stop used to wait:

- **starved decode**: a reload meets the registry's 429, new writer ids wait (pending), and the decode process the
  daemon runs for them (nice 19, SCHED_BATCH) is starved of CPU by a busy process on its core, as a loaded host
  does: its SIGTERM handling cannot run, and the stop waited up to 5 s for it;
- **silent at a reload**: the reload's check (check-config's child, the subject's version) waits on a registry that
  never answers; the stop waited 5 s for the reload thread;
- **silent at start**: the start's registry probe (before the restore) waits on it, with the client's timeout
  (300 s here): the stop waited for the whole timeout, or the 60 s grace and exit 1.

After each stop the store equals the oracle fold at its offsets, no decode or check-config process is left, and
no decode left a lease or a temporary file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from globald.snapshot import leases
from globald.store.names import TMP_PREFIX, snapshots_dir
from globald.store.statedir import lock_holder
from tests.chaos.registry_faults import STOP_S
from tests.harness import Broker, DaemonProcess
from tests.integration.test_registry_daemon import SECTION, V1, V2, decoded_at, produced, subject_section
from tests.reliability.checks import check_store
from tests.support.registry import SILENT, THROTTLED, RegistryDouble
from tests.unit.typed_fixtures import FIXTURES

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
SUBJECT = "stop-value"
WAIT_S = 120.0  # every wait for the daemon to reach a state: generous, a loaded 2-core machine


def typed(daemon: Daemon, broker: Broker, t: str, registry: RegistryDouble, section: str, records: int,
          **top: Any) -> DaemonProcess:
    """A daemon of table ``cust`` on ``t`` whose values take writer ids from ``registry`` (no retry within a
    request, as the campaign's: one request waits on a silent registry, for the client's whole timeout), once
    ``records`` more are on ``t``, written with schema v1 registered under ``SUBJECT``."""
    if records:
        one = registry.register(SUBJECT, V1)
        broker.admin.produce(t, produced(one, V1, records, keys=records // 2, seed=5))
    d = daemon({"cust": t}, start=False, registry={"url": registry.url, "timeout": 300}, **top)
    text = d.config.read_text().replace("timeout = 300\n", 'timeout = 300\n"max.retries" = 0\n')
    d.config.write_text(text + section)
    return d


def stop_in_time(d: DaemonProcess, broker: Broker, t: str) -> float:
    """SIGTERM; the seconds to the exit, which must be 0 within ``STOP_S``; then the store against the fold."""
    rc, took = d.timed_stop(90)
    assert rc == 0 and took <= STOP_S, f"exit {rc} {took:.2f}s after SIGTERM (bound {STOP_S}s)\n{d.tail(60)}"
    store = check_store(broker, d.state_dir, "cust", t)
    assert store.divergences == 0, f"store differs from the oracle at {store.offsets}: {store.error}"
    return took


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (zombies excluded: reaped by init once their parent exits)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def none_left(text: str) -> None:
    """No process naming ``text`` within a generous deadline (a SIGKILLed one is gone once the kernel runs it)."""
    deadline = time.monotonic() + 30
    while (left := processes_naming(text)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"left behind by the stop: {left}"


@contextmanager
def busy(cpu: int) -> Iterator[None]:
    """A process keeping ``cpu`` busy at the normal priority: what a loaded host is to a nice-19 process there."""
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def decode_in_flight(d: DaemonProcess, cpu: int) -> int:
    """The pid of a decode process the daemon runs, moved onto ``cpu`` while it still runs (status names the one in
    flight; one that ended meanwhile is let go and the next one taken)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        pid = (d.status()["tables"]["cust"].get("decode") or {}).get("running_pid")
        if pid:
            try:
                os.sched_setaffinity(pid, {cpu})
            except OSError:  # gone meanwhile
                continue
            if pid in processes_naming("globald.typed.decode_snapshot") and \
                    (d.status()["tables"]["cust"].get("decode") or {}).get("running_pid") == pid:
                return int(pid)
        time.sleep(0.02)
    raise AssertionError(f"no decode process in flight within {WAIT_S:.0f}s\n{d.tail()}")


@pytest.mark.long
def test_a_stop_does_not_wait_for_a_starved_decode_process_after_a_reload_met_a_throttled_registry(
        broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    with RegistryDouble() as registry:
        t = topic()
        d = typed(daemon, broker, t, registry, subject_section(SUBJECT), 300, snapshots={"interval_ms": 500,
                                                                                  "decode_interval_ms": 200})
        d.start()
        decoded_at(d, broker.admin.end_offsets(t), timeout=WAIT_S)
        registry.fault(THROTTLED, retry_after=600)
        generation = int(d.status()["config"]["generation"])
        os.kill(d.pid, signal.SIGHUP)
        doc = d.wait_for(lambda s: int(s["config"]["generation"]) > generation, timeout=WAIT_S, what="the reload")
        assert doc["config"]["last_reload"]["result"] == "applied", doc["config"]
        new = registry.register(SUBJECT, V2)  # an id the daemon never met: its values wait for the registry
        broker.admin.produce(t, produced(new, V2, 60, keys=120, seed=4))
        pending = decoded_at(d, broker.admin.end_offsets(t), timeout=WAIT_S)
        assert pending["pending"] > 0 and registry.faulted[THROTTLED] > 0, pending
        cpu = min(os.sched_getaffinity(0))
        with busy(cpu):
            pid = decode_in_flight(d, cpu)
            took = stop_in_time(d, broker, t)
        none_left(f"globald.typed.decode_snapshot --config {d.config}")  # this daemon's: others may run beside
        assert "stopped with the daemon" in d.log.read_text(), d.tail()  # the decode in flight, with the daemon
        table_dir = snapshots_dir(d.state_dir, "cust")
        assert not [lease for lease in leases.read_all(table_dir)[0] if "decode" in lease.holder]
        assert not [p for p in table_dir.rglob(f"{TMP_PREFIX}*")], "a decode's temporary file was left"
        print(f"stopped in {took:.2f}s, decode process {pid} starved on cpu {cpu}")


def test_a_stop_does_not_wait_for_a_reload_checking_against_a_silent_registry(
        broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    with RegistryDouble() as registry:
        t = topic()
        d = typed(daemon, broker, t, registry, subject_section(SUBJECT), 40)
        d.start()
        d.wait_running({"cust": broker.admin.end_offsets(t)}, timeout=WAIT_S)
        registry.fault(SILENT)
        os.kill(d.pid, signal.SIGHUP)
        d.wait_for(lambda s: registry.faulted[SILENT] > 0, timeout=WAIT_S, what="the reload asking the registry")
        took = stop_in_time(d, broker, t)
        none_left(f"check-config --config {d.config}")
        print(f"stopped in {took:.2f}s")


@pytest.mark.long
def test_a_stop_does_not_wait_for_the_starts_registry_probe_against_a_silent_registry(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    with RegistryDouble() as registry:
        t = topic()
        first = typed(daemon, broker, t, registry, SECTION, 40)  # a store, restored with the registry answering
        first.start()
        first.wait_running({"cust": broker.admin.end_offsets(t)}, timeout=WAIT_S)
        assert first.stop() == 0
        registry.fault(SILENT)
        d = typed(daemon, broker, t, registry, SECTION, 0)
        d.start()
        deadline = time.monotonic() + WAIT_S
        while not (registry.faulted[SILENT] > 0 and lock_holder(d.state_dir) == str(d.pid)):
            assert d.alive() and time.monotonic() < deadline, d.tail()
            time.sleep(0.05)
        took = stop_in_time(d, broker, t)
        print(f"stopped in {took:.2f}s")
