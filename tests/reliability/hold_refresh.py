"""The real daemon with metadata refreshes a test can hold back: ``python -m tests.reliability.hold_refresh run ...``.

A topic recreated between two refreshes is found by the next refresh's identity check; what the daemon applied and
published in between is what a test of that window must see. Waiting for the window on the clock races the
machine's speed, so the test holds it open instead: while the file named by ``GLOBALD_TEST_HOLD_REFRESH`` exists,
the loop's metadata refresh (and with it the identity check) is skipped; everything else runs. Removing the file
lets the next refresh (``metadata_refresh_ms`` later at most) check the topic. Each refresh made is counted in
``<file>.made`` (one line each), so a test can wait for one, and each one skipped in ``<file>.held``: once one
is, no refresh that began before the file appeared is still under way (the loop makes them one at a time). The
chaos campaign's hooks (``tests.midway``) work as with ``tests.chaos.entry``, which this wraps.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from globald.engine import loop
from tests.chaos import entry

HOLD_ENV = "GLOBALD_TEST_HOLD_REFRESH"


def made(path: str | os.PathLike[str], what: str = "made") -> int:
    """How many refreshes the daemon held by ``path`` has made so far (``what="held"``: skipped)."""
    try:
        with open(f"{os.fspath(path)}.{what}") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def install() -> None:
    original = loop.Loop._refresh_metadata

    def refresh(self: Any) -> None:
        path = os.environ.get(HOLD_ENV)
        if path and os.path.exists(path):
            with open(f"{path}.held", "a") as f:  # a refresh under way when the file appeared is over by now
                f.write("held\n")
            return
        original(self)
        if path:
            with open(f"{path}.made", "a") as f:
                f.write("refreshed\n")

    loop.Loop._refresh_metadata = refresh  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    sys.exit(entry.main())
