"""Executor side of ``globald.spark``: each Python worker resolves the broadcast descriptor to a local snapshot and
keeps one read-only handle per table, reopened only when the descriptor changes.

Everything a task reads comes from the one snapshot its descriptor resolves to, and snapshots at the same offsets
hold the same content on every host, so one Spark job never mixes two versions of a table. When the exact
snapshot cannot be had within the wait, the policy either fails the task or reads the newest snapshot; a fallback
is counted in the view's accumulator and logged, never silent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import Any, Protocol, cast

import pandas as pd
import pyarrow as pa

from globald.config import Config, load
from globald.errors import SnapshotNotFoundError
from globald.snapshot.manifest import offsets_from_json
from globald.snapshot.reader import OpenOptions, Snapshot
from globald.snapshot.resolve import Policy, Resolution, resolve

log = logging.getLogger(__name__)

Value = tuple[bytes, int]
Batches = Iterator[pa.RecordBatch]
MODE_SNAPSHOT = "snapshot"  # executors read their host's sidecar snapshots
MODE_BROADCAST = "broadcast"  # small tables: the driver broadcasts the content itself


@dataclass(frozen=True)
class Settings:
    """What executors need besides the descriptor; shipped inside each closure."""

    config_path: str
    table: str
    wait_timeout_s: float = 30.0
    policy: str = Policy.FAIL.value
    lease_s: float = 600.0
    batch_size: int = 1024


class Handle(Protocol):
    snapshot: str | None
    exact: bool
    note: str | None

    def multi_get(self, keys: list[bytes]) -> list[Value | None]: ...

    def close(self) -> None: ...


class SnapshotHandle:
    """A RocksDB snapshot opened read-only on this host, pinned by this worker's lease while in use."""

    def __init__(self, snap: Snapshot, res: Resolution) -> None:
        self._snap = snap
        self.snapshot: str | None = snap.id
        self.exact = res.exact
        self.note = res.note

    def multi_get(self, keys: list[bytes]) -> list[Value | None]:
        self._snap.renew()
        return self._snap.multi_get(keys)

    def close(self) -> None:
        self._snap.close(release=True)


class DictHandle:
    """Small-table mode: the content came with the broadcast."""

    def __init__(self, data: dict[bytes, Value], snapshot: str | None) -> None:
        self._data = data
        self.snapshot = snapshot
        self.exact = True
        self.note: str | None = None

    def multi_get(self, keys: list[bytes]) -> list[Value | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def close(self) -> None:
        pass


_HANDLES: dict[tuple[str, str], tuple[str, Handle]] = {}


@lru_cache(maxsize=8)
def _config(path: str) -> Config:
    return load(path)


def signature(desc: dict[str, Any]) -> str:
    """What identifies a descriptor's content: a refresh that changes none of it keeps the open handle."""
    keep = {k: desc.get(k) for k in ("table", "mode", "offsets", "snapshot")}
    return json.dumps(keep, sort_keys=True)


def handle(settings: Settings, desc: dict[str, Any], data: Any = None, fallbacks: Any = None) -> Handle:
    """This worker's handle for ``desc``; opened (resolving, requesting, waiting) only when ``desc`` changed."""
    key = (settings.config_path, settings.table)
    sig = signature(desc)
    cached = _HANDLES.get(key)
    if cached is not None and cached[0] == sig:
        return cached[1]
    if cached is not None:
        del _HANDLES[key]
        cached[1].close()
    h = _open(settings, desc, data)
    if not h.exact:
        log.warning("%s", h.note)
        if fallbacks is not None:
            fallbacks.add(1)
    _HANDLES[key] = (sig, h)
    return h


def _open(settings: Settings, desc: dict[str, Any], data: Any) -> Handle:
    if desc.get("mode") == MODE_BROADCAST:
        return DictHandle(data.value, desc.get("snapshot"))
    cfg = _config(settings.config_path)
    target = offsets_from_json(desc["offsets"])
    last: Exception | None = None
    for _ in range(3):  # the snapshot found may be collected before it is opened: resolve again
        res = resolve(cfg.state_dir, settings.table, target, hint=desc.get("snapshot"),
                      timeout=settings.wait_timeout_s, policy=Policy(settings.policy),
                      serve_stale=cfg.snapshots.serve_stale)
        try:
            snap = Snapshot(cfg.state_dir, settings.table, res.snapshot,
                            OpenOptions(serve_stale=cfg.snapshots.serve_stale, lease_s=settings.lease_s))
        except SnapshotNotFoundError as e:
            last = e
            continue
        return SnapshotHandle(snap, res)
    assert last is not None
    raise last


def close_all() -> None:
    """Close every cached handle of this worker (tests, and workers that outlive their job)."""
    for _, h in list(_HANDLES.values()):
        h.close()
    _HANDLES.clear()


def encode_key(key: object) -> bytes | None:
    """Keys are bytes as stored; strings are looked up by their UTF-8 encoding; None matches nothing."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"lookup keys must be bytes or str, not {type(key).__name__}")


def lookup(h: Handle, keys: list[bytes | None]) -> list[Value | None]:
    """One batched multi-get; null keys get None without touching the store."""
    if None not in keys:
        # No None in keys, checked just above: the cast spares a copy of every batch on the hot path.
        return h.multi_get(cast("list[bytes]", keys))
    present = [k for k in keys if k is not None]
    found = iter(h.multi_get(present))
    return [None if k is None else next(found) for k in keys]


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


# -- lookup paths: the functions Spark ships to executors -------------------------------------------------------


def partitions_fn(settings: Settings, desc_bc: Any, data_bc: Any, fallbacks: Any,
                  key: Callable[[Any], object] | None) -> Callable[[Iterable[Any]], Iterator[tuple[Any, Any, Any]]]:
    """For ``rdd.mapPartitions``: each element becomes (element, value or None, timestamp or None)."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, Any, Any]]:
        h = handle(settings, desc_bc.value, data_bc, fallbacks)
        for chunk in _chunks(rows, settings.batch_size):
            keys = [encode_key(key(r) if key is not None else r) for r in chunk]
            for r, v in zip(chunk, lookup(h, keys), strict=True):
                yield (r, None, None) if v is None else (r, v[0], v[1])

    return run


def arrow_fn(settings: Settings, desc_bc: Any, data_bc: Any, fallbacks: Any, on: str, value_col: str,
             timestamp_col: str, snapshot_col: str | None) -> Callable[[Batches], Batches]:
    """For ``df.mapInArrow``: appends the value, timestamp (and snapshot id) columns to every record batch."""

    def run(batches: Batches) -> Batches:
        h = handle(settings, desc_bc.value, data_bc, fallbacks)
        for batch in batches:
            column = batch.column(on)
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                column = column.cast(pa.binary())  # UTF-8 bytes, without a Python encode per key
            found = lookup(h, column.to_pylist())
            arrays = [*batch.columns,
                      pa.array([None if v is None else v[0] for v in found], type=pa.binary()),
                      pa.array([None if v is None else v[1] for v in found], type=pa.int64())]
            names = [*batch.schema.names, value_col, timestamp_col]
            if snapshot_col is not None:
                arrays.append(pa.array([h.snapshot] * batch.num_rows, type=pa.string()))
                names.append(snapshot_col)
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run


def pandas_fn(settings: Settings, desc_bc: Any, data_bc: Any,
              fallbacks: Any) -> Callable[[pd.Series], pd.DataFrame]:
    """Body of the pandas UDF: a Series of keys becomes a DataFrame with value and timestamp columns."""

    # Spark reads these type hints to pick a scalar (Series -> struct) pandas UDF.
    def run(keys: pd.Series) -> pd.DataFrame:
        h = handle(settings, desc_bc.value, data_bc, fallbacks)
        # pandas stands in NaN/NA for null strings: those look nothing up.
        found = lookup(h, [encode_key(k) for k in keys.astype(object).where(keys.notna(), None).tolist()])
        return pd.DataFrame({"value": [None if v is None else v[0] for v in found],
                             "timestamp": pd.array([None if v is None else v[1] for v in found], dtype="Int64")})

    return run
