"""``history`` removed from a versioned table (issue 45), without a broker: by a reload it is taken in place
(``settings.changes``' ``unversioned``), the store dropping its history as a restart does (``store.history.forget``:
the marks, durably, then the family); the latest values stay byte for byte, and a crash between the two steps is
resolved by the next open, whatever the table is declared then."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.oracle import Record
from globald.settings.changes import changes, delta
from globald.settings.config import parse
from globald.store import history, layout
from globald.store.names import HISTORY_CF, META_CF, db_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.unit.test_history import _apply, _random_records, _versioned

BASE: dict[str, Any] = {"state_dir": "/srv/state", "kafka": {"bootstrap.servers": "127.0.0.1:9092"}}
V1 = {"format": "avro", "schema": "/schemas/v1.avsc"}
V2 = {"format": "avro", "schema": "/schemas/v2.avsc"}


def _cfg(**table: Any) -> Any:
    return parse({**BASE, "tables": [{"name": "b", "topic": "tb", **table}]})


@pytest.mark.parametrize(("old", "new"), [
    ({"history": "7d"}, {}),  # raw
    ({"history": "7d", "value": V1}, {"value": V1}),  # typed
    ({"history": "7d", "value": V1}, {"value": V2}),  # typed, redeclared in the same reload
])
def test_a_reload_removing_history_is_taken_in_place(old: dict[str, Any], new: dict[str, Any]) -> None:
    found = changes(_cfg(**old), _cfg(**new))
    assert [c.key for c in found] == ["tables.b"] and not found[0].replaced
    d = delta(_cfg(**old), _cfg(**new))
    assert d.unversioned == (_cfg(**new).table("b"),)
    assert d.replaced == d.windowed == d.redeclared == d.added == () and d.dropped == ()
    assert d.stores_dropped == () and d.stores_added == ()


@pytest.mark.parametrize(("old", "new"), [
    ({}, {"history": "7d"}),  # added: a since is proven only by a replay
    ({"history": "7d"}, {"topic": "tc"}),  # removed, with another topic
    ({"history": "7d"}, {"value": V1}),  # removed, and made typed
    ({"history": "7d", "value": V1}, {}),  # removed, and made raw
])
def test_history_added_or_removed_with_a_change_the_store_cannot_follow_is_a_replacement(
        old: dict[str, Any], new: dict[str, Any]) -> None:
    found = changes(_cfg(**old), _cfg(**new))
    assert found[0].replaced and found[0].unversioned is None
    assert delta(_cfg(**old), _cfg(**new)).unversioned == ()


def _latest(path: Path) -> list[tuple[bytes, bytes, int]]:
    with StoreReader(path) as reader:
        return list(reader.items())


def _fold(records: list[Record]) -> list[tuple[bytes, bytes, int]]:
    """The latest-value fold: the greatest offset of a key wins, whatever its timestamp."""
    out: dict[bytes, tuple[bytes, int] | None] = {}
    for r in records:
        out[r.key] = None if r.value is None else (r.value, r.timestamp)
    return sorted((k, *v) for k, v in out.items() if v is not None)


def _marks(store: TableStore) -> dict[bytes, bytes]:
    meta = store.db.get_column_family(META_CF)
    try:
        return {k: v for k in history.MARKS if (v := meta.get(k)) is not None}
    finally:
        del meta


def test_a_store_drops_its_history_in_place_keeping_its_latest_values(tmp_path: Path) -> None:
    rng = random.Random(46)
    keys = [b"k%d" % i for i in range(30)] + [b"bin\x00\xff"]
    records = _random_records(rng, 800, keys)
    store, task = _versioned(tmp_path, window_ms=10**12)
    _apply(task, records, polls=8, rng=rng)
    store.history_read_at = history.now_ms()
    store.sync()
    path = db_dir(tmp_path, "tbl")
    before, offsets = _latest(path), store.offsets()
    assert before == _fold(records) and _marks(store) and store.history_status() is not None
    store.history_removed()
    assert store.history_status() is None and store.history_ms is None and _marks(store) == {}
    assert HISTORY_CF not in layout.families(path)
    assert _latest(path) == before and store.offsets() == offsets  # byte for byte, at the same offsets
    with StoreReader(path) as reader:
        assert reader.history is None  # get --as-of: "keeps no versions"
    more = [Record(r.key, r.value, r.timestamp + 1, r.partition, r.offset + 800) for r in records[-40:]]
    _apply(task, more, polls=2, rng=rng)  # a plain table's batches from now on
    assert store.history_status() is None and _latest(path) == _fold(records + more)
    store.close()
    reopened = TableStore.open(tmp_path, "tbl", "t", StoreOptions()).store  # a restart without history: as is
    assert reopened.history_status() is None and _latest(path) == _fold(records + more)
    reopened.close()


def test_forget_deletes_the_marks_before_it_drops_the_family() -> None:
    steps: list[str] = []

    def drop() -> None:
        steps.append("drop")
        raise RuntimeError("IO error: the disk went away")

    with pytest.raises(Exception, match="drop the history"):
        history.forget(lambda marks: steps.append(f"marks {sorted(marks.values(), key=repr)}"), drop, "t", "test")
    assert steps == [f"marks {[None] * len(history.MARKS)}", "drop"]


@pytest.mark.parametrize("declared", [None, 10**12])
def test_a_crash_between_the_marks_and_the_family_is_resolved_by_the_next_open(tmp_path: Path,
                                                                               declared: int | None) -> None:
    """Cut after ``forget``'s first step (marks deleted, family held): no reader takes the family for a history
    (as-of refused: no since), and the next open resolves it: without history (the reload's config) the family is
    dropped; with history declared again (a config changed back before the restart) the store is unproven, so the
    state manager rebuilds it from the topic, and ``since`` is proven by that replay, never kept from before."""
    rng = random.Random(47)
    records = _random_records(rng, 300, [b"k%d" % i for i in range(20)])
    store, task = _versioned(tmp_path, window_ms=10**12)
    _apply(task, records, polls=3, rng=rng)
    store._put_history_marks(dict.fromkeys(history.MARKS))  # forget's first step, then the crash
    store.close(clean=False)
    path = db_dir(tmp_path, "tbl")
    with StoreReader(path) as reader:
        assert reader.history is not None and reader.history.since is None
        assert reader.history.refusal("tbl") is not None
    reopened = TableStore.open(tmp_path, "tbl", "t", StoreOptions(), history_ms=declared).store
    if declared is None:
        assert HISTORY_CF not in layout.families(path) and _marks(reopened) == {}
    else:
        assert reopened.history_unproven  # rebuilt from the topic at its plan
    assert _latest(path) == _fold(records)
    reopened.close()


def test_marks_left_without_their_family_go_at_the_next_open(tmp_path: Path) -> None:
    """A drop cut short by an older globald (the family first): a plain table's open deletes its marks, so a later
    restart that declares history again finds no since to keep over a new, empty family."""
    store, task = _versioned(tmp_path, window_ms=10**12)
    _apply(task, _random_records(random.Random(48), 50, [b"a", b"b"]), polls=1, rng=random.Random(48))
    store.stale_history = False
    store._history = store._history_cf = None
    store.db.drop_column_family(HISTORY_CF)
    store.close(clean=False)
    plain = TableStore.open(tmp_path, "tbl", "t", StoreOptions()).store
    assert _marks(plain) == {}
    plain.close()
    again = TableStore.open(tmp_path, "tbl", "t", StoreOptions(), history_ms=10**12).store
    assert again.history_unproven
    again.close()


def test_an_exact_build_on_a_versioned_base_of_a_table_no_longer_versioned_is_plain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base snapshot published before the removal (kept for its readers, or by retention) holds a history and a
    since; a build on it after the removal drops them as the live store did, so no snapshot published after the
    removal answers as of a time with versions its tail never added."""
    from globald.settings.ref import ConfigRef
    from globald.snapshot.builder import Builder
    from globald.store.names import COLUMN_FAMILIES, FORMAT_VERSION, META_HISTORY_SINCE
    from globald.store.offline import open_offline, since_of
    from tests.unit.test_exact_build_since import _Consumer
    from tests.unit.test_update_task import Event

    base = tmp_path / "base" / "db"
    with open_offline(base, StoreOptions(), [*COLUMN_FAMILIES, HISTORY_CF]) as store:
        store.put_meta({**layout.stamp(FORMAT_VERSION, "t"), META_HISTORY_SINCE: b"5"}, "stamp", rebuild=False)
        store.put_all(HISTORY_CF, [(history.version_key(b"a", 5, 0, 0), history.VALUE + b"1")], "a version")
        store.put_offsets({0: 1}, "offsets")
    assert since_of(base) == 5
    config = parse({**BASE, "state_dir": str(tmp_path / "state"), "tables": [{"name": "rates", "topic": "t"}]})
    builder = Builder(ConfigRef(config), threading.Event())
    builder._consumer = _Consumer([Event(0, 1, _key=b"a", _value=b"2", _ts=7)])  # type: ignore[assignment]
    monkeypatch.setattr(builder, "_marks", lambda topic, until: {0: (0, 2)})
    monkeypatch.setattr(builder, "_check_same_topic", lambda *a: None)
    work = tmp_path / "work"
    built = builder.build(config.table("rates"), {0: 2}, {0: 1}, base.parent, work, time.monotonic() + 60)
    builder._consumer = None
    db = work / "db"
    assert built.records == 1 and HISTORY_CF not in layout.families(db) and since_of(db) is None
    with StoreReader(db) as reader:
        assert reader.history is None and [(k, v) for k, v, _ in reader.items()] == [(b"a", b"2")]
