"""The real daemon with metadata refreshes a test can hold back: ``python -m tests.reliability.hold_refresh run ...``.

A topic recreated between two refreshes is found by the next refresh's identity check; what the daemon applied and
published in between is what a test of that window must see. Waiting for the window on the clock races the
machine's speed, so the test holds it open instead: while the file named by ``GLOBALD_TEST_HOLD_REFRESH`` exists,
no metadata refresh (and with it no identity check) is asked of the cluster worker; everything else runs. Removing
the file lets the next refresh (``metadata_refresh_ms`` later at most) check the topic. Each refresh whose answer
the loop acted on is counted in ``<file>.made`` (one line each), so a test can wait for one, and each one skipped
in ``<file>.held`` once no refresh asked earlier is still out: from the first such line on, no check that began
before the file appeared is under way. The chaos campaign's hooks (``tests.midway``) work as with
``tests.chaos.entry``, which this wraps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from globald.engine import cluster_watch, identity
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
    watch, topics = cluster_watch.ClusterWatch, identity.TopicIdentity
    ask, turn, answer = watch._ask_refreshes, watch.turn, topics.refresh_answer
    answered = [0]  # refresh answers the watch acted on

    def refresh_answer(self: Any, rt: Any) -> Any:
        facts = answer(self, rt)
        if facts is not None and rt.assigned:  # the answers the watch acts on (ClusterWatch._refreshed)
            answered[0] += 1
        return facts

    def ask_refreshes(self: Any, applied: Mapping[str, Any]) -> None:
        path = os.environ.get(HOLD_ENV)
        if path and os.path.exists(path):
            # every refresh asked before the file appeared is answered and acted on
            if not any(self._identity.refresh_asked(name) for name in self._tables):
                with open(f"{path}.held", "a") as f:
                    f.write("held\n")
            return
        ask(self, applied)

    def counted_turn(self: Any, *args: Any) -> Any:
        before = answered[0]
        decisions = turn(self, *args)  # the loop acts on them before anything else of its turn
        path = os.environ.get(HOLD_ENV)
        if path and answered[0] > before:
            with open(f"{path}.made", "a") as f:
                f.write("refreshed\n")
        return decisions

    watch._ask_refreshes = ask_refreshes  # type: ignore[method-assign]
    watch.turn = counted_turn  # type: ignore[method-assign,assignment]
    topics.refresh_answer = refresh_answer  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    sys.exit(entry.main())
