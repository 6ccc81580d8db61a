"""Writing to a TableStore from a test, the way the daemon does: one batch with its offsets, made again on a stall."""

from __future__ import annotations

from collections.abc import Mapping

from globald.store.table_store import Batch, TableStore


def write_records(store: TableStore, records: Mapping[bytes, bytes | None], offsets: Mapping[int, int]) -> None:
    """Put each stored value (``None`` deletes its key) and ``offsets``, in one write."""

    def batch() -> Batch:
        b = store.new_batch()
        for key, stored in records.items():
            if stored is None:
                b.delete(key)
            else:
                b.put(key, stored)
        store.put_offsets(b, dict(offsets))
        return b

    store.write(batch(), rebuild=batch)
