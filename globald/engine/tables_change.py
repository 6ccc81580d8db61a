"""Tables added, dropped and redeclared by a reload (``service.reload``), on the loop thread between two turns: the
engine's set of tables (``engine.tables.TableSet``) changes, and every other part follows it through the events it
emits (``TableAdded``, ``TableDropped``, ``TableRedeclared``), in the bus order the daemon fixed, instead of a call
order kept by hand. What each change does is ``TableSet``'s; here, only their order.

- **Replaced** (another topic, typed or raw, history added): dropped, then added again under its name, in that
  order.
- **Windowed** (a versioned table's new window): its store takes the window in place, then it is redeclared (once,
  typed or not), so the publisher's next version carries the window and the since it moved to.
- **Unversioned** (a versioned table's history removed): its store drops its history in place, then it is
  redeclared, so the publisher's next version is a plain table's.
"""

from __future__ import annotations

from globald.engine.tables import TableSet
from globald.settings.changes import Delta


def apply(tables: TableSet, delta: Delta) -> None:
    """The tables ``delta`` changes: windowed, unversioned and redeclared first, then the dropped (and the
    replaced, their old declaration), then the added (and the replaced, their new one)."""
    replaced = {tc.name for tc in delta.replaced}
    for tc in delta.windowed:
        tables.rewindow(tc)
    for tc in delta.unversioned:
        tables.unversion(tc)
    redeclared = {tc.name for tc in delta.redeclared}
    for tc in (*delta.redeclared, *(tc for tc in delta.windowed if tc.name not in redeclared), *delta.unversioned):
        tables.redeclare(tc)
    for name in delta.stores_dropped:
        tables.drop(name, replaced=name in replaced)
    for tc in delta.stores_added:
        tables.add(tc)
