"""SIGTERM and SIGINT (a stop) and SIGHUP (a reload, ``service.reload``) for ``globald run``: heard at once, and
acted on by a thread of their own, never inside the handler. SIGHUP is ignored from the moment ``run`` starts
(``cli.main``, before the allocator's re-exec, which keeps it), so it never ends the process, even before this
relay is in place; the relay only queues the reload, which is read and checked on a thread of its own.

CPython runs a Python-level signal handler on the main thread between two bytecodes. So such a handler is late or
never run: a main thread inside a C call (a client's close, a flush, a compaction wait) runs no bytecode until the
call returns. And where it does run, it runs wherever that thread is, including inside ``threading.Event.wait`` at
the moment it holds the event's lock again; the main loop spends its idle time in exactly that wait, on the stop
event, so a handler that set the same event waited for a lock its own thread held (a deadlock CI saw twice).

So the signal's number is written to a pipe by CPython's C-level handler itself (``signal.set_wakeup_fd``), at the
moment the signal arrives, whatever the main thread is doing; the Python-level handler does nothing. A relay thread
reads the pipe and calls ``on_signal`` there, where taking any lock is safe: the stop is seen, logged and its grace
timer armed within moments even while the main thread is held in C. (A C call that holds the GIL still delays the
relay; the daemon makes none that waits without a bound, see the architecture page's list.)
"""

from __future__ import annotations

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
    Python signal handler, and ``set_wakeup_fd``). On exit the previous handlers and wakeup fd are back and the relay
    thread has ended."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # required by set_wakeup_fd; a full pipe only drops a repeat of a stop
    wanted = {int(s) for s in signals}

    def handler(signum: int, frame: FrameType | None) -> None:
        """Nothing: the C-level handler already wrote ``signum`` to the wakeup pipe."""

    def relay() -> None:
        while data := os.read(read_end, 64):
            for signum in data:
                if signum in wanted:  # the wakeup fd hears every signal with a Python-level handler
                    on_signal(signum)

    thread = threading.Thread(target=relay, name="globald-signals", daemon=True)
    thread.start()
    old = {s: signal.signal(s, handler) for s in signals}
    old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, h in old.items():
            signal.signal(s, h)
        os.close(write_end)  # the relay reads what is left, then the end of the pipe, and returns
        thread.join(timeout=5.0)
        if not thread.is_alive():
            os.close(read_end)
