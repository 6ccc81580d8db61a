"""Typed keys (``[tables.key]``): the columnar file indexed on the canonical form of the decoded key. A string key
matched by a string column, an integer key by an integer column or its decimal text; keys that do not decode left
out and counted; two stored keys decoding alike resolved to the latest; struct keys refused in one line; a typed-key
file never shares a path or a fingerprint with the raw-key file of the same snapshot. Keys are encoded here by
fastavro, orjson and struct directly, never by globald's code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from globald import typed
from globald.settings.typed_spec import ValueFormat
from globald.typed import columnar, columnar_table
from globald.typed.arrow import DecodeFailure, Decoder
from globald.typed.columnar import ColumnarInvalid, ColumnarTable, build_table, columnar_path, write_columnar
from globald.typed.keys import KeyTypeUnsupported, canonical
from tests.unit.typed_fixtures import FIXTURES, avro_payload, confluent


def key_decoder(fmt: str = "avro", schema: str = "key.avsc", framing: str = "confluent",
                on_error: str = "null") -> Decoder:
    writers = FIXTURES / "keyids" if framing == "confluent" and fmt == "avro" else None
    return typed.load(ValueFormat(format=fmt, schema=FIXTURES / schema, framing=framing, writer_schemas=writers,
                                  on_error=on_error), "tables[0].key")


def avro_key(text: str, schema_id: int = 1) -> bytes:
    return confluent(schema_id, avro_payload("key.avsc", text))  # type: ignore[arg-type]


RAW = typed.load(None, "tables[0].value")


def test_a_framed_avro_string_key_is_matched_by_a_string_column_and_bad_keys_are_left_out() -> None:
    content = sorted([(avro_key(f"cust-{i}-é"), b"v%d" % i, i) for i in range(200)]
                     + [(confluent(9, b"\x02a"), b"unknown id", 1), (avro_key("cust-x")[:-2], b"truncated", 1),
                        (b"\x01\x00\x00\x00\x01\x02a", b"wrong magic", 1)])
    table = ColumnarTable(build_table(content, RAW, {"table": "cust"}, key_decoder()))
    assert len(table) == 200 and table.meta["key_errors"] == 3 and table.meta["key_shadowed"] == 0
    found = table.lookup(pa.array(["cust-7-é", "cust-199-é", "cust-x", "a", None]))
    assert found.values.to_pylist() == [b"v7", b"v199", None, None, None]
    assert found.timestamps.to_pylist() == [7, 199, None, None, None]
    # the same bytes as binary match too; the raw (framed) bytes do not: the index holds decoded keys
    assert table.lookup(pa.array([b"cust-3-\xc3\xa9", avro_key("cust-3-é")])).values.to_pylist() == [b"v3", None]


def test_two_stored_keys_decoding_alike_keep_the_latest_and_count_the_shadowed() -> None:
    content = sorted([
        (avro_key("a", 1), b"a-old", 5), (avro_key("a", 2), b"a-new", 9),  # greater timestamp wins
        (avro_key("b", 1), b"b-new", 9), (avro_key("b", 2), b"b-old", 5),  # whichever id it is under
        (avro_key("c", 1), b"c-1", 7), (avro_key("c", 2), b"c-2", 7),  # a tie: the later in key order (id 2)
        (avro_key("d", 2), b"d", 1),
    ])
    table = ColumnarTable(build_table(content, RAW, {"table": "t"}, key_decoder()))
    assert table.meta["key_shadowed"] == 3 and len(table) == 4
    found = table.lookup(pa.array(["a", "b", "c", "d"]))
    assert found.values.to_pylist() == [b"a-new", b"b-new", b"c-2", b"d"]
    assert found.timestamps.to_pylist() == [9, 9, 7, 1]


def test_keys_sharing_a_hash_are_deduplicated_by_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pure logic: a hash colliding for every key must neither merge distinct keys nor hide real duplicates.
    for module in (columnar, columnar_table):  # the builder's hashes and the reader's
        monkeypatch.setattr(module, "key_hashes", lambda keys: np.full(len(keys), 7, np.uint64))
    content = sorted([(avro_key(f"k{i}", 1 + i % 2), b"v%d" % i, i) for i in range(30)]
                     + [(avro_key("k3", 1), b"x", 0)])
    table = ColumnarTable(build_table(content, RAW, {"table": "t"}, key_decoder()))
    assert table.meta["key_shadowed"] == 1
    assert table.lookup(pa.array([f"k{i}" for i in range(30)])).values.to_pylist() == [b"v%d" % i for i in range(30)]


def test_an_integer_key_matches_integers_and_their_decimal_text() -> None:
    longs = typed.load(ValueFormat(format="avro", schema=FIXTURES / "key_long.avsc"), "tables[0].key")
    content = sorted((avro_payload("key_long.avsc", n), b"v%d" % n, 0) for n in (-5, 0, 42, 2**40))  # type: ignore[arg-type]
    table = ColumnarTable(build_table(content, RAW, {"table": "n"}, longs))
    assert table.lookup(pa.array([42, -5, 2**40, 7], pa.int64())).values.to_pylist() == [b"v42", b"v-5",
                                                                                         b"v1099511627776", None]
    assert table.lookup(pa.array([0, 42], pa.int32())).values.to_pylist() == [b"v0", b"v42"]
    assert table.lookup(pa.array(["42", "042", "42.0", "-5"])).values.to_pylist() == [b"v42", None, None, b"v-5"]
    with pytest.raises(TypeError, match="strings, bytes or integers, not double"):
        table.lookup(pa.array([42.0]))


def test_a_json_string_key_framed_with_invalid_json_left_out() -> None:
    jkey = key_decoder("json", "key.schema.json")
    content = sorted([(confluent(3, orjson.dumps(f"id-{i}")), b"v%d" % i, i) for i in range(20)]
                     + [(confluent(3, b'"unterminated'), b"bad", 1), (confluent(3, b"null"), b"null key", 1),
                        (confluent(3, b"17"), b"number", 1)])  # a STRING given a number holds its text, as Spark's
    table = ColumnarTable(build_table(content, RAW, {"table": "j"}, jkey))
    assert len(table) == 21 and table.meta["key_errors"] == 2  # invalid JSON, and null: neither can be asked for
    assert table.lookup(pa.array(["id-4", "id-19", "17", "null"])).values.to_pylist() == [b"v4", b"v19", b"number",
                                                                                          None]


def test_a_struct_key_is_refused_in_one_line_naming_the_table_and_the_type() -> None:
    record = typed.load(ValueFormat(format="json", schema=FIXTURES / "customer.ddl"), "tables[2].key")
    with pytest.raises(KeyTypeUnsupported) as e:
        build_table([(b'{"id": 1}', b"v", 0)], RAW, {"table": "orders"}, record)
    text = str(e.value)
    assert "\n" not in text and text.startswith("table orders: its key (tables[2].key, format json) decodes to "
                                                "struct<id: int64")
    with pytest.raises(TypeError):  # callers that catch TypeError (the Spark join's refusal) still do
        build_table([(b'{"id": 1}', b"v", 0)], RAW, {"table": "orders"}, record)


def test_a_typed_key_file_has_its_own_path_and_fingerprint(tmp_path: Path) -> None:
    content = [(avro_key("a"), b"v", 1)]
    keyed, plain = build_table(content, RAW, {}, key_decoder()), build_table(content, RAW, {})
    assert columnar_path(tmp_path, RAW, key_decoder()) != columnar_path(tmp_path, RAW) == columnar_path(
        tmp_path, RAW, typed.load(None, "tables[0].key"))  # a raw key keeps the raw-key file
    framed_json = key_decoder("json", "key.schema.json")
    assert columnar_path(tmp_path, RAW, framed_json) != columnar_path(tmp_path, RAW, key_decoder())
    path = tmp_path / "keyed.arrow"
    write_columnar(path, keyed)
    with pytest.raises(ColumnarInvalid, match="another declaration"):
        ColumnarTable.open(path, RAW.fingerprint)
    assert ColumnarTable.open(path, columnar.fingerprint(RAW, key_decoder())).lookup(
        pa.array(["a"])).values.to_pylist() == [b"v"]
    assert not ColumnarTable(plain).typed_key and ColumnarTable(keyed).typed_key


def test_on_error_fail_names_the_decoded_key() -> None:
    strict = typed.load(ValueFormat(format="json", schema=FIXTURES / "customer.ddl", on_error="fail"),
                        "tables[0].value")
    content = sorted([(avro_key("good"), b'{"id": 1}', 1), (avro_key("bad-one"), b"{nope", 2)])
    table = ColumnarTable(build_table(content, strict, {"table": "t"}, key_decoder()))
    assert table.lookup(pa.array(["good"])).values.to_pylist()[0]["id"] == 1
    with pytest.raises(DecodeFailure, match=r"value of key 'bad-one' \(partition unknown, offset unknown\) does "
                                            r"not decode: invalid JSON"):
        table.lookup(pa.array(["good", "bad-one"]))


def test_canonical_forms() -> None:
    assert canonical(pa.array(["é", None])).to_pylist() == ["é".encode(), None]
    assert canonical(pa.array([-1, 10], pa.int8())).to_pylist() == [b"-1", b"10"]
    assert canonical(pa.array([b"\x00\xff"], pa.binary(2))).to_pylist() == [b"\x00\xff"]
    assert canonical(pa.chunked_array([["x"], ["y"]])).to_pylist() == [b"x", b"y"]
    assert canonical(pa.array(["a", "b", "a"]).dictionary_encode()).to_pylist() == [b"a", b"b", b"a"]
    assert canonical(pa.nulls(2)).to_pylist() == [None, None]


def test_get_finds_the_decoded_key_by_the_same_rule_as_the_file() -> None:
    from globald.typed.keys import find_decoded

    content = sorted([(avro_key("c", 1), b"c-1", 7), (avro_key("c", 2), b"c-2", 7), (avro_key("a", 2), b"a-new", 9),
                      (avro_key("a", 1), b"a-old", 5), (confluent(9, b"\x02c"), b"unknown id", 99)])
    assert find_decoded(content, key_decoder(), b"c", batch=2) == ((avro_key("c", 2), b"c-2", 7), 1)
    assert find_decoded(content, key_decoder(), b"a", batch=2) == ((avro_key("a", 2), b"a-new", 9), 1)
    assert find_decoded(content, key_decoder(), b"zz") == (None, 0)
    table = ColumnarTable(build_table(content, RAW, {}, key_decoder()))
    assert table.lookup(pa.array(["c", "a"])).values.to_pylist() == [b"c-2", b"a-new"]
