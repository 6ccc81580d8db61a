"""Origins of a typed table's values (``store.names.ORIGINS_CF``): written by the fold in the batch that writes the
value, on a real RocksDB; never claimed for a value they do not describe; dropped when the table stops being typed;
carried into the columnar file so that on_error = "fail" names the partition and offset. The Spark and CLI side,
against a real broker, is in tests/integration/test_spark_typed.py and tests/integration/test_typed.py."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from rocksdict import Options, Rdict

from globald import typed
from globald.common.states import StateMachine
from globald.engine.table import TableRuntime
from globald.engine.update_task import UpdateTask
from globald.settings.config import TableConfig
from globald.settings.typed_spec import ValueFormat
from globald.store.codec import decode_origin, encode_origin, encode_value
from globald.store.names import DEFAULT_CF, ORIGINS_CF, VALUES_CF, db_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from globald.typed.arrow import DecodeFailure
from globald.typed.columnar import ERROR_OFFSET, ColumnarTable, build_table, write_columnar
from tests.unit.test_typed_columnar import avro, typed_content
from tests.unit.test_update_task import Event

TYPED = TableConfig("tbl", "t", value=ValueFormat(format="json", schema=Path("unused.ddl")))


def test_an_origin_names_only_the_value_it_was_written_with() -> None:
    stored = encode_value(7, b"value")
    raw = encode_origin(3, 1 << 40, stored)
    assert decode_origin(raw, stored) == (3, 1 << 40)
    assert decode_origin(raw, encode_value(7, b"other")) is None  # left behind by a write that did not update it
    assert decode_origin(raw, encode_value(8, b"value")) is None
    assert decode_origin(None, stored) is None and decode_origin(raw[:-1], stored) is None


def _runtime(tmp_path: Path, config: TableConfig) -> tuple[TableRuntime, UpdateTask]:
    store = TableStore.open(tmp_path, config.name, config.topic, StoreOptions(), origins=config.typed).store
    rt = TableRuntime(config=config, store=store, machine=StateMachine(lambda *a: None, config.name))
    task = UpdateTask({config.name: rt})
    task.start(config.name, {})
    return rt, task


def _open_all(state_dir: Path) -> Rdict:
    path = str(db_dir(state_dir, "tbl"))
    return Rdict(path, Options(raw_mode=True),
                 column_families={cf: Options(raw_mode=True) for cf in Rdict.list_cf(path) if cf != DEFAULT_CF})


def _oracle(events: list[Event]) -> dict[bytes, tuple[bytes, int, int, int]]:
    """The last record per key: (value, timestamp, partition, offset); tombstones delete."""
    out: dict[bytes, tuple[bytes, int, int, int]] = {}
    for e in events:
        if e._key is None:
            continue
        if e._value is None:
            out.pop(e._key, None)
        else:
            out[e._key] = (e._value, e._ts, e._partition, e._offset)
    return out


def _events(seed: int, n: int) -> list[Event]:
    rnd = random.Random(seed)
    next_offset = {0: 0, 1: 0}
    events = []
    for _ in range(n):
        p = rnd.randrange(2)
        key = None if rnd.random() < 0.03 else b"k%d" % rnd.randrange(40)
        value = None if rnd.random() < 0.15 else rnd.randbytes(rnd.randrange(0, 20))
        events.append(Event(p, next_offset[p], _key=key, _value=value, _ts=rnd.randrange(1, 10**12)))
        next_offset[p] += 1
    return events


def _origins(tmp_path: Path, oracle: dict[bytes, tuple[bytes, int, int, int]]) -> dict[bytes, tuple[int, int] | None]:
    keys = sorted(oracle)
    with StoreReader(db_dir(tmp_path, "tbl")) as r:
        assert {k: (v, ts) for k, v, ts in r.items()} == {k: o[:2] for k, o in oracle.items()}
        found = r.origins(keys, [oracle[k][0] for k in keys], [oracle[k][1] for k in keys])
    return dict(zip(keys, found, strict=True))


def test_a_typed_store_records_where_each_value_came_from(tmp_path: Path) -> None:
    rt, task = _runtime(tmp_path, TYPED)
    events = _events(1, 600)
    for i in range(0, len(events), 50):  # several polls, a key overwritten and deleted across them
        task.update(events[i:i + 50])
    rt.store.close()
    oracle = _oracle(events)
    assert _origins(tmp_path, oracle) == {k: (o[2], o[3]) for k, o in oracle.items()}
    db = _open_all(tmp_path)
    kept = {k for k, _ in db.get_column_family(ORIGINS_CF).items()}
    db.close()
    assert kept == set(oracle)  # a tombstone deleted its key's origin too


def test_a_table_no_longer_typed_drops_its_origins_and_a_typed_one_records_from_then_on(tmp_path: Path) -> None:
    events = _events(2, 300)
    rt, task = _runtime(tmp_path, TYPED)
    task.update(events[:100])
    rt.store.close()
    raw = TableConfig("tbl", "t")
    rt, task = _runtime(tmp_path, raw)
    assert ORIGINS_CF not in Rdict.list_cf(str(db_dir(tmp_path, "tbl")))
    task.start("tbl", rt.store.offsets())
    task.update(events[100:200])
    rt.store.close()
    rt, task = _runtime(tmp_path, TYPED)
    task.start("tbl", rt.store.offsets())
    task.update(events[200:])
    rt.store.close()
    oracle = _oracle(events)
    late = {e._key for e in events[200:] if e._key is not None}
    assert _origins(tmp_path, oracle) == {k: (o[2], o[3]) if k in late else None for k, o in oracle.items()}


def test_a_value_written_without_its_origin_is_never_named_by_the_old_one(tmp_path: Path) -> None:
    rt, task = _runtime(tmp_path, TYPED)
    task.update([Event(0, 0, _key=b"a", _value=b"one", _ts=5), Event(0, 1, _key=b"b", _value=b"two", _ts=5)])
    rt.store.close()
    # What a globald that knows nothing of origins would do (it could not even open the store): a new value alone.
    db = _open_all(tmp_path)
    db.get_column_family(VALUES_CF)[b"a"] = encode_value(9, b"changed")
    db.close()
    with StoreReader(db_dir(tmp_path, "tbl")) as r:
        assert r.origins([b"a", b"b"], [b"changed", b"two"], [9, 5]) == [None, (0, 1)]


def test_the_columnar_file_keeps_the_origin_of_each_bad_value_only(tmp_path: Path) -> None:
    content = typed_content()
    bad = [k for k, v, _ in content if v[1:5] == b"\x00\x00\x00\x09"]
    assert bad, "the fixture holds a value under an unknown schema id"
    asked: list[list[bytes]] = []

    def origins(keys: object, values: object, stamps: object) -> list[tuple[int, int] | None]:
        asked.append(list(keys))  # type: ignore[call-overload]
        return [(4, 1000 + i) for i, _ in enumerate(asked[-1])]

    path = tmp_path / "c.arrow"
    write_columnar(path, build_table(content, avro("fail"), {}, origins=origins))
    assert asked == [bad]  # asked for the values that did not decode, and for nothing else
    table = ColumnarTable.open(path, avro("fail").fingerprint)
    with pytest.raises(DecodeFailure, match=rf"value of key '{bad[0].decode()}' \(partition 4, offset 1000\) does "
                                            r"not decode: unknown schema id 9") as failure:
        table.lookup(pa.array([content[0][0], bad[0]], pa.binary()))
    assert (failure.value.partition, failure.value.offset) == (4, 1000)
    clean = [(k, v, ts) for k, v, ts in content if k not in bad]
    assert ERROR_OFFSET not in build_table(clean, avro("fail"), {}, origins=origins).schema.names
    assert ERROR_OFFSET not in build_table(content, typed.load(None, "t"), {}, origins=origins).schema.names
