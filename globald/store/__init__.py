"""Per-table RocksDB stores: layout, encoding, the live store, read-only readers and Kafka checkpoint files."""
