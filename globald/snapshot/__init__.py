"""Immutable, consistent snapshots of table stores: published by the daemon, opened read-only by readers.

``open_snapshot(state_dir, table)`` opens CURRENT (or a given id); ``resolve`` finds or requests a snapshot at
exact offsets. Layout and contracts are described in each module. In the daemon, ``publisher.SnapshotPublisher``
is the facade over periodic publishing (``publishing``), the request desk (``desk``) and retention
(``retention``); one table's state is ``table_state.SnapshotTable``.
"""

from globald.snapshot.reader import Snapshot, current_id, listing, open_snapshot
from globald.snapshot.resolve import Policy, Resolution, resolve

__all__ = ["Policy", "Resolution", "Snapshot", "current_id", "listing", "open_snapshot", "resolve"]
