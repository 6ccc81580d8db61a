"""Issue 40 item 2: every schema the docs accept builds a columnar file that Arrow accepts, and the columns a Spark
join gets from it are valid and equal to the reference.

A property test over generated Avro, JSON (Spark DDL and JSON Schema) and Protobuf schemas and values
(``tests.unit.schema_strategies``): each table ``build_table`` makes passes ``validate(full=True)``, survives the
IPC file, and a lookup of its keys in another order (a ``take``), cast to the Arrow types Spark expects for the
schema (``cast_for_spark``), struct or flattened, is valid and reads back as the values that were written.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import random
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructField

from globald import typed
from globald.settings.typed_spec import ValueFormat
from globald.spark.typed import _arrow_of
from globald.typed.arrow import Decoder, python_rows
from globald.typed.columnar import ColumnarTable, ColumnarUnbuildable, build_table, write_columnar
from globald.typed.join import cast_for_spark, columns_of, spark_type
from globald.typed.keys import fingerprint
from tests.unit import schema_strategies as ss
from tests.unit.schema_strategies import NULL, Node, Pair, record
from tests.unit.typed_fixtures import varint

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])
Check = tuple[Decoder, list[bytes], list[Any]]


def check(decoder: Decoder, payloads: list[bytes], expected: list[Any]) -> tuple[pa.Array, list[Any]]:
    """The columnar file of ``payloads`` (keys k00000...) is valid and holds ``expected``; so is every Spark
    column made from a lookup of its keys in a shuffled order, with an absent key among them. Returns the struct
    column Spark gets, and what it must hold (for a real Spark job: test_spark_typed)."""
    items = [(b"k%05d" % i, p, i) for i, p in enumerate(payloads)]
    table = build_table(items, decoder, {"table": "t", "snapshot": "s"})
    table.validate(full=True)
    got = python_rows(table.column("value").combine_chunks())
    assert table.column("error").null_count == len(payloads), table.column("error").to_pylist()
    assert got == expected
    assert python_rows(decoder.decode(pa.array(payloads, pa.binary())).values) == expected  # get --decode's form
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "columnar.arrow"
        write_columnar(path, table)
        opened = ColumnarTable.open(path, fingerprint(decoder, None))
        order = list(range(len(payloads)))
        random.Random(len(payloads)).shuffle(order)
        keys = [b"k%05d" % i for i in order[: max(1, len(order) - 1)]] + [b"absent"]
        found = opened.lookup(pa.array(keys, pa.binary()))
    want = [expected[int(k[1:])] for k in keys[:-1]] + [None]
    target = _arrow_of(StructField("value", spark_type(decoder)))
    spark = cast_for_spark(found.values, target)
    spark.validate(full=True)
    assert spark.type == target and python_rows(spark) == want
    for name, column in columns_of(found.values, found.errors, "value", flatten_prefix="v_").items():
        if name.startswith("v_"):  # flattened: each field its own column
            flat = cast_for_spark(column, _arrow_of(StructField(name, spark_type(decoder).fields[
                decoder.arrow_type.get_field_index(name[2:])].dataType)))
            flat.validate(full=True)
            assert python_rows(flat) == [None if w is None else w[name[2:]] for w in want]
    return spark, want


# ---- Avro ----

def avro_decoder(schema: Any, tmp: Path) -> Decoder:
    path = tmp / "s.avsc"
    path.write_text(json.dumps(schema))
    return typed.load(ValueFormat(format="avro", schema=path), "tables[0].value")


def avro_case(node: Node, values: list[tuple[Any, Any]], tmp: Path) -> Check:
    schema = ss.avro_schema(node)
    parsed = fastavro.parse_schema(schema)
    payloads = []
    for written, _ in values:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, written)
        payloads.append(buf.getvalue())
    return avro_decoder(schema, tmp), payloads, [r for _, r in values]


@FAST
@given(st.data())
def test_generated_avro_schemas_build_valid_columns_equal_to_what_was_written(data: st.DataObject) -> None:
    node = data.draw(ss.avro_trees, "schema")
    values = data.draw(st.lists(ss.avro_values(node), min_size=1, max_size=8), "values")
    with tempfile.TemporaryDirectory() as d:
        check(*avro_case(node, values, Path(d)))


EVERY_CASE = record(
    ("id", Node("long")), ("nothing", NULL), ("nulls", Node("array", (NULL,))),
    ("nested", Node("array", (Node("array", (NULL,)),))), ("empty", record()),
    ("empties", Node("array", (record(),))), ("null_map", Node("map", (NULL,))),
    ("union_map", Node("map", (Node("nullable", (Node("string"),)),))),
    ("enum_map", Node("map", (Node("enum", size=3),))), ("fixed", Node("fixed", size=16)),
    ("fixed0", Node("array", (Node("fixed", size=0),))), ("money", Node("decimal", size=38, scale=6)),
    ("small", Node("decimal", size=5, scale=2)), ("blob", Node("bytes")), ("text", Node("string")),
    ("maybe", Node("nullable", (record(("n", NULL), ("l", Node("array", (NULL,)))),))))


@FAST
@given(st.lists(ss.avro_values(EVERY_CASE), min_size=1, max_size=60))
def test_every_named_avro_case_at_once(values: list[tuple[Any, Any]]) -> None:
    """Null fields and items, lists of lists of nulls, empty records, maps of unions, enums, fixed (also of size
    0), decimals on bytes and fixed, bytes and strings at their bounds: all in one record, always drawn."""
    with tempfile.TemporaryDirectory() as d:
        check(*avro_case(EVERY_CASE, values, Path(d)))


# The case, and the class around it: types with a null-typed part that a list<null> rule does not name. The
# last field is an array or a map: the hostile record's block of it claims 3e9 items. More items than rows: pyarrow's
# cast gave a null child the length of the outermost array.
AROUND: dict[str, tuple[list[dict[str, Any]], Callable[[int], dict[str, Any]]]] = {
    "array<null>": ([{"name": "flags", "type": {"type": "array", "items": "null"}}],
                    lambda i: {"flags": [None] * (i % 4)}),
    "array<record with a null field>": ([{"name": "events", "type": {"type": "array", "items": {
        "type": "record", "name": "Event", "fields": [{"name": "at", "type": "long"},
                                                      {"name": "gone", "type": "null"}]}}}],
        lambda i: {"events": [{"at": j, "gone": None} for j in range(i % 4 + 1)]}),
    "map<null>": ([{"name": "seen", "type": {"type": "map", "values": "null"}}],
                  lambda i: {"seen": {f"s{j}": None for j in range(i % 3 + 1)}}),
}


@pytest.mark.parametrize("case", AROUND)
def test_fifty_good_records_and_a_hostile_one_give_valid_spark_columns(case: str, tmp_path: Path) -> None:
    """The case of issue 40: 50 good records and one whose array<null> claims 3e9 items (a decode error), looked
    up in another order and cast to Spark's types. Before the fix pyarrow's cast of the taken struct made offsets
    past its values; the list<null> rule then in place covered the first case only."""
    fields, make = AROUND[case]
    schema = {"type": "record", "name": "Flags", "fields": [{"name": "id", "type": "long"}, *fields]}
    decoder = avro_decoder(schema, tmp_path)
    good = [{"id": i, **make(i)} for i in range(50)]
    payloads = []
    for v in good:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), v)
        payloads.append(buf.getvalue())
    buf = io.BytesIO()  # the hostile one: its last field's block claims 3e9 items (nulls: no bytes to contradict it)
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), {"id": 666, **make(0)})
    hostile = buf.getvalue()[:-1] + varint(3_000_000_000) + b"\x00"
    items = [(b"k%05d" % i, p, i) for i, p in enumerate([*payloads[:25], hostile, *payloads[25:]])]
    table = ColumnarTable(build_table(items, decoder, {"table": "t"}))
    assert table.error_count == 1 and table.errors[25].as_py()
    keys = [b"absent", *(b"k%05d" % i for i in range(51))][::-1]  # a join's keys: some not in the table
    found = table.lookup(pa.array(keys))
    target = _arrow_of(StructField("value", spark_type(decoder)))
    spark = cast_for_spark(found.values, target)
    spark.validate(full=True)
    assert python_rows(spark) == [*good[25:][::-1], None, *good[:25][::-1], None]


def test_a_table_arrow_refuses_is_a_clear_error_before_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """Should a builder ever make an invalid column again, the table fails with what to do, not Spark later."""
    decoder = avro_decoder({"type": "record", "name": "R", "fields": [
        {"name": "flags", "type": {"type": "array", "items": "null"}}]}, tmp_path)
    # Offsets going back: past the cheap checks pyarrow makes on building, caught by the full validation only.
    offsets = pa.array([0, 30, 25], pa.int32()).buffers()[1]
    bad = pa.ListArray.from_buffers(pa.list_(pa.null()), 2, [None, offsets], children=[pa.nulls(25)])
    invalid = pa.StructArray.from_arrays([bad], names=["flags"])
    monkeypatch.setattr(Decoder, "_to_arrow", lambda self, rows, reasons: invalid)
    with pytest.raises(ColumnarUnbuildable, match=re.escape("t snapshot s1: decoded by tables[0].value into an inval")):
        build_table([(b"k", b"\x00", 1), (b"l", b"\x00", 2)], decoder, {"table": "t", "snapshot": "s1"})


# ---- JSON ----

def json_case(data: st.DataObject, tmp: Path) -> Check:
    """A drawn JSON schema (Spark DDL or JSON Schema), its decoder, payloads and what they must read back as."""
    node = data.draw(ss.json_trees, "schema")
    as_ddl = not ss.has_null(node) and data.draw(st.booleans(), "ddl")
    if not as_ddl:  # a JSON Schema knows integer, number and string: the tree in those types
        node = _json_schema_kinds(node)
    values = data.draw(st.lists(ss.json_values(node), min_size=1, max_size=8), "values")
    text = ss.ddl(node) if as_ddl else json.dumps(ss.json_schema(node))
    path = tmp / "s.schema"
    path.write_text(text)
    decoder = typed.load(ValueFormat(format="json", schema=path), "tables[0].value")
    return decoder, [json.dumps(w).encode() for w, _ in values], [r for _, r in values]


def _json_schema_kinds(node: Node) -> Node:
    kind = {"int": "long", "float": "double", "binary": "string", "decimal": "string"}.get(node.kind, node.kind)
    return Node(kind, tuple(_json_schema_kinds(c) for c in node.children), node.size if kind == node.kind else 0,
                node.scale if kind == node.kind else 0, node.names)


# ---- Protobuf ----

SCALAR_TYPES = {"int32": 5, "sint32": 17, "int64": 3, "uint32": 13, "uint64": 4, "fixed64": 6, "bool": 8,
                "float": 2, "double": 1, "string": 9, "bytes": 12}  # FieldDescriptorProto.Type numbers


class _Proto:
    """A tree as one proto3 file: each record a top-level message M<n>, each enum E<n> (values E<n>_A...)."""

    def __init__(self, root: Node) -> None:
        self.file = descriptor_pb2.FileDescriptorProto(name="gen.proto", package="g", syntax="proto3")
        self.names: dict[int, str] = {}
        self.root = self.message(root)

    def message(self, node: Node) -> str:
        msg = self.file.message_type.add(name=f"M{len(self.file.message_type)}")
        full = f".g.{msg.name}"
        self.names[id(node)] = full
        for i, (name, child) in enumerate(zip(node.names, node.children, strict=True)):
            f = msg.field.add(name=name, number=i + 1, label=1)
            if child.kind == "map":
                entry = msg.nested_type.add(name=f"{name.capitalize()}Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, label=1, type=9)
                self.typed(entry.field.add(name="value", number=2, label=1), child.children[0])
                f.label, f.type, f.type_name = 3, 11, f"{full}.{entry.name}"
            elif child.kind == "array":
                f.label = 3
                self.typed(f, child.children[0])
            elif child.kind == "nullable":  # proto3 optional: a synthetic oneof of its own
                f.proto3_optional, f.oneof_index = True, len(msg.oneof_decl)
                msg.oneof_decl.add(name=f"_{name}")
                self.typed(f, child.children[0])
            else:
                self.typed(f, child)
        return full

    def typed(self, f: Any, node: Node) -> None:
        if node.kind == "record":
            f.type, f.type_name = 11, self.message(node)
        elif node.kind == "enum":
            enum = self.file.enum_type.add(name=f"E{len(self.file.enum_type)}")
            for n in range(node.size):
                enum.value.add(name=f"{enum.name}_{'ABC'[n]}", number=n)
            f.type, f.type_name = 14, f".g.{enum.name}"
            self.names[id(node)] = enum.name
        else:
            f.type = SCALAR_TYPES[node.kind]


def proto_values(node: Node, enums: dict[int, str], field: bool = False) -> st.SearchStrategy[Pair]:
    """(what ``fill`` sets, the row's value); a message ``field`` may be unset (null), an item of a list or map
    may not."""
    k = node.kind
    if k in ss.PROTO_SCALARS:
        wrap = decimal.Decimal if k in ("uint64", "fixed64") else (lambda x: x)
        return ss.PROTO_SCALARS[k].map(lambda v: (v, wrap(v)))
    if k == "nullable":
        return st.one_of(st.just((None, None)), proto_values(node.children[0], enums))
    if k == "enum":
        return st.integers(0, node.size - 1).map(lambda n: (n, f"{enums[id(node)]}_{'ABC'[n]}"))
    if k == "array":
        return st.lists(proto_values(node.children[0], enums), max_size=3).map(
            lambda xs: ([w for w, _ in xs], [r for _, r in xs]))
    if k == "map":
        return st.dictionaries(ss.TEXT.map(lambda s: s[:6]), proto_values(node.children[0], enums),
                               max_size=3).map(lambda d: ({a: w for a, (w, _) in d.items()},
                                                          {a: r for a, (_, r) in d.items()}))
    fields = st.tuples(*(proto_values(c, enums, field=True) for c in node.children))
    present = fields.map(lambda xs: ({f: w for f, (w, _) in zip(node.names, xs, strict=True)},
                                     {f: r for f, (_, r) in zip(node.names, xs, strict=True)}))
    return st.one_of(st.just((None, None)), present) if field else present


def fill(m: Any, node: Node, value: dict[str, Any]) -> None:
    m.SetInParent()
    for name, child in zip(node.names, node.children, strict=True):
        v = value[name]
        if child.kind == "record":
            if v is not None:
                fill(getattr(m, name), child, v)
        elif child.kind == "array" and child.children[0].kind == "record":
            for item in v:
                fill(getattr(m, name).add(), child.children[0], item)
        elif child.kind == "map" and child.children[0].kind == "record":
            for key, item in v.items():
                fill(getattr(m, name)[key], child.children[0], item)
        elif child.kind == "array":
            getattr(m, name).extend(v)
        elif child.kind == "map":
            getattr(m, name).update(v)
        elif v is not None:  # an optional field left unset reads null
            setattr(m, name, v)


def proto_case(data: st.DataObject, tmp: Path) -> Check:
    """A drawn proto3 message type, its decoder, payloads and what they must read back as."""
    node = data.draw(ss.proto_trees(), "schema")
    proto = _Proto(node)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto.file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(proto.root[1:]))
    values = data.draw(st.lists(proto_values(node, proto.names), min_size=1, max_size=8), "values")
    payloads = []
    for written, _ in values:
        m = cls()
        fill(m, node, written)
        payloads.append(m.SerializeToString())
    path = tmp / "gen.desc"
    path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[proto.file]).SerializeToString())
    decoder = typed.load(ValueFormat(format="protobuf", schema=path, message=proto.root[1:]), "tables[0].value")
    return decoder, payloads, [r for _, r in values]


@pytest.mark.parametrize("case", [json_case, proto_case], ids=["json", "protobuf"])
@FAST
@given(data=st.data())
def test_generated_json_and_protobuf_schemas_build_valid_columns_equal_to_what_was_written(
        case: Callable[[st.DataObject, Path], Check], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        check(*case(data, Path(d)))


def test_timestamps_keep_their_instant_through_the_spark_cast() -> None:
    """A millisecond timestamp becomes Spark's microseconds: the same instant, not a rescaled number."""
    from globald.typed.conform import conform

    ms = pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 123000, tzinfo=dt.UTC), None], pa.timestamp("ms", "UTC"))
    assert conform(ms[1:].take(pa.array([0])), pa.timestamp("us", "UTC")).to_pylist() == [None]
    assert conform(ms, pa.timestamp("us", "UTC")).to_pylist() == ms.to_pylist()
