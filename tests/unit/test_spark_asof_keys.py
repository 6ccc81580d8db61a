"""As-of lookups of a typed-key table (``globald.spark.asof_keys``), without Spark or a daemon: an Avro long key
written under two byte strings (its varint, and an overlong varint of the same integer), plus keys that do not
decode; the history entries in their stored form, indexed as the executor indexes them, and each row answered by
the as-of fold over the decoded key: of every version of every encoding, the greatest timestamp; on a tie between
encodings the stored key later in key order (the documented rule), within one encoding the later offset. Away from
such ties that is ``globald.embedded.oracle.as_of`` over canonical keys exactly, which is checked too."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from globald import typed
from globald.embedded.oracle import Record, as_of
from globald.settings.typed_spec import ValueFormat
from globald.spark.asof import FILE, FINGERPRINT, AsOfHandle, AsOfIndex, table_of
from globald.spark.asof_keys import TypedAsOf
from globald.store.history import VALUE, HistoryMeta, version_key
from globald.store.names import ASOF_KEYS_PREFIX
from globald.typed.columnar import ColumnarTable, ColumnarTooLarge, write_columnar
from globald.typed.keys import canonical
from tests.unit.test_spark_asof import _index
from tests.unit.typed_fixtures import FIXTURES

BASE = 1_800_000_000_000
LONGS = typed.load(ValueFormat(format="avro", schema=FIXTURES / "key_long.avsc"), "tables[0].key")


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def encodings(n: int) -> tuple[bytes, bytes]:
    """n's Avro varint, and the same integer with one needless continuation byte (decoders accept both)."""
    z, out = _zigzag(n), bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    return bytes(out) + bytes([z]), bytes(out) + bytes([z | 0x80, 0])


def _records(rng: random.Random) -> list[Record]:
    ints = [-3, 0, 1, 7, 63, 64, 2**40]  # 0: the key b"\x00", escaped in the history; 64: a two-byte varint
    out: list[Record] = []
    for i in range(2_500):
        n = rng.choice(ints)
        key = rng.choice(encodings(n)) if n != 7 else encodings(7)[0]  # 7: one encoding only
        if i % 211 == 0:
            key = b"\x02\x00\x00"  # trailing bytes: does not decode, never asked for
        value = None if rng.random() < 0.15 else b"v%d" % i
        ts = BASE + i * 100 + rng.randrange(-2_000, 2_000)
        if i % 53 == 0 and out:  # a tie at one time: the previous record's key, or its other encoding
            prev = out[-1]
            pair = [e for e in (encodings(m) for m in ints) if prev.key in e]
            key, ts = (rng.choice(pair[0]) if pair else prev.key), prev.timestamp
        out.append(Record(key, value, ts, 0, i))
    return out


def _decoded(key: bytes) -> bytes | None:
    return canonical(LONGS.decode(pa.array([key], pa.binary()), collect=True).values)[0].as_py()


def _rule(records: list[Record], canon: dict[bytes, bytes | None], key: bytes, t: int) -> tuple[bytes, int] | None:
    """The documented fold over a decoded key: the greatest (timestamp, stored key, offset) at or before t."""
    mine = [r for r in records if canon[r.key] == key and r.timestamp <= t]
    if not mine:
        return None
    best = max(mine, key=lambda r: (r.timestamp, r.key, r.offset))
    return None if best.value is None else (best.value, best.timestamp)


def test_a_typed_key_is_answered_by_the_as_of_fold_over_its_decoded_form() -> None:
    rng = random.Random(4545)
    records = _records(rng)
    since = BASE + 30_000
    typed_as_of = TypedAsOf(AsOfHandle(_index(records, since), "s", True, None), LONGS, "t")
    assert typed_as_of.groups.key_errors == 1  # every integer stored both ways (7 only through a tie):
    assert typed_as_of.groups.shadowed == 7
    canon = {r.key: _decoded(r.key) for r in records}
    of_key: dict[bytes, list[Record]] = {}  # each decoded key's records, as stored: the folds read only those
    for r in records:
        if (c := canon[r.key]) is not None:
            of_key.setdefault(c, []).append(r)
    canonical_records = {c: [Record(c, r.value, r.timestamp, r.partition, r.offset) for r in rs]
                         for c, rs in of_key.items()}  # the oracle's input: the records under their decoded keys
    stamps = [r.timestamp for r in records]
    asks: list[tuple[int | None, int | None]] = [(None, stamps[-1]), (1, None), (999, stamps[-1])]
    asks += [(int(c), r.timestamp) for r in records[::53] if (c := canon[r.key]) is not None]  # the ties
    for _ in range(1_500):
        t = rng.choice(stamps) if rng.random() < 0.5 else rng.randint(since - 5_000, max(stamps) + 5_000)
        asks.append((rng.choice([-3, 0, 1, 7, 63, 64, 2**40]), t))
    value, stamp, reason = typed_as_of.at(pa.array([n for n, _ in asks], pa.int64()),
                                          pa.array([t for _, t in asks], pa.int64()))
    crossed = 0
    for (n, at), v, ts, why in zip(asks, value.to_pylist(), stamp.to_pylist(), reason.to_pylist(), strict=True):
        if at is None:
            assert (v, ts, why) == (None, None, "the as-of time is null")
            continue
        if at < since:
            assert (v, ts) == (None, None) and "before since" in (why or ""), (n, at)
            continue
        assert why is None
        key = None if n is None else str(n).encode()
        want = None if key is None else _rule(of_key.get(key, []), canon, key, at)
        assert (v, ts) == ((None, None) if want is None else want), (n, at)
        if key is None:
            continue
        top = max((r.timestamp for r in of_key.get(key, []) if r.timestamp <= at), default=None)
        if len({r.key for r in of_key.get(key, []) if r.timestamp == top}) > 1:
            crossed += 1  # two encodings at that millisecond: the rule above, not the offsets, decides
        else:
            assert as_of(canonical_records.get(key, []), key, at) == want, (n, at)
    assert 0 < crossed < len(asks) // 10


def test_a_tombstone_of_one_encoding_hides_an_older_value_of_the_other() -> None:
    plain, overlong = encodings(5)
    records = [Record(plain, b"old", BASE, 0, 0), Record(overlong, None, BASE + 10, 0, 1),
               Record(plain, b"again", BASE + 20, 0, 2)]
    typed_as_of = TypedAsOf(AsOfHandle(_index(records, BASE), "s", True, None), LONGS, "t")
    value, stamp, _ = typed_as_of.at(pa.array(["5"] * 4), pa.array([BASE, BASE + 10, BASE + 15, BASE + 20]))
    assert value.to_pylist() == [b"old", None, None, b"again"]
    assert stamp.to_pylist() == [BASE, None, None, BASE + 20]


def test_a_history_read_by_seeks_is_refused_for_a_typed_key() -> None:
    index = AsOfIndex(None, None, None, None, "t")
    with pytest.raises(ColumnarTooLarge, match=r"\[tables.key\]"):
        TypedAsOf(AsOfHandle(index, "s", True, None), LONGS, "t")


def test_the_key_groups_are_written_once_beside_the_mapped_as_of_file(tmp_path: Path) -> None:
    """A mapped as-of file's snapshot directory gets the groups file; a second worker maps it, same answers."""
    plain, overlong = encodings(-2)
    records = [Record(plain, b"a", BASE, 0, 0), Record(overlong, b"b", BASE + 5, 0, 1)]
    path = tmp_path / FILE
    stored = sorted((version_key(r.key, r.timestamp, r.offset, r.partition), VALUE + (r.value or b""))
                    for r in records)
    marks = HistoryMeta(since=BASE, clock=None, untimed=None)
    write_columnar(path, table_of([([k for k, _ in stored], [v for _, v in stored])], {"table": "t", "snapshot": "s"},
                                  marks))
    answers = []
    for _ in range(2):
        handle = AsOfHandle(AsOfIndex.of_table(ColumnarTable.open(path, FINGERPRINT)), "s", True, None)
        typed_as_of = TypedAsOf(handle, LONGS, "t")
        answers.append(typed_as_of.at(pa.array([-2, -2, 3]), pa.array([BASE, BASE + 9, BASE])))
    [written] = tmp_path.glob(f"{ASOF_KEYS_PREFIX}*")
    assert typed_as_of.groups.table.path == written
    assert answers[0] == answers[1] and answers[0][0].to_pylist() == [b"a", b"b", None]
