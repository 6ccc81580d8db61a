"""globald.store.layout: the on-disk layout written in one place, and offsets in JSON read with one validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import WriteBatch

from globald.common.states import State
from globald.snapshot import manifest
from globald.status.document import DaemonStatus, TableStatus
from globald.store import layout
from globald.store.names import FORMAT_TIMESTAMPED, META_FORMAT, META_TOPIC
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore


def test_offsets_json_round_trip_in_partition_order() -> None:
    assert layout.offsets_to_json({10: 5, 2: 7}) == {"2": 7, "10": 5}
    assert list(layout.offsets_to_json({10: 5, 2: 7})) == ["2", "10"]
    assert layout.offsets_from_json({"2": 7, "10": 5}) == {2: 7, 10: 5}
    # Snapshot readers (and globald.spark) keep importing them from the manifest module: the same functions.
    assert manifest.offsets_to_json is layout.offsets_to_json
    assert manifest.offsets_from_json is layout.offsets_from_json


@pytest.mark.parametrize("raw", [[1], {"-1": 3}, {"x": 3}, {"1234567890": 3}, {"0": -1}, {"0": True}, {"0": "3"},
                                 {"0": 1 << 63}])
def test_offsets_json_that_is_not_offsets_is_refused_with_its_name(raw: object) -> None:
    with pytest.raises(ValueError, match=r"^requested"):
        layout.offsets_from_json(raw, "requested")


def test_a_status_document_reads_unreadable_offsets_as_none() -> None:
    doc = DaemonStatus(State.RUNNING, 1, {"t": TableStatus("RUNNING", "topic", {0: 3, 1: 4}, end_offsets={0: 3})})
    raw = doc.to_json()
    assert DaemonStatus.from_json(raw).tables["t"].offsets == {0: 3, 1: 4}
    raw["tables"]["t"]["offsets"] = {"0": "damaged"}
    raw["tables"]["t"]["end_offsets"] = None
    back = DaemonStatus.from_json(raw).tables["t"]
    assert back.offsets == {} and back.end_offsets == {}


def test_every_writer_stamps_and_stores_offsets_as_the_live_store_reads_them(tmp_path: Path) -> None:
    assert layout.stamp(FORMAT_TIMESTAMPED, "topic") == {META_FORMAT: b"1", META_TOPIC: b"topic"}
    store = TableStore.open(tmp_path, "t", "topic", StoreOptions()).store
    try:
        batch = WriteBatch(raw_mode=True)
        layout.put_offsets(batch, store.db, {0: 12, 3: 1 << 40})
        store.db.write(batch)
        assert store.offsets() == {0: 12, 3: 1 << 40}
    finally:
        store.close()
    with StoreReader(store.path) as r:
        assert r.offsets() == {0: 12, 3: 1 << 40}
