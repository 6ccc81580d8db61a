"""What a typed join adds to a batch, in one call, for the Spark side (``globald.spark``) to wire in.

Per descriptor and worker: ``open_typed(snapshot, decoder)`` (the snapshot's columnar file, decoded once per
host). Per Arrow batch: ``typed_columns(table.lookup(keys), ...)``, the columns to append. For the output schema:
``spark_type(decoder)``. A table whose snapshot cannot be held in a file decodes per batch instead:
``decoder.decode(values)`` on the values a multi-get found, then ``columns_of`` on the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from globald.typed.arrow import Decoder, flatten
from globald.typed.columnar import ColumnarTable, Lookup, ensure_columnar
from globald.typed.conform import conform

if TYPE_CHECKING:
    from globald.snapshot.reader import Snapshot


def open_typed(snapshot: Snapshot, decoder: Decoder, key_decoder: Decoder | None = None) -> ColumnarTable:
    """The snapshot decoded by ``decoder``: its columnar file, written first by whichever worker comes first. With
    a typed ``key_decoder`` it is indexed on the decoded keys (``globald.typed.keys``): the join column is then
    matched by its canonical form (strings by UTF-8, integers by decimal text)."""
    return ensure_columnar(snapshot, decoder, key_decoder)


def columns_of(values: pa.Array, errors: pa.Array, value_col: str, *, flatten_prefix: str | None = None,
               error_col: str | None = None) -> dict[str, pa.Array]:
    """``value_col`` as one struct column, or with ``flatten_prefix`` its fields at top level named prefix + field;
    ``error_col`` (when named) holds why a value is null although its key is there."""
    if flatten_prefix is not None and pa.types.is_struct(values.type):
        out = flatten(values, flatten_prefix)
    else:
        out = {value_col: values}
    if error_col is not None:
        out[error_col] = errors
    return out


def typed_columns(found: Lookup, value_col: str, *, timestamp_col: str | None = None,
                  flatten_prefix: str | None = None, error_col: str | None = None) -> dict[str, pa.Array]:
    """The columns a typed join appends to a batch, from ``ColumnarTable.lookup``; ``found.error_count`` is the
    batch's share of the per-query decode-error count."""
    out = columns_of(found.values, found.errors, value_col, flatten_prefix=flatten_prefix, error_col=error_col)
    if timestamp_col is not None:
        out[timestamp_col] = found.timestamps
    return out


def cast_for_spark(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as the Arrow type Spark expects (list items named ``element``, timestamps in microseconds, and the
    like), valid for every type a schema maps to: ``globald.typed.conform`` says why not ``Array.cast``."""
    return conform(array, target)


def spark_type(decoder: Decoder) -> Any:
    """The Spark type of the value column (pyspark's own Arrow mapping)."""
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(decoder.arrow_type)
