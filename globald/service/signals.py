"""SIGTERM and SIGINT for ``globald run``: acted on by a thread of their own, never inside the handler.

CPython runs a Python-level signal handler on the main thread between two bytecodes, wherever that thread is,
including inside ``threading.Event.wait`` at the moment it holds the event's lock again (``Condition.wait`` re-
acquiring it). The main loop spends its idle time in exactly that wait, on the stop event. A handler that sets the
same event then waits for a lock its own thread holds, and the daemon never stops: it logs "SIGTERM received" and
hangs until the stop grace's timer or the service manager's SIGKILL ends it. Logging takes locks too.

So the handler here takes no lock: it writes the signal's number to a pipe (``os.write`` is async-signal-safe; the
write end does not block, and a full pipe only drops a repeat of a stop already on its way), and a relay thread
reads the pipe and calls ``on_signal`` where taking any lock is safe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def relayed(on_signal: Callable[[int], None], signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """While inside, each of ``signals`` calls ``on_signal(signum)`` on a relay thread. Main thread only (as any
    Python signal handler). On exit the previous handlers are back and the relay thread has ended."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # a full pipe: a stop is already queued
            os.write(write_end, bytes([signum]))

    def relay() -> None:
        while data := os.read(read_end, 64):
            for signum in data:
                on_signal(signum)

    thread = threading.Thread(target=relay, name="globald-signals", daemon=True)
    thread.start()
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        os.close(write_end)  # the relay reads what is left, then the end of the pipe, and returns
        thread.join(timeout=5.0)
        if not thread.is_alive():
            os.close(read_end)
