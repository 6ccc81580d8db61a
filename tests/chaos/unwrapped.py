"""What the campaign's entry (``tests.chaos.entry``) reads in the daemon again and again, kept clear of the failure
points the campaign arms for the daemon: its arm file and the wall clock's offset (``SteppedClock``)."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time

CLOCK_REREAD_S = 1.0  # the Python-level clock re-reads its offset file at most this often


class UnwrappedFile:
    """A file of the campaign's that the daemon reads again and again (the arm, the clock's offset), read through
    ``openat(2)`` on a directory opened once, at start: libfiu wraps ``open`` but not ``openat``. Read with
    ``open()``, a failure point the campaign armed on ``open`` for the daemon failed the campaign's own read
    instead, and the caller kept its last value without a word: the clock re-reads its offset once a second, so a
    once-armed ``open`` fault was spent there more often than not (seed 10's "io-error open EIO once @ restore")."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self._dir: int | None = None
        self._open_dir()

    def _open_dir(self) -> None:
        with contextlib.suppress(OSError):  # not there yet: opened at the first read that finds it
            self._dir = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY | os.O_DIRECTORY)

    def read(self) -> bytes:
        if self._dir is None:
            self._open_dir()
        if self._dir is None:
            raise FileNotFoundError(self.path)
        fd = os.open(self.name, os.O_RDONLY, dir_fd=self._dir)  # openat: never a libfiu failure point
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


class SteppedClock:
    """``time.time`` and ``time.time_ns`` shifted by the offset in a file, re-read at most once a second (as
    libfaketime does with FAKETIME_CACHE_DURATION=1). Every wall-clock read of globald goes through these two;
    the monotonic clock, native libraries and the kernel keep the real time (see tools.py for why not libfaketime).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = UnwrappedFile(path)  # not open(): see UnwrappedFile
        self._real_ns = time.time_ns
        self._monotonic = time.monotonic
        self._offset_ns = 0
        self._next_read = 0.0
        self._read_at = -math.inf  # when the file was last read (monotonic), for ``in_force_after``

    def offset_ns(self) -> int:
        now = self._monotonic()
        if now >= self._next_read:
            self._next_read = now + CLOCK_REREAD_S
            try:
                self._offset_ns = int(float(self._file.read().decode().strip() or "0") * 1_000_000_000)
                self._read_at = now
            except (OSError, ValueError):  # read half-written (the campaign replaces it whole): the last offset
                pass
        return self._offset_ns

    def in_force_after(self, since: float) -> int:
        """The offset in force once the file has been read at or after ``since`` (a monotonic time). Waits out the
        cache rather than cutting it short, so the daemon's other threads see the clock as they would have; at most
        two re-read intervals (a file that cannot be read: the last offset)."""
        deadline = since + 2 * CLOCK_REREAD_S
        pause = threading.Event()  # as the hold waits: the daemon's own sleeps are left alone
        while self._read_at < since:
            now = self._monotonic()
            if now >= deadline:
                break
            pause.wait(min(max(self._next_read - now, 0.0), deadline - now))
            self.offset_ns()
        return self._offset_ns

    def time(self) -> float:
        return (self._real_ns() + self.offset_ns()) / 1e9

    def time_ns(self) -> int:
        return self._real_ns() + self.offset_ns()

    def install(self) -> None:
        time.time = self.time
        time.time_ns = self.time_ns
