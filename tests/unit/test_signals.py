"""The daemon's stop signals (``globald.service.signals``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.harness import REPO, write_config


def test_a_stop_signal_landing_inside_the_loops_wait_still_stops_the_daemon(tmp_path: Path) -> None:
    """CI hung twice at a daemon's stop: "SIGTERM received" logged, then nothing, its stacks showing the handler's
    ``Event.set`` waiting on the lock that the interrupted ``Event.wait`` below it held. The child recreates that
    instant on purpose: SIGTERM while its main thread holds the stop event's lock."""
    cfg = write_config(tmp_path / "c.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"}, {"t": "t"})
    try:
        r = subprocess.run([sys.executable, "-m", "tests.support.signal_in_wait", str(cfg)], capture_output=True,
                           text=True, timeout=60, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the stop signal deadlocked the main thread: {e.stderr!r}") from e
    assert (r.returncode, r.stdout.strip()) == (0, "stopped"), r.stderr[-2000:]


def _held_in_c(tmp_path: Path, block_s: int, grace_s: float | None) -> tuple[subprocess.Popen[str], Path, Path]:
    """A real daemon (no broker: its loop turns, its tables wait for Kafka) whose loop thread is inside libc's
    sleep for ``block_s`` seconds when this returns."""
    cfg = write_config(tmp_path / "c.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"}, {"t": "t"})
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
    while not Path(f"{trigger}.in").exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    return proc, trigger, log


def _heard_within(log: Path, seconds: float) -> float:
    sent = time.monotonic()
    while "SIGTERM received" not in log.read_text():
        assert time.monotonic() - sent < seconds, f"SIGTERM not heard within {seconds}s: {log.read_text()[-2000:]}"
        time.sleep(0.02)
    return time.monotonic() - sent


def test_a_stop_is_heard_at_once_while_the_loop_thread_is_inside_a_c_call(tmp_path: Path) -> None:
    """Issue 33: a Python-level handler runs only when the main thread returns to the interpreter, so a loop thread
    held in C (a client's close, a flush) never heard SIGTERM and never armed the stop's grace. The signal is now
    written to the relay's pipe by the C-level handler: heard within a second, and the stop completes, exit 0,
    once the call returns."""
    proc, _, log = _held_in_c(tmp_path, block_s=6, grace_s=None)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        _heard_within(log, 1.0)
        assert proc.poll() is None  # still inside the C call: heard, not yet acted on by the loop
        assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        proc.kill()
        proc.wait()


def test_a_stop_held_inside_a_c_call_past_its_grace_prints_the_stacks_and_exits_1(tmp_path: Path) -> None:
    """The grace timer is armed by the relay while the loop thread is still in C: past the grace the daemon
    prints every thread's stack, naming the frame it is stuck in, and exits 1 rather than wait for SIGKILL."""
    proc, _, log = _held_in_c(tmp_path, block_s=600, grace_s=2.0)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        _heard_within(log, 1.0)
        assert proc.wait(timeout=30) == 1
        assert "blocking_tick" in log.read_text(), log.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()
