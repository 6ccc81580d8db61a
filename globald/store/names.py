"""Reserved names of the on-disk layout, in one place.

``<state_dir>/tables/<table>/db`` is the table's RocksDB; ``.checkpoint`` beside it is the Kafka-format offsets
file. Inside the database, values live in the ``VALUES_CF`` family, next-offsets in ``OFFSETS_CF`` and store
metadata in ``META_CF``. The default family holds only plain values still waiting for their upgrade (``FORMAT_MIXED``);
a store records in ``META_FORMAT`` the oldest format that describes it, so an older globald reads what it can.
A typed table's store also has ``ORIGINS_CF``.
"""

from __future__ import annotations

from pathlib import Path

# Formats, in the order they appeared. Bump FORMAT_VERSION when a change would make an older globald misread a store.
# Plain: values without a timestamp in the default family and no META_FORMAT; written by globald before format 1
# and by Kafka Streams' plain key-value stores. Never written any more: opened, it becomes FORMAT_MIXED.
FORMAT_PLAIN = 0
# Timestamped: every value in VALUES_CF with its timestamp; the default family is empty.
FORMAT_TIMESTAMPED = 1
# Mid-upgrade: VALUES_CF as in format 1, plus plain values in the default family for keys VALUES_CF lacks. A reader
# of format 1 would miss those keys, so such a globald must rebuild the store instead (see table_store).
FORMAT_MIXED = 2
FORMAT_VERSION = FORMAT_MIXED  # the newest format this globald reads
READABLE_FORMATS = (FORMAT_TIMESTAMPED, FORMAT_MIXED)  # as stored in META_FORMAT

DEFAULT_CF = "default"  # RocksDB's own family: it always exists and cannot be dropped
VALUES_CF = "values_ts"
OFFSETS_CF = "offsets"
META_CF = "meta"
COLUMN_FAMILIES = (VALUES_CF, OFFSETS_CF, META_CF)
# Only in the store of a typed table (one declaring [tables.value] or [tables.key]): per key, where its stored value
# came from (codec.encode_origin), written in the batch that writes the value, so that a value that does not decode
# is named by partition and offset. Not in COLUMN_FAMILIES: a raw table's store never has it (it is dropped when a
# table stops being typed), and a globald before it, meeting a store that has it, cannot open it and rebuilds.
ORIGINS_CF = "origins"
# Only in the store of a versioned table (one declaring ``history``): every version of every key, for as-of lookups
# (``store.history``), written in the batch that writes the values. Not in COLUMN_FAMILIES, as ORIGINS_CF: a table
# that stops being versioned has it dropped, with the META_HISTORY_ marks.
HISTORY_CF = "history"

META_FORMAT = b"format_version"
META_TOPIC = b"topic"
META_TOPIC_ID = b"topic_id"  # the topic's ID (KIP-516) when the cluster gives one; absent otherwise
META_STATUS = b"status"
STATUS_OPEN = b"open"
STATUS_CLEAN = b"clean"
META_UPGRADED = b"upgraded_at"  # when the last plain value left the default family (Unix seconds, ASCII)
# Set (to COMPLETE_YES) once the table has been restored to a log end and the offsets of that restore are durable;
# absent from a fresh or wiped store until then. Live-store readers serve only a store that has it: without it the
# store may hold a half-rebuilt table, and they answer from the current snapshot instead.
META_COMPLETE = b"complete"
COMPLETE_YES = b"1"
# Per partition, ``META_FINGERPRINT_PREFIX + partition`` holds the fingerprint ladder of the records applied (see
# ``fingerprint``), written in the batch that moves the partition's offset.
META_FINGERPRINT_PREFIX = b"fingerprint/"
# A versioned table's (store.history): since (epoch ms, ASCII) is the earliest record time from which as-of answers
# are exact, absent when nothing proves one; clock the newest record timestamp applied; untimed "partition/offset"
# of the first record without a timestamp, which refuses as-of lookups.
META_HISTORY_SINCE = b"history/since"
META_HISTORY_CLOCK = b"history/clock"
META_HISTORY_UNTIMED = b"history/untimed"
# The wall-clock time (epoch ms, ASCII) the table was last known reading its topic (``store.gaps.since_after_gap``):
# written with the offsets of every batch a running loop applies, and at a clean stop.
META_HISTORY_READ = b"history/read"

TABLES_DIR = "tables"
DB_DIR = "db"
CHECKPOINT_FILE = ".checkpoint"
LOCK_FILE = "globald.lock"
STATUS_FILE = "status.json"
REQUESTS_DIR = "requests"  # operator requests to the running daemon (globald reset)
REGISTRY_DIR = "registry"  # Schema Registry cache (globald.typed.registry): schemas/<id>.avsc, readers/<pin>.json
# Hidden siblings of table directories (table names start with a letter or digit, so these never collide).
IMPORT_PREFIX = ".import-"  # a store being built by ``import-kafka-streams``; deleted if left over
REPLACED_PREFIX = ".replaced-"  # the store an import replaced, deleted once the new one is in place
BOOTSTRAP_PREFIX = ".bootstrap-"  # a table's store being downloaded from an export (globald.export.bootstrap)
# What store/durable.py leaves while it works, wherever it replaces a file or removes a tree:
# ``.tmp-<name>.<random>.tmp`` (a file being written, renamed over <name> once whole) and ``.trash-<name>`` (a tree
# renamed away before its removal).
TMP_PREFIX = ".tmp-"
TMP_SUFFIX = ".tmp"
TRASH_PREFIX = ".trash-"

# Kafka Streams' layout of a global store: <state.dir>/<application.id>/global/rocksdb/<store>/ with timestamped
# values (8-byte big-endian timestamp + value) in KS_TIMESTAMPED_CF or plain values in the default family, and the
# offsets of every global store of the application in <state.dir>/<application.id>/global/.checkpoint.
KS_GLOBAL_DIR = "global"
KS_ROCKSDB_DIR = "rocksdb"
KS_TIMESTAMPED_CF = "keyValueWithTimestamp"


def table_dir(state_dir: Path, table: str) -> Path:
    return tables_dir(state_dir) / table


def db_dir(state_dir: Path, table: str) -> Path:
    return table_dir(state_dir, table) / DB_DIR


def checkpoint_path(state_dir: Path, table: str) -> Path:
    return table_dir(state_dir, table) / CHECKPOINT_FILE


def tables_dir(state_dir: Path) -> Path:
    return state_dir / TABLES_DIR


def kafka_streams_store_dir(ks_state_dir: Path, application_id: str, store: str) -> Path:
    return ks_state_dir / application_id / KS_GLOBAL_DIR / KS_ROCKSDB_DIR / store


def kafka_streams_checkpoint(ks_state_dir: Path, application_id: str) -> Path:
    return ks_state_dir / application_id / KS_GLOBAL_DIR / CHECKPOINT_FILE

# Snapshots: <state_dir>/snapshots/<table>/{<id>/{db/,manifest.json}, CURRENT, leases/, requests/, responses/}.
SNAPSHOTS_DIR = "snapshots"
SNAPSHOT_DB_DIR = "db"
SNAPSHOT_MANIFEST = "manifest.json"
SNAPSHOT_CURRENT = "CURRENT"
# The offsets a run last showed to hold the table's topic, with the snapshots they vouch for (snapshot.recreated).
SNAPSHOT_VERIFIED = "VERIFIED"
SNAPSHOT_LEASES_DIR = "leases"
SNAPSHOT_REQUESTS_DIR = "requests"
SNAPSHOT_RESPONSES_DIR = "responses"
# Work in progress is hidden behind these prefixes; readers never look at dot-names, the daemon sweeps them.
SNAPSHOT_TMP_PREFIX = TMP_PREFIX  # a snapshot being published, .tmp-<id>
SNAPSHOT_BUILD_PREFIX = ".build-"
SNAPSHOT_TRASH_PREFIX = TRASH_PREFIX  # durable.remove_tree's: a snapshot being deleted
# In snapshots/: the snapshots of a table a reload dropped, moved aside when the name is added again while a reader
# still leases one of them (globald.snapshot.dropped); deleted once no lease holds any
SNAPSHOT_DROPPED_PREFIX = ".dropped-"
# A typed table's snapshot, decoded once per host: ``<id>/columnar-<fingerprint of the decoders>.arrow`` beside db/.
COLUMNAR_PREFIX = "columnar-"
COLUMNAR_SUFFIX = ".arrow"
# A versioned table's snapshot: its history, read once per host for as-of joins (globald.spark.asof), beside db/;
# the name carries the file's layout version, so a file of another layout is rebuilt.
ASOF_HISTORY_LAYOUT = "asof-history-v1"
ASOF_HISTORY_FILE = ASOF_HISTORY_LAYOUT + COLUMNAR_SUFFIX
# A versioned table's snapshot whose key is typed: each decoded key's stored keys, for as-of joins by decoded key
# (globald.spark.asof_keys), ``<id>/asof-keys-<fingerprint of the key declaration>.arrow`` beside db/.
ASOF_KEYS_PREFIX = "asof-keys-"


def snapshots_dir(state_dir: Path, table: str) -> Path:
    return state_dir / SNAPSHOTS_DIR / table
