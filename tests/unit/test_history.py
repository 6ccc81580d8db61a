"""Versioned tables (issue 45), without a broker: the ``history`` key, the as-of fold oracle, and the store's
versions written by the real update task into a real RocksDB store, read back through the reader that
``globald get --as-of`` and ``dump --as-of`` use, against the oracle at random times and keys."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from globald.cli.read import parse_time
from globald.common.errors import ConfigError, UsageError
from globald.common.states import StateMachine
from globald.embedded.oracle import Record, as_of, as_of_table
from globald.engine.table import TableRuntime
from globald.engine.update_task import UpdateTask
from globald.settings.config import TableConfig, parse
from globald.store import history
from globald.store.names import META_HISTORY_SINCE, db_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.unit.test_update_task import Event

# -- config -------------------------------------------------------------------------------------------------------


def _config(history_value: object) -> dict[str, Any]:
    return {"state_dir": "/tmp/x", "kafka": {"bootstrap.servers": "127.0.0.1:9092"},
            "tables": [{"name": "a", "topic": "a"}, {"name": "rates", "topic": "fx", "history": history_value}]}


@pytest.mark.parametrize(("given", "ms"), [("7d", 7 * 86_400_000), ("12h", 12 * 3_600_000), ("30m", 1_800_000),
                                           ("45s", 45_000), (5000, 5000)])
def test_history_takes_a_duration_or_milliseconds(given: object, ms: int) -> None:
    table = parse(_config(given)).tables[1]
    assert table.history == ms and table.versioned
    assert parse(_config(1)).tables[0].history is None  # without it, a table is as today


@pytest.mark.parametrize("given", ["7 days", "7w", "d", "", "1.5h", "-3d", 0, -5, 1.5, True, [1], "0d"])
def test_a_bad_history_names_its_key(given: object) -> None:
    with pytest.raises(ConfigError) as e:
        parse(_config(given))
    assert e.value.key == "tables[1].history", str(e.value)


# -- the as-of fold oracle ------------------------------------------------------------------------------------------

def _r(key: bytes, value: bytes | None, ts: int, offset: int, partition: int = 0) -> Record:
    return Record(key, value, ts, partition, offset)


def test_as_of_places_records_by_timestamp_then_offset() -> None:
    rs = [_r(b"k", b"a", 100, 0), _r(b"k", b"c", 300, 1), _r(b"k", b"b", 200, 2),  # 200 arrives after 300
          _r(b"k", b"tie-first", 400, 3), _r(b"k", b"tie-last", 400, 4),  # a tie: the greater offset wins
          _r(b"k", None, 500, 5), _r(b"k", b"back", 600, 6),  # a tombstone, then a value again
          _r(b"k", b"untimed", -1, 7), _r(b"other", b"x", 150, 8)]
    assert as_of(rs, b"k", 99) is None  # before the first record
    assert as_of(rs, b"k", 100) == (b"a", 100)
    assert as_of(rs, b"k", 250) == (b"b", 200)  # by timestamp, not by arrival
    assert as_of(rs, b"k", 399) == (b"c", 300)
    assert as_of(rs, b"k", 400) == (b"tie-last", 400)
    assert as_of(rs, b"k", 550) is None  # the tombstone
    assert as_of(rs, b"k", 10**13) == (b"back", 600)  # the untimed record has no place in time
    assert as_of(rs, b"absent", 10**13) is None
    assert as_of_table(rs, 150) == {b"k": (b"a", 100), b"other": (b"x", 150)}


# -- the store ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [b"", b"a", b"a\x00", b"a\x00\x01", b"\x00", b"\xff\x00\xff", b"ab"])
def test_version_keys_group_each_key_and_keep_key_order(key: bytes) -> None:
    others = [b"", b"a", b"a\x00", b"a\x00\x01", b"\x00", b"\xff\x00\xff", b"ab", b"a\x01", b"\x00\x00"]
    for other in others:
        mine, theirs = history.version_key(key, 5, 1, 0), history.version_key(other, 5, 1, 0)
        assert (mine < theirs) == (key < other) or key == other
        assert not theirs.startswith(history.escape(key)) or key == other  # prefix-free
    v = history.decode(history.version_key(key, 1234, 56, 7), history.VALUE + b"x")
    assert (v.key, v.value, v.timestamp, v.offset, v.partition) == (key, b"x", 1234, 56, 7)


def _versioned(tmp_path: Path, window_ms: int) -> tuple[TableStore, UpdateTask]:
    store = TableStore.open(tmp_path, "tbl", "t", StoreOptions(), history_ms=window_ms).store
    rt = TableRuntime(config=TableConfig("tbl", "t", history=window_ms), store=store,
                      machine=StateMachine(lambda *a: None, "tbl"))
    task = UpdateTask({"tbl": rt})
    task.start("tbl", {})
    return store, task


def _random_records(rng: random.Random, n: int, keys: list[bytes], base: int = 1_000_000) -> list[Record]:
    """Timestamps mostly rising from ``base``, often out of order, with ties and tombstones; partitions by key."""
    out: list[Record] = []
    offsets = {p: 0 for p in range(3)}
    for _ in range(n):
        base += rng.randint(0, 20)
        key = rng.choice(keys)
        p = keys.index(key) % 3
        ts = base - rng.randint(0, 400) if rng.random() < 0.3 else base  # out of order, and ties (steps of 0)
        value = None if rng.random() < 0.15 else f"v{offsets[p]}".encode()
        out.append(Record(key, value, ts, p, offsets[p]))
        offsets[p] += 1
    return out


def _apply(task: UpdateTask, records: list[Record], polls: int, rng: random.Random) -> None:
    """The records through the update task, in polls cut at random places (one batch each)."""
    events = [Event(r.partition, r.offset, _key=r.key, _value=r.value, _ts=r.timestamp) for r in records]
    cuts = sorted(rng.sample(range(1, len(events)), polls - 1)) if polls > 1 else []
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        task.update(events[start:end])  # type: ignore[arg-type]  # Event stands in for Message


def test_as_of_lookups_equal_the_oracle_and_latest_values_are_unchanged(tmp_path: Path) -> None:
    rng = random.Random(45)
    keys = [b"k%d" % i for i in range(40)] + [b"bin\x00\xff", b""]
    records = _random_records(rng, 3000, keys)
    store, task = _versioned(tmp_path, window_ms=10**12)  # a window nothing leaves
    _apply(task, records, polls=25, rng=rng)
    latest: dict[bytes, tuple[bytes, int]] = {}
    for r in records:  # today's fold: the greatest offset wins, whatever its timestamp
        if r.value is None:
            latest.pop(r.key, None)
        else:
            latest[r.key] = (r.value, r.timestamp)
    assert {k: store.get(k) for k in keys if store.get(k) is not None} == latest
    store.close()
    with StoreReader(db_dir(tmp_path, "tbl")) as reader:
        assert reader.history is not None and reader.history.refusal("tbl") is None
        since = reader.history.since
        assert since is not None and since >= history.now_ms() - 60_000  # the replay's start: this test's run
        stamps = [r.timestamp for r in records]
        for t in [rng.randint(min(stamps) - 10, max(stamps) + 10) for _ in range(300)] + stamps[:50]:
            key = rng.choice(keys)
            v = reader.as_of(key, t)
            got = None if v is None or v.value is None else (v.value, v.timestamp)
            assert got == as_of(records, key, t), (key, t)
        for t in rng.sample(stamps, 5):
            assert {k: (v, ts) for k, v, ts in reader.items_as_of(t)} == as_of_table(records, t)


def test_the_window_prunes_ended_versions_and_moves_since(tmp_path: Path) -> None:
    rng = random.Random(7)
    keys = [b"k%d" % i for i in range(10)]
    # Record times after the replay's start (this run), so that the window, not the replay, sets since.
    records = _random_records(rng, 2000, keys, base=history.now_ms() + 10**7)
    window = 2_000
    store, task = _versioned(tmp_path, window_ms=window)
    _apply(task, records, polls=40, rng=rng)
    store.close()
    clock = max(r.timestamp for r in records)
    with StoreReader(db_dir(tmp_path, "tbl")) as reader:
        assert reader.history is not None
        assert reader.history.since == clock - window  # by record time, the newest record's
        assert reader.history.clock == clock
        kept = len(list(reader._db.get_column_family("history").keys()))
        assert kept < len(records) // 2  # ended versions are gone
        since = reader.history.since
        for t in [rng.randint(since, clock + 10) for _ in range(300)]:
            key = rng.choice(keys)
            v = reader.as_of(key, t)
            got = None if v is None or v.value is None else (v.value, v.timestamp)
            assert got == as_of(records, key, t), (key, t)


def test_untimed_records_refuse_as_of_but_keep_latest_values(tmp_path: Path) -> None:
    store, task = _versioned(tmp_path, window_ms=10**9)
    task.update([Event(0, 0, _key=b"a", _value=b"1", _ts=500), Event(0, 1, _key=b"b", _value=b"2")])  # type: ignore[list-item]
    assert store.get(b"b") == (b"2", -1) and store.get(b"a") == (b"1", 500)
    store.close()
    with StoreReader(db_dir(tmp_path, "tbl")) as reader:
        assert reader.history is not None
        why = reader.history.refusal("tbl")
        assert why is not None and "no timestamp" in why and "0/1" in why


def test_since_is_pending_until_the_first_version_and_unproven_for_a_store_with_data(tmp_path: Path) -> None:
    store, task = _versioned(tmp_path / "a", window_ms=10**9)
    with StoreReader(db_dir(tmp_path / "a", "tbl")) as reader:
        assert reader.history is not None and reader.history.pending
    task.update([Event(0, 0, _key=b"a", _value=b"1", _ts=500)])  # type: ignore[list-item]
    store.close()
    # A plain table with data, then declared versioned: nothing proves what it saw before.
    plain = TableStore.open(tmp_path / "b", "tbl", "t", StoreOptions()).store
    rt = TableRuntime(config=TableConfig("tbl", "t"), store=plain, machine=StateMachine(lambda *a: None, "tbl"))
    UpdateTask({"tbl": rt}).update([Event(0, 0, _key=b"a", _value=b"1", _ts=500)])  # type: ignore[list-item]
    plain.close()
    reopened = TableStore.open(tmp_path / "b", "tbl", "t", StoreOptions(), history_ms=10**9).store
    reopened.close()
    with StoreReader(db_dir(tmp_path / "b", "tbl")) as reader:
        assert reader.history is not None and reader.history.since is None and not reader.history.pending
        assert "rebuilt from the topic" in (reader.history.refusal("tbl") or "")
    # A wipe (KIP-406, a recreated topic, a reset) starts it again, pending.
    wiped = TableStore.open(tmp_path / "b", "tbl", "t", StoreOptions(), history_ms=10**9).store
    wiped.wipe()
    assert wiped._meta is not None and wiped._meta.get(META_HISTORY_SINCE) == history.SINCE_PENDING
    # No longer versioned: its history is dropped, and the store opens as a plain table's.
    wiped.close()
    dropped = TableStore.open(tmp_path / "b", "tbl", "t", StoreOptions()).store
    assert dropped._meta is not None and dropped._meta.get(META_HISTORY_SINCE) is None
    dropped.close()
    with StoreReader(db_dir(tmp_path / "b", "tbl")) as reader:
        assert reader.history is None


@pytest.mark.parametrize(("text", "ms"), [
    ("1700000000123", 1_700_000_000_123), ("2023-11-14T22:13:20Z", 1_700_000_000_000),
    ("2023-11-14T22:13:20.123+00:00", 1_700_000_000_123), ("2023-11-14T23:13:20+01:00", 1_700_000_000_000),
    ("2023-11-14T22:13:20", 1_700_000_000_000)])
def test_as_of_time_is_iso_8601_or_epoch_ms(text: str, ms: int) -> None:
    assert parse_time(text) == ms


def test_a_bad_as_of_time_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_time("yesterday")


def test_status_history_round_trips_and_since_is_a_metric() -> None:
    from globald.common.states import State
    from globald.ops.metrics import Metrics, Sample
    from globald.status.document import DaemonStatus, TableStatus

    proven = {"since": 1_700_000_000_500, "versions": 10, "bytes": 99, "window_ms": 1000, "refused": None}
    pending = {"since": None, "versions": 0, "bytes": 0, "window_ms": 1000, "refused": "none applied yet"}
    doc = DaemonStatus(state=State.RUNNING, pid=1, tables={
        "rates": TableStatus(state="RUNNING", topic="fx", history=proven),
        "new": TableStatus(state="RUNNING", topic="n", history=pending),
        "plain": TableStatus(state="RUNNING", topic="p")})
    assert DaemonStatus.from_json(doc.to_json()).tables["rates"].history == proven
    text = Metrics(lambda: Sample(doc=doc), lambda: (0.0, 0.0)).render().decode()
    assert 'globald_table_history_since_seconds{table="rates"} 1.7000000005e+09' in text
    assert 'globald_table_history_since_seconds{table="new"}' not in text  # pending: absent, never a 0
    assert 'table="plain"' not in "".join(line for line in text.splitlines() if "history" in line)


def test_a_bulk_load_keeps_versions_with_its_offsets(tmp_path: Path) -> None:
    # A restore writes without the WAL and flushes every family at its end: the versions come with the offsets.
    rng = random.Random(3)
    records = _random_records(rng, 500, [b"k%d" % i for i in range(20)])
    store, task = _versioned(tmp_path, window_ms=10**12)
    store.begin_bulk_load()
    _apply(task, records, polls=5, rng=rng)
    store.end_bulk_load()
    store.close()
    with StoreReader(db_dir(tmp_path, "tbl")) as reader:
        assert reader.offsets() == {p: 1 + max(r.offset for r in records if r.partition == p) for p in range(3)}
        for t in rng.sample([r.timestamp for r in records], 50):
            assert {k: (v, ts) for k, v, ts in reader.items_as_of(t)} == as_of_table(records, t)


# -- history added to a store with data, the topic's compaction lag, reloads ----------------------------------------

def test_a_plan_rebuilds_a_store_with_data_declared_versioned_and_since_is_the_replay_start_less_the_lag(
        tmp_path: Path) -> None:
    from globald.engine.identity import PlanFacts, TopicIdentity
    from globald.engine.state_manager import HISTORY_ADDED, StateManager
    from globald.kafka.worker import ClusterWorker
    from globald.settings.ref import ConfigRef

    # A plain table's store with data and offsets; then the table is declared versioned (a restart, or a reload).
    plain = TableStore.open(tmp_path, "tbl", "t", StoreOptions()).store
    rt = TableRuntime(config=TableConfig("tbl", "t"), store=plain, machine=StateMachine(lambda *a: None, "tbl"))
    task = UpdateTask({"tbl": rt})
    task.start("tbl", {})
    task.update([Event(0, 0, _key=b"a", _value=b"old", _ts=5)])  # type: ignore[list-item]
    plain.close()
    config = parse({"state_dir": str(tmp_path), "kafka": {"bootstrap.servers": "127.0.0.1:9"},
                    "tables": [{"name": "tbl", "topic": "t", "history": "1000d"}]})
    events: list[object] = []
    ref = ConfigRef(config)
    manager = StateManager(ref, events.append)
    manager.identity = TopicIdentity(ClusterWorker(ref, 60.0), events.append)  # asks nothing here: facts given
    stored, why = manager.open_table(config.tables[0])
    rt = manager.tables["tbl"]
    assert stored == {0: 1} and why is None and rt.store.history_unproven
    manager.restoring(rt, "starting")
    lag = 3_600_000
    plan = manager.plan(rt, PlanFacts([0], {0: (0, 1)}, None, None, lag))
    # Wiped with its own kind, counted and said as every wipe is, and planned from the log start: no operator step.
    assert plan is not None and plan.starts == {0: 0}
    assert manager.wipe_counts() == {("tbl", HISTORY_ADDED): 1} and isinstance(rt.store, TableStore)
    assert rt.store.get(b"a") is None
    assert any(getattr(e, "kind", None) == HISTORY_ADDED for e in events)
    assert not rt.store.history_unproven and rt.store.compaction_lag_ms == lag
    task = UpdateTask({"tbl": rt})
    task.start("tbl", plan.starts)
    before = history.now_ms()
    task.update([Event(0, 0, _key=b"a", _value=b"old", _ts=5)])
    after = history.now_ms()
    status = rt.store.history_status()
    assert status is not None and before - lag <= status["since"] <= after - lag, status
    assert status["compaction_lag_ms"] == lag and status["refused"] is None
    # A table that tails without a gap keeps its since, across a restart too: nothing left to rebuild.
    rt.store.close()
    rt.store.open_or_wipe()
    again = rt.store.history_status()
    assert not rt.store.history_unproven and again is not None and again["since"] == status["since"]
    manager.close(clean=True)


def test_an_unknown_compaction_lag_gives_no_earlier_since(tmp_path: Path) -> None:
    from globald.kafka.identity import TopicIds

    # A Kafka 0.9 client (no version handshake): no DescribeConfigs to ask, so unknown, and nothing is sent.
    ids = TopicIds({"bootstrap.servers": "127.0.0.1:9", "api.version.request": "false"})
    assert ids.compaction_lag_ms("t", 0.1) is None
    store, task = _versioned(tmp_path, window_ms=10**12)
    store.compaction_lag_ms = None
    before = history.now_ms()
    task.update([Event(0, 0, _key=b"a", _value=b"1", _ts=5)])  # type: ignore[list-item]
    status = store.history_status()
    assert status is not None and status["since"] >= before and status["compaction_lag_ms"] is None


def test_a_reload_adding_history_replaces_the_table_and_a_new_window_or_its_removal_is_taken_in_place() -> None:
    from globald.settings.changes import changes, delta

    base = {"state_dir": "/srv/state", "kafka": {"bootstrap.servers": "127.0.0.1:9092"}}
    v1 = {"format": "avro", "schema": "/schemas/v1.avsc"}
    for table in ({"name": "b", "topic": "tb"}, {"name": "b", "topic": "tb", "value": v1}):  # raw, typed
        typed = "value" in table
        plain, week, day = ({**base, "tables": [{**table, **h}]} for h in ({}, {"history": "7d"}, {"history": "1d"}))
        found = changes(parse(plain), parse(week))  # history added: replaced, replayed
        assert [c.key for c in found] == ["tables.b"] and found[0].replaced and found[0].redeclared is None
        assert found[0].windowed is None and found[0].unversioned is None
        d = delta(parse(plain), parse(week))
        assert d.replaced == (parse(week).table("b"),) and d.windowed == d.unversioned == ()
        found = changes(parse(week), parse(plain))  # removed: in place (tests/unit/test_history_removal.py)
        assert not found[0].replaced and found[0].unversioned == parse(plain).table("b")
        for old, new in ((week, day), (day, week)):  # the window shrinks or grows: in place, nothing replayed
            found = changes(parse(old), parse(new))
            assert found[0].windowed == parse(new).table("b") and not found[0].replaced
            d = delta(parse(old), parse(new))
            assert d.windowed == (parse(new).table("b"),) and d.replaced == d.added == d.dropped == ()
            assert d.stores_dropped == () and d.stores_added == ()
            assert d.redeclared == ((parse(new).table("b"),) if typed else ())  # a typed one is redeclared too
        # A new window with another topic, or a raw table made typed, is still a replacement.
        moved = {**base, "tables": [{**table, "topic": "tc", "history": "1d"}]}
        other = {} if typed else {"value": v1}
        retyped = {**base, "tables": [{"name": "b", "topic": "tb", "history": "1d", **other}]}
        for new in (moved, retyped):
            found = changes(parse(week), parse(new))
            assert found[0].replaced and found[0].windowed is None, new


@pytest.mark.parametrize(("since", "clock", "window", "expected"), [
    (1_000, 50_000, 10_000, 40_000),  # shrunk: forward at once to clock - window
    (45_000, 50_000, 10_000, 45_000),  # already later than the window bounds: kept
    (40_000, 50_000, 30_000, 40_000),  # grown: kept, never back (older versions may be pruned already)
    (40_000, None, 1, 40_000),  # no record time yet: nothing to bound it by
])
def test_a_new_window_moves_since_forward_only(since: int, clock: int | None, window: int, expected: int) -> None:
    assert history.windowed_since(since, clock, window) == expected


def test_a_store_takes_a_new_window_in_place_keeping_its_versions(tmp_path: Path) -> None:
    rng = random.Random(30)
    keys = [b"k%d" % i for i in range(10)]
    base = history.now_ms() + 10**7  # after the replay's start: the window, not the replay, sets since
    records = _random_records(rng, 1000, keys, base=base)
    store, task = _versioned(tmp_path, window_ms=10**9)
    _apply(task, records, polls=10, rng=rng)
    family = store._history_cf
    assert family is not None
    held = len(list(family.keys()))
    clock = max(r.timestamp for r in records)
    first = store.history_status()
    assert first is not None and first["since"] is not None and first["since"] < clock - 4_000
    was, since = store.history_window(10**10)  # grown: since and every version kept
    assert was == since == first["since"] and len(list(family.keys())) == held
    was, since = store.history_window(4_000)  # shrunk: since forward at once, nothing deleted by the change itself
    assert was == first["since"] and since == clock - 4_000 and len(list(family.keys())) == held
    more = [Record(r.key, r.value, r.timestamp + 5, r.partition, r.offset + 1000) for r in records[-50:]]
    _apply(task, more, polls=1, rng=rng)  # the next batch prunes by the new window
    assert len(list(family.keys())) < held
    store.close()
    with StoreReader(db_dir(tmp_path, "tbl")) as reader:  # persisted with the store's metadata
        assert reader.history is not None and reader.history.since == clock + 5 - 4_000
        for t in [rng.randint(reader.history.since, clock + 10) for _ in range(200)]:
            key = rng.choice(keys)
            v = reader.as_of(key, t)
            got = None if v is None or v.value is None else (v.value, v.timestamp)
            assert got == as_of(records + more, key, t), (key, t)


def test_a_bulk_load_keeps_its_own_compaction_shape(tmp_path: Path) -> None:
    # The gate scaling the base level to the table in the middle of a bulk load set off compactions there (a
    # versioned table, twice the bytes, crossed a doubling and restored at half a plain one's rate).
    store, _ = _versioned(tmp_path, window_ms=10**12)
    store.begin_bulk_load()
    store._gate.shape = (1, 1)  # not what the table's size gives: a gate that scales would set it now
    store.fit_compactions(force=True)
    assert store._gate.shape == (1, 1)
    store.end_bulk_load()
    store._gate.shape = (1, 1)
    store.fit_compactions(force=True)  # serving again: the shape follows the table
    assert store._gate.shape != (1, 1)
    store.close()
