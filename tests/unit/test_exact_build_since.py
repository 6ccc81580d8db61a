"""``since`` of an exact-offset snapshot build of a versioned table (issue 45): from the log start, a replay's
(the time its first versions are written less the topic's ``min.compaction.lag.ms``, the live table's last plan's,
passed from the desk with the job: no broker call); on a base, the base's, because a build reads every offset of
its tail or is refused. Pure logic and an offline RocksDB store; the Tansu lane's
``test_an_exact_build_of_a_versioned_table_holds_the_as_of_fold_at_its_offsets`` builds against a real broker."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from globald.common.states import State, StateMachine
from globald.engine.table import TableRuntime
from globald.engine.view import TableView
from globald.settings.config import TableConfig, parse
from globald.settings.ref import ConfigRef
from globald.snapshot.builder import Builder, BuildRefused
from globald.snapshot.desk import RequestDesk
from globald.snapshot.exact_requests import Code, Request
from globald.snapshot.table_state import SnapshotTable
from globald.store import history, layout
from globald.store.names import COLUMN_FAMILIES, FORMAT_VERSION, HISTORY_CF, META_HISTORY_SINCE
from globald.store.offline import open_offline, since_of
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.unit.test_update_task import Event

LAG = 3_600_000


def _config(tmp_path: Path) -> Any:
    return parse({"state_dir": str(tmp_path / "state"), "kafka": {"bootstrap.servers": "127.0.0.1:9"},
                  "tables": [{"name": "rates", "topic": "t", "history": "30d"}]})


class _Consumer:
    """Stands in for the build's consumer: hands out ``records`` once, then nothing."""

    def __init__(self, records: list[Event]) -> None:
        self.records = records

    def assign(self, _: list[TopicPartition]) -> None: ...

    def resume(self, _: list[TopicPartition]) -> None: ...

    def pause(self, _: list[TopicPartition]) -> None: ...

    def unassign(self) -> None: ...

    def consume(self, _n: int, _timeout: float) -> list[Event]:
        out, self.records = self.records, []
        return out


def _since_of_build(tmp_path: Path, lag_ms: int | None) -> tuple[int, int | None, int]:
    """A build from the log start's fold of two records (``Builder._apply``, as ``build`` runs it): the time
    before, its since, the time after."""
    config = _config(tmp_path)
    builder = Builder(ConfigRef(config), threading.Event())
    builder._consumer = _Consumer([Event(0, 0, _key=b"a", _value=b"1", _ts=5),  # type: ignore[assignment]
                                   Event(0, 1, _key=b"a", _value=b"2", _ts=7)])
    db = tmp_path / f"db-{lag_ms}"
    with open_offline(db, StoreOptions(), [*COLUMN_FAMILIES, HISTORY_CF]) as store:
        store.put_meta({**layout.stamp(FORMAT_VERSION, "t"), META_HISTORY_SINCE: history.SINCE_PENDING}, "stamp",
                       rebuild=False)
        before = history.now_ms()
        assert builder._apply(store, "t", {0: 0}, {0: 2}, time.monotonic() + 60, False, 30 * 86_400_000,
                              lag_ms) == 2
        after = history.now_ms()
        store.put_offsets({0: 2}, "offsets")
    builder._consumer = None
    return before, since_of(db), after


def test_a_build_from_the_log_start_proves_since_less_the_compaction_lag(tmp_path: Path) -> None:
    before, since, after = _since_of_build(tmp_path, LAG)
    assert since is not None and before - LAG <= since <= after - LAG, (before, since, after)


def test_a_build_from_the_log_start_with_the_lag_unknown_takes_it_as_0(tmp_path: Path) -> None:
    before, since, after = _since_of_build(tmp_path, None)
    assert since is not None and before <= since <= after, (before, since, after)


def test_a_tail_with_a_hole_is_refused_so_a_base_keeps_its_since() -> None:
    # A record the log cleaner removed leaves its offset unused: the build never reads past a hole in [base,
    # target), so every version of the tail is there and the base's since holds for the build.
    todo = {0: 10}
    with pytest.raises(BuildRefused) as e:
        Builder._one(Event(0, 11), 0, todo, {0: 20})  # type: ignore[arg-type]
    assert e.value.code == Code.COMPACTED
    assert Builder._one(Event(0, 10), 0, todo, {0: 20}) and todo == {0: 11}  # type: ignore[arg-type]


def test_the_table_view_carries_the_planned_lag_of_a_versioned_table(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "rates", "t", StoreOptions(), history_ms=10**9).store
    try:
        rt = TableRuntime(config=TableConfig("rates", "t", history=10**9), store=store,
                          machine=StateMachine(lambda *a: None, "rates"))
        assert rt.view().compaction_lag_ms is None  # not planned yet: unknown
        store.compaction_lag_ms = LAG
        assert rt.view().compaction_lag_ms == LAG
    finally:
        store.close()


class _Engine:
    store_fault = False

    def table_view(self, table: str) -> TableView:
        return TableView(table, "t", State.RUNNING, None, (0,), None, LAG)


class _Publishing:
    def live_offsets(self, _: Any) -> dict[int, int]:
        return {0: 50}  # past the target: no base to publish


def test_the_desk_passes_the_live_tables_lag_with_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path)
    tab = SnapshotTable(config.tables[0], tmp_path / "snapshots")
    desk = RequestDesk(ConfigRef(config), _Engine(), {"rates": tab}, None, _Publishing(), None)  # type: ignore[arg-type]
    submitted: list[tuple[Any, ...]] = []
    monkeypatch.setattr(desk, "_room_for_build", lambda *_: None)
    monkeypatch.setattr(desk._builds, "submit", lambda *a: submitted.append(a))
    desk._admit(tab, Request("r1", "rates", {0: 10}))
    assert len(submitted) == 1 and submitted[0][-1] == LAG, submitted
