"""``globald migrate``: open each table's store offline, as the daemon would, and report what that imported.

Contract: it runs only while no daemon owns the state_dir (it takes the same lock), never wipes or creates a store,
and takes offsets from a Kafka-format ``.checkpoint`` only into a store that holds data but no offsets — the code
path the daemon itself runs on first open (KIP-1035). A plain-layout store is stamped as upgrading (KIP-258).
"""

from __future__ import annotations

from typing import Any

from globald.common.errors import StoreCorruptError, StoreUnavailableError
from globald.settings.config import Config
from globald.store.names import FORMAT_MIXED, FORMAT_TIMESTAMPED, db_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.statedir import lock_state_dir, prepare_state_dir
from globald.store.table_store import TableStore


def migrate(config: Config, table: str | None = None) -> dict[str, dict[str, Any]]:
    """Per table: imported offsets, the offsets the store now holds, its format before and after, or an error."""
    tables = [config.table(table)] if table else list(config.tables)
    options = StoreOptions.from_config(config.store)
    prepare_state_dir(config.state_dir)
    lock = lock_state_dir(config.state_dir)
    report: dict[str, dict[str, Any]] = {}
    try:
        for tc in tables:
            if not (db_dir(config.state_dir, tc.name) / "CURRENT").exists():
                report[tc.name] = {"imported": {}, "note": "no store yet: the daemon will restore it from the topic"}
                continue
            try:
                with StoreReader(db_dir(config.state_dir, tc.name)) as r:
                    before = r.format_version()
                opened = TableStore.open(config.state_dir, tc.name, tc.topic, options, wipe_unusable=False,
                                         origins=tc.typed, history_ms=tc.history)
            except (StoreCorruptError, StoreUnavailableError) as e:
                report[tc.name] = {"error": f"{e}; left as it is: the daemon will rebuild it from the topic"}
                continue
            store = opened.store
            try:
                report[tc.name] = {"imported": opened.imported, "note": opened.import_note,
                                   "offsets": store.offsets(), "format_before": before,
                                   "format": FORMAT_MIXED if store.upgrading else FORMAT_TIMESTAMPED,
                                   "upgrading_plain_values": store.upgrading}
            finally:
                store.close()
    finally:
        lock.close()
    return report
