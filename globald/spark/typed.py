"""Typed tables in Spark (issue 24): ``view.join`` and ``view.udf`` of a table whose ``[tables.value]`` declares a
format hand out the decoded value as a struct column of the schema's Spark type, not bytes.

Contract, on classic and Spark Connect sessions alike:
- ``join(df, on)`` adds ``value_col`` (a struct, null where the key is absent or its value did not decode) and
  ``timestamp_col``; ``flatten=True`` puts the struct's fields at top level instead, named ``value_col + "_" +
  field`` (or ``flatten="prefix_"``: that prefix); ``error_col`` (when named) says why a value did not decode.
- The decode errors a join's rows met are counted per query on the driver (``view.decode_errors.value``), through
  a hidden column the join's ``DataFrame.observe`` adds up, as fallbacks are (``globald.spark.session``).
- ``udf()`` is an Arrow UDF (pandas UDFs cannot return nested structs): key column ->
  struct<value: the schema's struct, timestamp: bigint, error: string>.
- Small-table mode gives the same rows: the shipped content is decoded once per Python worker into the same
  lookup structure (``small_join="spark"`` has no typed form: a typed view always joins through the index).
- A typed key (``[tables.key]``): the join column is matched against the decoded keys by canonical form
  (``globald.typed.keys``: strings by UTF-8, integers by decimal text); a record key is refused before any job.
  As-of lookups too: the row's decoded key is translated to the stored keys it stands for, and their versions
  merged (``globald.spark.asof_keys``).
- ``on_error = "fail"``: a looked-up value that does not decode fails the task with ``DecodeFailure`` naming the
  key and the reason (partition and offset "unknown": a snapshot keeps neither per key).

Executors decode once per host: every worker maps the snapshot's columnar file (``globald.typed.join``); a
snapshot too large for one decodes the values each batch's multi-get found. Each executor loads the decoders from
its own host's config; the driver's decoder fingerprint travels with the function, and an executor whose
declaration differs fails its task naming its config rather than decoding otherwise.

Decoders are cached per process (driver and every reused Python worker) under the fingerprint of their declaration
(format, schema files, the registry subject's pinned version), never under the table's name alone: each
``refresh()`` loads the declaration in force and carries its fingerprint in the descriptor (``decoder``), so a job
decodes with the schema of the version it reads, and a long-lived application follows a changed schema at its next
refresh, in the driver and in workers alike. The descriptor also names a registry subject's reader schema id
(``reader_ids``): a worker starting after the daemon took a newer version still builds the job's own.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from globald.common.errors import GlobaldError
from globald.settings.config import load
from globald.spark import asof, executor, versions
from globald.spark.asof_keys import TypedAsOf
from globald.spark.batch import binary_keys
from globald.spark.executor import MODE_BROADCAST, Settings, SnapshotHandle, _open
from globald.spark.host import config_path
from globald.spark.session import FALLBACK_COL, Fallbacks, functions, is_connect
from globald.spark.small import content_origins
from globald.typed import load_table
from globald.typed.arrow import Decoder, Origin, RecordContext
from globald.typed.columnar import ColumnarTable, ColumnarTooLarge, Lookup, build_table
from globald.typed.join import cast_for_spark, open_typed, spark_type, typed_columns
from globald.typed.keys import canonical, require_canonical
from globald.typed.keys import fingerprint as file_fingerprint

ERRORS_COL = "__globald_decode_errors"  # hidden: a batch's decode errors, on its first row


class TypedDeclarationError(GlobaldError):
    """An executor's config declares the table's value format otherwise than the driver's (another schema file,
    another format): give every host the same ``[tables.value]`` section and schema files."""


DECODERS_KEPT = 16
DESCRIPTOR_KEY = "decoder"  # the descriptor's field: the fingerprint of the declaration the view was refreshed with
READERS_KEY = "reader_ids"  # and the registry reader schemas ({"value": id}) of that declaration
_DECODERS: OrderedDict[tuple[str, str, str], tuple[Decoder, Decoder]] = OrderedDict()
_DECODERS_LOCK = threading.Lock()


def current(path: str, table: str, reader_ids: dict[str, int] | None = None) -> tuple[Decoder, Decoder]:
    """(key decoder, value decoder) of ``table`` as the config at ``path`` declares it now (the config and every
    schema file read again), kept under its fingerprint: the same declaration keeps its decoders (and the writer
    schemas they fetched). ``reader_ids``: a registry subject's reader schema by id, as a descriptor names it (a
    daemon that took a newer version meanwhile does not change what a job of the older one reads)."""
    key_dec, val_dec = load_table(load(path), table, reader_ids)
    fp = file_fingerprint(val_dec, key_dec)
    with _DECODERS_LOCK:
        found = _DECODERS.get((path, table, fp))
        if found is None:
            found = _DECODERS[(path, table, fp)] = (key_dec, val_dec)
            while len(_DECODERS) > DECODERS_KEPT:
                _DECODERS.popitem(last=False)
        _DECODERS.move_to_end((path, table, fp))
        return found


def decoders(path: str, table: str, fingerprint: str | None = None,
             reader_ids: dict[str, int] | None = None) -> tuple[Decoder, Decoder]:
    """(key decoder, value decoder) of ``table`` in the config at ``path`` whose declaration has ``fingerprint``
    (the descriptor's, with its ``reader_ids``), loaded once per process and fingerprint; without one, the
    declaration in force now. TypedDeclarationError when this host declares the table otherwise."""
    if fingerprint is not None:
        with _DECODERS_LOCK:
            found = _DECODERS.get((path, table, fingerprint))
        if found is not None:
            return found
    found = current(path, table, reader_ids)
    if fingerprint is not None and file_fingerprint(found[1], found[0]) != fingerprint:
        raise TypedDeclarationError(
            f"config {path}: table {table} declares its value or key format otherwise than the version this job "
            "reads was refreshed with (another schema file, format or registry subject version on this host, or a "
            "schema changed since the refresh): give every host the same [tables.value] section and schema files, "
            "and refresh the view")
    return found


def of_view(view: Any) -> tuple[Decoder, Decoder]:
    """The decoders of the view's current descriptor (refreshing first if it has none)."""
    view._current()
    desc = view.descriptor or {}
    return decoders(view.config_path, view.table.name, desc.get(DESCRIPTOR_KEY), desc.get(READERS_KEY))


def declaration(config_path: str, table: str) -> dict[str, Any]:
    """What ``refresh()`` puts in the descriptor: the fingerprint of ``table``'s declaration in force now and the
    registry reader schemas it reads with."""
    key_dec, val_dec = current(config_path, table)
    ids = {name: d.reader_id for name, d in (("key", key_dec), ("value", val_dec)) if d.reader_id is not None}
    return {DESCRIPTOR_KEY: file_fingerprint(val_dec, key_dec), **({READERS_KEY: ids} if ids else {})}


def is_typed(view: Any) -> bool:
    """Whether the view's table declares a value or a key format other than raw."""
    return bool(view.table.typed)


def counter(view: Any) -> Fallbacks:
    """The view's per-query decode-error count (a view copied by pickling starts again from 0)."""
    got = view.__dict__.get("_decode_errors")
    if got is None:
        got = view.__dict__["_decode_errors"] = Fallbacks()
    return got


@dataclass(frozen=True)
class Shape:
    """What a typed lookup appends, shipped with the function."""

    fingerprint: str  # the driver's decoders (value, and a typed key): every executor must decode alike
    value_col: str
    timestamp_col: str | None
    flatten_prefix: str | None
    error_col: str | None
    as_of: str | None = None  # the time column of an as-of join (globald.spark.asof)


class TypedHandle:
    """One worker's decoded table for one descriptor: the snapshot's columnar file (snapshot mode), or the shipped
    content decoded in memory (small-table mode); a snapshot too large for a file is decoded per batch."""

    def __init__(self, settings: Settings, desc: dict[str, Any], data: Any, fingerprint: str,
                 as_of: bool = False) -> None:
        path, source = config_path(settings.config_path)
        try:
            self.key_decoder, self.decoder = decoders(path, settings.table, fingerprint, desc.get(READERS_KEY))
        except TypedDeclarationError as e:
            raise TypedDeclarationError(f"{e} (this host's config: {source}; the driver's: "
                                        f"{settings.config_path})") from None
        self.raw: SnapshotHandle | None = None
        self.table: ColumnarTable | None = None
        self.snapshot: str | None = desc.get("snapshot")
        self.exact, self.note = True, None
        self.as_of: asof.AsOfHandle | None = None
        self.as_of_keys: TypedAsOf | None = None  # a typed key: the join column's decoded keys -> stored bytes
        if as_of:  # the versions' raw values, decoded per batch (data: the shipped versions in small-table mode)
            self.as_of = asof.opener(settings, desc, data)
            self.snapshot, self.exact, self.note = self.as_of.snapshot, self.as_of.exact, self.as_of.note
            if self.key_decoder.typed:
                try:
                    self.as_of_keys = TypedAsOf(self.as_of, self.key_decoder, settings.table)
                except BaseException:
                    self.as_of.close()
                    raise
            return
        if desc.get("mode") == MODE_BROADCAST:
            content: pa.Table = data.value
            items = zip(*(content.column(c).to_pylist() for c in ("key", "value", "timestamp")), strict=True)
            about = {"table": settings.table, "snapshot": self.snapshot}
            self.table = ColumnarTable(build_table(items, self.decoder, about, self.key_decoder,
                                                   content_origins(content)))
            return
        raw = _open(dataclasses.replace(settings, memory_index_mb=0), desc, data)  # keeps the snapshot open
        assert isinstance(raw, SnapshotHandle) and raw.snap is not None
        self.raw, self.snapshot, self.exact, self.note = raw, raw.snapshot, raw.exact, raw.note
        try:
            self.table = open_typed(raw.snap, self.decoder, self.key_decoder)
        except ColumnarTooLarge as e:
            if self.key_decoder.typed:  # the store is keyed by the raw bytes: a decoded key has no multi-get
                raise ColumnarTooLarge(f"{e}; table {settings.table} declares a typed key, which only the "
                                       "columnar file can look up: declare the key raw to join it") from None
            self.table = None  # decoded per batch, from the multi-get's values

    def lookup(self, column: pa.Array | pa.ChunkedArray) -> Lookup:
        """Decoded value, timestamp and error of each key of ``column`` (binary or string; a typed key also
        integers, matched by canonical form); DecodeFailure under on_error = "fail"."""
        keys = canonical(column) if self.key_decoder.typed else binary_keys(column)
        if self.table is not None:
            return self.table.lookup(keys)
        assert self.raw is not None
        value, ts = self.raw.columns(keys)
        snap = self.raw.snap
        assert snap is not None

        def origin(row: int, key_list: list[Any]) -> Origin | None:  # asked for the failing row only
            return snap.origins([key_list[row]], [value[row].as_py()], [ts[row].as_py()])[0]

        return self._decode(keys, value, ts, origin)

    def _decode(self, keys: pa.Array, value: pa.Array, ts: pa.Array,
                origin: Callable[[int, list[Any]], Origin | None] | None) -> Lookup:
        """The raw values a batch found, decoded."""
        key_list = keys.to_pylist()
        def where(row: int) -> Origin | None:
            return None if origin is None else origin(row, key_list)

        decoded = self.decoder.decode(value, RecordContext(keys=key_list, origin=where))
        return Lookup(decoded.values, ts, decoded.errors, len(value) - value.null_count, decoded.error_count)

    def lookup_at(self, column: pa.Array | pa.ChunkedArray, times: pa.Array | pa.ChunkedArray) -> Lookup:
        """``lookup`` as of each row's time (``globald.spark.asof``; a typed key by its decoded form,
        ``globald.spark.asof_keys``): a row with no answer (a time before the history's ``since``) has its reason in
        the errors, not counted as a decode error."""
        assert self.as_of is not None
        if self.as_of_keys is not None:  # matched by decoded key, as lookup matches it (globald.spark.asof_keys)
            keys = canonical(column)
            value, ts, reason = self.as_of_keys.at(keys, times)
        else:
            keys = binary_keys(column)
            value, ts, reason = self.as_of.at(keys, times)
        found = self._decode(keys, value, ts, None)
        return dataclasses.replace(found, errors=pc.coalesce(found.errors, reason.cast(found.errors.type)))

    def columns(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(decoded value, timestamp) of each key: ``lookup`` without the errors."""
        found = self.lookup(keys)
        return found.values, found.timestamps

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()
        if self.as_of is not None:
            self.as_of.close()


def handle(settings: Settings, desc: dict[str, Any], data: Any, fingerprint: str,
           as_of: bool = False) -> TypedHandle:
    """This worker's typed handle for ``desc``, opened again only when the descriptor changed (its declaration's
    fingerprint included: the handle decoded under the previous schema is closed, its snapshot released);
    ``as_of``: the one that answers as of a time."""
    h = executor.handle(settings, desc, data, opener=partial(TypedHandle, fingerprint=fingerprint, as_of=as_of),
                        key=(settings, "typed", as_of))
    assert isinstance(h, TypedHandle)
    return h


def _value_fields(decoder: Decoder, shape: Shape) -> list[Any]:
    """The Spark fields the value becomes: one struct, or its fields at top level."""
    from pyspark.sql.types import StructField, StructType

    kind = spark_type(decoder)
    if shape.flatten_prefix is not None and isinstance(kind, StructType):
        return [StructField(shape.flatten_prefix + f.name, f.dataType, True) for f in kind.fields]
    return [StructField(shape.value_col, kind, True)]


def _arrow_of(field: Any) -> pa.DataType:
    """The Arrow type Spark expects for ``field``, its timestamps as UTC instants (how the JVM reads them).

    PySpark 4.0 spells that ``timestamp_utc=True`` (its default), later releases ``timezone="UTC"`` (their default,
    None, makes naive timestamps), so the keyword follows the installed function's own signature."""
    from pyspark.sql.pandas.types import to_arrow_type

    utc: dict[str, Any] = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_type).parameters else {}
    return to_arrow_type(field.dataType, **utc)


def arrow_fn(settings: Settings, desc_bc: Any, data_bc: Any, on: str, shape: Shape, snapshot_col: str | None,
             count_fallbacks: bool, targets: dict[str, pa.DataType]) -> Callable[[Iterator[pa.RecordBatch]],
                                                                              Iterator[pa.RecordBatch]]:
    """For ``df.mapInArrow``: each batch with the typed columns appended (cast to the Arrow types Spark expects),
    the hidden decode-error count and (``count_fallbacks``) the hidden fallback flag."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        h = handle(settings, desc_bc.value, data_bc, shape.fingerprint, shape.as_of is not None)
        unreported = not h.exact
        for batch in batches:
            found = (h.lookup(batch.column(on)) if shape.as_of is None
                     else h.lookup_at(batch.column(on), batch.column(shape.as_of)))
            added = typed_columns(found, shape.value_col, timestamp_col=shape.timestamp_col,
                                  flatten_prefix=shape.flatten_prefix, error_col=shape.error_col)
            # In the declared order (Spark reads the columns by position), as the types Spark expects.
            arrays = [*batch.columns, *(cast_for_spark(added[n], t) for n, t in targets.items() if n in added)]
            names = [*batch.schema.names, *(n for n in targets if n in added)]
            if snapshot_col is not None:
                arrays.append(pa.repeat(pa.scalar(h.snapshot, pa.string()), batch.num_rows))
                names.append(snapshot_col)
            flags = np.zeros((2, batch.num_rows), np.int64)
            if batch.num_rows:
                flags[0, 0] = found.error_count
                if unreported:
                    flags[1, 0], unreported = 1, False
            arrays.append(pa.array(flags[0]))
            names.append(ERRORS_COL)
            if count_fallbacks:
                arrays.append(pa.array(flags[1]))
                names.append(FALLBACK_COL)
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run


def join(view: Any, df: Any, on: str, value_col: str, timestamp_col: str, snapshot_col: str | None,
         flatten: bool | str, error_col: str | None, as_of: str | None = None) -> Any:
    """``view.join`` of a typed table (see the module's contract)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    key_dec, val_dec = of_view(view)
    require_canonical(key_dec, view.table.name)
    prefix = (value_col + "_" if flatten is True else flatten) or None
    shape = Shape(file_fingerprint(val_dec, key_dec), value_col, timestamp_col, prefix, error_col, as_of)
    fields = _value_fields(val_dec, shape)
    fields.append(StructField(timestamp_col, LongType(), True))
    if error_col is not None:
        fields.append(StructField(error_col, StringType(), True))
    if snapshot_col is not None:
        fields.append(StructField(snapshot_col, StringType(), True))
    names = [f.name for f in fields]
    clash = [n for n in names if n in df.columns]
    if clash or len(set(names)) != len(names):
        raise ValueError(f"join: output columns {names} clash with each other or with {df.columns}")
    targets = {f.name: _arrow_of(f) for f in fields}
    desc_bc, data_bc = view._broadcasts(as_of is not None)
    count = view.mode != MODE_BROADCAST
    fn = arrow_fn(view.settings, desc_bc, data_bc, on, shape, snapshot_col, count, targets)
    hidden = [StructField(ERRORS_COL, LongType(), False)]
    if count:
        hidden.append(StructField(FALLBACK_COL, LongType(), False))
    out = df.mapInArrow(fn, StructType([*df.schema.fields, *fields, *hidden]))
    spark = df.sparkSession
    if count:
        out = view.fallbacks.watch(out, spark)
    # The one observation mechanism, counting the errors column under the name it adds up.
    return counter(view).watch(out.withColumnRenamed(ERRORS_COL, FALLBACK_COL), spark)


def udf(view: Any, as_of: bool = False) -> Any:
    """``view.udf()`` of a typed table: an Arrow UDF, key -> struct<value, timestamp, error>; ``as_of``: of
    (key, time), as of that time (``globald.spark.asof``)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    key_dec, val_dec = of_view(view)
    require_canonical(key_dec, view.table.name)
    versions.require(versions.ARROW_UDF, "view.udf() of a typed table (an Arrow UDF)",
                     "view.join(df, key_column) reads the same values on this PySpark")
    shape = Shape(file_fingerprint(val_dec, key_dec), "value", None, None, None)
    kind = StructType([*_value_fields(val_dec, shape), StructField("timestamp", LongType(), True),
                       StructField("error", StringType(), True)])
    target = _arrow_of(StructField("r", kind))
    settings, (desc_bc, data_bc) = view.settings, view._broadcasts(as_of)
    errors = counter(view)
    if errors.accumulator is None and not is_connect(view.spark):
        errors.accumulator = view.spark.sparkContext.accumulator(0)
    # A column function has no DataFrame to observe: on a classic session its errors go to an accumulator (a retried
    # task adds again, as Spark's accumulators do in transformations); Connect has none, so its UDF counts nothing.
    acc = errors.accumulator

    def answer(found: Lookup) -> pa.Array:
        if acc is not None and found.error_count:
            acc.add(found.error_count)
        return cast_for_spark(pa.StructArray.from_arrays([found.values, found.timestamps, found.errors],
                                                         names=["value", "timestamp", "error"]), target)

    # Spark picks the Arrow UDF's kind from these type hints: every parameter a pa.Array.
    def run(keys: pa.Array) -> pa.Array:
        return answer(handle(settings, desc_bc.value, data_bc, shape.fingerprint).lookup(keys))

    def run_at(keys: pa.Array, times: pa.Array) -> pa.Array:
        return answer(handle(settings, desc_bc.value, data_bc, shape.fingerprint, True).lookup_at(keys, times))

    F = functions(view.spark)
    return F.arrow_udf(run_at if as_of else run, kind)

