"""Per-table RocksDB stores: reserved names (``names``), encodings (``codec``), the on-disk layout written in one
place (``layout``), durable file writes (``durable``), errors mapped once (``failures``) and the one way to write
(``writes``); the live store (``table_store`` on ``database``, the engine's ``protocol.Store``), every other database
opened (``offline``: exact builds, bootstraps, Kafka Streams imports), read-only readers and Kafka checkpoint files; the
state_dir itself, private and locked (``statedir``). Imports nothing above it (import-linter)."""
