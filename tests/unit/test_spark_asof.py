"""The executor's as-of index (``globald.spark.asof``) against the as-of fold (``globald.embedded.oracle.as_of``) at
many random keys and times, without Spark or a daemon: history entries in their stored form and order (as the
history family holds them), parsed, indexed and searched a batch at a time; out-of-order timestamps, ties,
tombstones, NUL and 0xff bytes in keys, times before ``since``, null times and null keys. The Spark and daemon end
of the same contract is tests/tansu/test_spark_as_of.py."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from globald.embedded.oracle import Record, as_of
from globald.spark.asof import AsOfIndex, AsOfRefusedError, table_of, times_ms
from globald.store.history import TOMBSTONE, VALUE, HistoryMeta, Version, version_key
from globald.typed.columnar import ColumnarTable

BASE = 1_800_000_000_000


def _records(rng: random.Random, fixed: bool = False, step: int = 100) -> list[Record]:
    """Versions of 25 keys; ``fixed``: every value of one width; ``step``: ms between versions (1M: a span of 35
    days, too wide for int32 stamps)."""
    keys = [b"k%d" % i for i in range(20)] + [b"\x00", b"\x00\xff\x00", b"a\x00b", b"\xff" * 3, b""]
    out: list[Record] = []
    offsets = [0, 0]
    for i in range(3_000):
        key = rng.choice(keys)
        partition = hash(key) % 2
        value = None if rng.random() < 0.15 else (b"v%05d" % i if fixed else b"v%d" % i)
        ts = BASE + i * step + rng.randrange(-2_000, 2_000)  # wanders back and forth: placed by time
        if i % 97 == 0 and out:  # a tie: another version of a key at a time it already has
            key, ts, partition = out[-1].key, out[-1].timestamp, out[-1].partition
        out.append(Record(key, value, ts, partition, offsets[partition]))
        offsets[partition] += 1
    return out


def _index(records: list[Record], since: int | None, chunk: int = 700) -> AsOfIndex:
    stored = sorted((version_key(r.key, r.timestamp, r.offset, r.partition),
                     TOMBSTONE if r.value is None else VALUE + r.value) for r in records)
    chunks = [([k for k, _ in stored[i:i + chunk]], [v for _, v in stored[i:i + chunk]])
              for i in range(0, len(stored), chunk)]  # chunks cut a key's versions: the index joins them
    marks = HistoryMeta(since=since, clock=None, untimed=None)
    return AsOfIndex.of_table(ColumnarTable(table_of(chunks, {"table": "t", "snapshot": "s"}, marks)))


@pytest.mark.parametrize(("fixed", "step", "layout"), [
    (False, 100, (pa.int32(), pa.binary())),
    (True, 100, (pa.int32(), pa.binary(6))),  # one width: no value offsets
    (True, 1_000_000, (pa.int64(), pa.binary(6))),  # a span past int32 milliseconds: int64 stamps
])
def test_the_index_answers_as_the_as_of_fold(fixed: bool, step: int, layout: tuple[pa.DataType, pa.DataType]
                                             ) -> None:
    rng = random.Random(45)
    records = _records(rng, fixed, step)
    since = BASE + 500 * step
    index = _index(records, since)
    assert index.table is not None
    version = index.table.arrow.column("older").type.value_type
    assert (version.field("timestamp").type, version.field("value").type) == layout
    assert (index.table.timestamps.type, index.table.values.type) == layout  # each key's newest version
    keys = sorted({r.key for r in records})
    stamps = [r.timestamp for r in records]
    asks: list[tuple[bytes | None, int | None]] = [(None, stamps[0]), (keys[0], None), (b"absent", stamps[-1]),
                                                   (keys[1], 2**62), (keys[2], max(stamps) + 2**31)]
    for _ in range(4_000):
        t = rng.choice(stamps) if rng.random() < 0.5 else rng.randint(since - 5_000, max(stamps) + 5_000)
        asks.append((rng.choice(keys), t))
    value, stamp, reason = index.at(pa.array([k for k, _ in asks], pa.binary()),
                                    pa.array([t for _, t in asks], pa.int64()))
    for (key, at), v, ts, why in zip(asks, value.to_pylist(), stamp.to_pylist(), reason.to_pylist(), strict=True):
        if at is None:
            assert (v, ts, why) == (None, None, "the as-of time is null")
        elif at < since:
            assert (v, ts) == (None, None) and why is not None and "before since" in why, (key, at)
        else:
            want = None if key is None else as_of(records, key, at)
            assert (v, ts) == ((None, None) if want is None else want), (key, at)
            assert why is None


def test_times_in_any_unit_are_floored_to_their_millisecond() -> None:
    us = pa.array([1_500, -1_500, None], pa.timestamp("us", tz="UTC"))
    assert times_ms(us).to_pylist() == [1, -2, None]
    assert times_ms(pa.array([3], pa.timestamp("s"))).to_pylist() == [3_000]
    assert times_ms(pa.array([7], pa.int32())).to_pylist() == [7]
    with pytest.raises(TypeError, match="timestamp"):
        times_ms(pa.array(["x"]))


def test_a_refused_history_fails_the_lookup_with_its_line() -> None:
    table = table_of([], {"table": "t", "snapshot": "s"}, HistoryMeta(since=None, clock=None, untimed="0/5"))
    index = AsOfIndex.of_table(ColumnarTable(table))
    with pytest.raises(AsOfRefusedError, match="carry no timestamp"):
        index.at(pa.array([b"k"]), pa.array([1], pa.int64()))


class _Snap:
    """A snapshot too large for the as-of file, as ``AsOfIndex`` reads it then: one ``as_of`` a row."""

    def __init__(self, records: list[Record]) -> None:
        self.records, self.renewed = records, 0

    def renew(self) -> None:
        self.renewed += 1

    def as_of(self, key: bytes, t: int) -> Version | None:
        best = max((r for r in self.records if r.key == key and r.timestamp <= t),
                   key=lambda r: (r.timestamp, r.offset, r.partition), default=None)
        return None if best is None else Version(key, best.value, best.timestamp, best.offset, best.partition)


def test_a_history_read_by_seeks_answers_alike() -> None:
    rng = random.Random(7)
    records = _records(rng)[:600]
    since = BASE + 1_000
    mapped = _index(records, since)
    seeks = AsOfIndex(None, _Snap(records), since, None, "t")  # type: ignore[arg-type]
    keys = pa.array([rng.choice(records).key for _ in range(300)] + [None], pa.binary())
    times = pa.array([rng.randint(BASE - 3_000, BASE + 70_000) for _ in range(300)] + [BASE], pa.int64())
    assert [c.to_pylist() for c in seeks.at(keys, times)] == [c.to_pylist() for c in mapped.at(keys, times)]


def test_times_before_every_version_or_far_past_the_narrowed_stamps_answer_as_the_fold() -> None:
    records = _records(random.Random(7), fixed=True)
    index = _index(records, -2**62 - 1)  # every time asked is from since on
    newest = max(records, key=lambda r: (r.timestamp, r.offset))
    keys = [newest.key] * 4
    times = [-2**62, BASE - 10**7, newest.timestamp, 2**62]
    value, stamp, reason = index.at(pa.array(keys, pa.binary()), pa.array(times, pa.int64()))
    for at, v, ts in zip(times, value.to_pylist(), stamp.to_pylist(), strict=True):
        want = as_of(records, newest.key, at)
        assert (v, ts) == ((None, None) if want is None else want), at
    assert reason.null_count == 4


def test_a_history_of_one_version_a_key_has_no_older_list_and_answers_as_the_fold() -> None:
    records = [Record(b"k%d" % i, None if i % 5 == 0 else b"v%d" % i, BASE + i, 0, i) for i in range(50)]
    index = _index(records, BASE - 10)
    keys = [r.key for r in records] * 2
    times = [BASE - 1] * 50 + [BASE + 100] * 50
    value, stamp, _ = index.at(pa.array(keys, pa.binary()), pa.array(times, pa.int64()))
    for key, at, v, ts in zip(keys, times, value.to_pylist(), stamp.to_pylist(), strict=True):
        want = as_of(records, key, at)
        assert (v, ts) == ((None, None) if want is None else want), (key, at)
