"""Test fixtures built from the documented on-disk layouts with rocksdict, not produced by the software they stand for.

- The plain layout: values without a timestamp in RocksDB's default column family, no format marker. globald wrote
  it before format 1 (offsets only in the Kafka-format ``.checkpoint`` beside the store); Kafka Streams' plain
  key-value stores (before KIP-258) use the same layout.
- A Kafka Streams global store: ``<state.dir>/<application.id>/global/rocksdb/<store>/`` holding values in the
  ``keyValueWithTimestamp`` column family as an 8-byte big-endian timestamp followed by the value (KIP-258), or plain
  values in the default family; the offsets of the application's global stores are in
  ``<state.dir>/<application.id>/global/.checkpoint``, Kafka's format: ``0``, a count, then ``topic partition offset``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from globald.store import checkpoint_file

KS_TIMESTAMPED_CF = "keyValueWithTimestamp"  # spelled out here, not imported: the fixture states the layout itself


def write_plain_store(path: Path, values: Mapping[bytes, bytes]) -> None:
    """A RocksDB at ``path`` with ``values`` as they are (no timestamp) in the default column family."""
    path.mkdir(parents=True, exist_ok=True)
    db = Rdict(str(path), Options(raw_mode=True))
    batch = WriteBatch(raw_mode=True)
    for k, v in values.items():
        batch.put(k, v)
    db.write(batch)
    del batch  # rocksdict objects pin the database: release them before close, or its LOCK stays taken
    db.close()


def write_kafka_streams_store(state_dir: Path, application_id: str, store: str,
                              values: Mapping[bytes, tuple[bytes, int]], offsets: Mapping[tuple[str, int], int],
                              timestamped: bool = True) -> Path:
    """A Kafka Streams global store of ``values`` (key -> (value, timestamp)) and its global .checkpoint.

    ``timestamped=False`` writes the pre-KIP-258 layout: plain values in the default family, timestamps dropped."""
    path = state_dir / application_id / "global" / "rocksdb" / store
    path.mkdir(parents=True)
    opts = Options(raw_mode=True)
    opts.create_missing_column_families(True)
    db = Rdict(str(path), opts, column_families={KS_TIMESTAMPED_CF: Options(raw_mode=True)} if timestamped else None)
    batch = WriteBatch(raw_mode=True)
    handle = db.get_column_family_handle(KS_TIMESTAMPED_CF) if timestamped else None
    for k, (v, ts) in values.items():
        if handle is not None:
            batch.put(k, struct.pack(">q", ts) + v, handle)
        else:
            batch.put(k, v)
    db.write(batch)
    del handle, batch
    db.close()
    checkpoint_file.write(state_dir / application_id / "global" / ".checkpoint", dict(offsets))
    return path
