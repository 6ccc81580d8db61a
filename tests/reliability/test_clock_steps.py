"""Wall-clock steps, +1 h and back and -1 h and back, in every phase of the daemon's work (issue 33).

The daemon is held at the phase by the chaos campaign's hooks (``tests.chaos.entry``: it stops itself there), the
clock is stepped while it stands there, then it goes on, and the clock is stepped back. After that the loop keeps
turning, records produced afterwards are applied, SIGTERM stops it with exit 0 within its stop grace, and the
store equals the fold, with a snapshot of the new records made after the steps. Each step is shown to have reached
the daemon: the wall-clock time it writes into status.json moves with it. The step made while the daemon stands
frozen is shown to land inside the phase: the Python-level clock re-reads its offset at most once a second, and a
phase lasts milliseconds after the daemon goes on, so its hook (armed with "clock") holds the phase until the clock
has re-read its file, and records the offset the phase went on with.

Which clock, per direction:
- **+1 h, then back to +0: libfaketime** (Debian faketime) with the settings of ../shared/KAFKA-TESTING.md, a step
  of CLOCK_REALTIME only (``FAKETIME_DONT_FAKE_MONOTONIC=1``, a timestamp file re-read at each call), so that
  librdkafka's waits see the step back too: what a real NTP step does, and what held the loop before (a client's
  destroy on the loop thread, joining a thread in a wait timed on the wall clock). While the clock is at +1 h,
  libfaketime disturbs librdkafka's metadata requests (tests/chaos/tools.py); every check here is made at +0.
  ``time.sleep`` is not shimmed (the campaign's ``GLOBALD_CHAOS_SLEEP_FIX`` is left off): the daemon makes none,
  and one would fail with EINVAL under libfaketime.
- **-1 h, then forward to +0: the campaign's Python-level clock** (``tests.chaos.entry``: ``time.time`` shifted).
  libfaketime at a negative offset disturbs librdkafka past use: measured here, ``Consumer(...)`` under libfaketime
  at -3600 never returns (at +3600 it returns in 35 ms, and at +0 in 0.3 s), which a real clock set an hour back
  does not do. This direction reaches every wall-clock read globald makes (leases, manifests, snapshot ids,
  status), not librdkafka's; the step back into librdkafka is the first direction's.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from globald.service.daemon import STOP_GRACE_S
from globald.snapshot import exact_requests
from globald.snapshot.exact_requests import Code
from tests.chaos.entry import CLOCK_ENV
from tests.ci import unavailable
from tests.harness import Broker, DaemonProcess, oracle_at, random_records
from tests.integration.snapshot_helpers import manifest_of, snapshot_values, wait_snapshot_at
from tests.midway import wait_frozen
from tests.reliability.checks import check_store, same_process
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]

HOUR = 3600
# A stop waiting out a stepped wall clock would take the hour; the daemon's own stop grace (STOP_GRACE_S, 60 s on
# the monotonic clock from the SIGTERM) cuts such a stop with exit 1. So exit 0 is the claim: a stop that ended by
# itself within the grace. Not a bound of the test's clock: a fixed 30 s measured from outside (which, during the
# stop, also held the test's own steps and looks) is a timing claim a loaded 2-core machine can miss on a stop that
# never waited on the wall clock. The harness waits past the grace, so that its exit 1 is what a failure shows.
STOP_WAIT_S = STOP_GRACE_S + 60


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        unavailable("libfaketime is not installed (Debian package faketime; `make sysdeps` installs it)")
    return found[0]


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return dict(json.loads(r.read()))


def faketime_env(control: Path) -> dict[str, str]:
    """The daemon sees the wall clock shifted by the offset written in ``control`` (re-read at every call)."""
    return Clock(control).env()


@dataclass
class Clock:
    """The daemon's wall clock: an offset in a file, read by libfaketime at every call, or by the campaign's
    Python-level clock (``tool="python"``) at most once a second."""

    path: Path
    tool: str = "libfaketime"

    def env(self) -> dict[str, str]:
        self.set(0)
        if self.tool == "python":
            return {CLOCK_ENV: str(self.path)}
        return {"LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(self.path), "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def set(self, offset_s: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        os.replace(tmp, self.path)


@dataclass
class Run:
    broker: Broker
    d: DaemonProcess
    topic: str
    arm_path: Path
    clock: Clock

    def arm(self, phase: str, nth: int = 1, arm_id: int = 1, **more: Any) -> None:
        tmp = self.arm_path.with_name(self.arm_path.name + ".tmp")
        # "clock": on the Python-level clock, the phase goes on once the step made while it stood is in force.
        tmp.write_text(json.dumps({"id": arm_id, "phase": phase, "action": "freeze", "table": "tbl", "nth": nth,
                                   "clock": True, **more}))
        tmp.replace(self.arm_path)

    def offset_in_phase(self, arm_id: int = 1, timeout: float = 30.0) -> float:
        """The Python-level clock's offset in force when the frozen phase went on, as its hook recorded it."""
        fired = self.arm_path.with_name(f"{self.arm_path.name}.fired-{arm_id}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                doc = json.loads(fired.read_text())
            except ValueError:  # being rewritten by the hook
                doc = {}
            if "clock_offset_s" in doc:
                return float(doc["clock_offset_s"])
            time.sleep(0.05)
        raise AssertionError(f"the phase's hook recorded no clock offset within {timeout:.0f}s; log:\n"
                             f"{self.d.tail()}")

    def check_step_in_phase(self, offset_s: int) -> None:
        """The step made while the daemon stood frozen was in force when its phase went on (the Python-level clock;
        libfaketime re-reads its file at every call)."""
        if self.clock.tool == "python":
            in_phase = self.offset_in_phase()
            assert in_phase == offset_s, f"the phase went on at {in_phase:+.0f}s, not at the step's {offset_s:+d}s"

    def daemon_offset(self, timeout: float = 60.0) -> float:
        """The daemon's wall clock minus ours, read from the time it writes into status.json (at least once a
        second while it runs)."""
        path = self.d.state_dir / "status.json"
        before = path.stat().st_mtime_ns if path.exists() else 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_mtime_ns != before:
                try:
                    doc = json.loads(path.read_text())
                except ValueError:  # being replaced: read the next one
                    continue
                return float(doc["updated"]) - time.time()
            time.sleep(0.1)
        raise AssertionError(f"no status written within {timeout:.0f}s; log:\n{self.d.tail()}")

    def step(self, offset_s: int) -> None:
        """Step the daemon's wall clock to ``offset_s`` and show that the step reached it."""
        self.clock.set(offset_s)
        deadline = time.monotonic() + 60
        while abs(self.daemon_offset() - offset_s) > 120:
            assert time.monotonic() < deadline, f"the daemon's clock did not move to {offset_s:+d}s"

    @property
    def port(self) -> int:
        """The HTTP port the daemon bound (port 0 in its config: the kernel's pick, said in its status). A port
        picked free here and closed before the daemon bound it could be taken meanwhile by another xdist worker's
        broker, Spark or daemon."""
        doc = self.d.wait_for(lambda s: s.get("pid") == self.d.pid and s.get("http", {}).get("port"),
                              timeout=120, what="the HTTP port in status")
        return int(doc["http"]["port"])

    def loop_turns(self) -> None:
        """The loop turns after the steps: healthz's loop age (on the monotonic clock, this process's too) shows a
        turn after this began, then another after that was seen, each sample under 5 s; waited for (60 s bound)
        rather than sampled over a fixed window."""
        port = self.port
        mark, turns, ages = time.monotonic(), 0, []
        deadline = mark + 60
        while turns < 2:
            asked = time.monotonic()
            ages.append(healthz(port)["loop_age_seconds"])
            assert ages[-1] < 5.0 and asked < deadline, f"the loop stopped turning after the clock step: loop " \
                                                         f"ages {ages}; log:\n{self.d.tail()}"
            if asked - ages[-1] > mark:  # its last turn came after the mark, whenever the age was computed
                mark, turns = time.monotonic(), turns + 1
            else:
                time.sleep(0.05)


def _start(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str, **config: Any) -> Run:
    arm_path, clock = tmp_path / "arm.json", Clock(tmp_path / "faketime", tool)
    arm_path.write_text("{}")
    d = daemon({"tbl": t}, start=False, http={"enabled": True, "port": 0}, metadata_refresh_ms=500, **config)
    d.module = "tests.chaos.entry"
    d.env = {**(d.env or {}), "GLOBALD_CHAOS_ARM": str(arm_path), **clock.env()}
    return Run(broker, d, t, arm_path, clock)


def _through(run: Run, first: int, then_: int) -> None:
    """The daemon stands frozen at its armed point: step its clock to ``first`` there, let it go on, show the step
    reached it, then step to ``then_``."""
    run.clock.set(first)
    os.kill(run.d.pid, signal.SIGCONT)
    run.check_step_in_phase(first)
    run.step(first)
    run.step(then_)


def _finish(run: Run, pid: int, row: FaultRow) -> None:
    """After the steps: the loop turns, new records are applied and published in a snapshot made after the steps,
    SIGTERM stops it with exit 0 (within its stop grace), store == fold."""
    since = time.time()  # the daemon's clock is back at +0 (``Run.step``)
    run.loop_turns()
    run.broker.admin.produce(run.topic, random_records(200, keys=300, seed=991))
    ends = run.broker.admin.end_offsets(run.topic)
    run.d.wait_running({"tbl": ends}, timeout=120)
    current = wait_snapshot_at(run.d, "tbl", ends)
    created = manifest_of(run.d, "tbl", current["id"]).created
    assert created >= since, f"the snapshot at the new records was created {since - created:.1f}s before the steps " \
                             f"ended: {current}"
    row.pid_changes += same_process(run.d, pid)
    started = time.monotonic()
    assert run.d.stop(timeout=STOP_WAIT_S) == 0, f"not stopped by itself within its stop grace after the clock " \
                                                 f"steps; log:\n{run.d.tail()}"
    row.notes.append(f"SIGTERM to exit: {time.monotonic() - started:.1f}s")
    assert row.diverged(check_store(run.broker, run.d.state_dir, "tbl", run.topic).divergences) == 0


# direction -> (the first step, the second, the clock tool: see the module docstring)
STEPS = {"forward-and-back": (HOUR, 0, "libfaketime"), "back-and-forward": (-HOUR, 0, "python")}


def _records(broker: Broker, t: str, n: int, seed: int) -> None:
    broker.admin.produce(t, random_records(n, keys=max(300, n // 4), seed=seed))


def _at_start(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str) -> Run:
    _records(broker, t, 3_000, 1)
    run = _start(broker, daemon, tmp_path, t, tool)
    run.arm("start")
    run.d.start()
    wait_frozen(run.d, run.arm_path)
    return run


def _at_restore(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str) -> Run:
    _records(broker, t, 30_000, 2)
    run = _start(broker, daemon, tmp_path, t, tool)
    run.arm("restore", fraction=0.3)
    run.d.start()
    wait_frozen(run.d, run.arm_path)
    return run


def _at_bulk_end(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str) -> Run:
    _records(broker, t, 110_000, 3)  # at least BULK_LOAD_MIN_RECORDS: a bulk load
    run = _start(broker, daemon, tmp_path, t, tool)
    run.arm("bulk-load end")
    run.d.start()
    wait_frozen(run.d, run.arm_path, timeout=240)
    return run


def _running(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str, **config: Any) -> Run:
    _records(broker, t, 3_000, 4)
    run = _start(broker, daemon, tmp_path, t, tool, **config)
    run.d.start()
    run.d.wait_running({"tbl": broker.admin.end_offsets(t)})
    return run


def _at_check_at_plan(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str) -> Run:
    run = _running(broker, daemon, tmp_path, t, tool)
    assert run.d.stop() == 0
    _records(broker, t, 500, 5)
    run.arm("identity check")  # the first record read back after a start with a store: the plan's check
    run.d.start()
    wait_frozen(run.d, run.arm_path)
    return run


def _armed_while_running(phase: str, produce: int, broker: Broker, daemon: Daemon, tmp_path: Path, t: str,
                         tool: str) -> Run:
    """RUNNING from empty (its plan read nothing back), then frozen at ``phase``, reached by the next refresh's
    check (every 500 ms), or by the commit or the publish of ``produce`` more records."""
    run = _running(broker, daemon, tmp_path, t, tool)
    run.arm(phase)
    if produce:
        _records(broker, t, produce, 6)
    wait_frozen(run.d, run.arm_path)
    return run


def _at_exact_build(broker: Broker, daemon: Daemon, tmp_path: Path, t: str, tool: str) -> Run:
    run = _running(broker, daemon, tmp_path, t, tool, snapshots={"interval_ms": 200, "retain": 2})
    ends_a = broker.admin.end_offsets(t)
    wait_snapshot_at(run.d, "tbl", ends_a)
    _records(broker, t, 3_000, 8)
    ends_b = broker.admin.end_offsets(t)
    wait_snapshot_at(run.d, "tbl", ends_b)
    target = {p: (ends_a[p] + ends_b[p]) // 2 for p in ends_b}  # no snapshot there: only a build answers it
    run.arm("exact build")
    request = exact_requests.submit(run.d.state_dir, "tbl", target)
    wait_frozen(run.d, run.arm_path)
    run.exact = request  # type: ignore[attr-defined]
    run.target = target  # type: ignore[attr-defined]
    return run


PHASES: dict[str, Callable[[Broker, Daemon, Path, str, str], Run]] = {
    "start": _at_start, "restore": _at_restore, "bulk-load end": _at_bulk_end,
    "identity check at plan": _at_check_at_plan,
    "identity check at refresh": functools.partial(_armed_while_running, "identity check", 0),
    "commit": functools.partial(_armed_while_running, "commit", 200),
    "snapshot publish": functools.partial(_armed_while_running, "snapshot publish", 200),
    "exact build": _at_exact_build,
}
# The quick phases run in `make test`; the restores, the exact build and the plan's check (two daemon runs) are
# over 30 s on a loaded 2-core machine and run in `make test-long`.
_LONG = {"restore", "bulk-load end", "exact build", "identity check at plan"}


def _cases() -> list[Any]:
    """Every phase in both directions; the long ones in the long lane. So is +1 h and back at start: its step back
    lands while the cluster worker's first questions wait in librdkafka, stretched by the hour, and the worker
    leaves them behind after 60 s, as designed (70 s on the 2-core machine)."""
    return [pytest.param(p, s, marks=pytest.mark.long) if p in _LONG or (p, s) == ("start", "forward-and-back")
            else pytest.param(p, s) for p in PHASES for s in STEPS]


@pytest.mark.parametrize(("phase", "steps"), _cases())
def test_clock_stepped_in_a_phase(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                                  fault: Callable[[str, str], FaultRow], phase: str, steps: str) -> None:
    first, then_, tool = STEPS[steps]
    row = fault(f"wall clock stepped {first:+d}s and back at {phase} ({tool})",
                "loop keeps turning, new records applied, SIGTERM exits 0 within its stop grace, store equals the fold")
    t = topic()
    run = PHASES[phase](broker, daemon, tmp_path, t, tool)
    pid = run.d.pid
    _through(run, first, then_)
    row.injected += 1
    if phase == "exact build":
        # +1 h and back: the build's metadata call waited inside librdkafka on the wall clock (an hour) and never
        # answered; a worker stuck in a client is now left behind and a new one builds the request again
        # (``exact_builds.STUCK_S``).
        request, target = run.exact, run.target  # type: ignore[attr-defined]
        answer = exact_requests.wait(run.d.state_dir, request, timeout=120)
        # Answered, and right: the build's bounds are monotonic, so a stepped wall clock is no reason to give up.
        assert answer.code == Code.READY and answer.snapshot, answer
        assert snapshot_values(run.d, "tbl", answer.snapshot) == oracle_at(run.broker, run.topic, target), \
            "the exact build at the target differs from the fold"
    _finish(run, pid, row)


@pytest.mark.parametrize("steps", STEPS)
def test_clock_stepped_during_the_stop(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                                       fault: Callable[[str, str], FaultRow], steps: str) -> None:
    """The clock stepped while the daemon runs, then stepped back while it stands inside its shutdown: the stop
    still ends with exit 0 within its stop grace, and the store equals the fold. The second step is shown by the last
    status the daemon writes (NOT_RUNNING)."""
    first, then_, tool = STEPS[steps]
    row = fault(f"wall clock stepped {first:+d}s, then back during the stop ({tool})",
                "exit 0 within its stop grace, store == fold")
    t = topic()
    run = _running(broker, daemon, tmp_path, t, tool)
    run.step(first)
    run.arm("stop")
    started = time.monotonic()
    os.kill(run.d.pid, signal.SIGTERM)
    wait_frozen(run.d, run.arm_path)
    run.clock.set(then_)
    os.kill(run.d.pid, signal.SIGCONT)
    run.check_step_in_phase(then_)
    row.injected += 1
    assert run.d.proc is not None
    assert run.d.proc.wait(timeout=STOP_WAIT_S) == 0, f"not stopped by itself within its stop grace with the " \
                                                      f"clock stepped; log:\n{run.d.tail()}"
    row.notes.append(f"SIGTERM to exit, the test's steps included: {time.monotonic() - started:.1f}s")
    doc = json.loads((run.d.state_dir / "status.json").read_text())
    assert doc["state"] == "NOT_RUNNING" and abs(float(doc["updated"]) - time.time() - then_) < 120, doc
    assert row.diverged(check_store(broker, run.d.state_dir, "tbl", t).divergences) == 0


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_libfaketime_at_zero_leaves_the_loop_consuming(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                                                       fault: Callable[[str, str], FaultRow]) -> None:
    """Issue 33's second probe: under libfaketime at +0, before any step, the identity check's ``time.sleep``
    failed with EINVAL, the loop took that OSError for a store fault, and the table was degraded for good, silently
    retried. Several metadata refreshes (each with its check) later, the table is RUNNING, never degraded, and
    consuming."""
    row = fault("libfaketime at +0 (its sleep wrapper fails with EINVAL)", "never degraded, records applied")
    t = topic()
    run = _running(broker, daemon, tmp_path, t, "libfaketime")
    pid = run.d.pid
    seen: list[str | None] = []
    for i in range(4):  # each round: records, then a few refreshes (500 ms apart)
        _records(broker, t, 100, 20 + i)
        ends = broker.admin.end_offsets(t)
        doc = run.d.wait_running({"tbl": ends}, timeout=60)
        seen.append(doc.get("degraded"))
        time.sleep(1.5)
    row.injected += 1
    assert seen == [None] * 4, f"degraded under libfaketime at +0: {seen}; log:\n{run.d.tail()}"
    assert "Invalid argument" not in run.d.tail(400)
    _finish(run, pid, row)
