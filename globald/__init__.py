"""globald: mirrors compacted Kafka topics ("global tables") into local RocksDB stores, self-healing."""

__version__ = "0.1.0"
