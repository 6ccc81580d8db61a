"""The daemon's stop signals (``globald.service.signals``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import REPO, write_config
from tests.support.native_block import HOLD_FAILED_EXIT, HoldFailed, hold_deadline, hold_in_c

HEARD_BOUND_S = 120.0  # only bounds a broken run: what is checked is that the signal was heard inside the C call


def test_a_stop_signal_landing_inside_the_loops_wait_still_stops_the_daemon(tmp_path: Path) -> None:
    """CI hung twice at a daemon's stop: "SIGTERM received" logged, then nothing, its stacks showing the handler's
    ``Event.set`` waiting on the lock that the interrupted ``Event.wait`` below it held. The child recreates that
    instant on purpose: SIGTERM while its main thread holds the stop event's lock."""
    cfg = write_config(tmp_path / "c.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"}, {"t": "t"},
                       http={"port": 0})  # not 9464: another worker's daemon may hold it
    try:
        r = subprocess.run([sys.executable, "-m", "tests.support.signal_in_wait", str(cfg)], capture_output=True,
                           text=True, timeout=60, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the stop signal deadlocked the main thread: {e.stderr!r}") from e
    assert (r.returncode, r.stdout.strip()) == (0, "stopped"), r.stderr[-2000:]


def test_the_native_hold_lasts_to_its_deadline_or_fails() -> None:
    """The daemon below is held in C by ``hold_in_c``: a call that returned at once (an error code) would let the
    tests pass on a daemon never held, so its result is checked."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    deadline = hold_deadline(libc, 1)
    hold_in_c(libc, deadline)
    assert time.monotonic() >= deadline - 1e-3  # the same clock as CLOCK_MONOTONIC
    with pytest.raises(HoldFailed, match=errno.errorcode[errno.EINVAL]):
        hold_in_c(libc, hold_deadline(libc, 30), clock=12345)  # no such clock: refused at once


def _held_in_c(tmp_path: Path, block_s: int, grace_s: float | None) -> tuple[subprocess.Popen[str], float, Path]:
    """A real daemon (no broker: its loop turns, its tables wait for Kafka) whose loop thread is inside a glibc call
    for ``block_s`` seconds, or until the file ``block.release`` appears, when this returns: the process, the call's
    deadline (``time.monotonic()``), its log."""
    cfg = write_config(tmp_path / "c.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"}, {"t": "t"},
                       http={"port": 0})  # not 9464: another worker's daemon may hold it
    trigger, log = tmp_path / "block", tmp_path / "daemon.log"
    env = {**os.environ, "NATIVE_BLOCK_FILE": str(trigger), "NATIVE_BLOCK_S": str(block_s)}
    if grace_s is not None:
        env["NATIVE_BLOCK_GRACE_S"] = str(grace_s)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.native_block", "run", "--config", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    deadline = time.monotonic() + 60
    while "starting on" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    trigger.touch()
    entered = Path(f"{trigger}.in")
    while not entered.exists() or not entered.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    return proc, float(entered.read_text()), log


def _heard_inside_the_call(proc: subprocess.Popen[str], log: Path, call_ends: float) -> None:
    """SIGTERM (just sent) is logged before the C call returns: a daemon that heard it only after the call would
    log it after ``call_ends``. Waits for the line (bounded by HEARD_BOUND_S only), not for a fixed window."""
    bound = time.monotonic() + HEARD_BOUND_S
    while "SIGTERM received" not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} without hearing SIGTERM: {log.read_text()[-2000:]}"
        assert time.monotonic() < bound, f"SIGTERM not heard within {HEARD_BOUND_S}s: {log.read_text()[-2000:]}"
        time.sleep(0.02)
    heard = time.monotonic()
    assert heard < call_ends, f"heard {heard - call_ends:.1f}s after the C call returned: {log.read_text()[-2000:]}"


def test_a_stop_is_heard_at_once_while_the_loop_thread_is_inside_a_c_call(tmp_path: Path) -> None:
    """Issue 33: a Python-level handler runs only when the main thread returns to the interpreter, so a loop thread
    held in C (a client's close, a flush) never heard SIGTERM and never armed the stop's grace. The signal is now
    written to the relay's pipe by the C-level handler: heard while the call still runs, and the stop completes,
    exit 0, once the call returns: here when the test ends it, once the signal was heard (a daemon that could hear
    it only after the call would wait for the hold's deadline, past HEARD_BOUND_S)."""
    proc, call_ends, log = _held_in_c(tmp_path, block_s=600, grace_s=None)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        _heard_inside_the_call(proc, log, call_ends)
        (tmp_path / "block.release").touch()
        assert proc.wait(timeout=120) == 0, log.read_text()[-2000:]  # HOLD_FAILED_EXIT if the hold did not last
    finally:
        proc.kill()
        proc.wait()


def test_a_stop_held_inside_a_c_call_past_its_grace_prints_the_stacks_and_exits_1(tmp_path: Path) -> None:
    """The grace timer is armed by the relay while the loop thread is still in C: past the grace the daemon
    prints every thread's stack, naming the frame it is stuck in, and exits 1 rather than wait for SIGKILL."""
    proc, call_ends, log = _held_in_c(tmp_path, block_s=600, grace_s=2.0)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        _heard_inside_the_call(proc, log, call_ends)
        assert proc.wait(timeout=120) == 1, (proc.returncode == HOLD_FAILED_EXIT, log.read_text()[-2000:])
        assert "blocking_tick" in log.read_text(), log.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()
