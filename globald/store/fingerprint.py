"""Fingerprints of applied records: how a store tells the topic it mirrors from another one of the same name.

A topic deleted and recreated with more records than the stored offsets passes every offset check, and resuming
from the old offsets would mirror it wrong without a word. So each partition keeps, in the same write batch as its
offsets, a ``Ladder`` of fingerprints (offset and a hash of key, value and timestamp) of records it applied: the
last one, and older ones spaced further and further apart, so that a check still finds one the log holds when
compaction or retention removed the newest. A record read back at a fingerprint's offset that hashes differently,
or a log that has no record there any more although it still reaches past it, names another topic.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b
from typing import TYPE_CHECKING

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from globald.store.codec import NO_TIMESTAMP
from globald.store.names import META_FINGERPRINT_PREFIX

if TYPE_CHECKING:
    from confluent_kafka import Message

_ENTRY = struct.Struct(">q8s")
_ABSENT = b"\xff\xff\xff\xff"
# How far behind the newest fingerprint each older rung may fall before the next newer one replaces it: the first
# is kept at most ~1,000 records back, the last at most ~10M. A rung moves only to a fingerprint older than the one
# it replaces is newer, so the ladder always spans from the last record to far behind it.
_SPACING = (1_000, 100_000, 10_000_000)


def digest(key: bytes | None, value: bytes | None, timestamp: int) -> bytes:
    """8 bytes that tell one record from another (null key and tombstone distinct from empty bytes)."""
    h = blake2b(digest_size=8)
    for part in (key, value):
        h.update(_ABSENT if part is None else len(part).to_bytes(4, "big") + part)
    h.update(timestamp.to_bytes(8, "big", signed=True))
    return h.digest()


def record_fingerprint(m: Message) -> Fingerprint:
    """The fingerprint of a record as consumed: what the update task stores and what a check compares."""
    ts_type, ts = m.timestamp()
    offset = m.offset()
    assert offset is not None  # librdkafka gives every record its offset
    return Fingerprint(offset, digest(m.key(), m.value(), NO_TIMESTAMP if ts_type == TIMESTAMP_NOT_AVAILABLE else ts))


@dataclass(frozen=True)
class Fingerprint:
    offset: int
    digest: bytes


@dataclass(frozen=True)
class Ladder:
    """Fingerprints of one partition, newest first."""

    rungs: tuple[Fingerprint, ...]

    def climb(self, newest: Fingerprint) -> Ladder:
        """The ladder once ``newest`` (a record past every rung) has been applied."""
        if not self.rungs:
            return Ladder((newest,))
        rungs = list(self.rungs)
        for i, spacing in reversed(list(enumerate(_SPACING, start=1))):
            if i >= len(rungs):
                if i == len(rungs):
                    rungs.append(rungs[i - 1])
                continue
            if newest.offset - rungs[i].offset >= spacing:
                rungs[i] = rungs[i - 1]
        rungs[0] = newest
        return Ladder(tuple(_distinct(rungs)))

    def encode(self) -> bytes:
        return b"".join(_ENTRY.pack(f.offset, f.digest) for f in self.rungs)

    @classmethod
    def decode(cls, raw: bytes) -> Ladder:
        if len(raw) % _ENTRY.size:
            raise ValueError(f"fingerprint ladder of {len(raw)} bytes is not a whole number of entries")
        return cls(tuple(Fingerprint(o, d) for o, d in _ENTRY.iter_unpack(raw)))


EMPTY = Ladder(())


def ladders_in(meta_items: Iterable[tuple[object, object]]) -> tuple[dict[int, Ladder], list[str]]:
    """The ladders among a store's metadata entries, iterated from META_FINGERPRINT_PREFIX on, and the problems of
    those that do not decode (a damaged ladder only costs the check it would have allowed)."""
    found: dict[int, Ladder] = {}
    problems: list[str] = []
    for k, v in meta_items:
        if not isinstance(k, bytes) or not isinstance(v, bytes) or not k.startswith(META_FINGERPRINT_PREFIX):
            break
        try:
            found[int(k[len(META_FINGERPRINT_PREFIX):])] = Ladder.decode(v)
        except ValueError as e:
            problems.append(f"{k!r}: {e}")
    return found, problems


def _distinct(rungs: list[Fingerprint]) -> list[Fingerprint]:
    out: list[Fingerprint] = []
    for f in rungs:
        if not out or f.offset != out[-1].offset:
            out.append(f)
    return out
