"""Avro values: fastavro decodes, through the reader schema, records written under any writer schema.

Why fastavro: it is the maintained Avro implementation for Python with a C (Cython) decoder, about 10x the official
``avro`` package, and it implements Avro's schema resolution (added fields take their defaults, removed ones are
skipped, promotions apply), which is what evolution across Confluent ids needs. pyarrow reads Avro container files
only, not single framed records.

The Arrow type follows Spark's ``from_avro``: records are structs, arrays lists, maps map<string, _>, enums strings,
a union of null and one type that type (nullable), fixed fixed_size_binary; logical types decimal, date,
timestamp-millis/micros (UTC) and local-timestamp-millis/micros (no zone), uuid (string); time-millis/micros their
int/long (ms/us after midnight: Spark has no time-of-day type).
A union of several non-null types has no single column type and is refused when the schema is loaded, except as
the reader schema itself when every branch is a record: several record types in one topic, one struct field per
type (``globald.typed.avro_union``).
"""

from __future__ import annotations

import io
import json
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

import fastavro
import pyarrow as pa

from globald.settings.typed_spec import SchemaError, ValueFormat, read_schema_file, writer_files
from globald.typed import framing
from globald.typed.arrow import DecodeError, OneValue
from globald.typed.avro_check import Limits, Node, compile_schema, validate
from globald.typed.avro_resolve import check_format
from globald.typed.avro_union import RecordBranches, full_name

if TYPE_CHECKING:
    from globald.typed.registry import Registry

PRIMITIVES = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
              "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
# time-millis/micros stay the int/long they are on the wire (parse() drops the logical type), as Spark's from_avro
# gives them: Spark has no time-of-day type.
LOGICAL = {"date": pa.date32(), "time-millis": pa.int32(), "time-micros": pa.int64(),
           "timestamp-millis": pa.timestamp("ms", "UTC"), "timestamp-micros": pa.timestamp("us", "UTC"),
           "local-timestamp-millis": pa.timestamp("ms"), "local-timestamp-micros": pa.timestamp("us"),
           "uuid": pa.string()}


class _Types:
    """Avro schema -> Arrow type, resolving named types (records, enums, fixed) by full and short name."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.open: set[str] = set()  # records being mapped: meeting one again means a recursive schema
        self.has_uuid = False

    def of(self, s: Any, namespace: str = "") -> pa.DataType:
        if isinstance(s, str):
            if s in PRIMITIVES:
                return PRIMITIVES[s]
            full = s if "." in s or not namespace else f"{namespace}.{s}"
            if full in self.open or s in self.open:
                raise ValueError(f"recursive type {s}: a column cannot hold it")
            found = self.named.get(full, self.named.get(s))
            if found is None:
                raise ValueError(f"unknown type name {s!r}")
            return found
        if isinstance(s, list):
            return self._union(s, namespace)
        if not isinstance(s, dict) or "type" not in s:
            raise ValueError(f"not an Avro schema: {s!r}")
        logical = s.get("logicalType")
        if logical == "decimal" and s["type"] in ("bytes", "fixed"):
            self._name(s, namespace, None)
            precision, scale = int(s["precision"]), int(s.get("scale", 0))
            return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
        if logical in LOGICAL:
            self.has_uuid |= logical == "uuid"
            return LOGICAL[logical]
        kind = s["type"]
        if kind == "record" or kind == "error":
            return self._record(s, namespace)
        if kind == "enum":
            return self._name(s, namespace, pa.string())
        if kind == "fixed":
            return self._name(s, namespace, pa.binary(int(s["size"])))
        if kind == "array":
            return pa.list_(self.of(s["items"], namespace))
        if kind == "map":
            return pa.map_(pa.string(), self.of(s["values"], namespace))
        return self.of(kind, namespace)  # {"type": "long"} and the like

    def _name(self, s: dict[str, Any], namespace: str, t: pa.DataType | None) -> pa.DataType:
        name = s.get("name")
        if name is not None and t is not None:
            full = name if "." in name else f"{s.get('namespace', namespace)}.{name}".lstrip(".")
            self.named[full] = self.named[name] = t
        return t

    def _record(self, s: dict[str, Any], namespace: str) -> pa.DataType:
        name = s["name"]
        inner = s.get("namespace", name.rpartition(".")[0] if "." in name else namespace)
        full = name if "." in name else f"{inner}.{name}".lstrip(".")
        self.open.add(full)
        fields = [pa.field(f["name"], self.of(f["type"], inner)) for f in s["fields"]]
        self.open.discard(full)
        return self._name(s, namespace, pa.struct(fields))

    def _union(self, branches: list[Any], namespace: str) -> pa.DataType:
        types = [self.of(b, namespace) for b in branches]
        real = [t for t in types if t != pa.null()]
        if len(real) > 1:
            raise ValueError(f"a union of {len(real)} non-null types ({branches}) has no single column type; "
                             "use a union of null and one type")
        return real[0] if real else pa.null()


def _uuids_as_text(value: Any) -> Any:
    """fastavro gives uuid.UUID objects; the column holds their text."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _uuids_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_uuids_as_text(v) for v in value]
    return value


def _without_time_types(s: Any) -> Any:
    """The schema with time-millis/micros left as plain int/long, so that fastavro gives the numbers."""
    if isinstance(s, dict):
        if s.get("logicalType") in ("time-millis", "time-micros"):
            return {k: v for k, v in s.items() if k != "logicalType"}
        return {k: _without_time_types(v) for k, v in s.items()}
    if isinstance(s, list):
        return [_without_time_types(v) for v in s]
    return s


def parse(path: Any, where: str, text: bytes | str | None = None) -> tuple[Any, Any]:
    """(the schema as JSON, as fastavro parsed it) of an .avsc file (or of ``text``, from the registry, ``path``
    then naming it); SchemaError names ``where`` and the file."""
    try:
        raw = json.loads(read_schema_file(path, where) if text is None else text)
        return raw, fastavro.parse_schema(_without_time_types(raw))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as e:
        raise SchemaError(where, f"{path} is not a valid Avro schema ({type(e).__name__}: {e})") from None


def _checker(raw: Any, path: Any, where: str) -> Node:
    try:
        return compile_schema(raw)
    except ValueError as e:
        raise SchemaError(where, f"{path} is not a valid Avro schema ({e})") from None


def compile_avro(fmt: ValueFormat, where: str, registry: Registry | None = None,
                 reader_text: str | None = None) -> tuple[pa.DataType, OneValue]:
    """``registry``: where writer ids come from with ``writer_schemas = "registry"``; ``reader_text``: the reader
    schema taken from a subject (``globald.typed.registry``), instead of the schema file. A value comes with its
    array items and map entries: items of no bytes (null, an empty record) make it larger than its payload."""
    named = fmt.schema if reader_text is None else f"subject {fmt.subject}"
    key = f"{where}.schema" if reader_text is None else f"{where}.subject"
    raw, reader = parse(named, key, reader_text)
    types = _Types()
    branches = RecordBranches.of(raw)  # several record types in one topic: a struct of one field per type
    try:
        arrow_type = types.of(raw) if branches is None else branches.arrow_type(types.of)
    except (ValueError, KeyError, TypeError) as e:
        raise SchemaError(key, f"{named}: {e}") from None
    check_format(fmt, where, raw)  # a writer schema the reader cannot read: refused here, naming the field
    writers: dict[int, tuple[Any, Node]] = {}
    names: dict[int, str | None] = {}  # each writer's record name: the union branch its records resolve to
    for sid, path in writer_files(fmt, where).items():
        writer_raw, writer = parse(path, f"{where}.writer_schemas")
        # A writer schema equal to the reader needs no resolution, which fastavro would otherwise redo per record.
        writers[sid] = (reader if writer_raw == raw else writer, _checker(writer_raw, path, f"{where}.writer_schemas"))
        names[sid] = full_name(writer_raw)
    own = _checker(raw, named, key)
    limits = Limits(items=fmt.max_items)
    fix = _uuids_as_text if types.has_uuid else None
    read = fastavro.schemaless_reader if branches is None else partial(
        fastavro.schemaless_reader, return_record_name=True, return_record_name_override=True)

    def branch(record: Any, writer_name: str | None) -> Any:
        if branches is None:
            return record
        picked = branches.pick(record, writer_name)
        return picked if fix is None else fix(picked)

    def finish(buf: io.BytesIO, writer: Any, check: Node, value: bytes, start: int) -> tuple[Any, int]:
        # Every reader's one way in: the bytes are checked against the writer schema before fastavro believes them.
        items = validate(check, value, start, limits)
        size = len(value)
        try:
            record = read(buf, writer, None if writer is reader else reader)
        except (EOFError, IndexError) as e:  # fastavro reading past the end: which one depends on the field
            raise DecodeError(f"truncated or corrupt Avro payload ({type(e).__name__}: {e})") from None
        if buf.tell() != size:  # a payload for another schema often decodes partway: the rest says it is not ours
            raise DecodeError(f"{size - buf.tell()} bytes left after the record: not written with this schema")
        return (record if fix is None else fix(record)), items

    if fmt.framing == "none":
        def one(value: bytes) -> tuple[Any, int]:
            record, items = finish(io.BytesIO(value), reader, own, value, 0)
            return branch(record, full_name(raw)), items
        return arrow_type, one

    where_ids = fmt.writer_schemas
    fetch = registry if fmt.writers_from_registry else None

    def one_framed(value: bytes) -> tuple[Any, int]:
        sid, _, start = framing.split(value, with_indexes=False)
        found = writers.get(sid)
        if found is None and fetch is not None:  # raises PendingSchema while the registry cannot give it
            writer_raw, writer = parse(f"schema {sid}", f"{where}.writer_schemas", fetch.writer(sid))
            try:
                check = _checker(writer_raw, f"schema {sid}", f"{where}.writer_schemas")
            except SchemaError as e:  # the registry's schema, not the operator's config: this value's error
                raise DecodeError(str(e)) from None
            found = writers[sid] = (reader if writer_raw == raw else writer, check)
            names[sid] = full_name(writer_raw)
        if found is None:
            raise DecodeError(f"unknown schema id {sid} (no {sid}.avsc in writer_schemas {where_ids})")
        buf = io.BytesIO(value)
        buf.seek(start)
        record, items = finish(buf, *found, value, start)
        return branch(record, names.get(sid)), items

    return arrow_type, one_framed
