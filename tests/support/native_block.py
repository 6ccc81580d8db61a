"""A real daemon whose loop thread a test can hold inside a C call: ``python -m tests.support.native_block run
--config FILE``. When the file named by ``NATIVE_BLOCK_FILE`` appears, the next loop turn waits ``NATIVE_BLOCK_S``
seconds inside glibc, on a mutex it already holds (``pthread_mutex_clocklock`` on the monotonic clock: unlike a
sleep, a signal does not cut it short, as it does not cut a librdkafka ``thrd_join`` short), through ctypes with
the GIL released, and first writes ``<file>.in``. ``NATIVE_BLOCK_GRACE_S``, when set, replaces the daemon's stop
grace."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

from globald.common import logs
from globald.service import daemon
from globald.settings import config as configmod


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_CLOCK_MONOTONIC = 1


def hold_in_c(libc: ctypes.CDLL, seconds: int) -> None:
    mutex = ctypes.create_string_buffer(64)  # pthread_mutex_t is 40 bytes on x86_64 and aarch64 glibc
    assert libc.pthread_mutex_init(mutex, None) == 0
    assert libc.pthread_mutex_lock(mutex) == 0
    now = _Timespec()
    libc.clock_gettime(_CLOCK_MONOTONIC, ctypes.byref(now))
    deadline = _Timespec(now.tv_sec + seconds, now.tv_nsec)
    libc.pthread_mutex_clocklock(mutex, _CLOCK_MONOTONIC, ctypes.byref(deadline))  # ETIMEDOUT at the deadline


def main() -> int:
    if "NATIVE_BLOCK_GRACE_S" in os.environ:
        daemon.STOP_GRACE_S = float(os.environ["NATIVE_BLOCK_GRACE_S"])
    trigger, seconds = Path(os.environ["NATIVE_BLOCK_FILE"]), int(os.environ["NATIVE_BLOCK_S"])
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    tick = daemon.Daemon.tick

    def blocking_tick(self: daemon.Daemon) -> None:
        tick(self)
        if trigger.exists():
            trigger.unlink()
            Path(f"{trigger}.in").touch()
            hold_in_c(libc, seconds)  # the loop thread inside C: a stop must still be heard at once

    daemon.Daemon.tick = blocking_tick  # type: ignore[method-assign]
    cfg = configmod.load(sys.argv[sys.argv.index("--config") + 1])
    logs.setup(cfg.log_level, cfg.log_format, [])
    return daemon.Daemon(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
