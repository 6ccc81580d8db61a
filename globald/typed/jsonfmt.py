"""JSON values: orjson parses, the declared schema types, as Spark's ``from_json`` would in PERMISSIVE mode.

Why orjson: the fastest correct JSON parser for Python (Rust, RFC 8259 strict, rejects invalid UTF-8), several
times the standard library's ``json``. pyarrow's JSON reader wants newline-delimited files, not a column of
separate documents, and cannot say which record failed.

The schema file holds either a Spark DDL string (``name STRING, tags ARRAY<STRING>, address STRUCT<city: STRING>``)
or a JSON Schema (a JSON object). A field missing from a record is null; a field the schema does not name is
ignored; a value of the wrong JSON type makes the record an error with the field's path in the reason. Strings
parse into DATE (ISO 8601) and TIMESTAMP (ISO 8601; no zone means UTC; a number is epoch seconds, as in Spark).
A STRING field given another JSON value holds that value's JSON text, as Spark's does.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import re
from collections.abc import Callable
from typing import Any

import orjson
import pyarrow as pa

from globald.settings.typed_spec import SchemaError, ValueFormat, read_schema_file, writer_files
from globald.typed import framing
from globald.typed.arrow import DecodeError, OneValue

Convert = Callable[[Any, str], Any]  # (JSON value, its path for reasons) -> what Arrow builds the type from

DDL_TYPES = {
    "STRING": pa.string(), "VARCHAR": pa.string(), "CHAR": pa.string(), "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(), "BYTE": pa.int8(), "SMALLINT": pa.int16(), "SHORT": pa.int16(), "INT": pa.int32(),
    "INTEGER": pa.int32(), "BIGINT": pa.int64(), "LONG": pa.int64(), "FLOAT": pa.float32(), "REAL": pa.float32(),
    "DOUBLE": pa.float64(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", "UTC"),
    "TIMESTAMP_LTZ": pa.timestamp("us", "UTC"), "TIMESTAMP_NTZ": pa.timestamp("us"), "BINARY": pa.binary(),
}
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*')|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|([<>(),:]))")


class _DDL:
    """A recursive-descent parser of Spark's DDL: ``field TYPE [NOT NULL] [COMMENT 'text'], ...``."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos, text = 0, text.strip().rstrip(";")
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip():
                    raise ValueError(f"unexpected {text[pos:pos + 20]!r}")
                break
            self.tokens.append(next(g for g in m.groups() if g is not None))
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expect: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expect is not None and tok.upper() != expect):
            raise ValueError(f"expected {expect or 'more'}, found {tok or 'the end'}")
        self.i += 1
        return tok

    def fields(self, end: str | None) -> pa.DataType:
        out = []
        while True:
            name = self.take()
            name = name[1:-1].replace("``", "`") if name.startswith("`") else name
            if self.peek() == ":":
                self.take()
            out.append(pa.field(name, self.type()))
            if (self.peek() or "").upper() == "NOT":
                self.take()
                self.take("NULL")
            if (self.peek() or "").upper() == "COMMENT":
                self.take()
                self.take()
            if self.peek() != ",":
                break
            self.take()
        if self.peek() != end:
            raise ValueError(f"expected {end or 'the end'}, found {self.peek()}")
        if end is not None:
            self.take()
        return pa.struct(out)

    def type(self) -> pa.DataType:
        word = self.take().upper()
        if word in ("DECIMAL", "DEC", "NUMERIC"):
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take()
                precision = int(self.take())
                if self.peek() == ",":
                    self.take()
                    scale = int(self.take())
                self.take(")")
            return pa.decimal128(precision, scale)
        if word in ("VARCHAR", "CHAR") and self.peek() == "(":
            self.take(), self.take(), self.take(")")
        if word == "ARRAY":
            self.take("<")
            item = self.type()
            self.take(">")
            return pa.list_(item)
        if word == "MAP":
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            self.take(">")
            return pa.map_(key, value)
        if word == "STRUCT":
            self.take("<")
            return self.fields(">")
        if word not in DDL_TYPES:
            raise ValueError(f"unknown type {word}")
        return DDL_TYPES[word]


def ddl_type(text: str) -> pa.DataType:
    return _DDL(text).fields(None)


class _JsonSchema:
    """JSON Schema -> Arrow: objects with properties are structs, with only additionalProperties maps, arrays
    lists; integer int64, number double, string (format date-time: timestamp, date: date32), boolean; a type list
    or anyOf/oneOf with null is the other type, nullable; local $ref (#/definitions, #/$defs) followed."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.open: set[str] = set()

    def of(self, s: Any) -> pa.DataType:
        if not isinstance(s, dict):
            raise ValueError(f"not a JSON Schema: {s!r}")
        if "$ref" in s:
            ref = s["$ref"]
            if not ref.startswith("#/") or ref in self.open:
                raise ValueError(f"$ref {ref}: only local, non-recursive references are supported")
            node: Any = self.root
            for part in ref[2:].split("/"):
                node = node[part]
            self.open.add(ref)
            t = self.of(node)
            self.open.discard(ref)
            return t
        for key in ("anyOf", "oneOf"):
            if key in s:
                real = [b for b in s[key] if b.get("type") != "null"]
                if len(real) != 1:
                    raise ValueError(f"{key} with {len(real)} non-null branches has no single column type")
                return self.of(real[0])
        kind = s.get("type", "string" if "enum" in s else None)
        if isinstance(kind, list):
            real = [k for k in kind if k != "null"]
            if len(real) != 1:
                raise ValueError(f"type {kind} has no single column type")
            kind = real[0]
        if kind == "object":
            props = s.get("properties")
            if props:
                return pa.struct([pa.field(k, self.of(v)) for k, v in props.items()])
            extra = s.get("additionalProperties")
            return pa.map_(pa.string(), self.of(extra)) if isinstance(extra, dict) else pa.string()
        if kind == "array":
            return pa.list_(self.of(s.get("items", {"type": "string"})))
        if kind == "string":
            return {"date-time": pa.timestamp("us", "UTC"), "date": pa.date32()}.get(str(s.get("format")), pa.string())
        simple = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(), "null": pa.null()}
        if kind not in simple:
            raise ValueError(f"type {kind!r} is not supported")
        return simple[kind]


def schema_type(text: str) -> pa.DataType:
    """The Arrow type of a JSON schema file's content: a JSON Schema when it is a JSON object, else Spark DDL."""
    if text.lstrip().startswith("{"):
        return _JsonSchema(json.loads(text)).of(json.loads(text))
    return ddl_type(text)


def _fail(path: str, want: str, got: Any) -> DecodeError:
    shown = orjson.dumps(got).decode()
    return DecodeError(f"{path or 'the value'}: expected {want}, got {shown[:60]}")


def _timestamp(v: Any, path: str, zone: bool) -> dt.datetime:
    if isinstance(v, int | float) and not isinstance(v, bool):
        stamp = dt.datetime.fromtimestamp(v, dt.UTC)
        return stamp if zone else stamp.replace(tzinfo=None)
    if not isinstance(v, str):
        raise _fail(path, "an ISO 8601 timestamp", v)
    try:
        stamp = dt.datetime.fromisoformat(v)
    except ValueError:
        raise _fail(path, "an ISO 8601 timestamp", v) from None
    if zone and stamp.tzinfo is None:
        return stamp.replace(tzinfo=dt.UTC)
    return stamp


def converter(t: pa.DataType) -> Convert:
    """The function that checks one JSON value against ``t`` and gives what Arrow builds ``t`` from."""
    if pa.types.is_struct(t):
        parts = [(t.field(i).name, converter(t.field(i).type)) for i in range(t.num_fields)]

        def struct(v: Any, path: str) -> Any:
            if not isinstance(v, dict):
                raise _fail(path, "an object", v)
            return {name: None if v.get(name) is None else conv(v[name], f"{path}.{name}".lstrip("."))
                    for name, conv in parts}
        return struct
    if pa.types.is_map(t):
        item = converter(t.item_type)
        return lambda v, p: {k: None if x is None else item(x, f"{p}.{k}") for k, x in _obj(v, p).items()}
    if pa.types.is_list(t):
        each = converter(t.value_type)
        return lambda v, p: [None if x is None else each(x, f"{p}[{i}]") for i, x in enumerate(_arr(v, p))]
    if pa.types.is_boolean(t):
        return lambda v, p: v if isinstance(v, bool) else _raise(_fail(p, "a boolean", v))
    if pa.types.is_integer(t):
        return lambda v, p: v if isinstance(v, int) and not isinstance(v, bool) else _raise(_fail(p, "an integer", v))
    if pa.types.is_floating(t):
        return lambda v, p: (float(v) if isinstance(v, int | float) and not isinstance(v, bool)
                             else _raise(_fail(p, "a number", v)))
    if pa.types.is_decimal(t):
        return lambda v, p: (decimal.Decimal(str(v)) if isinstance(v, int | float | str) and not isinstance(v, bool)
                             else _raise(_fail(p, "a decimal", v)))
    if pa.types.is_timestamp(t):
        zone = t.tz is not None
        return lambda v, p: _timestamp(v, p, zone)
    if pa.types.is_date(t):
        return lambda v, p: _date(v, p)
    if pa.types.is_binary(t):
        return lambda v, p: _b64(v, p)
    if pa.types.is_null(t):
        return lambda v, p: None
    return lambda v, p: v if isinstance(v, str) else orjson.dumps(v).decode()  # string: as Spark, the JSON text


def _raise(e: DecodeError) -> Any:
    raise e


def _obj(v: Any, path: str) -> dict[str, Any]:
    return v if isinstance(v, dict) else _raise(_fail(path, "an object", v))


def _arr(v: Any, path: str) -> list[Any]:
    return v if isinstance(v, list) else _raise(_fail(path, "an array", v))


def _date(v: Any, path: str) -> dt.date:
    try:
        return dt.date.fromisoformat(v)
    except (TypeError, ValueError):
        raise _fail(path, "an ISO 8601 date", v) from None


def _b64(v: Any, path: str) -> bytes:
    try:
        return base64.b64decode(v, validate=True)
    except (TypeError, ValueError):
        raise _fail(path, "base64 text", v) from None


def _count_items(doc: Any, most: int) -> None:
    """DecodeError when ``doc`` holds more than ``most`` array elements and object members, all levels together."""
    items, todo = 0, [doc]
    while todo:
        v = todo.pop()
        if isinstance(v, list | dict):
            items += len(v)
            if items > most:
                raise DecodeError(f"a JSON value of more than {most} array elements and object members: over "
                                  "max_items")
            todo.extend(v.values() if isinstance(v, dict) else v)


def compile_json(fmt: ValueFormat, where: str, reader_text: str | None = None
                 ) -> tuple[pa.DataType, OneValue]:
    """``reader_text``: a JSON Schema taken from a registry subject (``globald.typed.registry``), not a file."""
    named = fmt.schema if reader_text is None else f"subject {fmt.subject}"
    key = f"{where}.schema" if reader_text is None else f"{where}.subject"
    try:
        if reader_text is None:
            assert fmt.schema is not None
            text = read_schema_file(fmt.schema, key).decode("utf-8")
        else:
            text = reader_text
        arrow_type = schema_type(text)
    except (ValueError, KeyError, TypeError) as e:
        raise SchemaError(key, f"{named} is neither a Spark DDL string nor a JSON Schema this reads: {e}") from None
    ids = set(writer_files(fmt, where))
    conv = converter(arrow_type)
    most = fmt.max_items

    def parse(payload: bytes) -> tuple[Any, int]:
        try:
            doc = orjson.loads(payload)  # nesting past 1024 is orjson's error; each item takes at least one byte
        except orjson.JSONDecodeError as e:
            raise DecodeError(f"invalid JSON: {e}") from None
        if len(payload) > most:  # only then can it hold more items than the bound
            _count_items(doc, most)
        return (None if doc is None else conv(doc, "")), 0  # every item takes a byte: the payload's size bounds them

    if fmt.framing == "none":
        return arrow_type, parse

    def one(value: bytes) -> tuple[Any, int]:
        sid, _, start = framing.split(value, with_indexes=False)
        if fmt.writer_schemas is not None and not fmt.writers_from_registry and sid not in ids:
            raise DecodeError(f"unknown schema id {sid} (no {sid}.json in writer_schemas {fmt.writer_schemas})")
        return parse(value[start:])

    return arrow_type, one
