"""A real daemon whose stop gets stuck: a user's state callback (run on the loop thread, as the embedding API
documents) blocks forever on PENDING_SHUTDOWN. Run as ``python -m tests.support.stuck_stop run --config FILE``;
``STUCK_STOP_GRACE_S`` replaces the daemon's stop grace so that a test need not wait a minute."""

from __future__ import annotations

import os
import sys
import threading

from globald.common import logs
from globald.common.states import Listeners, State
from globald.service import daemon
from globald.settings import config as configmod


def block_forever_on_shutdown(new: State, old: State, reason: str) -> None:
    if new == State.PENDING_SHUTDOWN:
        threading.Event().wait()


def main() -> int:
    daemon.STOP_GRACE_S = float(os.environ["STUCK_STOP_GRACE_S"])
    cfg = configmod.load(sys.argv[sys.argv.index("--config") + 1])
    logs.setup(cfg.log_level, cfg.log_format, [])
    listeners = Listeners()
    listeners.state.append(block_forever_on_shutdown)
    return daemon.Daemon(cfg, listeners).run()


if __name__ == "__main__":
    sys.exit(main())
