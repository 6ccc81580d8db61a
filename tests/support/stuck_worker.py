"""A real daemon whose cluster worker a test can hold inside a C call, as a librdkafka call that does not return
(``list_topics``, ``offsets_for_times``, ``committed`` against a silent broker) holds it:
``python -m tests.support.stuck_worker run --config FILE``. When the file named by ``STUCK_WORKER_FILE`` appears,
the loop asks the worker a question that waits inside glibc (``native_block.Hold``, the GIL released) for
``STUCK_WORKER_S`` seconds, and the worker writes ``<file>.in`` once it is inside. The process ends as
``globald run`` ends it (``cli.main._end_process``), so that a stop is measured as the real one."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

from globald.cli.main import _end_process
from globald.common import logs
from globald.service import daemon
from globald.settings import config as configmod
from tests.support.native_block import HOLD_FAILED_EXIT, Hold, HoldFailed, hold_deadline


def main() -> None:
    trigger, seconds = Path(os.environ["STUCK_WORKER_FILE"]), int(os.environ["STUCK_WORKER_S"])
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    tick = daemon.Daemon.tick

    def stuck(_: Any) -> None:
        deadline = hold_deadline(libc, seconds)
        Path(f"{trigger}.in").write_text(repr(deadline))
        try:
            Hold(libc).wait(deadline)  # nobody releases it: the worker is inside C until the deadline
        except HoldFailed as e:
            logging.getLogger("globald").error("STUCK-WORKER failed: %s", e)
            os._exit(HOLD_FAILED_EXIT)

    def asking_tick(self: daemon.Daemon) -> None:
        tick(self)
        if trigger.exists():
            trigger.unlink()
            self.thread.worker.ask("stuck-worker", stuck)  # on the loop thread, as every question is asked

    daemon.Daemon.tick = asking_tick  # type: ignore[method-assign]
    cfg = configmod.load(sys.argv[sys.argv.index("--config") + 1])
    logs.setup(cfg.log_level, cfg.log_format, [])
    _end_process(daemon.Daemon(cfg).run(), exporting=False)


if __name__ == "__main__":
    main()
