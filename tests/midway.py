"""Stop the real daemon at a point of its own work, not at a moment picked by the test's clock.

A test that must look at the daemon in the middle of something (a rebuild) cannot wait for it to start and then
freeze it: on a fast machine the work is over before the freeze, on a slow one the test is late. The chaos
campaign's entry point (``tests.chaos.entry``) wraps globald's functions with hooks that stop the process
(SIGSTOP) when an armed point is reached; this module arms them for ordinary tests.

Contract: ``arm`` before the daemon starts; ``freeze_at_restore`` once its first restore is over (a hook fires on
the next restore of the table, at ``fraction`` of it); ``wait_frozen`` returns once the daemon stopped itself
there, and fails if it did not within ``timeout``. The caller sends SIGCONT when done looking.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.chaos import entry
from tests.harness import DaemonProcess


def arm(d: DaemonProcess, path: Path) -> None:
    """Run ``d`` through the campaign's entry point, reading its arm file at ``path`` (nothing armed yet)."""
    path.write_text("{}")
    d.module = entry.__name__
    d.env = {**(d.env or {}), entry.ARM_ENV: str(path)}


def freeze_at_restore(path: Path, table: str, fraction: float, arm_id: int = 1) -> None:
    """The next restore of ``table`` stops the daemon once ``fraction`` of it is restored."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"id": arm_id, "phase": "restore", "action": "freeze", "table": table,
                               "fraction": fraction, "nth": 1}))
    tmp.replace(path)


def wait_frozen(d: DaemonProcess, path: Path, arm_id: int = 1, timeout: float = 120.0) -> None:
    fired = path.with_name(f"{path.name}.fired-{arm_id}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not d.alive():
            raise AssertionError(f"the daemon exited before reaching its armed point; log:\n{d.tail()}")
        if fired.exists() and _stopped(d.pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"the daemon did not reach its armed point within {timeout:.0f}s; log:\n{d.tail()}")


def _stopped(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")
