"""The columnar file: content and lookups equal to the decoded items (raw and typed), absent and null keys, keys
sharing a hash, on_error = "fail" at lookup, and files that must not be used. The snapshot side (the file beside a
real snapshot, written once per host) is in tests/integration/test_typed.py."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from globald import typed
from globald.settings.typed_spec import ValueFormat
from globald.typed import columnar, columnar_table
from globald.typed.arrow import DecodeFailure, python_rows
from globald.typed.columnar import ColumnarInvalid, ColumnarTable, build_table, key_hashes, write_columnar
from tests.unit.typed_fixtures import FIXTURES, avro_payload, avro_schema, customer_v2


def items(n: int, seed: int = 1) -> list[tuple[bytes, bytes, int]]:
    rnd = random.Random(seed)
    keys = {rnd.randbytes(rnd.randrange(0, 12)) for _ in range(n)} | {b"", b"\x00", b"\x00\x00", b"a", b"a\x00"}
    return sorted((k, rnd.randbytes(rnd.randrange(0, 40)), rnd.randrange(-1, 10**12)) for k in keys)


def test_raw_lookups_equal_the_items(tmp_path: Path) -> None:
    content = items(5000)
    decoder = typed.load(None, "tables[0].value")
    path = tmp_path / "c.arrow"
    write_columnar(path, build_table(content, decoder, {"snapshot": "1"}))
    table = ColumnarTable.open(path, decoder.fingerprint)
    expected = {k: (v, ts) for k, v, ts in content}
    rnd = random.Random(2)
    asked = [k for k, _, _ in rnd.sample(content, 3000)] + [rnd.randbytes(6) for _ in range(500)] + [None]
    rnd.shuffle(asked)
    found = table.lookup(pa.array(asked, pa.binary()))
    got = list(zip(found.values.to_pylist(), found.timestamps.to_pylist(), strict=True))
    assert got == [expected.get(k, (None, None)) if k is not None else (None, None) for k in asked]
    assert found.found == sum(k in expected for k in asked if k is not None) and found.error_count == 0
    assert table.keys.to_pylist() == [k for k, _, _ in content]  # rows in the snapshot's key order


def test_string_keys_are_looked_up_as_utf8() -> None:
    content = sorted((f"cust-{i}-é".encode(), b"v%d" % i, i) for i in range(100))
    table = ColumnarTable(build_table(content, typed.load(None, "t"), {}))
    found = table.lookup(pa.array(["cust-7-é", "nope", None]))
    assert found.values.to_pylist() == [b"v7", None, None]


def test_keys_sharing_a_hash_are_still_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pure logic: a hash that collides for every key exercises the probe and the byte-by-byte confirmation.
    for module in (columnar, columnar_table):  # the builder's hashes and the reader's
        monkeypatch.setattr(module, "key_hashes", lambda keys: np.full(len(keys), 42, np.uint64))
    content = items(60)
    table = ColumnarTable(build_table(content, typed.load(None, "t"), {}))
    asked = [k for k, _, _ in content] + [b"absent"]
    assert table.lookup(pa.array(asked, pa.binary())).values.to_pylist() == [v for _, v, _ in content] + [None]



@pytest.mark.parametrize("asked_n", [1, columnar_table._PROBE_TAIL, columnar_table._PROBE_TAIL + 1, 700])
def test_long_chains_are_probed_to_their_ends_in_batches_of_any_size(monkeypatch: pytest.MonkeyPatch,
                                                                     asked_n: int) -> None:
    # Four hashes for every key: chains as long as the index allows, ended a slot a round and then in one round
    # (the tail), or in one round from the start; absent keys end at an empty slot or at the chain's end.
    for module in (columnar, columnar_table):  # the builder's hashes and the reader's
        monkeypatch.setattr(module, "key_hashes",
                            lambda keys: np.array([len(k or b"") % 4 for k in keys.to_pylist()], np.uint64))
    content = items(300, seed=3)
    table = ColumnarTable(build_table(content, typed.load(None, "t"), {}))
    row = {k: i for i, (k, _, _) in enumerate(content)}
    rnd = random.Random(asked_n)
    asked = [rnd.choice(content)[0] if rnd.random() < 0.8 else b"absent-%d" % i for i in range(asked_n)]
    assert table.positions(pa.array(asked, pa.binary())).tolist() == [row.get(k, -1) for k in asked]

def test_the_hash_spreads_keys_of_one_and_of_many_lengths() -> None:
    fixed = pa.array([b"%016d" % i for i in range(20000)], pa.binary())
    mixed = pa.array([b"k" * (i % 7) + b"%d" % i for i in range(20000)], pa.binary())
    for keys in (fixed, mixed):
        h = key_hashes(keys)
        assert len(np.unique(h)) == len(keys)
        assert abs(np.bincount((h % np.uint64(64)).astype(np.int64), minlength=64).std()) < 60  # low bits mixed
    sliced = fixed.slice(100, 50)
    assert np.array_equal(key_hashes(sliced), key_hashes(fixed)[100:150])


def typed_content() -> list[tuple[bytes, bytes, int]]:
    content = [(b"k%03d" % i, b"\x00\x00\x00\x00\x02" + avro_payload("customer_v2.avsc", customer_v2(i)), i)
               for i in range(50)]
    content[7] = (b"k007", b"\x00\x00\x00\x00\x09garbage", 7)  # an id the table does not know
    return content


def avro(on_error: str) -> typed.arrow.Decoder:
    return typed.load(ValueFormat(format="avro", schema=FIXTURES / "customer_reader.avsc", framing="confluent",
                                  writer_schemas=FIXTURES / "ids", on_error=on_error), "tables[0].value")


def test_typed_lookups_are_the_reference_decode_and_count_errors() -> None:
    import io

    import fastavro

    table = ColumnarTable(build_table(typed_content(), avro("null"), {}))
    assert table.error_count == 1 and table.meta["errors"] == 1
    found = table.lookup(pa.array([b"k003", b"k007", b"k049", b"zzz"], pa.binary()))
    writer, reader = avro_schema("customer_v2.avsc"), avro_schema("customer_reader.avsc")
    ref = [fastavro.schemaless_reader(io.BytesIO(typed_content()[i][1][5:]), writer, reader) for i in (3, 49)]
    assert python_rows(found.values) == [ref[0], None, ref[1], None]
    assert found.error_count == 1 and "unknown schema id 9" in found.errors[1].as_py()
    assert found.found == 3


def test_on_error_fail_fails_the_lookup_of_the_bad_key_only() -> None:
    table = ColumnarTable(build_table(typed_content(), avro("fail"), {}))  # building never raises
    assert table.lookup(pa.array([b"k003", b"k008"], pa.binary())).error_count == 0
    with pytest.raises(DecodeFailure, match=r"value of key 'k007' \(partition unknown, offset unknown\) does not "
                                            r"decode: unknown schema id 9"):
        table.lookup(pa.array([b"k003", b"k007"], pa.binary()))


def test_a_file_of_another_declaration_or_damaged_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "c.arrow"
    raw = typed.load(None, "t")
    write_columnar(path, build_table(items(100), raw, {}))
    with pytest.raises(ColumnarInvalid, match="another declaration"):
        ColumnarTable.open(path, avro("null").fingerprint)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ColumnarInvalid):
        ColumnarTable.open(path, raw.fingerprint)
    with pytest.raises(FileNotFoundError):
        ColumnarTable.open(tmp_path / "none.arrow", raw.fingerprint)


def test_an_empty_snapshot() -> None:
    table = ColumnarTable(build_table([], avro("null"), {}))
    found = table.lookup(pa.array([b"a", None], pa.binary()))
    assert found.values.null_count == 2 and found.values.type == avro("null").arrow_type


def test_join_columns_struct_flattened_and_error() -> None:
    from globald.typed.join import spark_type, typed_columns

    decoder = avro("null")
    found = ColumnarTable(build_table(typed_content(), decoder, {})).lookup(pa.array([b"k001", b"k007", b"x"]))
    cols = typed_columns(found, "customer", timestamp_col="customer_ts", error_col="customer_error")
    assert list(cols) == ["customer", "customer_error", "customer_ts"]
    assert cols["customer_ts"].to_pylist() == [1, 7, None]
    flat = typed_columns(found, "customer", flatten_prefix="c_")
    assert list(flat)[:3] == ["c_id", "c_name", "c_tags"] and flat["c_id"].to_pylist() == [1, None, None]
    assert spark_type(decoder).simpleString().startswith("struct<id:bigint,name:string,tags:array<string>")


def test_a_snapshot_too_large_for_one_file_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pure logic: 2 GB of keys is too much for a unit test; what Arrow raises then is simulated.
    def overflow(arrays: list[pa.Array]) -> pa.Array:
        raise pa.ArrowCapacityError("array cannot contain more than 2147483646 bytes")

    monkeypatch.setattr(columnar.pa, "concat_arrays", overflow)
    with pytest.raises(columnar.ColumnarTooLarge, match="big snapshot 42: array cannot contain"):
        build_table(items(10), typed.load(None, "t"), {"table": "big", "snapshot": "42"})
