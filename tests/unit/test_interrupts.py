"""The demo's interrupts (``embedded.interrupts``) as pure logic: an interrupt whose KeyboardInterrupt was dropped
on its way (CPython drops one raised while a finalizer runs) is raised again at the next check, once; clean-up
and a caught interrupt end that."""

from __future__ import annotations

import signal
import threading

import pytest

from globald.embedded.interrupts import Interrupts


def test_a_dropped_interrupt_is_raised_again_once_at_the_next_check_on_the_main_thread() -> None:
    i = Interrupts()
    i.check()  # nothing received: nothing raised
    with pytest.raises(KeyboardInterrupt):
        i._handle(signal.SIGINT, None)  # the first signal raises where the main thread is: say, in a finalizer
    raised: list[BaseException] = []

    def elsewhere() -> None:
        try:
            i.check()
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert raised == []  # never on another thread (the daemon's, printing a state change)
    with pytest.raises(KeyboardInterrupt):
        i.check()
    i.check()  # once


def test_a_caught_interrupt_or_the_clean_up_ends_the_checks() -> None:
    caught, cleaning = Interrupts(), Interrupts()
    for i in (caught, cleaning):
        with pytest.raises(KeyboardInterrupt):
            i._handle(signal.SIGINT, None)
    caught.acknowledged = True  # the command's own except KeyboardInterrupt
    cleaning.cleaning_up()
    caught.check()
    cleaning.check()
