"""The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then (protobuf only) the message-index
array, then the payload.

The message-index array says which message of the writer's .proto file the payload is: a count, then that many
indexes (the top-level message, then nested ones), every number a zigzag varint (Kafka's ByteUtils.writeVarint).
The common case, the first message of the file, is the single byte 0 standing for [0]. Many libraries get this
wrong (plain varints, or no array at all); both directions live here so that tests and the benchmark produce
exactly what Confluent's serializers write.
"""

from __future__ import annotations

import struct

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic, schema id


class FramingError(ValueError):
    """A value is not in the wire format the table declares (its text is the reason a decode error reports)."""


def _zigzag_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the zigzag varint at ``pos``."""
    shift = raw = 0
    while True:
        if pos >= len(buf):
            raise FramingError("truncated message-index array")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise FramingError("message-index varint longer than 10 bytes")


def _put_zigzag_varint(n: int) -> bytes:
    raw = (n << 1) ^ (n >> 63)
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def split(value: bytes, with_indexes: bool) -> tuple[int, tuple[int, ...], int]:
    """(schema id, message indexes, payload start) of a framed value; FramingError says why it is not one."""
    if len(value) < HEADER.size:
        raise FramingError(f"truncated Confluent header ({len(value)} of {HEADER.size} bytes)")
    magic, schema_id = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise FramingError(f"wrong magic byte {value[0]} (Confluent framing starts with 0)")
    pos = HEADER.size
    if not with_indexes:
        return schema_id, (), pos
    count, pos = _zigzag_varint(value, pos)
    if count == 0:
        return schema_id, (0,), pos  # the shortcut for the first message of the file
    if count < 0 or count > 100:  # no .proto nests messages 100 deep: this is not an index array
        raise FramingError(f"message-index array of {count} entries")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag_varint(value, pos)
        if index < 0:
            raise FramingError(f"negative message index {index}")
        indexes.append(index)
    return schema_id, tuple(indexes), pos


def frame(schema_id: int, payload: bytes, indexes: tuple[int, ...] | None = None) -> bytes:
    """``payload`` as Confluent's serializers write it: ``indexes`` given for protobuf, [0] as the single 0."""
    head = HEADER.pack(MAGIC, schema_id)
    if indexes is None:
        return head + payload
    if indexes == (0,):
        return head + b"\0" + payload
    return head + _put_zigzag_varint(len(indexes)) + b"".join(_put_zigzag_varint(i) for i in indexes) + payload
