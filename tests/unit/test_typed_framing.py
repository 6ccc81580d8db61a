"""The Confluent wire format: header, the protobuf message-index array (zigzag varints, the single-0 shortcut)."""

from __future__ import annotations

import pytest

from globald.typed.framing import FramingError, frame, split
from tests.unit.typed_fixtures import confluent


def test_avro_and_json_header_is_magic_and_big_endian_id() -> None:
    value = confluent(258, b"payload")
    assert split(value, with_indexes=False) == (258, (), 5)
    assert frame(258, b"payload") == value


@pytest.mark.parametrize(("indexes", "written"), [
    ((0,), b"\x00"),  # the shortcut: one byte 0 for [0]
    ((1,), b"\x02\x02"),  # count 1, index 1, both zigzag (1 -> 2), as Kafka's ByteUtils.writeVarint writes them
    ((1, 2), b"\x04\x02\x04"),
    ((70,), b"\x02\x8c\x01"),  # zigzag 140: a two-byte varint
])
def test_message_index_array_is_zigzag_varints(indexes: tuple[int, ...], written: bytes) -> None:
    value = confluent(7, b"P", written)
    assert split(value, with_indexes=True) == (7, indexes, 5 + len(written))
    assert frame(7, b"P", indexes) == value


def test_explicit_zero_index_array_reads_as_the_shortcut_does() -> None:
    assert split(confluent(7, b"P", b"\x02\x00"), with_indexes=True)[1] == (0,)


@pytest.mark.parametrize(("value", "reason"), [
    (b"\x00\x00\x00", "truncated Confluent header"),
    (b"\x01\x00\x00\x00\x01payload", "wrong magic byte 1"),
    (b"", "truncated Confluent header"),
])
def test_bad_headers_say_why(value: bytes, reason: str) -> None:
    with pytest.raises(FramingError, match=reason):
        split(value, with_indexes=False)


@pytest.mark.parametrize(("indexes", "reason"), [
    (b"", "truncated message-index array"),
    (b"\x04\x02", "truncated message-index array"),
    (b"\x03", "message-index array of -2 entries"),
    (b"\x02\x01", "negative message index -1"),
    (b"\xff" * 11, "longer than 10 bytes"),
])
def test_bad_message_index_arrays_say_why(indexes: bytes, reason: str) -> None:
    with pytest.raises(FramingError, match=reason):
        split(confluent(1, b"", indexes), with_indexes=True)
