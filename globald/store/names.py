"""Reserved names of the on-disk layout, in one place.

``<state_dir>/tables/<table>/db`` is the table's RocksDB; ``.checkpoint`` beside it is the Kafka-format offsets
file. Inside the database, values live in the ``VALUES_CF`` family, next-offsets in ``OFFSETS_CF`` and store
metadata in ``META_CF``. The default family is left empty in this format.
"""

from __future__ import annotations

from pathlib import Path

# Version of the layout described above. Bump it when a change would make an older globald misread a store.
FORMAT_VERSION = 1

VALUES_CF = "values_ts"
OFFSETS_CF = "offsets"
META_CF = "meta"
COLUMN_FAMILIES = (VALUES_CF, OFFSETS_CF, META_CF)

META_FORMAT = b"format_version"
META_TOPIC = b"topic"
META_STATUS = b"status"
STATUS_OPEN = b"open"
STATUS_CLEAN = b"clean"

TABLES_DIR = "tables"
DB_DIR = "db"
CHECKPOINT_FILE = ".checkpoint"
LOCK_FILE = "globald.lock"
STATUS_FILE = "status.json"


def table_dir(state_dir: Path, table: str) -> Path:
    return state_dir / TABLES_DIR / table


def db_dir(state_dir: Path, table: str) -> Path:
    return table_dir(state_dir, table) / DB_DIR


def checkpoint_path(state_dir: Path, table: str) -> Path:
    return table_dir(state_dir, table) / CHECKPOINT_FILE


# Snapshots: <state_dir>/snapshots/<table>/{<id>/{db/,manifest.json}, CURRENT, leases/, requests/, responses/}.
SNAPSHOTS_DIR = "snapshots"
SNAPSHOT_DB_DIR = "db"
SNAPSHOT_MANIFEST = "manifest.json"
SNAPSHOT_CURRENT = "CURRENT"
SNAPSHOT_LEASES_DIR = "leases"
SNAPSHOT_REQUESTS_DIR = "requests"
SNAPSHOT_RESPONSES_DIR = "responses"
# Work in progress is hidden behind these prefixes; readers never look at dot-names, the daemon sweeps them.
SNAPSHOT_TMP_PREFIX = ".tmp-"
SNAPSHOT_BUILD_PREFIX = ".build-"
SNAPSHOT_TRASH_PREFIX = ".trash-"


def snapshots_dir(state_dir: Path, table: str) -> Path:
    return state_dir / SNAPSHOTS_DIR / table
