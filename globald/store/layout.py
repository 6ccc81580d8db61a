"""The on-disk layout of a table's store, written and read in this one place: the metadata that says what a store
is, how offsets are kept in it, and offsets in the JSON files beside stores and snapshots.

Reserved names are ``names``', byte encodings ``codec``'s. Everything that writes a store (the live store, an exact
snapshot build, an import of a Kafka Streams store) goes through these functions, so a change of layout is made once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from globald.store.codec import (
    decode_offset,
    decode_origin,
    encode_offset,
    encode_origin,
    fingerprint_key,
    partition_key,
)
from globald.store.fingerprint import Ladder
from globald.store.names import META_CF, META_FORMAT, META_TOPIC, OFFSETS_CF

# A partition number in a file longer than this is garbage, not a partition (offsets are Kafka's 63-bit ones).
_MAX_PARTITION_DIGITS = 9
# One set of options for every listing: rocksdict's default Options install its own comparator, which is never
# freed (136 B per Options, measured with jemalloc's stats.allocated); a listing per published snapshot made that
# the daemon's one steady memory growth (about 4 MB an hour in the accelerated soak). RocksDB only reads them.
_LISTING_OPTIONS = Options(raw_mode=True)


def families(path: Path | str) -> list[str]:
    """The column families of the database at ``path`` (RocksDB opens one only with all of them named)."""
    return Rdict.list_cf(str(path), _LISTING_OPTIONS)


def stamp(fmt: int, topic: str) -> dict[bytes, bytes]:
    """The metadata a new store is stamped with: the oldest format that describes it and the topic it mirrors."""
    return {META_FORMAT: str(fmt).encode(), META_TOPIC: topic.encode()}


def put_meta(batch: WriteBatch, db: Rdict, entries: Mapping[bytes, bytes | None]) -> None:
    """Add ``entries`` to the metadata in ``batch``; a None value deletes its key."""
    handle = db.get_column_family_handle(META_CF)
    for key, value in entries.items():
        if value is None:
            batch.delete(key, handle)
        else:
            batch.put(key, value, handle)


def put_offsets(batch: WriteBatch, db: Rdict, offsets: Mapping[int, int],
                ladders: Mapping[int, Ladder] | None = None) -> None:
    """Add next-offsets (and the fingerprint ladders of the records below them) to ``batch``: in the batch that
    holds those records, so that data and offsets are only ever durable together."""
    handle = db.get_column_family_handle(OFFSETS_CF)
    for partition, offset in offsets.items():
        batch.put(partition_key(partition), encode_offset(offset), handle)
    if ladders:
        put_meta(batch, db, {fingerprint_key(p): ladder.encode() for p, ladder in ladders.items()})


class OriginWriter:
    """Adds the origin of each value a batch writes (a typed table's ``names.ORIGINS_CF``), in the same batch."""

    __slots__ = ("_batch", "_handle")

    def __init__(self, batch: Any, handle: Any) -> None:  # a WriteBatch or an UpgradingBatch (plain)
        self._batch, self._handle = batch, handle

    def put(self, key: bytes, partition: int, offset: int, stored: bytes) -> None:
        self._batch.put(key, encode_origin(partition, offset, stored), self._handle)

    def delete(self, key: bytes) -> None:
        self._batch.delete(key, self._handle)


def origins_in(family: Rdict, keys: Sequence[bytes], stored: Sequence[bytes]) -> list[tuple[int, int] | None]:
    """(partition, offset) of each stored value of ``keys``, from an origins family; None where not recorded."""
    raws: list[bytes | None] = family.get(list(keys)) or []  # a multi-get: one answer a key
    return [decode_origin(raw, s) for raw, s in zip(raws, stored, strict=True)]


def offsets_in(items: Iterable[tuple[bytes | str | int | float | bool, Any]]) -> dict[int, int]:
    """The next-offsets held by the items of a store's offsets family (rocksdict types them loosely)."""
    return {int(k): decode_offset(v) for k, v in items}


def offsets_to_json(offsets: Mapping[int, int]) -> dict[str, int]:
    """Offsets as JSON: partition numbers as strings, in partition order."""
    return {str(p): o for p, o in sorted(offsets.items())}


def offsets_from_json(raw: object, what: str = "offsets") -> dict[int, int]:
    """Partition -> next-offset from JSON ({"0": 12, ...}); raises ValueError naming what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be an object")
    out: dict[int, int] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not k.isdigit() or len(k) > _MAX_PARTITION_DIGITS:
            raise ValueError(f"{what}: partition {k!r} is not a partition number")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 63:
            raise ValueError(f"{what}[{k}] = {v!r} is not an offset")
        out[int(k)] = v
    return out
