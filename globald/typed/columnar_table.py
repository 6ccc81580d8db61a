"""The reader's side of a columnar file (``globald.typed.columnar`` builds it): the mapped file looked up in
vectorized form, and what a lookup answers. Kept apart from the builder so that each stays readable; the file's
layout and the lookup's contract are described in ``globald.typed.columnar``'s docstring."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.common.errors import GlobaldError
from globald.typed.arrow import ERROR_TYPE, DecodeFailure, RecordContext
from globald.typed.hashing import HASH, as_binary, key_hashes
from globald.typed.keys import canonical

META = "globald.columnar"
ERROR_PARTITION, ERROR_OFFSET = "error_partition", "error_offset"  # where a bad value came from (see build_table)


class ColumnarInvalid(GlobaldError):
    """A columnar file cannot be used (truncated, from another format, hashed differently). It is rebuilt from the
    snapshot; nothing to do unless it keeps happening (then check the disk)."""


@dataclass(frozen=True)
class Lookup:
    values: pa.Array  # the decoder's type; null where the key is absent, null, or its value did not decode
    timestamps: pa.Array  # int64, null where absent
    errors: pa.Array  # string: why the row's value did not decode
    found: int
    error_count: int  # looked-up keys whose value did not decode: the per-query count


# Queries left in a batch's probes (``ColumnarTable._probe``) at or below which the rest of their chains is read
# in one round.
_PROBE_TAIL = 64


class ColumnarTable:
    """A decoded snapshot, looked up in vectorized form; its columns are views of the mapped file."""

    def __init__(self, table: pa.Table, path: Path | None = None) -> None:
        self.path = path
        self.meta: dict[str, Any] = json.loads((table.schema.metadata or {}).get(META.encode(), b"{}"))
        single = table.combine_chunks()  # a one-batch file: no copy
        self.arrow = single  # every column, those of other layouts too (globald.spark.asof's older versions)
        self.keys = single.column("key").chunk(0) if single.num_rows else pa.array([], pa.binary())
        self.timestamps = _one(single, "timestamp")
        self.values = _one(single, "value")
        self.errors = _one(single, "error")
        names = single.schema.names
        self._origin = ((_one(single, ERROR_PARTITION), _one(single, ERROR_OFFSET))
                        if ERROR_PARTITION in names and ERROR_OFFSET in names else None)
        self._hash = np.asarray(_one(single, "hash").to_numpy(zero_copy_only=False), np.uint64)
        slots = _one(single, "slots")
        self._slots = np.asarray(slots.values.to_numpy(zero_copy_only=False) if len(slots) else np.empty(0, np.int32))
        self._probes = int(self.meta.get("probes", 0))
        self.fail = self.meta.get("on_error") == "fail"
        self.where = str(self.meta.get("where", "table"))
        self.typed_key = "key" in self.meta  # indexed on canonical decoded keys (globald.typed.keys)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def error_count(self) -> int:
        """Values of the snapshot that did not decode."""
        return len(self.errors) - self.errors.null_count

    @property
    def pending(self) -> int:
        """Values that did not decode because their writer schema was not fetched yet (a registry outage)."""
        return int(self.meta.get("pending", 0))

    @classmethod
    def open(cls, path: Path, fingerprint: str, available: Callable[[list[int]], bool] | None = None
             ) -> ColumnarTable:
        """Map ``path`` read-only. FileNotFoundError when absent; ColumnarInvalid when it cannot be used, or when
        ``available`` (``Decoder.available``) says a writer schema it was decoded without can now be had."""
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
            # Untrusted bytes: offsets past their buffers would make a take read out of bounds (full: every offset).
            table.validate(full=True)
            found = cls(table, path)
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException, ValueError, KeyError) as e:
            raise ColumnarInvalid(f"{path}: {e}") from None
        if found.meta.get("fingerprint") != fingerprint:
            raise ColumnarInvalid(f"{path} was decoded under another declaration")
        if found.meta.get("hash") != HASH or not np.array_equal(key_hashes(found.keys[:8]), found._hash[:8]):
            raise ColumnarInvalid(f"{path}: its keys were hashed by another function ({found.meta.get('hash')})")
        ids = found.meta.get("pending_ids")
        if ids and available is not None and available(list(ids)):
            raise ColumnarInvalid(f"{path} was decoded before writer schema(s) {ids} were fetched; they are now")
        return found

    def positions(self, keys: pa.Array) -> np.ndarray:
        """Each key's row, -1 where absent or null. Probing compares the 64-bit hashes only (numpy); the bytes of
        every candidate are then confirmed at once by Arrow."""
        pos = np.full(len(keys), -1, np.int64)
        if not len(self) or not len(keys):
            return pos
        keys = canonical(keys) if self.typed_key else as_binary(keys)
        wanted = key_hashes(keys)
        todo = np.flatnonzero(np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), bool))
        found_at, found_row = self._probe(wanted, todo, 0)
        pos[found_at] = found_row
        candidates = self.keys.take(pa.array(np.maximum(pos, 0), mask=pos < 0))
        same = np.asarray(pc.fill_null(pc.equal(keys, candidates), False).to_numpy(zero_copy_only=False), bool)
        for at in np.flatnonzero((pos >= 0) & ~same):  # two keys sharing a 64-bit hash: never seen, yet right
            pos[at] = self._probe_one(keys[int(at)].as_py(), int(wanted[at]))
        return pos

    def _probe(self, wanted: np.ndarray, todo: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """(query, row) of the first slot from ``start`` on whose row has the query's hash; an empty slot met
        first means absent. A slot a round while many queries are left (most end at their first slots); the few
        left then (``_PROBE_TAIL``) read the rest of their chains in one round. A round per step of the batch's
        longest chain cost each batch a dozen rounds of numpy calls whatever its size, which made small batches
        no faster than a dict (issue 44.3)."""
        size = np.uint64(len(self._slots))
        found_at: list[np.ndarray] = []
        found_row: list[np.ndarray] = []
        for step in range(start, self._probes):
            if len(todo) <= _PROBE_TAIL:
                if len(todo):
                    self._probe_tail(wanted, todo, step, found_at, found_row)
                break
            rows = self._slots[((wanted[todo] + np.uint64(step)) % size).astype(np.int64)].astype(np.int64)
            todo, rows = todo[rows >= 0], rows[rows >= 0]
            hit = self._hash[rows] == wanted[todo]
            found_at.append(todo[hit])
            found_row.append(rows[hit])
            todo = todo[~hit]
        if not found_at:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(found_at), np.concatenate(found_row)

    def _probe_tail(self, wanted: np.ndarray, todo: np.ndarray, step: int, found_at: list[np.ndarray],
                    found_row: list[np.ndarray]) -> None:
        """``_probe`` from ``step`` to the end of the chains, for a few queries (``todo``): every slot left of each,
        in one round; appends what it found."""
        hashes = wanted[todo]
        at = (hashes[:, None] + np.arange(step, self._probes, dtype=np.uint64)) % np.uint64(len(self._slots))
        rows = self._slots[at.astype(np.int64)].astype(np.int64)
        empty = rows < 0
        hit = ~empty & (self._hash[np.maximum(rows, 0)] == hashes[:, None])
        ended = empty | hit
        first = ended.argmax(axis=1)  # the slot that ends each query's probe (0 when none does: absent)
        line = np.arange(len(todo))
        found = hit[line, first]  # ended by its hash, not by an empty slot
        found_at.append(todo[found])
        found_row.append(rows[line, first][found])

    def _probe_one(self, key: bytes, h: int) -> int:
        size = len(self._slots)
        for step in range(self._probes):
            row = int(self._slots[(h + step) % size])
            if row < 0:
                return -1
            if int(self._hash[row]) == h and self.keys[row].as_py() == key:
                return row
        return -1

    def lookup(self, keys: pa.Array, context: RecordContext | None = None) -> Lookup:
        """The rows of ``keys`` (binary or string; a typed-key table also integers, by their decimal text). Under
        on_error = "fail", a looked-up value that did not decode raises DecodeFailure naming its key (a typed key by
        its decoded form) and the partition and offset its store recorded for it."""
        pos = self.positions(keys)
        missing = pos < 0
        take = pa.array(np.where(missing, 0, pos), mask=missing)
        errors = self.errors.take(take) if len(self) else pa.nulls(len(keys), ERROR_TYPE)
        error_count = len(errors) - errors.null_count
        if error_count and self.fail:
            row = int(np.flatnonzero(errors.is_valid().to_numpy(zero_copy_only=False))[0])
            at = int(pos[row])
            key = self.keys[at].as_py()
            if self._origin is not None:
                partition, offset = (column[at].as_py() for column in self._origin)
            else:
                _, partition, offset = (context or RecordContext()).at(row)
            raise DecodeFailure(self.where, key, partition, offset, errors[row].as_py())
        if not len(self):
            return Lookup(pa.nulls(len(keys), self.values.type), pa.nulls(len(keys), pa.int64()), errors, 0, 0)
        return Lookup(self.values.take(take), self.timestamps.take(take), errors, int((~missing).sum()), error_count)


def _one(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.chunk(0) if column.num_chunks else pa.array([], column.type)
