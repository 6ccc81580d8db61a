"""The state_dir's lock (``store.statedir``): looks at it never make a daemon taking it refuse to start, and an owner
is still found and refused."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from globald.common.errors import StateDirLockedError
from globald.store import statedir


def test_looks_at_the_lock_never_make_a_daemon_taking_it_refuse(tmp_path: Path) -> None:
    """CI, under load: a daemon started while its test polled for it (``lock_holder``, as ``globald status`` does)
    exited "owned by another globald". Here looks run without pause while the lock is taken and let go 200 times."""
    statedir.prepare_state_dir(tmp_path)
    stop = threading.Event()
    looks = 0

    def look() -> None:
        nonlocal looks
        while not stop.is_set():
            statedir.lock_holder(tmp_path)
            looks += 1

    lookers = [threading.Thread(target=look) for _ in range(2)]
    for t in lookers:
        t.start()
    try:
        for _ in range(200):
            statedir.lock_state_dir(tmp_path).close()
    finally:
        stop.set()
        for t in lookers:
            t.join(30)
    assert looks > 200  # the looks did overlap the takes


def test_an_owner_is_found_and_a_second_one_refused_after_the_grace(tmp_path: Path) -> None:
    statedir.prepare_state_dir(tmp_path)
    held = statedir.lock_state_dir(tmp_path)
    try:
        assert statedir.lock_holder(tmp_path) == str(os.getpid())
        with pytest.raises(StateDirLockedError, match="owned by another globald"):
            statedir.lock_state_dir(tmp_path)
        with pytest.raises(StateDirLockedError):
            statedir.refuse_if_owned(tmp_path)
    finally:
        held.close()
    assert statedir.lock_holder(tmp_path) is None
