"""Ctrl-C for the commands that start things and must remove them again (``globald demo``, ``globald dev``).

Contract: the first SIGINT or SIGTERM stops the command (a ``KeyboardInterrupt`` in the main thread). From then on,
and from the moment clean-up starts for any other reason (``cleaning_up``), every further one is noted on stderr
and otherwise ignored until the process exits. A second Ctrl-C (people press it twice when clean-up takes seconds,
and a terminal sends it to the whole process group) must neither cut the clean-up short, which would leave the
broker's JVMs and the work directory behind, nor change the exit status the first one decided (130 for the demo).
When clean-up is done, ``done`` leaves both signals ignored by the kernel until the process exits: CPython resets
a Python-level handler to the default action while the interpreter finalizes, so a Ctrl-C in those last
milliseconds would otherwise kill the process with SIGINT (exit -2) instead of letting it exit with its status.

What such a command starts runs in process groups of its own (``start_new_session``: the terminal's Ctrl-C reaches
the command, which stays in charge of stopping them). ``stop_groups(child_groups())`` at the end of clean-up stops
every such group still there, found from ``/proc``, so that a child whose start was cut short, before the code that
started it learnt its PID (PySpark's JVM during ``getOrCreate``), is not left running with parent PID 1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NOTICE = b"globald: still cleaning up; further Ctrl-C is ignored until that is done\n"
STOP_TIMEOUT_S = 20.0  # SIGTERM, then SIGKILL: a JVM's shutdown hooks take a second or two, a loaded machine more


class Interrupts:
    def __init__(self) -> None:
        self.received = 0
        self.cleaning = False
        self.acknowledged = False  # the command's handler caught the KeyboardInterrupt the first signal raised

    def check(self) -> None:
        """On the main thread, at a point where the command may stop: raise the KeyboardInterrupt again when the
        one the first signal raised never reached the command. CPython drops an exception raised while a finalizer
        or a garbage-collection callback runs ("Exception ignored in"), and the command then ran on to its end."""
        if self.received and not self.acknowledged and threading.current_thread() is threading.main_thread():
            self.acknowledged = True
            raise KeyboardInterrupt

    def install(self) -> Interrupts:
        """Handle SIGINT and SIGTERM from now on (main thread only, as any Python signal handler)."""
        for s in SIGNALS:
            signal.signal(s, self._handle)
        return self

    def cleaning_up(self) -> None:
        """Clean-up starts: no signal may interrupt it any more (nor ``check``)."""
        self.cleaning = True
        self.acknowledged = True

    def done(self) -> None:
        """Clean-up is over and the command returns its exit status: signals are ignored until the process ends."""
        self.cleaning = self.acknowledged = True
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


def child_groups() -> set[int]:
    """The process groups led by this process's children: the children started in a session of their own."""
    me, found = os.getpid(), set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the command name, in parentheses, may hold spaces
        if int(fields[1]) == me and int(fields[2]) == int(proc.name):
            found.add(int(proc.name))
    return found


def stop_groups(groups: Iterable[int], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to each whole group, then SIGKILL to what is left after ``timeout``; returns when all are gone.
    Each group's leader is this process's child (``child_groups``), reaped here; never this process's own group."""
    pending = set(groups) - {os.getpgid(0)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in pending:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            pending = {g for g in pending if _group_alive(g)}
            if pending:
                time.sleep(0.1)
        if not pending:
            return


def _group_alive(group: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(group, os.WNOHANG)  # the leader, once it exits, is a zombie until reaped
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
