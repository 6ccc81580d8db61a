"""Stores that are corrupt or of an unknown format are wiped and rebuilt, never served, never fatal."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rocksdict import WriteBatch

from globald.store.names import META_CF, META_FORMAT, db_dir
from tests.harness import Broker, DaemonProcess, open_store_db, oracle_at, random_records, values_only

pytestmark = pytest.mark.kafka


def _restored(broker: Broker, d: DaemonProcess, t: str) -> dict:
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, doc["tables"]["tbl"]["offsets"])
    return doc


@pytest.mark.parametrize("damage", ["manifest", "format"])
def test_unusable_store_is_wiped_and_rebuilt(broker: Broker, topic: Callable[..., str],
                                             daemon: Callable[..., DaemonProcess], damage: str) -> None:
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=200, seed=30))
    d = daemon({"tbl": t})
    _restored(broker, d, t)
    assert d.stop() == 0
    path = db_dir(d.state_dir, "tbl")
    if damage == "manifest":
        for m in path.glob("MANIFEST-*"):
            m.write_bytes(b"\x00garbage" * 64)
    else:
        db = open_store_db(path)
        wb = WriteBatch(raw_mode=True)
        wb.put(META_FORMAT, b"999", db.get_column_family_handle(META_CF))
        db.write(wb)
        del wb
        db.close()
    d.start()
    doc = _restored(broker, d, t)
    assert doc["tables"]["tbl"]["wipes"] == 1
    assert "WIPE" in d.log.read_text()
