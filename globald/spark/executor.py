"""Executor side of ``globald.spark``: each Python worker resolves the shipped descriptor to a snapshot of its own
host's sidecar and keeps one read-only handle per table, reopened only when the descriptor changes.

The sidecar is found through the host's config: ``$GLOBALD_CONFIG`` in the executor's environment, else the
driver's config path (``globald.spark.host``). The table, its topic and the offsets always come from the driver.

Everything a task reads comes from the one snapshot its descriptor resolves to, and snapshots at the same offsets
hold the same content on every host, so one Spark job never mixes two versions of a table. When the exact
snapshot cannot be had within the wait, the policy either fails the task or reads the newest snapshot; a fallback
is logged, and counted where the lookup path can report it (``globald.spark.session.Fallbacks``), never
silent. Every error and fallback note names the host, the sidecar's state_dir and the config that led there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa

from globald.common.errors import SnapshotError, SnapshotNotFoundError, SnapshotUnavailableError
from globald.snapshot.manifest import offsets_from_json
from globald.snapshot.reader import OpenOptions, Snapshot
from globald.snapshot.resolve import Policy, Resolution, resolve
from globald.spark.batch import MultiGet, binary_keys, encode_key, lookup_arrow, lookup_pandas
from globald.spark.host import sidecar
from globald.spark.mapped import open_raw, raw_columns
from globald.spark.memindex import DEFAULT_MEMORY_INDEX_MB, MemoryIndex
from globald.spark.session import FALLBACK_COL
from globald.typed.columnar import ROW_BYTES

log = logging.getLogger(__name__)

Value = tuple[bytes, int]
Batches = Iterator[pa.RecordBatch]
MODE_SNAPSHOT = "snapshot"  # executors read their host's sidecar snapshots
MODE_BROADCAST = "broadcast"  # small tables: the driver ships the content itself


@dataclass(frozen=True)
class Settings:
    """What executors need besides the descriptor; shipped inside each closure."""

    config_path: str  # the driver's; an executor whose environment sets $GLOBALD_CONFIG uses that instead
    table: str
    wait_timeout_s: float = 30.0
    policy: str = Policy.FAIL.value
    lease_s: float = 600.0
    batch_size: int = 1024
    # A raw snapshot whose keys and values fit is mapped from one file per host (globald.spark.mapped), shared by
    # every worker; larger ones, or all with 0, are read by multi-gets. The name is kept from when it was per worker.
    memory_index_mb: int = DEFAULT_MEMORY_INDEX_MB


class Handle(Protocol):
    snapshot: str | None
    exact: bool
    note: str | None

    def columns(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(value: binary, timestamp: int64) for a binary array of keys; null in both where absent or null."""
        ...

    def close(self) -> None: ...


class SnapshotHandle:
    """A snapshot of this host's sidecar: mapped from its one file per host when it fits ``budget`` bytes
    (``globald.spark.mapped``; the snapshot is then closed, its lease released), else kept open read-only, pinned
    by this worker's lease, and read by batched multi-gets."""

    def __init__(self, snap: Snapshot, res: Resolution, note: str | None, budget: int) -> None:
        self.snapshot: str | None = snap.id
        self.exact = res.exact
        self.note = note
        self._snap: Snapshot | None = snap
        # The manifest's key count is RocksDB's estimate: a table clearly over budget is not read at all.
        fits = budget > 0 and snap.manifest.records * ROW_BYTES <= budget
        self._table = open_raw(snap, budget) if fits else None
        if self._table is not None:
            snap.close(release=True)
            self._snap = None
        self._multi_get = MultiGet(self._fetch)

    @property
    def mapped(self) -> bool:
        return self._table is not None

    @property
    def snap(self) -> Snapshot | None:
        """The open snapshot (None once mapped): typed tables map its columnar file."""
        return self._snap

    def _fetch(self, keys: list[bytes]) -> list[bytes | None]:
        assert self._snap is not None
        self._snap.renew()
        return self._snap.multi_get_stored(keys)

    def columns(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        return self._multi_get(keys) if self._table is None else raw_columns(self._table, keys)

    def close(self) -> None:
        if self._snap is not None:
            self._snap.close(release=True)


class ContentHandle:
    """Small-table mode: the snapshot's content came with the function (a broadcast on a classic session, the
    closure on Connect) as an Arrow table, indexed once per Python worker and descriptor."""

    def __init__(self, content: pa.Table, snapshot: str | None) -> None:
        self._index = MemoryIndex.of_table(content)
        self.snapshot = snapshot
        self.exact = True
        self.note: str | None = None

    def columns(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        return self._index.lookup(keys)

    def close(self) -> None:
        pass


# One handle per view's settings (views of one table with different options keep their own), with the signature
# of the descriptor it was opened for.
_HANDLES: dict[Hashable, tuple[str, Handle]] = {}


def signature(desc: dict[str, Any]) -> str:
    """What identifies a descriptor's content: a refresh that changes none of it keeps the open handle."""
    # "decoder": a typed table's declaration (globald.spark.typed): a new schema reopens the handle, decoded anew.
    keep = {k: desc.get(k) for k in ("table", "mode", "offsets", "snapshot", "decoder")}
    return json.dumps(keep, sort_keys=True)


def handle(settings: Settings, desc: dict[str, Any], data: Any = None, fallbacks: Any = None,
           opener: Callable[[Settings, dict[str, Any], Any], Handle] | None = None, key: Hashable = None) -> Handle:
    """This worker's handle for ``desc``; opened (resolving, requesting, waiting) only when ``desc`` changed.
    ``opener`` makes another kind of handle (``globald.spark.typed``), cached alike under its own ``key``."""
    key = settings if key is None else key
    sig = signature(desc)
    cached = _HANDLES.get(key)
    if cached is not None and cached[0] == sig:
        return cached[1]
    if cached is not None:
        del _HANDLES[key]
        cached[1].close()
    h = (opener or _open)(settings, desc, data)
    if not h.exact:
        log.warning("%s", h.note)
        if fallbacks is not None:
            fallbacks.add(1)
    _HANDLES[key] = (sig, h)
    return h


def _open(settings: Settings, desc: dict[str, Any], data: Any) -> Handle:
    if desc.get("mode") == MODE_BROADCAST:
        return ContentHandle(data.value, desc.get("snapshot"))
    # This host's own sidecar ($GLOBALD_CONFIG, else the driver's path); the table and topic are the driver's.
    side = sidecar(settings.config_path, settings.table, desc.get("topic"))
    target = offsets_from_json(desc["offsets"])
    last: SnapshotError | None = None
    try:
        for _ in range(3):  # the snapshot found may be collected before it is opened: resolve again
            res = resolve(side.state_dir, settings.table, target, hint=desc.get("snapshot"),
                          timeout=settings.wait_timeout_s, policy=Policy(settings.policy),
                          serve_stale=side.serve_stale)
            try:
                snap = Snapshot(side.state_dir, settings.table, res.snapshot,
                                OpenOptions(serve_stale=side.serve_stale, lease_s=settings.lease_s))
            except SnapshotNotFoundError as e:
                last = e
                continue
            return SnapshotHandle(snap, res, None if res.note is None else f"{side.where()}: {res.note}",
                                  settings.memory_index_mb << 20)
        assert last is not None
        raise last
    except SnapshotError as e:
        raise located(e, side.where()) from None


def located(e: SnapshotError, where: str) -> SnapshotError:
    """``e`` with the host and sidecar it happened on in front of its message, as the same kind of error."""
    if isinstance(e, SnapshotUnavailableError):
        return SnapshotUnavailableError(e.code, f"{where}: {str(e).removeprefix(f'{e.code}: ')}")
    return type(e)(f"{where}: {e}")


def close_all() -> None:
    """Close every cached handle of this worker (tests, and workers that outlive their job)."""
    for _, h in list(_HANDLES.values()):
        h.close()
    _HANDLES.clear()


def lookup(h: Handle, keys: list[bytes | None]) -> list[Value | None]:
    """One batch of keys looked up at once, as (value, timestamp) per key (the RDD path); None where absent."""
    value, ts = h.columns(pa.array(keys, pa.binary()))
    return [None if v is None else (v, t) for v, t in zip(value.to_pylist(), ts.to_pylist(), strict=True)]


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


def arrow_fn(settings: Settings, desc_bc: Any, data_bc: Any, on: str, value_col: str, timestamp_col: str,
             snapshot_col: str | None, count_fallbacks: bool = True,
             opener: Callable[[Settings, dict[str, Any], Any], Handle] | None = None,
             key: Hashable = None, as_of: str | None = None,
             error_col: str | None = None) -> Callable[[Batches], Batches]:
    """For ``df.mapInArrow``: appends the value, timestamp (and snapshot id) columns to every record batch, and
    (``count_fallbacks``) the hidden ``FALLBACK_COL``: 1 on the first row of a task that read another version than
    its descriptor asked for, else 0, which the driver's observation adds up (``globald.spark.session``).
    ``opener`` and ``key``: another kind of handle, as ``handle`` takes them (the benchmarks' per-worker index).
    ``as_of``: each row's key as of the time in that column, from the handle ``opener`` makes
    (``globald.spark.asof.opener``), ``error_col`` the reason a row got no answer (a time before ``since``)."""

    def run(batches: Batches) -> Batches:
        h: Any = handle(settings, desc_bc.value, data_bc, opener=opener, key=key)
        unreported = not h.exact
        for batch in batches:
            reason = None
            if as_of is None:
                value, timestamp = lookup_arrow(h.columns, batch.column(on))
            else:
                value, timestamp, reason = h.at(binary_keys(batch.column(on)), batch.column(as_of))
            arrays = [*batch.columns, value, timestamp]
            names = [*batch.schema.names, value_col, timestamp_col]
            if error_col is not None:
                arrays.append(pa.nulls(batch.num_rows, pa.string()) if reason is None else reason)
                names.append(error_col)
            if snapshot_col is not None:
                arrays.append(pa.repeat(pa.scalar(h.snapshot, pa.string()), batch.num_rows))
                names.append(snapshot_col)
            if count_fallbacks:
                flags = np.zeros(batch.num_rows, np.int64)
                if unreported and batch.num_rows:
                    flags[0], unreported = 1, False
                arrays.append(pa.array(flags))
                names.append(FALLBACK_COL)
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run


def pandas_fn(settings: Settings, desc_bc: Any, data_bc: Any) -> Callable[[pd.Series], pd.DataFrame]:
    """Body of the pandas UDF: a Series of keys becomes a DataFrame with value and timestamp columns. A fallback
    is logged on the executor; a column function has nowhere to count it (``globald.spark.session.Fallbacks``)."""

    # Spark reads these type hints to pick a scalar (Series -> struct) pandas UDF.
    def run(keys: pd.Series) -> pd.DataFrame:
        h = handle(settings, desc_bc.value, data_bc)
        return lookup_pandas(h.columns, keys)  # pandas' NaN/NA for a null key looks nothing up

    return run
