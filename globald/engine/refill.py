"""Refilling a store that a wipe emptied while the daemon runs, from elsewhere than its topic (KIP-406 + issue 34).

A table wiped for an invalid offset, a recreated topic or a corrupt store would replay its whole topic. When a
``Refills`` source is configured (``[export] bootstrap``: the newest usable export), the loop holds the emptied
table back from its plan while the source works on a thread of its own, and takes its answer at a later turn:

- a *stage*, a complete store directory the source checked (checksums, offsets equal to its manifest's, topic,
  format), which the loop puts in place of the emptied store by one durable rename (``TableStore.replace_with``)
  before planning the table as any other: the plan's identity check reads the stage's fingerprints back;
- or nothing, and the table restores from its topic, as without a source.

The loop never waits for the source: it asks once, and looks at each turn. A wipe of the same table while its
refill is out cancels it, and what it staged is never installed. An operator's reset is not refilled: its
purpose is a replay of the topic (the source decides, by the wipe's kind).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from globald.engine.identity import TopicIdentity
from globald.engine.table import TableRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refilled:
    """A source's answer. ``stage``: a checked, complete store directory to put in place; None: use the topic."""

    stage: Path | None


class Refills(Protocol):
    """Where an emptied store may come from before its topic (implemented by ``export.refill``). Every method is
    called on the loop thread and returns at once; the work happens on the source's own threads."""

    def begin(self, table: str, kind: str) -> bool:
        """Start refilling ``table``, emptied by a wipe of ``kind``; False when the source does not refill it."""
        ...

    def result(self, table: str) -> Refilled | None:
        """The answer once it is in (asked once, after ``begin``); None while the source is at work."""
        ...

    def cancel(self, table: str) -> None:
        """Give the refill up; what it staged is removed and never installed."""
        ...


class Refiller:
    """The loop's side: which emptied tables wait for a refill, and putting a refilled store in place."""

    def __init__(self, source: Refills | None, identity: TopicIdentity) -> None:
        self._source = source
        self._identity = identity
        self._out: set[str] = set()  # tables whose refill was begun and not yet answered

    @property
    def on(self) -> bool:
        """A source is configured: a plan that wipes a table stops there, so that the table is refilled first."""
        return self._source is not None

    def hold(self, rt: TableRuntime) -> bool:
        """True while ``rt`` must not be planned: its refill is out. Begins one for a table a wipe emptied; once
        the answer is in, installs its stage. Raises the store's faults (the caller rewinds every table)."""
        if self._source is None:
            return False
        if rt.name not in self._out:
            kind, rt.emptied = rt.emptied, None
            if kind is None or not self._source.begin(rt.name, kind):
                return False
            self._out.add(rt.name)
        answer = self._source.result(rt.name)
        if answer is None:
            return True
        self._out.discard(rt.name)
        if answer.stage is not None:
            self._identity.cancel(rt.name)  # answers about the emptied store do not apply to the refilled one
            rt.store.replace_with(answer.stage)
            log.info("table %s: store refilled from %s; tailing the topic from %s", rt.name, answer.stage.name,
                     rt.store.offsets())
        return False

    def cancel(self, table: str) -> None:
        """``table`` was wiped again (or the loop ends): a refill still out is given up."""
        if self._source is not None and table in self._out:
            self._out.discard(table)
            self._source.cancel(table)

    def close(self) -> None:
        for table in sorted(self._out):
            self.cancel(table)
