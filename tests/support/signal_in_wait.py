"""SIGTERM delivered while the main thread holds the loop's stop event's lock, as it does for an instant inside
``Event.wait`` (its condition re-acquiring the lock): the daemon must still stop. Run as ``python -m
tests.support.signal_in_wait CONFIG``; prints ``stopped`` and exits 0 when it did. A handler that sets the event
itself waits on the lock its own thread holds and never returns (the caller's timeout ends it)."""

from __future__ import annotations

import os
import signal
import sys
import time

from globald.service.daemon import Daemon
from globald.settings import config as configmod


def main() -> int:
    daemon = Daemon(configmod.load(sys.argv[1]))
    with daemon._signals(True):
        with daemon.thread._stop._cond:  # type: ignore[attr-defined]  # the lock Event.wait holds at that instant
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:  # bytecodes run, so the Python-level handler runs here
                pass
        stopped = daemon.thread._stop.wait(10)
    print("stopped" if stopped else "not stopped", flush=True)
    return 0 if stopped else 1


if __name__ == "__main__":
    sys.exit(main())
