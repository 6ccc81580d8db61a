"""The daemon's stop signals (``globald.service.signals``)."""

from __future__ import annotations

import subprocess
import sys
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
