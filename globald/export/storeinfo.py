"""What a RocksDB table database says about itself, read-only: offsets, fingerprint ladders, topic, topic ID and
format. The exporter reads a snapshot's to write its manifest; the bootstrap reads a downloaded one's to check it
holds what its manifest claims."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from globald.store import layout
from globald.store.codec import decode_format, unreadable_format
from globald.store.fingerprint import Fingerprint, ladders_in
from globald.store.names import (
    DEFAULT_CF,
    META_CF,
    META_FINGERPRINT_PREFIX,
    META_FORMAT,
    META_TOPIC,
    META_TOPIC_ID,
    OFFSETS_CF,
    ORIGINS_CF,
)

# Opened read-only, never written: the same options for every family (see store.layout on why they are shared).
_OPTIONS = Options(raw_mode=True)
_OPTIONS.create_if_missing(False)


class StoreInfoError(Exception):
    """The database cannot be opened read-only or is not a globald store of a format this release reads."""


@dataclass(frozen=True)
class StoreInfo:
    offsets: dict[int, int]
    ladders: dict[int, tuple[Fingerprint, ...]]
    topic: str | None
    topic_id: str | None
    format: int
    typed: bool


def read(db: Path) -> StoreInfo:
    try:
        families = layout.families(db)
        rd = Rdict(str(db), _OPTIONS, column_families={cf: _OPTIONS for cf in families if cf != DEFAULT_CF},
                   access_type=AccessType.read_only())
    except Exception as e:  # rocksdict raises bare Exceptions naming the file
        raise StoreInfoError(f"cannot open {db} read-only: {e}") from None
    try:
        if META_CF not in families or OFFSETS_CF not in families:
            raise StoreInfoError(f"{db} is not a globald store (no {META_CF} or {OFFSETS_CF} family)")
        meta = rd.get_column_family(META_CF)
        raw_format = meta.get(META_FORMAT)
        if raw_format is None or unreadable_format(raw_format):
            raise StoreInfoError(f"{db}: store format {raw_format!r} is not one this globald reads")
        found, problems = ladders_in(meta.items(from_key=META_FINGERPRINT_PREFIX))
        if problems:
            raise StoreInfoError(f"{db}: damaged fingerprint ladders: {'; '.join(problems)}")
        topic, topic_id = meta.get(META_TOPIC), meta.get(META_TOPIC_ID)
        offsets = layout.offsets_in(rd.get_column_family(OFFSETS_CF).items())
        del meta
        return StoreInfo(offsets=offsets, ladders={p: lad.rungs for p, lad in found.items()},
                         topic=topic.decode(errors="replace") if isinstance(topic, bytes) else None,
                         topic_id=topic_id.decode(errors="replace") if isinstance(topic_id, bytes) else None,
                         format=decode_format(raw_format), typed=ORIGINS_CF in families)
    finally:
        rd.close()
