"""Tables added, dropped and redeclared by a reload (``service.reload``), on the loop thread between two turns: the
engine owns the set of tables, and every other part follows it through the events emitted here (``TableAdded``,
``TableDropped``, ``TableRedeclared``), in the bus order the daemon fixed, instead of a call order kept by hand.

- **Redeclared**: the table takes its new declaration; ``TableRedeclared`` (nothing is replayed).

- **Added**: ``TableAdded`` first (every part makes its entry for the table, before its store opens and before its
  first ``StateChanged``); then its store is opened (empty the first time; a name dropped earlier had its directory
  deleted then), the update task routes its topic to it, and it is planned like a table at start: RESTORING,
  restored from its store's offsets while every other table keeps consuming and stays RUNNING. ``StateChanged``
  says so, with the reason ``added by a reload``, to the hooks and every subscriber.
- **Dropped**: it goes PENDING_SHUTDOWN then NOT_RUNNING with the reason ``dropped by a reload`` (as a stop
  does), its partitions are unassigned at once (nothing more of it is consumed), its questions to the cluster are
  dropped, its store is closed and its directory deleted (one durable rename first); ``TableDropped`` last (every
  part forgets it). Its snapshots are the snapshot side's (``snapshot.dropped``): kept for the readers whose
  leases hold them, deleted once none does.
- **Replaced** (another topic, typed or raw): dropped, then added again under its name, in that order.
"""

from __future__ import annotations

import logging
import shutil

from globald.common.states import State
from globald.engine.events import TableAdded, TableDropped, TableRedeclared
from globald.engine.loop import Loop
from globald.settings.changes import Delta
from globald.settings.config import TableConfig
from globald.store import durable
from globald.store.names import table_dir

log = logging.getLogger(__name__)

ADDED = "added by a reload"
DROPPED = "dropped by a reload"


def apply(loop: Loop, delta: Delta) -> None:
    """The tables ``delta`` changes: redeclared first, then the dropped (and the replaced, their old declaration),
    then the added (and the replaced, their new one)."""
    replaced = {tc.name for tc in delta.replaced}
    for tc in delta.redeclared:
        loop.manager.tables[tc.name].config = tc
        loop.emit(TableRedeclared(tc))
    for name in delta.stores_dropped:
        drop_table(loop, name, replaced=name in replaced)
    for tc in delta.stores_added:
        add_table(loop, tc)


def add_table(loop: Loop, tc: TableConfig) -> None:
    loop.emit(TableAdded(tc))  # before the store opens: an export may refill it (``export.refill``)
    manager = loop.manager
    stored, why = manager.open_table(tc)
    rt = manager.tables[tc.name]
    loop.task.add(rt)
    loop.task.start(tc.name, stored)
    loop.pending.add(tc.name)  # planned at the next turn, as every table is at start
    manager.restoring(rt, ADDED)
    log.info("table %s (topic %s) %s: restoring from %s", tc.name, tc.topic, ADDED,
             "its store's offsets" if stored else "the log start")
    if why is not None:  # the disk refused the store: like a store fault at start, every table waits for it
        loop.rewind_all(f"table {tc.name}: {why}")


def drop_table(loop: Loop, name: str, replaced: bool = False) -> None:
    manager = loop.manager
    rt = manager.tables[name]
    rt.machine.to(State.PENDING_SHUTDOWN, DROPPED)  # the hooks and subscribers hear it first, as at a stop
    rt.machine.to(State.NOT_RUNNING, DROPPED)
    loop.unassign(rt)  # at once: nothing more of its topic is fetched
    loop.refill.cancel(name)  # a refill still out would install into a table that is gone
    loop.identity.forget(name)
    loop.pending.discard(name)
    del manager.tables[name]
    loop.task.remove(name)
    loop.problems.resolved(name)
    try:
        rt.store.close(clean=False)  # its data is going: nothing to flush
    except Exception as e:  # a store that failed earlier: it is deleted all the same
        log.warning("table %s: close failed (%s); deleting it anyway", name, e)
    folder = table_dir(manager.config.state_dir, name)
    try:
        durable.remove_tree(folder)
    except OSError as e:  # the rename was refused (a failing disk): delete in place, so a re-add starts empty
        log.warning("table %s: cannot rename %s away (%s); deleting it in place", name, folder, e)
        shutil.rmtree(folder, ignore_errors=True)
    log.info("table %s %s: no longer consumed, its store deleted; its snapshots stay while readers lease them",
             name, DROPPED)
    loop.emit(TableDropped(name, replaced))  # last: every event of the table reached its parts before
