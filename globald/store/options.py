"""RocksDB tuning for table stores, as a frozen dataclass turned into rocksdict ``Options``.

Memory is bounded per table: one block cache shared by every column family (index and filter blocks charged to
it) and at most ``max_write_buffers`` memtables of ``write_buffer_mb`` for the values. The bulk-load variant
only changes how the values memtable is built (append now, sort at flush); what lands on disk is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, MemtableFactory, Options, WriteOptions

from globald.config import StoreConfig
from globald.store.names import COLUMN_FAMILIES, VALUES_CF

# Offsets and metadata hold a handful of keys: a small memtable keeps their arenas from costing memory.
_SMALL_FAMILY_BUFFER_MB = 1
_BULK_BACKGROUND_JOBS = 8


def write_options(disable_wal: bool = False, sync: bool = False) -> WriteOptions:
    o = WriteOptions()
    # Properties at run time; rocksdict's type stub declares them as methods.
    cast(Any, o).disable_wal = disable_wal
    cast(Any, o).sync = sync
    return o


@dataclass(frozen=True)
class StoreOptions:
    block_cache_mb: int = 64
    write_buffer_mb: int = 32
    max_write_buffers: int = 3
    bloom_bits_per_key: int = 10

    @classmethod
    def from_config(cls, c: StoreConfig) -> StoreOptions:
        return cls(block_cache_mb=c.block_cache_mb, write_buffer_mb=c.write_buffer_mb,
                   max_write_buffers=c.max_write_buffers)

    def rocksdb(self, create: bool = True, cache: Cache | None = None) -> Options:
        """Database-wide options (also those of the default family, which this format leaves empty)."""
        o = Options(raw_mode=True)
        o.create_if_missing(create)
        o.create_missing_column_families(create)
        # Data and offsets live in different column families; flushing them together keeps SSTs consistent
        # even where the WAL is not consulted (checkpoints, read-only opens, writes made with the WAL off).
        o.set_atomic_flush(True)
        # One writer thread per store; turning this off also allows the append-only memtable of bulk loads.
        o.set_allow_concurrent_memtable_write(False)
        o.set_write_buffer_size(self.write_buffer_mb << 20)
        o.set_max_write_buffer_number(self.max_write_buffers)
        o.set_compression_type(DBCompressionType.lz4())
        o.set_keep_log_file_num(3)
        o.set_max_background_jobs(2)
        table = BlockBasedOptions()
        table.set_block_cache(cache if cache is not None else Cache(self.block_cache_mb << 20))
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_cache_index_and_filter_blocks(True)
        o.set_block_based_table_factory(table)
        return o

    def column_families(self, bulk: bool = False) -> tuple[Options, dict[str, Options]]:
        """(database options, {family: options}) sharing one block cache.

        With ``bulk`` the values family appends to a vector memtable that is sorted once when flushed: a
        several-fold cheaper write while nothing reads the live memtable (a restore), and slow point reads.
        """
        cache = Cache(self.block_cache_mb << 20)
        families = {cf: self.rocksdb(cache=cache) for cf in COLUMN_FAMILIES}
        for cf, o in families.items():
            if cf != VALUES_CF:
                o.set_write_buffer_size(_SMALL_FAMILY_BUFFER_MB << 20)
        db = self.rocksdb(cache=cache)
        if bulk:
            families[VALUES_CF].set_memtable_factory(MemtableFactory.vector())
            # Sorting and writing the memtables is then the work left behind the writer: two flush threads (a
            # quarter of the background jobs) halve the backlog a restore waits for at its end.
            db.set_max_background_jobs(_BULK_BACKGROUND_JOBS)
        return db, families
