"""A reload applied all or nothing, by structure: every part a reload can fail in prepares first, and only once all
of them have does the config go in force and each commit.

- ``prepare(delta)`` does a part's fallible steps (bind a new HTTP address, make the new consumer, make an added
  table's snapshot folder) and keeps what it made aside: nothing of it shows yet. It raises to refuse the reload.
- ``abort()`` then undoes it, on every part, whichever prepared and whichever did not (a part that was never asked,
  or whose prepare raised half-way, finds nothing or little to undo): the config in force, its generation and every
  part stay as they were.
- ``commit()`` takes what was prepared, once the ``ConfigRef`` holds the new config; it does not fail on what a
  prepare could have checked. It returns what must run off the loop thread (a replaced listener's stop, a replaced
  hook runner's close), for the reload thread (``service.reload``).

The parts commit in the order the daemon lists them, which is the order of today's effects: the snapshot publisher,
the engine (whose table changes reach every subscriber as events, in the bus's order), then operations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from globald.settings.changes import Delta
from globald.settings.ref import ConfigRef

log = logging.getLogger(__name__)

Cleanup = Callable[[], None]


class Participant(Protocol):
    def prepare(self, delta: Delta) -> None: ...

    def commit(self) -> list[Cleanup]: ...

    def abort(self) -> None: ...


def apply(delta: Delta, ref: ConfigRef, parts: Sequence[Participant]) -> list[Cleanup]:
    """Prepare every part, then set ``ref`` and commit every part; or, when a prepare raises, abort every part and
    raise what it raised (``service.reload`` refuses the reload with it). Loop thread, between two turns."""
    try:
        for part in parts:
            part.prepare(delta)
    except BaseException:
        for part in reversed(parts):
            try:
                part.abort()
            except Exception:  # one abort failing must not keep the others from undoing theirs
                log.exception("reload: %s could not undo its prepared part; ignored", type(part).__name__)
        raise
    ref.set(delta.config)  # in force from here: clients made from now on take its [kafka]
    later: list[Cleanup] = []
    for part in parts:
        later += part.commit()
    return later
