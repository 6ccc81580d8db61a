"""UpdateTask on a real store with hand-made consumer events: stale errors of a given-up assignment are ignored."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from globald.common.errors import StoreUnavailableError
from globald.common.states import StateMachine
from globald.engine.table import TableRuntime
from globald.engine.update_task import UpdateTask
from globald.settings.config import TableConfig
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore


@dataclass
class Event:
    """Stands in for confluent_kafka.Message, which cannot be constructed with an error from Python."""

    _partition: int
    _offset: int
    _code: int | None = None
    _key: bytes | None = b"k"
    _value: bytes | None = b"v"
    _topic: str = "t"
    _ts: int = 0

    def error(self) -> KafkaError | None:
        return None if self._code is None else KafkaError(self._code)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts) if self._ts else (0, 0)  # (TIMESTAMP_CREATE_TIME, ts), or none given


def _task(tmp_path: Path) -> tuple[TableRuntime, UpdateTask]:
    store = TableStore.open(tmp_path, "tbl", "t", StoreOptions()).store
    rt = TableRuntime(config=TableConfig("tbl", "t"), store=store, machine=StateMachine(lambda *a: None, "tbl"))
    rt.end_offsets = {0: 20}
    task = UpdateTask({"tbl": rt})
    task.start("tbl", {0: 10})
    return rt, task


def test_invalid_offset_counts_only_at_the_current_position(tmp_path: Path) -> None:
    rt, task = _task(tmp_path)
    stale = task.update([Event(0, 5000, KafkaError._AUTO_OFFSET_RESET)])  # asked for by an earlier assignment
    assert stale.tables["tbl"].invalid_offset is None
    current = task.update([Event(0, 10, KafkaError._AUTO_OFFSET_RESET)])
    assert current.tables["tbl"].invalid_offset is not None
    assert task.positions("tbl") == {0: 10} and rt.store.offsets() == {}  # no write for a table about to be wiped
    rt.store.close()


def test_end_of_partition_advances_only_within_known_ends(tmp_path: Path) -> None:
    rt, task = _task(tmp_path)
    r = task.update([Event(0, 12), Event(0, 20, KafkaError._PARTITION_EOF)])  # a compaction gap 13..19 at the tail
    assert r.tables["tbl"].positions == {0: 20} and rt.store.offsets() == {0: 20} == task.positions("tbl")
    r = task.update([Event(0, 67_000, KafkaError._PARTITION_EOF)])  # the end of a topic since deleted
    assert r.tables["tbl"].positions == {} and rt.store.offsets() == {0: 20}
    task.start("tbl", {})  # wiped, not yet planned: nothing may set its offsets
    r = task.update([Event(0, 20, KafkaError._PARTITION_EOF)])
    assert r.tables["tbl"].positions == {}
    rt.store.close()


def test_an_end_past_the_known_ends_moves_positions_once_the_broker_confirms_it(tmp_path: Path) -> None:
    rt, task = _task(tmp_path)
    # Records up to 19, then the end of partition past a transaction's commit marker at 20, after the plan's end.
    r = task.update([Event(0, 19), Event(0, 21, KafkaError._PARTITION_EOF)])
    assert r.tables["tbl"].positions == {0: 20} and rt.store.offsets() == {0: 20}
    assert task.unconfirmed_ends == {"tbl": {0: 21}}
    task.committed("tbl")
    assert task.confirm_ends("tbl", {0: 21}) == {0: 21}  # the broker's end (last stable offset) reached it
    assert rt.store.offsets() == {0: 21} == task.positions("tbl") and "tbl" in task.dirty
    assert task.unconfirmed_ends == {"tbl": {}}

    task.update([Event(0, 67_000, KafkaError._PARTITION_EOF)])  # the end of a topic since deleted
    assert task.confirm_ends("tbl", {0: 30}) == {} and task.unconfirmed_ends == {"tbl": {}}
    assert rt.store.offsets() == {0: 21}

    task.update([Event(0, 25, KafkaError._PARTITION_EOF)])
    task.update([Event(0, 24)])  # records reached it: nothing is left to confirm
    assert task.unconfirmed_ends == {"tbl": {}} and rt.store.offsets() == {0: 25}
    task.update([Event(0, 40, KafkaError._PARTITION_EOF)])
    task.start("tbl", {})  # wiped: what was seen before is forgotten
    assert task.unconfirmed_ends == {"tbl": {}}
    rt.store.close()


def test_a_failed_write_moves_no_position(tmp_path: Path) -> None:
    rt, task = _task(tmp_path)
    rt.store.close()  # every write now fails, as on a disk that refuses
    with pytest.raises(StoreUnavailableError):
        task.update([Event(0, 10), Event(0, 11)])
    assert task.positions("tbl") == {0: 10} and not task.dirty


def test_a_held_back_write_is_made_again_with_the_same_records_and_offsets(tmp_path: Path) -> None:
    """When RocksDB holds a write back, the batch (consumed by rocksdict) is made again from the poll's records:
    the store it leaves must equal the one the poll's own batch leaves, tombstones, null keys and errors included."""
    poll = [Event(0, 10, _key=b"a", _value=b"1"), Event(0, 11, _key=b"b", _value=b"2"),
            Event(0, 12, _key=None, _value=b"null key"), Event(0, 13, _key=b"a", _value=None),
            Event(0, 14, KafkaError._PARTITION_EOF), Event(0, 14, _key=b"c", _value=b"3"),
            Event(0, 15, _key=b"b", _value=b"4")]
    rt, task = _task(tmp_path / "once")
    task.update(poll)
    again, other = _task(tmp_path / "again")
    again.store.write(other._refold(again, poll, {0: 16}, {}), rebuild=lambda: pytest.fail("no stall expected"))
    assert rt.store.offsets() == again.store.offsets() == {0: 16}
    expected = {b"b": (b"4", -1), b"c": (b"3", -1)}  # -1: the events carry no timestamp
    assert {k: rt.store.get(k) for k in (b"a", b"b", b"c")} == {b"a": None, **expected}
    assert {k: again.store.get(k) for k in (b"a", b"b", b"c")} == {b"a": None, **expected}
    rt.store.close()
    again.store.close()


@pytest.mark.parametrize("seed", range(8))
def test_polls_of_interleaved_runs_leave_each_table_equal_to_the_fold_of_its_records(tmp_path: Path,
                                                                                      seed: int) -> None:
    """Two tables, three partitions each, polls mixing runs of every length with end-of-partition and transient
    error events in the middle of a run, records of a topic no table reads, null keys and tombstones: after each
    poll every table holds the last value per key of its records so far, and positions just past its last records."""
    rnd = random.Random(seed)
    runtimes = {}
    for name, topic in (("one", "t1"), ("two", "t2")):
        store = TableStore.open(tmp_path / name, name, topic, StoreOptions()).store
        runtimes[name] = TableRuntime(config=TableConfig(name, topic), store=store,
                                      machine=StateMachine(lambda *a: None, name))
    task = UpdateTask(runtimes)
    for name in runtimes:
        task.start(name, {})
    next_offset = {(t, p): 0 for t in ("t1", "t2", "other") for p in range(3)}
    oracle: dict[str, dict[bytes, tuple[bytes, int]]] = {"one": {}, "two": {}}
    applied = {"one": 0, "two": 0}
    for _ in range(12):
        poll: list[Event] = []
        while len(poll) < rnd.randrange(1, 300):
            topic, p = rnd.choice(["t1", "t2", "other"]), rnd.randrange(3)
            for _ in range(rnd.choice([1, 1, 2, 5, 40])):
                roll = rnd.random()
                o = next_offset[topic, p]
                if roll < 0.04:
                    poll.append(Event(p, o, KafkaError._PARTITION_EOF, _topic=topic))
                    continue
                if roll < 0.06:
                    poll.append(Event(p, o, KafkaError._TRANSPORT, _topic=topic))
                    continue
                key = None if roll < 0.1 else b"k%d" % rnd.randrange(60)
                value = None if roll < 0.25 else rnd.randbytes(rnd.randrange(0, 12))
                ts = rnd.choice([0, 1_700_000_000_000 + o])
                poll.append(Event(p, o, _key=key, _value=value, _topic=topic, _ts=ts))
                next_offset[topic, p] = o + 1
                table = {"t1": "one", "t2": "two"}.get(topic)
                if table is None or key is None:
                    applied[table] = applied.get(table, 0) + (table is not None)
                    continue
                applied[table] += 1
                if value is None:
                    oracle[table].pop(key, None)
                else:
                    oracle[table][key] = (value, ts or -1)
        result = task.update(poll)
        assert len(result.errors) == sum(e._code == KafkaError._TRANSPORT for e in poll)
        for name, topic in (("one", "t1"), ("two", "t2")):
            store = runtimes[name].store
            expected = {p: next_offset[topic, p] for p in range(3) if next_offset[topic, p]}
            assert store.offsets() == expected == task.positions(name)
            held = {k: store.get(k) for k in (b"k%d" % i for i in range(60))}
            assert {k: v for k, v in held.items() if v is not None} == oracle[name]
            assert task.applied[name].records == applied[name]
    for rt in runtimes.values():
        rt.store.close()
