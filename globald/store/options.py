"""RocksDB tuning for table stores, as a frozen dataclass turned into rocksdict ``Options``."""

from __future__ import annotations

from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options

from globald.config import StoreConfig


@dataclass(frozen=True)
class StoreOptions:
    block_cache_mb: int = 64
    write_buffer_mb: int = 32
    max_write_buffers: int = 3
    bloom_bits_per_key: float = 10.0

    @classmethod
    def from_config(cls, c: StoreConfig) -> StoreOptions:
        return cls(block_cache_mb=c.block_cache_mb, write_buffer_mb=c.write_buffer_mb,
                   max_write_buffers=c.max_write_buffers)

    def rocksdb(self, create: bool = True) -> Options:
        o = Options(raw_mode=True)
        o.create_if_missing(create)
        o.create_missing_column_families(create)
        # Data and offsets live in different column families; flushing them together keeps SSTs consistent
        # even where the WAL is not consulted (checkpoints, read-only opens of flushed files).
        o.set_atomic_flush(True)
        o.set_write_buffer_size(self.write_buffer_mb << 20)
        o.set_max_write_buffer_number(self.max_write_buffers)
        o.set_compression_type(DBCompressionType.lz4())
        o.set_keep_log_file_num(3)
        o.set_max_background_jobs(2)
        table = BlockBasedOptions()
        table.set_block_cache(Cache(self.block_cache_mb << 20))
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_cache_index_and_filter_blocks(True)
        o.set_block_based_table_factory(table)
        return o
