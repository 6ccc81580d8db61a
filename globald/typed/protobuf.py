"""Protobuf values: the official runtime parses each payload with the message class built from a descriptor set.

Why the official ``protobuf`` runtime: it is the reference implementation (its upb C core parses at C speed), it
builds message classes from a descriptor set at run time, so no generated code is shipped, and it reads any
writer's payload with the reader's message as protobuf's compatibility rules promise.

The Arrow type follows Spark's ``from_protobuf``: messages are structs, repeated fields lists, maps map<key, value>,
enums their value names (an unknown number its decimal text), google.protobuf.Timestamp a UTC timestamp (us),
int32 kinds int32, int64 kinds and uint32 int64, uint64 kinds decimal(20, 0). A field without presence (proto3
implicit) reads as its default; one with presence, or a message field, as null when unset. A recursive message
has no column type and is refused when the schema is loaded.
"""

from __future__ import annotations

import base64
import decimal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from globald.settings.typed_spec import SchemaError, ValueFormat, read_schema_file, writer_files
from globald.typed import framing
from globald.typed.arrow import DecodeError, OneValue

if TYPE_CHECKING:
    from globald.typed.registry import Registry

F = FieldDescriptor
SCALARS: dict[int, tuple[pa.DataType, Callable[[Any], Any] | None]] = {
    F.TYPE_DOUBLE: (pa.float64(), None), F.TYPE_FLOAT: (pa.float32(), None),
    F.TYPE_INT32: (pa.int32(), None), F.TYPE_SINT32: (pa.int32(), None), F.TYPE_SFIXED32: (pa.int32(), None),
    F.TYPE_INT64: (pa.int64(), None), F.TYPE_SINT64: (pa.int64(), None), F.TYPE_SFIXED64: (pa.int64(), None),
    F.TYPE_UINT32: (pa.int64(), None), F.TYPE_FIXED32: (pa.int64(), None),
    F.TYPE_UINT64: (pa.decimal128(20, 0), decimal.Decimal), F.TYPE_FIXED64: (pa.decimal128(20, 0), decimal.Decimal),
    F.TYPE_BOOL: (pa.bool_(), None), F.TYPE_STRING: (pa.string(), None), F.TYPE_BYTES: (pa.binary(), None),
}
TIMESTAMP = "google.protobuf.Timestamp"

Convert = Callable[[Any], Any]


def _timestamp_micros(ts: Any) -> int:
    return int(ts.seconds) * 1_000_000 + int(ts.nanos) // 1000


class _Compiler:
    """Descriptor -> (Arrow type, function from a message to the Python value Arrow builds it from)."""

    def __init__(self) -> None:
        self.open: set[str] = set()

    def message(self, d: Descriptor) -> tuple[pa.DataType, Convert]:
        if d.full_name == TIMESTAMP:
            return pa.timestamp("us", "UTC"), _timestamp_micros
        if d.full_name in self.open:
            raise ValueError(f"message {d.full_name} is recursive: a column cannot hold it")
        self.open.add(d.full_name)
        fields = [(f.name, *self.field(f)) for f in d.fields]
        self.open.discard(d.full_name)
        arrow = pa.struct([pa.field(name, t) for name, t, _ in fields])
        # A message field, or one with explicit presence, reads null when unset; an implicit proto3 scalar its default.
        convs = [(name, conv, not f.is_repeated and (f.message_type is not None or f.has_presence))
                 for (name, _, conv), f in zip(fields, d.fields, strict=True)]

        def convert(m: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, conv, presence in convs:
                if presence and not m.HasField(name):
                    out[name] = None
                else:
                    out[name] = conv(getattr(m, name))
            return out

        return arrow, convert

    def single(self, f: FieldDescriptor) -> tuple[pa.DataType, Convert | None]:
        """The type of one element of the field (the field itself when not repeated)."""
        if f.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
            return self.message(f.message_type)
        if f.type == F.TYPE_ENUM:
            names = {v.number: v.name for v in f.enum_type.values}
            return pa.string(), lambda n: names.get(n, str(n))
        return SCALARS[f.type]

    def field(self, f: FieldDescriptor) -> tuple[pa.DataType, Convert]:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            kf, vf = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            kt, kc = self.single(kf)
            vt, vc = self.single(vf)
            if kc is None and vc is None:
                return pa.map_(kt, vt), dict
            k_conv, v_conv = kc or (lambda x: x), vc or (lambda x: x)
            return pa.map_(kt, vt), lambda m: {k_conv(k): v_conv(v) for k, v in m.items()}
        t, conv = self.single(f)
        if f.is_repeated:
            if conv is None:
                return pa.list_(t), list
            each = conv
            return pa.list_(t), lambda xs: [each(x) for x in xs]
        return t, conv or (lambda x: x)


def _pool(path: Path | str, where: str, data: bytes | None = None
          ) -> tuple[descriptor_pool.DescriptorPool, FileDescriptor | None]:
    """A pool holding every file of the descriptor set, and its last file (protoc writes the imports first).
    ``data``: the set itself (from the registry, ``path`` then names where it came from)."""
    if data is None:
        assert isinstance(path, Path)
        data = read_schema_file(path, where)
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(data).file
        pool = descriptor_pool.DescriptorPool()
        for f in files:
            pool.Add(f)
        last = pool.FindFileByName(files[-1].name) if files else None
    except Exception as e:  # the runtime raises several kinds for a malformed or incomplete set
        raise SchemaError(where, f"{path} is not a usable protobuf descriptor set ({type(e).__name__}: {e}); make "
                          "it with protoc --include_imports --descriptor_set_out") from None
    return pool, last


def message_at(file: FileDescriptor, indexes: tuple[int, ...]) -> str:
    """The full name of the message a Confluent message-index array points at in ``file``."""
    types = list(file.message_types_by_name.values())
    name = ""
    for i in indexes:
        if i >= len(types):
            raise DecodeError(f"message index {list(indexes)} points past the {len(types)} message(s) of "
                              f"{file.name}")
        d = types[i]
        name, types = d.full_name, list(d.nested_types)
    return name


def _count_items(m: Any, most: int) -> None:
    """DecodeError when the message holds more than ``most`` repeated elements and map entries, all levels
    together."""
    items, todo = 0, [m]
    while todo:
        for f, v in todo.pop().ListFields():
            if f.is_repeated:
                items += len(v)
                if items > most:
                    raise DecodeError(f"a protobuf value of more than {most} repeated elements and map entries: "
                                      "over max_items")
                if f.message_type is None:
                    continue
                if not f.message_type.GetOptions().map_entry:
                    todo.extend(v)
                elif f.message_type.fields_by_name["value"].message_type is not None:
                    todo.extend(v.values())
            elif f.message_type is not None:
                todo.append(v)


def compile_protobuf(fmt: ValueFormat, where: str, registry: Registry | None = None,
                     reader_text: str | None = None) -> tuple[pa.DataType, OneValue]:
    """``registry``: where writer ids come from with ``writer_schemas = "registry"``; ``reader_text``: the reader
    schema taken from a subject, a base64 descriptor set (``globald.typed.registry``), instead of the schema file.
    Either way ``message`` names the reader's message type: it must be in the subject's schema or a file that
    schema imports."""
    assert fmt.message is not None
    if reader_text is None:
        assert fmt.schema is not None
        pool, _ = _pool(fmt.schema, f"{where}.schema")
        named: Path | str = fmt.schema
    else:
        named = f"subject {fmt.subject}"
        pool, _ = _pool(named, f"{where}.subject", base64.standard_b64decode(reader_text))
    try:
        desc = pool.FindMessageTypeByName(fmt.message)
    except KeyError:
        raise SchemaError(f"{where}.message", f"no message {fmt.message} in {named}") from None
    try:
        arrow_type, convert = _Compiler().message(desc)
    except ValueError as e:
        raise SchemaError(f"{where}.message", f"{fmt.message}: {e}") from None
    cls = message_factory.GetMessageClass(desc)
    most = fmt.max_items

    def parse(payload: bytes) -> tuple[Any, int]:
        m = cls()
        m.ParseFromString(payload)  # nesting past 100 is the runtime's error; each element takes at least a byte
        if len(payload) > most:  # only then can it hold more elements than the bound
            _count_items(m, most)
        return convert(m), 0  # every item takes a byte: the payload's size bounds them

    if fmt.framing == "none":
        return arrow_type, parse
    # The index array names the message in the writer's file: that id's descriptor set, else the reader's file.
    writer_file = {sid: _pool(p, f"{where}.writer_schemas")[1] for sid, p in writer_files(fmt, where).items()}
    fetch = registry if fmt.writers_from_registry else None
    own_file = desc.file
    message = fmt.message
    names: dict[tuple[int | None, tuple[int, ...]], str] = {}  # (writer id, indexes) -> message: resolved once

    def one(value: bytes) -> tuple[Any, int]:
        sid, indexes, start = framing.split(value, with_indexes=True)
        if fetch is not None and sid not in writer_file:  # raises PendingSchema while the registry cannot give it
            text = fetch.writer(sid)
            try:
                writer_file[sid] = _pool(f"schema {sid}", f"{where}.writer_schemas", base64.standard_b64decode(text))[1]
            except (SchemaError, ValueError) as e:  # the registry's schema, not the operator's config: this value's
                raise DecodeError(str(e)) from None
        if writer_file or fetch is not None:
            if sid not in writer_file:
                raise DecodeError(f"unknown schema id {sid} (no {sid}.desc in writer_schemas {fmt.writer_schemas})")
            file = writer_file[sid]
        else:
            file = own_file
        where_named = (sid if writer_file or fetch is not None else None, indexes)
        named = names.get(where_named)
        if named is None:
            named = message_at(file, indexes) if file is not None else message
            names[where_named] = named
        if named != message:
            raise DecodeError(f"the record is a {named} (message index {list(indexes)}), the table reads {message}")
        return parse(value[start:])

    return arrow_type, one
