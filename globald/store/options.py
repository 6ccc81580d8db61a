"""RocksDB tuning for table stores, as a frozen dataclass turned into rocksdict ``Options``.

Memory is bounded per table: one block cache shared by every column family (index and filter blocks charged to
it) and at most ``max_write_buffers`` memtables of ``write_buffer_mb`` for the values. The bulk-load variant
changes how the values memtables are built (smaller ones within the same memory, appended to now and sorted at
flush) and when compaction runs (not before ``bulk_l0_mb`` of flushed memtables have piled up in L0); what lands
on disk is the same data in other files. Neither changes what a crash leaves: flushes stay atomic across
families, and compactions only rewrite flushed files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, MemtableFactory, Options

from globald.store.names import COLUMN_FAMILIES, HISTORY_CF, ORIGINS_CF, VALUES_CF

if TYPE_CHECKING:  # only a type: at run time the store imports nothing above it (config imports kafka)
    from globald.settings.config import StoreConfig

# Offsets and metadata hold a handful of keys: a small memtable keeps their arenas from costing memory.
_SMALL_FAMILY_BUFFER_MB = 1
_BULK_BACKGROUND_JOBS = 8
# RocksDB's default, spelled out: a bulk load's L0 pile starts compacting no earlier than this many files.
L0_COMPACTION_TRIGGER = 4
# Outside bulk loads L0 is merged down once it holds this many files (a snapshot a second flushes one each): twice
# RocksDB's default halves how often the base level is rewritten (write amplification 5.7 -> 4.1 under churn).
STEADY_L0_TRIGGER = 8
# The history family's L0 is merged down at this many files: each merge of L0 rewrites the base level below it
# (versions of every key: each flush overlaps all of it), so four times fewer merges cut the family's compaction
# writes under the churn load by a third in 40 s (114 -> 74 MB) and by two thirds in 120 s (778 -> 266 MB;
# docs/as-of.md, Disk).
# Its seeks look into up to this many more files (no bloom filter there either way: store.history.as_of).
HISTORY_L0_TRIGGER = 32
# L0 files at which writes slow down / stop: RocksDB's margins (20, 36) above the files a bulk load may leave, so
# the writes that follow a load never wait for its merge. During a load, past its bound, compaction of L0 lags
# behind the flushes for a while: writes slow down at twice the bound and stop at three times.
_L0_SLOWDOWN_MARGIN = 20
_L0_STOP_MARGIN = 36
_BULK_L0_SLOWDOWN_FACTOR = 2
_BULK_L0_STOP_FACTOR = 3


@dataclass(frozen=True)
class StoreOptions:
    block_cache_mb: int = 64
    write_buffer_mb: int = 32
    max_write_buffers: int = 3
    bloom_bits_per_key: int = 10
    # A bulk load's values memtables (at most write_buffer_mb), as many of them as fit the same memory. What is
    # still unflushed when the last record arrives is flushed before RUNNING: small memtables keep that tail short
    # (a 1M-record restore's last flush: 250-280 ms at 32 MiB, 50-75 ms at 8 MiB), and a sort within a few MiB
    # stays in the CPU's cache (at 10M the flushes took a quarter less CPU).
    bulk_write_buffer_mb: int = 8
    # A bulk load compacts only once this many MiB of flushed memtables have piled up in L0. Leveled compaction
    # merges each handful of flushes into the levels below again and again, rewriting the whole table several
    # times during a restore: at 10M records that was a third of the restore's CPU. After the load the store's
    # usual compaction merges the files left behind in one pass, in the background while the table is served.
    # The bound keeps the open files and a point read's filter probes of a very large load in check.
    bulk_l0_mb: int = 2048
    # Leveled compaction's shape outside bulk loads (``compaction_gate.shape`` scales it with the table; None:
    # RocksDB's defaults, 256 and 64 MiB). RocksDB's defaults keep a table under 256 MiB in one file of one level,
    # and an L0 compaction then rewrites all of it, every few snapshots while they still link the old copy (issue
    # 33: 2.08 x live and a write amplification of 15.1 under churn). Measured in docs/operations/disk-space.md.
    level_base_mb: int | None = None
    target_file_mb: int | None = None
    l0_trigger: int = STEADY_L0_TRIGGER

    @classmethod
    def from_config(cls, c: StoreConfig) -> StoreOptions:
        return cls(block_cache_mb=c.block_cache_mb, write_buffer_mb=c.write_buffer_mb,
                   max_write_buffers=c.max_write_buffers)

    @property
    def bulk_buffer_mb(self) -> int:
        return min(self.write_buffer_mb, self.bulk_write_buffer_mb)

    @property
    def bulk_l0_files(self) -> int:
        """L0 files at which a bulk load's first compaction starts."""
        return max(L0_COMPACTION_TRIGGER, self.bulk_l0_mb // self.bulk_buffer_mb)

    def rocksdb(self, create: bool = True, cache: Cache | None = None, bloom: bool = True) -> Options:
        """Database-wide options (also those of the default family, which this format leaves empty); without
        ``bloom`` no bloom filter (a family read by seeks alone, which a whole-key filter never answers)."""
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
        o.set_level_zero_file_num_compaction_trigger(self.l0_trigger)
        if self.level_base_mb is not None:
            o.set_max_bytes_for_level_base(self.level_base_mb << 20)
        if self.target_file_mb is not None:
            o.set_target_file_size_base(self.target_file_mb << 20)

        o.set_level_zero_slowdown_writes_trigger(self.bulk_l0_files + _L0_SLOWDOWN_MARGIN)
        o.set_level_zero_stop_writes_trigger(self.bulk_l0_files + _L0_STOP_MARGIN)
        table = BlockBasedOptions()
        table.set_block_cache(cache if cache is not None else Cache(self.block_cache_mb << 20))
        if bloom:
            table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_cache_index_and_filter_blocks(True)
        o.set_block_based_table_factory(table)
        return o

    def column_families(self, bulk: bool = False, origins: bool = False, compactions: bool = True,
                        history: bool = False) -> tuple[Options, dict[str, Options]]:
        """(database options, {family: options}) sharing one block cache; with ``origins`` a typed table's, with
        ``history`` a versioned table's (tuned as the values family, for the same reason as origins); without
        ``compactions`` the large families start with automatic compactions off (``compaction_gate``).

        With ``bulk`` the values family appends to a vector memtable that is sorted once when flushed: a
        several-fold cheaper write while nothing reads the live memtable (a restore), and slow point reads.
        Its flushed files then wait in L0 for one compaction (see ``bulk_l0_mb``). The origins family has a
        key for every value: it is tuned as the values family is, so its memtables never set off the atomic
        flushes of both before the values' own fill.
        """
        cache = Cache(self.block_cache_mb << 20)
        families = {cf: self.rocksdb(cache=cache) for cf in COLUMN_FAMILIES}
        for cf, o in families.items():
            if cf != VALUES_CF:
                o.set_write_buffer_size(_SMALL_FAMILY_BUFFER_MB << 20)
        large = [VALUES_CF]
        if origins:
            families[ORIGINS_CF] = self.rocksdb(cache=cache)
            large.append(ORIGINS_CF)
        if history:
            # Read by seeks only (store.history.as_of): a bloom filter would cost its flushes and never be consulted.
            families[HISTORY_CF] = self.rocksdb(cache=cache, bloom=False)
            families[HISTORY_CF].set_level_zero_file_num_compaction_trigger(max(self.l0_trigger, HISTORY_L0_TRIGGER))
            large.append(HISTORY_CF)
        db = self.rocksdb(cache=cache)
        for cf in large:
            families[cf].set_disable_auto_compactions(not compactions)
        for values in (families[cf] for cf in large if bulk):
            values.set_memtable_factory(MemtableFactory.vector())
            values.set_write_buffer_size(self.bulk_buffer_mb << 20)
            values.set_max_write_buffer_number(
                max(2, self.max_write_buffers * self.write_buffer_mb // self.bulk_buffer_mb))
            values.set_level_zero_file_num_compaction_trigger(self.bulk_l0_files)
            values.set_level_zero_slowdown_writes_trigger(_BULK_L0_SLOWDOWN_FACTOR * self.bulk_l0_files)
            values.set_level_zero_stop_writes_trigger(_BULK_L0_STOP_FACTOR * self.bulk_l0_files)
            # L0's compaction score also counts its bytes against the base level's: raised with the file
            # trigger, or the size alone would start the compactions the trigger puts off.
            values.set_max_bytes_for_level_base(self.bulk_l0_mb << 20)
        if bulk and history:
            # A versioned table's versions are each record again (1M versions against 100k values in
            # bench/history_restore.py): compressing them as the load's flushes write them cost a tenth of the
            # flushes' CPU. The merge of L0 after the load compresses them (the family's usual options then); the
            # pile's bound is in memtables' bytes (``bulk_l0_files``), which uncompressed files do not exceed.
            families[HISTORY_CF].set_compression_type(DBCompressionType.none())
        if bulk:
            # Sorting and writing the memtables is then the work left behind the writer: two flush threads (a
            # quarter of the background jobs) halve the backlog a restore waits for at its end.
            db.set_max_background_jobs(_BULK_BACKGROUND_JOBS)
        return db, families
