"""A real daemon whose loop thread a test can hold inside a C call: ``python -m tests.support.native_block run
--config FILE``. When the file named by ``NATIVE_BLOCK_FILE`` appears, the next loop turn waits inside glibc until
the file ``<file>.release`` appears or ``NATIVE_BLOCK_S`` seconds have passed: on a condition variable
(``pthread_cond_clockwait`` on the monotonic clock: unlike a sleep, a signal does not cut it short, as it does not
cut a librdkafka ``thrd_join`` short), through ctypes with the GIL released, and first writes ``<file>.in`` holding
the hold's deadline on the monotonic clock (CLOCK_MONOTONIC, the clock of Python's ``time.monotonic`` in every
process). A test that releases the hold itself, once it has seen what it waits for, knows the thread was inside C
until then, and waits no fixed time for a deadline. A hold that does not last (the call refused, or woken by neither
its release nor its deadline: ``HoldFailed``) ends the daemon with ``HOLD_FAILED_EXIT``, so that no test passes on a
daemon that was never held. ``NATIVE_BLOCK_GRACE_S``, when set, replaces the daemon's stop grace."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys
import threading
import time
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


class Hold:
    """One hold inside glibc, which another thread may end early (``release``): a condition variable nobody signals
    but ``release``, waited on with a deadline."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self.libc = libc
        # pthread_mutex_t is 40 bytes and pthread_cond_t 48 on x86_64 and aarch64 glibc
        self.mutex, self.cond = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
        self.released = False  # read and written with the mutex held
        _check("pthread_mutex_init", libc.pthread_mutex_init(self.mutex, None))
        _check("pthread_cond_init", libc.pthread_cond_init(self.cond, None))

    def wait(self, deadline_s: float, clock: int = _CLOCK_MONOTONIC) -> bool:
        """Inside glibc until released (True) or until ``deadline_s`` on ``clock`` (False); HoldFailed when the call
        returned otherwise (an error code, a wake-up that was neither)."""
        libc = self.libc
        deadline = _Timespec(int(deadline_s), int(deadline_s % 1 * 1e9))
        _check("pthread_mutex_lock", libc.pthread_mutex_lock(self.mutex))
        try:
            # pthread functions return the errno; glibc resumes the wait after a signal handler, never returns EINTR
            rc = 0 if self.released else libc.pthread_cond_clockwait(self.cond, self.mutex, clock,
                                                                     ctypes.byref(deadline))
            released = self.released
        finally:
            libc.pthread_mutex_unlock(self.mutex)
        if released:
            return True
        end = _Timespec()
        libc.clock_gettime(clock, ctypes.byref(end))
        if rc != errno.ETIMEDOUT or end.tv_sec + end.tv_nsec / 1e9 < deadline_s - 1e-3:  # 1 ms: float rounding
            raise HoldFailed(f"pthread_cond_clockwait returned {errno.errorcode.get(rc, rc)} "
                             f"{deadline_s - end.tv_sec - end.tv_nsec / 1e9:.3f} s before its deadline, unreleased")
        return False

    def release(self) -> None:
        _check("pthread_mutex_lock", self.libc.pthread_mutex_lock(self.mutex))
        self.released = True
        self.libc.pthread_cond_signal(self.cond)
        self.libc.pthread_mutex_unlock(self.mutex)


def hold_in_c(libc: ctypes.CDLL, deadline_s: float, clock: int = _CLOCK_MONOTONIC) -> None:
    """Inside glibc until ``deadline_s`` on ``clock``; HoldFailed unless it timed out there."""
    Hold(libc).wait(deadline_s, clock)


def _release_when(path: Path, hold: Hold) -> None:
    """The hold's other thread: it ends the hold once ``path`` appears (the test's word)."""
    while not path.exists():
        time.sleep(0.05)
    hold.release()


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
            hold = Hold(libc)
            threading.Thread(target=_release_when, args=(Path(f"{trigger}.release"), hold), daemon=True).start()
            deadline = hold_deadline(libc, seconds)
            Path(f"{trigger}.in").write_text(repr(deadline))
            try:
                hold.wait(deadline)  # the loop thread inside C: a stop must still be heard at once
            except HoldFailed as e:
                logging.getLogger("globald").error("NATIVE-BLOCK failed: %s", e)
                os._exit(HOLD_FAILED_EXIT)

    daemon.Daemon.tick = blocking_tick  # type: ignore[method-assign]
    cfg = configmod.load(sys.argv[sys.argv.index("--config") + 1])
    logs.setup(cfg.log_level, cfg.log_format, [])
    return daemon.Daemon(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
