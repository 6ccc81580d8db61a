"""Byte encodings of stored values and offsets (KIP-258 timestamped values).

A stored value is the record timestamp as 8 big-endian signed bytes, then the value bytes. ``NO_TIMESTAMP``
(-1) stands in when the broker gives none. Offsets are stored as 8 big-endian signed bytes under the partition
number in decimal ASCII. An origin (a typed table's, see ``names.ORIGINS_CF``) is the partition as 4 and the offset
as 8 big-endian signed bytes, then the CRC-32 of the stored value it describes: an origin left behind by a write
that did not update it (a release that knew nothing of origins, a path that forgot) never names another record.
"""

from __future__ import annotations

import struct
import zlib

from globald.store import names

NO_TIMESTAMP = -1
_I64 = struct.Struct(">q")
pack_i64 = _I64.pack


def encode_value(timestamp: int, value: bytes) -> bytes:
    return _I64.pack(timestamp) + value


def decode_value(stored: bytes) -> tuple[bytes, int]:
    """(value, timestamp) of a stored value."""
    if len(stored) < 8:
        raise ValueError(f"stored value of {len(stored)} bytes is shorter than its timestamp prefix")
    return stored[8:], _I64.unpack_from(stored)[0]


_ORIGIN = struct.Struct(">iqI")


def encode_origin(partition: int, offset: int, stored: bytes) -> bytes:
    """Where ``stored`` (a stored value: timestamp prefix, then the value) came from."""
    return _ORIGIN.pack(partition, offset, zlib.crc32(stored))


def decode_origin(raw: bytes | None, stored: bytes) -> tuple[int, int] | None:
    """(partition, offset) of the record that wrote ``stored``; None when ``raw`` is absent, malformed, or
    describes another value."""
    if raw is None or len(raw) != _ORIGIN.size:
        return None
    partition, offset, crc = _ORIGIN.unpack(raw)
    return (partition, offset) if crc == zlib.crc32(stored) else None


def encode_offset(offset: int) -> bytes:
    return _I64.pack(offset)


def decode_offset(raw: bytes) -> int:
    return int(_I64.unpack(raw)[0])


def partition_key(partition: int) -> bytes:
    return str(partition).encode()


def fingerprint_key(partition: int) -> bytes:
    return names.META_FINGERPRINT_PREFIX + partition_key(partition)


def decode_format(raw: bytes) -> int:
    """The format number stored under META_FORMAT; -1 when it is not a number."""
    return int(raw) if raw.isdigit() else -1


def unreadable_format(raw: bytes) -> str | None:
    """Why this build cannot read a store whose META_FORMAT is ``raw``; None when it can."""
    fmt = decode_format(raw)
    if fmt in names.READABLE_FORMATS:
        return None
    what = "newer than this globald reads" if fmt > names.FORMAT_VERSION else "unknown"
    readable = ", ".join(map(str, names.READABLE_FORMATS))
    return f"store format {raw.decode(errors='replace')} is {what} (it reads formats {readable})"
