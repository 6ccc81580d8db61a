"""The engine's one set of tables (``TableSet``): each table's runtime, the routes from topics to tables, and the
only way a table joins or leaves the set while the daemon runs (a reload: ``add``, ``drop``, ``redeclare``), each
change announced on the bus (``TableAdded``, ``TableDropped``, ``TableRedeclared``).

The state manager opens the stores at start and registers them here; the loop drives the changes (``drive``: what
of the loop a change needs, handed over by the loop itself, once). What is per table elsewhere stays there and
follows the set through its events (see ``docs/architecture.md``, "Where to change what"):

- the update task's positions, fingerprints and counts (``engine.update_task``): what it applied, not who exists;
- the loop's tables waiting for their plan (``Loop.pending``): a queue of the loop's turns, not a registry;
- each part's own state of a table, made on ``TableAdded`` and forgotten on ``TableDropped``: the snapshots'
  versions and folders (``snapshot.publisher``, which outlive the table for their readers' leases), the export
  schedule and origin (``export.service``), the decode throttle (``ops.decoding``). None of them decides which
  tables exist.

A reload's changes:

- **Redeclared**: the table takes its new declaration; ``TableRedeclared`` (nothing is replayed).
- **Windowed**: a versioned table's new ``history`` window, taken by its store in place (``rewindow``): every
  version it holds stays, the pruning takes the new window from the next batch, ``since`` moves forward at once
  when the window shrinks and stays when it grows (``store.history.windowed_since``); then ``TableRedeclared``
  (the next publish carries the new window and since). Nothing is replayed.
- **Unversioned**: a versioned table's ``history`` removed, in place (``unversion``): its latest values, offsets and
  state stay (RUNNING stays RUNNING, nothing is replayed), its store drops the history as a restart does
  (``store.history.forget``: the marks, then the family); then ``TableRedeclared`` (the next publish is plain).
- **Added**: ``TableAdded`` first (every part makes its entry for the table, before its store opens and before its
  first ``StateChanged``); then its store is opened (empty the first time; a name dropped earlier had its directory
  deleted then), its topic is routed to it, and it is planned like a table at start: RESTORING, restored from its
  store's offsets while every other table keeps consuming and stays RUNNING. ``StateChanged`` says so, with the
  reason ``added by a reload``, to the hooks and every subscriber.
- **Dropped**: it goes PENDING_SHUTDOWN then NOT_RUNNING with the reason ``dropped by a reload`` (as a stop
  does), its partitions are unassigned at once (nothing more of it is consumed), its questions to the cluster are
  dropped, its store is closed and its directory deleted (one durable rename first); ``TableDropped`` last (every
  part forgets it). Its snapshots are the snapshot side's (``snapshot.dropped``): kept for the readers whose
  leases hold them, deleted once none does.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from globald.common.errors import StoreUnavailableError
from globald.common.states import State
from globald.engine.events import Emit, TableAdded, TableDropped, TableRedeclared
from globald.engine.identity import TopicIdentity
from globald.engine.problems import Problems
from globald.engine.refill import Refiller
from globald.engine.table import TableRuntime
from globald.settings.config import Config, TableConfig
from globald.settings.spec import duration_text
from globald.store import durable
from globald.store.failures import STORE_FAULTS
from globald.store.history import time_text
from globald.store.names import table_dir

log = logging.getLogger(__name__)

ADDED = "added by a reload"
DROPPED = "dropped by a reload"


class Stores(Protocol):
    """What a change asks of the state manager (which holds the set: named here, not imported)."""

    @property
    def config(self) -> Config: ...

    def open_table(self, tc: TableConfig) -> tuple[dict[int, int], str | None]: ...

    def restoring(self, rt: TableRuntime, why: str) -> None: ...


class Positions(Protocol):
    """What a change asks of the update task (which routes through the set: named here, not imported)."""

    def add(self, name: str) -> None: ...

    def start(self, table: str, positions: Mapping[int, int]) -> None: ...

    def remove(self, name: str) -> None: ...


@dataclass(frozen=True)
class Driver:
    """What of the loop a change of the set needs, handed over by the loop when it starts (``TableSet.drive``)."""

    manager: Stores  # opens a table's store (and registers it here)
    task: Positions  # a table's positions
    identity: TopicIdentity  # a table's questions to the cluster
    refill: Refiller  # a refill still out for a table
    problems: Problems  # a table's backoff
    emit: Emit
    pending: set[str]  # the loop's tables waiting for their plan
    unassign: Callable[[TableRuntime], None]
    rewind_all: Callable[[str], None]


class TableSet(Mapping[str, TableRuntime]):
    """Every table the engine mirrors, by name, and by topic for the update task's routes."""

    def __init__(self) -> None:
        self._tables: dict[str, TableRuntime] = {}
        self._by_topic: dict[str, TableRuntime] = {}
        self._changed = False  # a reload added or dropped a table since the start
        self._driver: Driver | None = None

    @classmethod
    def of(cls, runtimes: Iterable[TableRuntime]) -> TableSet:
        """A set of ``runtimes`` whose stores are open already (tests, benchmarks)."""
        tables = cls()
        for rt in runtimes:
            tables.register(rt)
        return tables

    def __getitem__(self, name: str) -> TableRuntime:
        return self._tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def register(self, rt: TableRuntime) -> None:
        """A table whose store the state manager is opening (at start, or by ``add``)."""
        self._tables[rt.name] = rt
        self._by_topic[rt.topic] = rt

    # -- the update task's routes -------------------------------------------------------------------------------

    def route(self, topic: str) -> TableRuntime | None:
        """The table a record of ``topic`` goes to; None for a topic no table mirrors (a dropped table's, still
        queued in the consumer)."""
        return self._by_topic.get(topic)

    @property
    def only_topic(self) -> str | None:
        """The one topic, when the set is one table and no reload changed it: the consumer is assigned only the
        tables' topics, so every record is of it. None once a table was added or dropped, even if one is left: a
        record of a dropped table's topic still queued must never be taken for another's."""
        if self._changed or len(self._by_topic) != 1:
            return None
        return next(iter(self._by_topic))

    # -- changes (a reload's, on the loop thread between two turns) ---------------------------------------------

    def drive(self, driver: Driver) -> None:
        """Take the loop that changes the set from now on (the loop, when it starts)."""
        self._driver = driver

    @property
    def _loop(self) -> Driver:
        assert self._driver is not None, "the tables change on the loop thread, once the loop runs"
        return self._driver

    def redeclare(self, tc: TableConfig) -> None:
        self._tables[tc.name].config = tc  # same topic: its route stands
        self._loop.emit(TableRedeclared(tc))

    def rewindow(self, tc: TableConfig) -> None:
        """Take ``tc``'s new ``history`` window in place (the module docstring); its ``redeclare`` follows."""
        rt = self._tables[tc.name]
        before_ms, window_ms = rt.config.history, tc.history
        assert before_ms is not None and window_ms is not None
        rt.config = tc
        try:
            was, since = rt.store.history_window(window_ms)
        except StoreUnavailableError as e:
            # Nothing is pruned but by a batch, which moves since in the same write: the since stored stays exact.
            log.warning("table %s: the new history window could not be marked in its store (%s); since moves "
                        "with its next batch", tc.name, e)
            was = since = None
        if since is None or was is None:
            what = "no since to move yet"
        elif since == was:
            what = f"since kept at {time_text(since)}"
        else:
            what = f"since moved to {time_text(since)} (was {time_text(was)})"
        log.info("history window of %s changed %s -> %s in place; %s", tc.name, duration_text(before_ms),
                 duration_text(window_ms), what)

    def unversion(self, tc: TableConfig) -> None:
        """Take ``tc``, a versioned table's declaration without ``history``, in place (the module docstring); its
        ``redeclare`` follows."""
        rt = self._tables[tc.name]
        before_ms = rt.config.history
        assert before_ms is not None and tc.history is None
        rt.config = tc
        try:
            rt.store.history_removed()
        except STORE_FAULTS as e:
            # Marks or family not dropped: closed, the store is reopened by the recovery (as after a failed write),
            # without history, which drops the rest at its open (store.history.adopt); nothing publishes it before.
            try:
                rt.store.close(clean=False)
            except Exception as closing:  # released all the same
                log.warning("table %s: close reported: %s", tc.name, closing)
            self._loop.rewind_all(f"table {tc.name}: dropping its history: {e}")
            return
        log.info("history (%s) of %s removed in place: its latest values kept, its versions dropped",
                 duration_text(before_ms), tc.name)

    def add(self, tc: TableConfig) -> None:
        loop = self._loop
        loop.emit(TableAdded(tc))  # before the store opens: an export may refill it (``export.refill``)
        self._changed = True
        stored, why = loop.manager.open_table(tc)  # registered here
        rt = self._tables[tc.name]
        loop.task.add(tc.name)
        loop.task.start(tc.name, stored)
        loop.pending.add(tc.name)  # planned at the next turn, as every table is at start
        loop.manager.restoring(rt, ADDED)
        log.info("table %s (topic %s) %s: restoring from %s", tc.name, tc.topic, ADDED,
                 "its store's offsets" if stored else "the log start")
        if why is not None:  # the disk refused the store: like a store fault at start, every table waits for it
            loop.rewind_all(f"table {tc.name}: {why}")

    def drop(self, name: str, replaced: bool = False) -> None:
        """``replaced``: its ``add`` under the same name, with its new declaration, follows at once."""
        loop = self._loop
        rt = self._tables[name]
        rt.machine.to(State.PENDING_SHUTDOWN, DROPPED)  # the hooks and subscribers hear it first, as at a stop
        rt.machine.to(State.NOT_RUNNING, DROPPED)
        loop.unassign(rt)  # at once: nothing more of its topic is fetched
        loop.refill.cancel(name)  # a refill still out would install into a table that is gone
        loop.identity.forget(name)
        loop.pending.discard(name)
        self._changed = True
        del self._tables[name]
        self._by_topic = {topic: t for topic, t in self._by_topic.items() if t.name != name}
        loop.task.remove(name)
        loop.problems.resolved(name)
        try:
            rt.store.close(clean=False)  # its data is going: nothing to flush
        except Exception as e:  # a store that failed earlier: it is deleted all the same
            log.warning("table %s: close failed (%s); deleting it anyway", name, e)
        folder = table_dir(loop.manager.config.state_dir, name)
        try:
            durable.remove_tree(folder)
        except OSError as e:  # the rename was refused (a failing disk): delete in place, so a re-add starts empty
            log.warning("table %s: cannot rename %s away (%s); deleting it in place", name, folder, e)
            shutil.rmtree(folder, ignore_errors=True)
        log.info("table %s %s: no longer consumed, its store deleted; its snapshots stay while readers lease them",
                 name, DROPPED)
        loop.emit(TableDropped(name, replaced))  # last: every event of the table reached its parts before
