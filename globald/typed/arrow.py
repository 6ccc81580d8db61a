"""Decoding a column of stored values into one Arrow column, vectorized over the batch.

Contract: ``Decoder.decode(values)`` turns a binary array into an array of the decoder's ``arrow_type`` (a struct
for json, avro and protobuf; binary, untouched, for raw) of the same length, row for row. A null stays null. A value
that does not decode becomes null with its reason in ``errors`` and is counted, under ``on_error = "null"``; under
``"fail"`` the batch raises ``DecodeFailure`` naming the key, partition, offset (where the caller knows them) and
reason of its first bad value. No value ever crashes the decoder: every library error is a reason.

Each format (``avro``, ``protobuf``, ``jsonfmt``) supplies the Arrow type its schema maps to and a function from one
payload to the Python value Arrow builds that type from (``OneValue``); ``pa.array`` calls then build the column in
C, one for the whole batch unless its Python would pass ``BUILD_UNITS``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from globald.common.errors import GlobaldError
from globald.settings.typed_spec import ValueFormat

ERROR_TYPE = pa.string()
# How much of a batch ``Decoder.decode`` holds as Python at once (issue 40 item 6), in payload bytes plus array items
# and map entries: every decoded value stays a Python object until ``pa.array`` builds the column, and one byte or
# one item may become some 64 bytes of Python (an empty dict; an Avro item of no bytes is one). A batch counted in
# values only (65,536) could so hold GBs of values each within max_items (1M items: some 60 MB of Python); at 1 Mi
# the Python of a batch stays near 64 MiB whatever its values, and a value at max_items is built on its own. Each
# build is C over a few thousand rows at least, so splitting costs nothing measurable.
BUILD_UNITS = 1 << 20


class DecodeError(ValueError):
    """One value does not decode; its text is the reason reported for it."""


class PendingSchema(DecodeError):
    """A value's writer schema id is not fetched yet (the Schema Registry is unreachable): the value is decoded once
    the registry answers (``globald.typed.registry``). Not a bad record: bring the registry back, or check
    [registry]."""

    def __init__(self, schema_id: int, why: str) -> None:
        super().__init__(f"schema {schema_id} not yet fetched ({why})")
        self.schema_id = schema_id


class DecodeFailure(GlobaldError):
    """A value does not decode and its table says ``on_error = "fail"``. The message names the key, partition,
    offset (where known) and why: fix that record (produce a corrected value, or a tombstone), or the schema files,
    or set ``on_error = "null"`` to read it as null and count it instead."""

    def __init__(self, where: str, key: bytes | None, partition: int | None, offset: int | None, reason: str) -> None:
        self.key, self.partition, self.offset, self.reason = key, partition, offset, reason
        shown = key.decode("utf-8", "backslashreplace") if key is not None else "unknown"
        super().__init__(f"{where}: value of key {shown!r} (partition "
                         f"{'unknown' if partition is None else partition}, offset "
                         f"{'unknown' if offset is None else offset}) does not decode: {reason}")


# One payload decoded: (the Python value Arrow builds the column from, its array items and map entries where they may
# outnumber the payload's bytes (Avro's items of no bytes), else 0: with the payload's size, what it may weigh).
OneValue = Callable[[bytes], tuple[Any, int]]
Origin = tuple[int, int]  # (partition, offset) of the record a value came from
# Origins of rows given as (keys, values, timestamps), as a snapshot recorded them (``Snapshot.origins``).
OriginLookup = Callable[[Sequence[bytes], Sequence[bytes], Sequence[int]], list[Origin | None]]


@dataclass(frozen=True)
class RecordContext:
    """Where the values of a batch come from, row for row, for DecodeFailure: given as sequences, or asked of
    ``origin`` (a typed table's store records each value's, see ``StoreReader.origins``) for the failing row
    only; None where not known (a value written before its table was typed)."""

    keys: Sequence[bytes | None] | None = None
    partitions: Sequence[int | None] | None = None
    offsets: Sequence[int | None] | None = None
    origin: Callable[[int], Origin | None] | None = None

    def at(self, row: int) -> tuple[bytes | None, int | None, int | None]:
        def pick(seq: Sequence[Any] | None) -> Any:
            return None if seq is None else seq[row]

        key = pick(self.keys)
        if self.partitions is None and self.origin is not None:
            found = self.origin(row)
            return (key, None, None) if found is None else (key, *found)
        return key, pick(self.partitions), pick(self.offsets)


@dataclass(frozen=True)
class Decoded:
    values: pa.Array  # the decoder's arrow_type
    errors: pa.Array  # string: why the row's value did not decode; null where it did (or was null)
    error_count: int
    pending: tuple[int, ...] = ()  # writer schema ids not fetched yet (PendingSchema), sorted
    pending_count: int = 0  # of the errors, values waiting for one of them


class Decoder:
    """A table's values (or keys) decoder, built by ``globald.typed.load`` from its declared format."""

    def __init__(self, fmt: ValueFormat, where: str, arrow_type: pa.DataType,
                 one: OneValue | None, fingerprint: str,
                 available: Callable[[list[int]], bool] | None = None, reader_id: int | None = None) -> None:
        self.format = fmt
        self.where = where  # the config section, "tables[0].value", for messages
        self.arrow_type = arrow_type
        self._one = one  # None: raw, the stored bytes are the value
        self.fingerprint = fingerprint
        # Writer ids from a registry: whether any of the ids a columnar file was decoded without can be had now.
        self.available = available
        self.reader_id = reader_id  # a reader schema from a registry subject: its schema id

    @property
    def typed(self) -> bool:
        return self._one is not None

    def decode_value(self, value: bytes) -> Any:
        """One value as Python (what Arrow builds the column from); DecodeError says why it does not decode."""
        return self._weighed(value)[0]

    def _weighed(self, value: bytes) -> tuple[Any, int]:
        """(``decode_value``, its weight in ``BUILD_UNITS``: payload bytes plus the items they may amplify to)."""
        if self._one is None:
            return value, len(value)
        try:
            row, items = self._one(value)
            return row, len(value) + items
        except DecodeError:
            raise
        except Exception as e:  # a decoding library meeting bytes it cannot read: a reason, never a crash
            raise DecodeError(f"{type(e).__name__}: {e}") from None

    def decode(self, values: pa.Array, context: RecordContext | None = None, *, collect: bool = False) -> Decoded:
        """``collect``: keep every error per row even under on_error = "fail" (the caller raises when a failing
        row is read: the columnar file of a whole snapshot)."""
        if self._one is None:
            return Decoded(values.cast(pa.binary()), pa.nulls(len(values), ERROR_TYPE), 0)
        rows: list[Any] = []
        reasons: list[str | None] = []  # of the rows of ``rows``: the build to come
        pending: dict[int, int] = {}
        built: list[pa.Array] = []  # the batch's columns so far, each of at most BUILD_UNITS of Python
        built_reasons: list[str | None] = []
        units = 0
        row: Any = None
        for value in values.to_pylist():
            try:
                row, weight = (None, 0) if value is None else self._weighed(value)
                rows.append(row)
                reasons.append(None)
                units += weight
            except DecodeError as e:
                rows.append(None)
                reasons.append(str(e) or "undecodable")
                if isinstance(e, PendingSchema):
                    pending[e.schema_id] = pending.get(e.schema_id, 0) + 1
            if units >= BUILD_UNITS:
                built.append(self._to_arrow(rows, reasons))
                built_reasons += reasons
                rows, reasons, row, units = [], [], None, 0  # row too: its Python goes now, not a value later
        built.append(self._to_arrow(rows, reasons))
        reasons = built_reasons + reasons
        column = built[0] if len(built) == 1 else pa.concat_arrays(built)
        bad = [i for i, r in enumerate(reasons) if r is not None]
        if bad and self.format.on_error == "fail" and not collect:
            raise DecodeFailure(self.where, *(context or RecordContext()).at(bad[0]), reasons[bad[0]] or "")
        return Decoded(column, pa.array(reasons, ERROR_TYPE), len(bad), tuple(sorted(pending)),
                       sum(pending.values()))

    def _to_arrow(self, rows: list[Any], reasons: list[str | None]) -> pa.Array:
        """One C-level build; should a value not fit its Arrow type (an int64 into int32, a decimal wider than
        its precision), only that row becomes an error, found by building row by row."""
        try:
            return pa.array(rows, self.arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        for i, row in enumerate(rows):
            try:
                pa.array([row], self.arrow_type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                rows[i] = None
                reasons[i] = f"does not fit the schema's type: {e}"
        return pa.array(rows, self.arrow_type)


def jsonable(value: Any) -> Any:
    """A decoded value (Arrow's Python form, maps as dicts) as JSON writes it: timestamps and dates in ISO 8601,
    decimals as strings (exact), bytes as base64; what ``get --decode`` and ``dump --decode`` print."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, bytes) else base64.b64encode(k).decode(): jsonable(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def python_rows(column: pa.Array) -> list[Any]:
    """The column's rows as Python, maps as dicts (the shape JSON and a reference decoder give)."""
    return list(column.to_pylist(maps_as_pydicts="lossy"))


def flatten(values: pa.StructArray, prefix: str) -> dict[str, pa.Array]:
    """A struct column's fields as top-level columns named ``prefix + field``, null where the struct is null: what
    a flattened join adds."""
    return {prefix + values.type.field(i).name: child for i, child in enumerate(values.flatten())}
