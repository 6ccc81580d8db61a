"""What RocksDB accounts to one store's memory, by kind: the status document's ``memory`` section (globald.ops.memory).

RocksDB's native memory is invisible to Python profilers, so the status carries the store's own accounting: a soak
can then tell a block cache warming up to its configured size (which levels off) from growth that does not.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocksdict import Rdict

# Integer properties summed over a store's column families (bytes). The block cache is shared by every family
# of a store (see store.options), so its usage is read once, not summed.
_PER_FAMILY = {
    "memtables": "rocksdb.cur-size-all-mem-tables",
    "table_readers": "rocksdb.estimate-table-readers-mem",
}
_SHARED = {
    "block_cache": "rocksdb.block-cache-usage",
    "block_cache_pinned": "rocksdb.block-cache-pinned-usage",
}


def usage(db: Rdict, families: Sequence[Rdict]) -> dict[str, int]:
    """Bytes by kind of ``db`` and its ``families``. Pass only long-lived family objects: one made just to ask
    would flush its family alone when dropped (see TableStore.estimate_keys)."""
    handles = [db, *families]
    out = {kind: sum(int(h.property_int_value(prop) or 0) for h in handles) for kind, prop in _PER_FAMILY.items()}
    out.update({kind: int(db.property_int_value(prop) or 0) for kind, prop in _SHARED.items()})
    return out
