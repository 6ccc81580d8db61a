"""A snapshot decoded once per host into an Arrow IPC file beside it, mapped read-only by every worker.

Why: a Python worker that builds its own index holds its own copy (16 cores, 16 copies), and decoding per lookup
costs the decoder's per-value Python again at every query. The file is decoded once per snapshot and format, by the
first reader on the host (the others wait on a lock and then map it); the page cache then holds one copy, and a
lookup neither decodes nor copies: it hashes the batch's keys (numpy over the Arrow buffers), probes an
open-addressing table stored in the file (one gather per probe, for the whole batch), confirms the bytes with
Arrow's ``equal`` and gathers the rows with ``take``. A binary search over sorted hashes was 5-10x slower here:
17 dependent cache misses a key against one or two.

Contract: ``ColumnarTable.lookup(keys)`` answers every key as the snapshot's point lookup followed by
``Decoder.decode`` would: the decoded value, its timestamp and its decode error; null in all three for an absent
or null key. The file lives in the snapshot's directory (``columnar-<fingerprint>.arrow``), so it is valid for
exactly that content and that declared format, and it goes when retention deletes the snapshot. It is written
under a temporary name and renamed into place (``globald.store.durable.replace_file``): a reader sees no file or a
whole one. Rows are in key order (the snapshot's) with columns key, timestamp, value, error and ``hash`` (the key's
64-bit hash) and ``slots``: the open-addressing table (two slots a key, each a row or -1, linear probing from the
hash modulo their number), stored two to a row so that every column has one entry a key. The index costs 16 bytes a
key. A table whose key is declared typed is indexed on each decoded key's canonical form instead of the stored
bytes, and looked up the same way (``globald.typed.keys``); its file has a name of its own.

Raw tables use this file too: a raw table is a typed table whose value decoder is the identity, so its mapped file
(``globald.spark.mapped``) is this one, its value column the record's value bytes. A change here changes both.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from globald.common.errors import GlobaldError
from globald.store.durable import replace_file
from globald.store.names import COLUMNAR_PREFIX, COLUMNAR_SUFFIX
from globald.typed.arrow import ERROR_TYPE, Decoder, Origin, OriginLookup
from globald.typed.columnar_table import ERROR_OFFSET as ERROR_OFFSET
from globald.typed.columnar_table import ERROR_PARTITION as ERROR_PARTITION
from globald.typed.columnar_table import META as META
from globald.typed.columnar_table import ColumnarInvalid as ColumnarInvalid
from globald.typed.columnar_table import ColumnarTable as ColumnarTable
from globald.typed.columnar_table import Lookup as Lookup
from globald.typed.hashing import HASH, key_hashes, slot_table
from globald.typed.keys import decoded_keys, fingerprint, latest_rows, require_canonical

if TYPE_CHECKING:
    from globald.snapshot.reader import Snapshot

log = logging.getLogger(__name__)

PREFIX, SUFFIX = COLUMNAR_PREFIX, COLUMNAR_SUFFIX  # declared in store/names.py
DECODE_BATCH = 65_536
# Key and value bytes of one batch at most (issue 40 item 6): its payloads are held three times while it decodes (the
# records, their binary column, its Python list), and count alone lets 65,536 values of a MB each make GBs. 64 MiB
# is some 600,000 typical rows (100 bytes), so the count still cuts ordinary batches. What the values become as
# Python is bounded by ``BUILD_UNITS`` (``Decoder.decode``); the file is the same whatever the cuts.
DECODE_BATCH_BYTES = 64 << 20
ROW_BYTES = 48  # what a row costs in the file beyond its key and value: timestamp, hash, slots, offsets, error


class ColumnarUnbuildable(GlobaldError):
    """The values of a snapshot, decoded, make a table that Arrow's full validation refuses (offsets past their
    values and the like), which Spark could not read either: a globald defect for this schema, not a bad record.
    Report it with the table's schema file; the table's raw reads (``get``, a raw join) and ``get --decode`` are
    unaffected meanwhile."""


class ColumnarTooLarge(GlobaldError):
    """A snapshot too large for a columnar file of one record batch (over 2 GB of keys, or of one string column).
    Nothing to do: its readers decode per batch instead (``Decoder.decode`` on the values a multi-get found)."""


def columnar_path(snapshot_dir: Path, decoder: Decoder, key_decoder: Decoder | None = None) -> Path:
    return snapshot_dir / f"{PREFIX}{fingerprint(decoder, key_decoder)[:24]}{SUFFIX}"


def build_table(items: Iterable[tuple[bytes, bytes, int]], decoder: Decoder, about: dict[str, Any],
                key_decoder: Decoder | None = None, origins: OriginLookup | None = None) -> pa.Table:
    """The file's content from (key, value, timestamp) in key order. Decode errors are kept per row, never raised
    here: under on_error = "fail" it is the lookup of that key that fails, naming the partition and offset that
    ``origins`` gives for the row (``Snapshot.origins``). With a typed ``key_decoder`` the rows are
    indexed on the canonical form of the decoded key (``globald.typed.keys``): keys that do not decode are left
    out and counted (``key_errors``), and of keys decoding alike the latest is kept (``key_shadowed``)."""
    started = time.monotonic()
    typed_key = key_decoder is not None and key_decoder.typed
    if typed_key:
        assert key_decoder is not None
        require_canonical(key_decoder, str(about.get("table")))
    keys: list[pa.Array] = []
    hashes: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    values: list[pa.Array] = []
    errors: list[pa.Array] = []
    key_errors = 0
    pending: set[int] = set()  # writer ids from a registry not fetched yet: the file is redone once one can be had
    pending_count = 0
    where: dict[int, Origin] = {}  # row of the file (before typed keys are resolved) -> origin of its bad value
    rows_before = 0
    for batch in _batches(items):
        raw_keys = pa.array([k for k, _, _ in batch], pa.binary())
        stamp = np.fromiter((ts for _, _, ts in batch), np.int64, len(batch))
        raw_values = pa.array([v for _, v, _ in batch], pa.binary())
        rows: Any = None  # the batch's row of each row kept, where typed keys left some out
        if typed_key:
            assert key_decoder is not None
            raw_keys, rows = decoded_keys(raw_keys, key_decoder)
            if len(rows) < len(batch):  # keys that do not decode: no join column can ask for them
                key_errors += len(batch) - len(rows)
                stamp, raw_values = stamp[rows], raw_values.take(pa.array(rows))
        keys.append(raw_keys)
        hashes.append(key_hashes(keys[-1]))
        stamps.append(stamp)
        decoded = decoder.decode(raw_values, collect=True)
        values.append(decoded.values)
        errors.append(decoded.errors)
        pending.update(decoded.pending)
        pending_count += decoded.pending_count
        if decoded.error_count and origins is not None:
            bad = np.flatnonzero(decoded.errors.is_valid().to_numpy(zero_copy_only=False))
            at = bad if rows is None else np.asarray(rows)[bad]
            found = origins(*zip(*(batch[i] for i in at), strict=True))
            where.update((rows_before + int(r), o) for r, o in zip(bad, found, strict=True) if o is not None)
        rows_before += len(raw_values)
    try:
        key_column = pa.concat_arrays(keys) if keys else pa.array([], pa.binary())
        value_column = pa.concat_arrays(values) if values else pa.array([], decoder.arrow_type)
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as e:  # 32-bit offsets of a binary or string column
        raise ColumnarTooLarge(f"{about.get('table')} snapshot {about.get('snapshot')}: {e}") from None
    hash_column = np.concatenate(hashes) if hashes else np.empty(0, np.uint64)
    stamp_column = np.concatenate(stamps) if stamps else np.empty(0, np.int64)
    error = pa.concat_arrays(errors) if errors else pa.array([], ERROR_TYPE)
    origin = _origin_columns(where, len(error)) if len(error) - error.null_count else {}
    key_meta: dict[str, Any] = {}
    if typed_key:
        assert key_decoder is not None
        kept = latest_rows(key_column, hash_column, stamp_column)
        shadowed = 0 if kept is None else len(key_column) - len(kept)
        if kept is not None:
            take = pa.array(kept)
            key_column, value_column, error = key_column.take(take), value_column.take(take), error.take(take)
            origin = {name: column.take(take) for name, column in origin.items()}
            hash_column, stamp_column = hash_column[kept], stamp_column[kept]
        key_meta = {"key": key_decoder.where, "key_type": str(key_decoder.arrow_type), "key_errors": key_errors,
                    "key_shadowed": shadowed}
        if key_errors or shadowed:
            log.warning("%s snapshot %s: %d key(s) do not decode and are left out, %d shadowed by a later record "
                        "with the same decoded key", about.get("table"), about.get("snapshot"), key_errors, shadowed)
    slots, probes = slot_table(hash_column)
    meta = {**about, "fingerprint": fingerprint(decoder, key_decoder), "where": decoder.where, "hash": HASH,
            "probes": probes, "on_error": decoder.format.on_error, "rows": len(hash_column),
            "errors": len(error) - error.null_count, **key_meta, "decode_s": round(time.monotonic() - started, 3),
            **({"pending": pending_count, "pending_ids": sorted(pending)} if pending else {})}
    slot_type = pa.int32() if slots.dtype == np.int32 else pa.int64()
    table = pa.table({
        "key": key_column,
        "timestamp": pa.array(stamp_column),
        "value": value_column,
        "error": error,
        "hash": pa.array(hash_column),
        "slots": pa.FixedSizeListArray.from_arrays(pa.array(slots, slot_type), 2),
        **origin,
    }).replace_schema_metadata({META: json.dumps(meta)})
    # Before anyone maps it: a table Arrow refuses is a clear error here, not a batch Spark fails on far away.
    # Full validation costs about 2 ms for 65,536 customer rows against seconds to decode them.
    try:
        table.validate(full=True)
    except pa.ArrowInvalid as e:
        raise ColumnarUnbuildable(f"{about.get('table')} snapshot {about.get('snapshot')}: decoded by {decoder.where} "
                                  f"into an invalid Arrow table ({e})") from None
    return table


def _batches(items: Iterable[tuple[bytes, bytes, int]]) -> Iterator[list[tuple[bytes, bytes, int]]]:
    """``items`` in lists of ``DECODE_BATCH`` records, or fewer where their keys and values pass
    ``DECODE_BATCH_BYTES`` (a list holds at least one record, however large)."""
    batch: list[tuple[bytes, bytes, int]] = []
    size = 0
    for item in items:
        batch.append(item)
        size += len(item[0]) + len(item[1])
        if len(batch) == DECODE_BATCH or size >= DECODE_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _origin_columns(where: dict[int, Origin], rows: int) -> dict[str, pa.Array]:
    """The partition and offset of each row's bad value, null elsewhere: only in the file of a snapshot with decode
    errors, so a clean one costs nothing for them."""
    partition, offset = np.zeros(rows, np.int32), np.zeros(rows, np.int64)
    known = np.zeros(rows, bool)
    for row, (p, o) in where.items():
        partition[row], offset[row], known[row] = p, o, True
    return {ERROR_PARTITION: pa.array(partition, mask=~known), ERROR_OFFSET: pa.array(offset, mask=~known)}


def write_columnar(path: Path, table: pa.Table) -> None:
    """The file at ``path``, atomically: one record batch, so that every column maps as one array."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))
    replace_file(path, sink.getvalue().to_pybytes())


@contextlib.contextmanager
def _host_lock(directory: Path) -> Iterator[None]:
    """One decoder per snapshot directory on this host at a time: the others wait, then map its file."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _bounded(items: Iterable[tuple[bytes, bytes, int]], limit: int | None, about: dict[str, Any]
             ) -> Iterator[tuple[bytes, bytes, int]]:
    """``items``, raising ColumnarTooLarge once their keys and values (plus ``ROW_BYTES`` a row) pass ``limit``."""
    if limit is None:
        yield from items
        return
    used = 0
    for k, v, ts in items:
        used += len(k) + len(v) + ROW_BYTES
        if used > limit:
            raise ColumnarTooLarge(f"{about.get('table')} snapshot {about.get('snapshot')}: over the {limit >> 20} MB "
                                   "its reader allows for the file")
        yield k, v, ts


def mapped_or_built(path: Path, fp: str, build: Callable[[], pa.Table], what: str,
                    available: Callable[[list[int]], bool] | None = None) -> ColumnarTable:
    """The file at ``path`` (of fingerprint ``fp``), mapped; built by ``build`` and written first when there is
    none, or when the one there cannot be used (``ColumnarTable.open``, ``available`` included), under the host lock
    of its directory (one builder per host, the others then map it). A directory this user may not write (read-only,
    full or over quota) gets the table in this worker's memory, logged naming ``what``."""
    with contextlib.suppress(FileNotFoundError, ColumnarInvalid):
        return ColumnarTable.open(path, fp, available)
    try:
        with _host_lock(path.parent):
            try:
                return ColumnarTable.open(path, fp, available)  # another worker built it meanwhile
            except FileNotFoundError:
                pass
            except ColumnarInvalid as e:
                log.info("%s rebuilt: %s", what, e)
            write_columnar(path, build())
    except OSError as e:
        log.warning("cannot write %s (%s): building it in this worker's memory", what, e)
        return ColumnarTable(build())
    return ColumnarTable.open(path, fp)


def ensure_columnar(snapshot: Snapshot, decoder: Decoder, key_decoder: Decoder | None = None,
                    limit: int | None = None) -> ColumnarTable:
    """The snapshot decoded by ``decoder``, from its columnar file; decoded and written first when there is none.

    What the Spark side calls once per descriptor and worker; with a typed ``key_decoder`` the file is indexed on
    the decoded keys (``build_table``) and has a name of its own. A snapshot directory this user may not write (a
    reader that is not the daemon's user) is decoded into this process's memory instead, and logged. Raises
    ColumnarTooLarge for a snapshot that does not fit one file, or whose keys and values (``ROW_BYTES`` more a row)
    pass ``limit`` bytes when one is given and no file is there yet: the caller reads per batch."""
    directory = snapshot.table_dir / snapshot.id
    about = {"table": snapshot.manifest.table, "snapshot": snapshot.id,
             "offsets": {str(p): o for p, o in snapshot.offsets.items()}}

    def decoded() -> pa.Table:
        table = build_table(_bounded(snapshot, limit, about), decoder, about, key_decoder, snapshot.origins)
        log.info("decoded snapshot %s of %s: %d rows, %d decode errors, %.2fs", snapshot.id, about["table"],
                 table.num_rows, table.num_rows - table.column("error").null_count,
                 json.loads(table.schema.metadata[META.encode()])["decode_s"])
        return table

    return mapped_or_built(columnar_path(directory, decoder, key_decoder), fingerprint(decoder, key_decoder),
                           decoded, f"the columnar file of snapshot {snapshot.id}", decoder.available)
