"""Ctrl-C for the commands that start things and must remove them again (``globald demo``, ``globald dev``).

Contract: the first SIGINT or SIGTERM stops the command (a ``KeyboardInterrupt`` in the main thread). From then on,
and from the moment clean-up starts for any other reason (``cleaning_up``), every further one is noted on stderr
and otherwise ignored until the process exits. A second Ctrl-C (people press it twice when clean-up takes seconds,
and a terminal sends it to the whole process group) must neither cut the clean-up short, which would leave the
broker's JVMs and the work directory behind, nor change the exit status the first one decided (130 for the demo).
When clean-up is done, ``done`` leaves both signals ignored by the kernel until the process exits: CPython resets
a Python-level handler to the default action while the interpreter finalizes, so a Ctrl-C in those last
milliseconds would otherwise kill the process with SIGINT (exit -2) instead of letting it exit with its status.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NOTICE = b"globald: still cleaning up; further Ctrl-C is ignored until that is done\n"


class Interrupts:
    def __init__(self) -> None:
        self.received = 0
        self.cleaning = False

    def install(self) -> Interrupts:
        """Handle SIGINT and SIGTERM from now on (main thread only, as any Python signal handler)."""
        for s in SIGNALS:
            signal.signal(s, self._handle)
        return self

    def cleaning_up(self) -> None:
        """Clean-up starts: no signal may interrupt it any more."""
        self.cleaning = True

    def done(self) -> None:
        """Clean-up is over and the command returns its exit status: signals are ignored until the process ends."""
        self.cleaning = True
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if not self.cleaning:
            self.cleaning = True  # before raising: a second signal during the unwinding must not raise again
            raise KeyboardInterrupt
        # os.write, not print: a handler may run while the main thread is inside print itself (reentrant call).
        with contextlib.suppress(OSError):
            os.write(2, NOTICE)
