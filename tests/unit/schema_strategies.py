"""Hypothesis strategies for the typed-table property test (test_typed_arrow_valid): schemas of every shape the docs
accept, in Avro, JSON (a Spark DDL string or a JSON Schema) and Protobuf, with values valid for them.

A schema is drawn as a tree of ``Node``; each format writes the tree its own way and draws values for it as
(what the format's writer takes, the Python value globald's column must read back as): that second one, not
globald's decode, is the reference, so a wrong decode and a wrong column are both caught. The trees lean to the
shapes that broke Arrow: null-typed fields and items, lists of lists of nulls, empty records, maps of unions.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

UTC = dt.UTC
Pair = tuple[Any, Any]  # (what the writer takes, what the column reads back as)


@dataclass(frozen=True)
class Node:
    kind: str  # a leaf name ("null", "int", "enum", "decimal", ...), or "array", "map", "nullable", "record"
    children: tuple[Node, ...] = ()
    size: int = 0  # enum: symbols; fixed: bytes; decimal: precision
    scale: int = 0
    names: tuple[str, ...] = field(default=())  # record field names


def record(*fields: tuple[str, Node]) -> Node:
    return Node("record", tuple(n for _, n in fields), names=tuple(f for f, _ in fields))


NULL = Node("null")
# Bytes and strings at their bounds: empty, one, and long; text with 4-byte UTF-8 characters.
TEXT = st.one_of(st.just(""), st.text(max_size=12), st.just("\U0010ffff€\x00" * 700))
BLOB = st.one_of(st.just(b""), st.binary(max_size=12), st.just(bytes(range(256)) * 9))
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False)
DOUBLE = st.floats(allow_nan=False)
INSTANT = st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=UTC))


EXACT = decimal.Context(prec=80)  # the default 28 digits would round a 38-digit value


def decimals(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    most = 10**precision - 1
    return st.one_of(st.sampled_from([most, -most, 0]), st.integers(-most, most)).map(
        lambda u: decimal.Decimal(u).scaleb(-scale, EXACT))


def _trees(leaves: st.SearchStrategy[Node], nullable: bool, empty_records: bool) -> st.SearchStrategy[Node]:
    def grow(inner: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        fields = st.lists(inner, min_size=0 if empty_records else 1, max_size=3).map(
            lambda kids: Node("record", tuple(kids), names=tuple(f"f{i}" for i in range(len(kids)))))
        grown = [inner.map(lambda n: Node("array", (n,))), inner.map(lambda n: Node("map", (n,))), fields]
        if nullable:
            grown.append(inner.filter(lambda n: n.kind not in ("null", "nullable")).map(
                lambda n: Node("nullable", (n,))))
        return st.one_of(*grown)

    return st.recursive(leaves, grow, max_leaves=6).map(lambda n: n if n.kind == "record" else record(("v", n)))


# ---- Avro ----

AVRO_LEAVES = st.one_of(
    st.sampled_from([Node(k) for k in ("null", "boolean", "int", "long", "float", "double", "bytes", "string",
                                        "date", "timestamp-millis", "timestamp-micros", "uuid")]),
    st.integers(1, 4).map(lambda n: Node("enum", size=n)),
    st.sampled_from([0, 1, 16]).map(lambda n: Node("fixed", size=n)),
    st.tuples(st.integers(1, 38), st.integers(0, 6)).map(lambda ps: Node("decimal", size=ps[0], scale=min(ps))),
    st.just(NULL))
avro_trees = _trees(AVRO_LEAVES, nullable=True, empty_records=True)


def avro_schema(node: Node, counter: list[int] | None = None) -> Any:
    """The tree as an Avro schema; named types get names of their own."""
    counter = [0] if counter is None else counter

    def name(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}{counter[0]}"

    k = node.kind
    if k in ("date", "timestamp-millis", "timestamp-micros"):
        return {"type": "int" if k == "date" else "long", "logicalType": k}
    if k == "uuid":
        return {"type": "string", "logicalType": "uuid"}
    if k == "enum":
        return {"type": "enum", "name": name("E"), "symbols": ["A", "B", "C", "D"][:node.size]}
    if k == "fixed":
        return {"type": "fixed", "name": name("X"), "size": node.size}
    if k == "decimal":  # on bytes up to 18 digits, on a 16-byte fixed above: both encodings
        base = {"type": "bytes"} if node.size <= 18 else {"type": "fixed", "name": name("D"), "size": 16}
        return {**base, "logicalType": "decimal", "precision": node.size, "scale": node.scale}
    if k == "array":
        return {"type": "array", "items": avro_schema(node.children[0], counter)}
    if k == "map":
        return {"type": "map", "values": avro_schema(node.children[0], counter)}
    if k == "nullable":
        return ["null", avro_schema(node.children[0], counter)]
    if k == "record":
        return {"type": "record", "name": name("R"), "fields": [
            {"name": f, "type": avro_schema(c, counter)} for f, c in zip(node.names, node.children, strict=True)]}
    return k


def avro_values(node: Node) -> st.SearchStrategy[Pair]:
    k = node.kind
    same = {"null": st.none(), "boolean": st.booleans(), "int": INT32, "long": INT64, "float": FLOAT32,
            "double": DOUBLE, "bytes": BLOB, "string": TEXT, "timestamp-millis": INSTANT,
            "date": st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)),
            "timestamp-micros": st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)).map(
                lambda d: d.replace(tzinfo=UTC))}
    if k in same:
        return same[k].map(lambda v: (v, v))
    if k == "uuid":
        return st.uuids().map(lambda u: (u, str(u)))
    if k == "enum":
        return st.sampled_from(["A", "B", "C", "D"][:node.size]).map(lambda v: (v, v))
    if k == "fixed":
        return st.binary(min_size=node.size, max_size=node.size).map(lambda v: (v, v))
    if k == "decimal":
        return decimals(node.size, node.scale).map(lambda v: (v, v))
    return _composite(node, avro_values)


def _composite(node: Node, values: Any) -> st.SearchStrategy[Pair]:
    k, kids = node.kind, node.children
    if k == "array":
        return st.lists(values(kids[0]), max_size=4).map(lambda xs: ([w for w, _ in xs], [r for _, r in xs]))
    if k == "map":
        return st.dictionaries(TEXT.map(lambda s: s[:8]), values(kids[0]), max_size=3).map(
            lambda d: ({key: w for key, (w, _) in d.items()}, {key: r for key, (_, r) in d.items()}))
    if k == "nullable":
        return st.one_of(st.just((None, None)), values(kids[0]))
    assert k == "record", k
    return st.tuples(*(values(c) for c in kids)).map(
        lambda xs: ({f: w for f, (w, _) in zip(node.names, xs, strict=True)},
                    {f: r for f, (_, r) in zip(node.names, xs, strict=True)}))


# ---- JSON: a Spark DDL string or a JSON Schema ----

JSON_LEAVES = st.one_of(
    st.sampled_from([Node(k) for k in ("string", "boolean", "int", "long", "float", "double", "date", "timestamp",
                                        "binary", "null")]),
    st.tuples(st.integers(1, 38), st.integers(0, 6)).map(lambda ps: Node("decimal", size=ps[0], scale=min(ps))))
json_trees = _trees(JSON_LEAVES, nullable=False, empty_records=False)
DDL = {"string": "STRING", "boolean": "BOOLEAN", "int": "INT", "long": "BIGINT", "float": "FLOAT",
       "double": "DOUBLE", "date": "DATE", "timestamp": "TIMESTAMP", "binary": "BINARY"}


def ddl(node: Node, top: bool = True) -> str:
    """The tree as a Spark DDL string (a JSON value's schema); DDL has no null type (callers filter it out)."""
    k = node.kind
    if k == "record":
        inner = ", ".join(f"`{f}` {ddl(c, False)}" if top else f"`{f}`: {ddl(c, False)}"
                          for f, c in zip(node.names, node.children, strict=True))
        return inner if top else f"STRUCT<{inner}>"
    if k == "array":
        return f"ARRAY<{ddl(node.children[0], False)}>"
    if k == "map":
        return f"MAP<STRING, {ddl(node.children[0], False)}>"
    if k == "decimal":
        return f"DECIMAL({node.size}, {node.scale})"
    return DDL[k]


def has_null(node: Node) -> bool:
    return node.kind == "null" or any(has_null(c) for c in node.children)


def json_schema(node: Node) -> dict[str, Any]:
    """The tree as a JSON Schema: int and float have no JSON Schema type of their own, nor do binary and decimal
    (they read as integer, number and string)."""
    k = node.kind
    if k == "record":
        return {"type": "object", "properties": {f: json_schema(c) for f, c in zip(node.names, node.children,
                                                                                     strict=True)}}
    if k == "array":
        return {"type": "array", "items": json_schema(node.children[0])}
    if k == "map":
        return {"type": "object", "additionalProperties": json_schema(node.children[0])}
    if k in ("date", "timestamp"):
        return {"type": "string", "format": "date-time" if k == "timestamp" else "date"}
    return {"type": {"long": "integer", "double": "number", "boolean": "boolean", "null": "null"}.get(k, "string")}


def json_values(node: Node, top: bool = True) -> st.SearchStrategy[Pair]:
    """(the JSON value, what the column reads back as), with null at any place a value may be missing (the
    document itself, ``top``, is an object)."""
    k = node.kind
    if k == "timestamp":
        return INSTANT.map(lambda d: (d.isoformat(), d))
    if k == "date":
        return st.dates().map(lambda d: (d.isoformat(), d))
    if k == "binary":
        return BLOB.map(lambda b: (base64.b64encode(b).decode(), b))
    if k == "decimal":
        return decimals(node.size, node.scale).map(lambda v: (str(v), v))
    plain: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(), "string": TEXT, "boolean": st.booleans(), "int": INT32, "long": INT64,
        "float": st.floats(width=32, allow_nan=False, allow_infinity=False),
        "double": st.floats(allow_nan=False, allow_infinity=False)}  # JSON has no infinity
    if k in plain:
        return plain[k].map(lambda v: (v, v))
    inner = _composite(node, lambda n: json_values(n, False))
    return inner if top else st.one_of(st.just((None, None)), inner)


# ---- Protobuf ----

PROTO_LEAVES = st.one_of(
    st.sampled_from([Node(k) for k in ("int32", "sint32", "int64", "uint32", "uint64", "fixed64", "bool", "float",
                                        "double", "string", "bytes")]),
    st.integers(1, 3).map(lambda n: Node("enum", size=n)))
# Protobuf has no null type and no nested repeated: lists hold leaves or messages, maps values likewise; a message
# field may be unset (null), and so may a scalar declared ``optional``.
PROTO_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "int32": INT32, "sint32": INT32, "int64": INT64, "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1), "fixed64": st.integers(0, 2**64 - 1), "bool": st.booleans(),
    "float": FLOAT32, "double": DOUBLE, "string": TEXT, "bytes": BLOB}


def proto_trees() -> st.SearchStrategy[Node]:
    def grow(inner: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        # A proto3 ``optional`` scalar or enum (explicit presence): null when unset.
        field = st.one_of(inner, PROTO_LEAVES.map(lambda n: Node("nullable", (n,))))
        message = st.lists(field, max_size=3).map(
            lambda kids: Node("record", tuple(kids), names=tuple(f"f{i}" for i in range(len(kids)))))
        single = st.one_of(PROTO_LEAVES, message)
        return st.one_of(message, single.map(lambda n: Node("array", (n,))), single.map(lambda n: Node("map", (n,))))

    return st.recursive(PROTO_LEAVES, grow, max_leaves=6).map(
        lambda n: n if n.kind == "record" else record(("v", n)))
