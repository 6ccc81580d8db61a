"""A real daemon whose loop thread a test can hold inside a C call: ``python -m tests.support.native_block run
--config FILE``. When the file named by ``NATIVE_BLOCK_FILE`` appears, the next loop turn waits ``NATIVE_BLOCK_S``
seconds inside glibc, on a mutex it already holds (``pthread_mutex_clocklock`` on the monotonic clock: unlike a
sleep, a signal does not cut it short, as it does not cut a librdkafka ``thrd_join`` short), through ctypes with
the GIL released, and first writes ``<file>.in`` holding the hold's end on the monotonic clock (CLOCK_MONOTONIC, the
clock of Python's ``time.monotonic`` in every process): a signal heard before then was heard while inside C. A hold
that does not last (the call refused: ``HoldFailed``) ends the daemon with ``HOLD_FAILED_EXIT``, so that no test
passes on a daemon that was never held. ``NATIVE_BLOCK_GRACE_S``, when set, replaces the daemon's stop grace."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys
from pathlib import Path

from globald.common import logs
from globald.service import daemon
from globald.settings import config as configmod


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_CLOCK_MONOTONIC = 1
HOLD_FAILED_EXIT = 97


class HoldFailed(RuntimeError):
    """The C call meant to hold the thread returned otherwise than by timing out at its deadline (an error code, an
    early return): the test it serves would prove nothing. The message says what it returned; a glibc older than
    2.30 has no pthread_mutex_clocklock."""


def _check(what: str, rc: int) -> None:
    if rc != 0:
        raise HoldFailed(f"{what} returned {errno.errorcode.get(rc, rc)}")


def hold_deadline(libc: ctypes.CDLL, seconds: int, clock: int = _CLOCK_MONOTONIC) -> float:
    """The end of a hold of ``seconds`` starting now, in seconds on ``clock``."""
    now = _Timespec()
    if libc.clock_gettime(clock, ctypes.byref(now)) != 0:  # -1, the code in errno
        raise HoldFailed(f"clock_gettime returned {errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}")
    return now.tv_sec + seconds + now.tv_nsec / 1e9


def hold_in_c(libc: ctypes.CDLL, deadline_s: float, clock: int = _CLOCK_MONOTONIC) -> None:
    """Inside glibc until ``deadline_s`` on ``clock``; HoldFailed unless it timed out there."""
    mutex = ctypes.create_string_buffer(64)  # pthread_mutex_t is 40 bytes on x86_64 and aarch64 glibc
    _check("pthread_mutex_init", libc.pthread_mutex_init(mutex, None))
    _check("pthread_mutex_lock", libc.pthread_mutex_lock(mutex))
    deadline = _Timespec(int(deadline_s), int(deadline_s % 1 * 1e9))
    rc = libc.pthread_mutex_clocklock(mutex, clock, ctypes.byref(deadline))  # pthread functions return the errno
    end = _Timespec()
    libc.clock_gettime(clock, ctypes.byref(end))
    if rc != errno.ETIMEDOUT or end.tv_sec + end.tv_nsec / 1e9 < deadline_s - 1e-3:  # 1 ms: float rounding
        raise HoldFailed(f"pthread_mutex_clocklock returned {errno.errorcode.get(rc, rc)} "
                         f"{deadline_s - end.tv_sec - end.tv_nsec / 1e9:.3f} s before its deadline")


def main() -> int:
    if "NATIVE_BLOCK_GRACE_S" in os.environ:
        daemon.STOP_GRACE_S = float(os.environ["NATIVE_BLOCK_GRACE_S"])
    trigger, seconds = Path(os.environ["NATIVE_BLOCK_FILE"]), int(os.environ["NATIVE_BLOCK_S"])
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    tick = daemon.Daemon.tick

    def blocking_tick(self: daemon.Daemon) -> None:
        tick(self)
        if trigger.exists():
            trigger.unlink()
            deadline = hold_deadline(libc, seconds)
            Path(f"{trigger}.in").write_text(repr(deadline))
            try:
                hold_in_c(libc, deadline)  # the loop thread inside C: a stop must still be heard at once
            except HoldFailed as e:
                logging.getLogger("globald").error("NATIVE-BLOCK failed: %s", e)
                os._exit(HOLD_FAILED_EXIT)

    daemon.Daemon.tick = blocking_tick  # type: ignore[method-assign]
    cfg = configmod.load(sys.argv[sys.argv.index("--config") + 1])
    logs.setup(cfg.log_level, cfg.log_format, [])
    return daemon.Daemon(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
