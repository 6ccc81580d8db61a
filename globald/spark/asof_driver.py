"""The driver side of as-of lookups (issue 45): the checks ``view.join(df, on, as_of=...)`` and
``view.udf(as_of=...)`` make before any job, and the as-of UDF. The executor side is ``globald.spark.asof``.

A table that declares no ``history``, or whose history the descriptor's snapshot refuses (records without
timestamps, a store not yet rebuilt with history), raises AsOfRefusedError at the call, on the driver. The
snapshot is looked at when the driver's host has a sidecar; without one, the executors say it in the task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from globald.spark import executor, typed, versions
from globald.spark.asof import AsOfHandle, AsOfRefusedError, opener, refusal
from globald.spark.batch import binary_keys
from globald.spark.executor import Settings
from globald.spark.session import functions


def handle(settings: Settings, desc: dict[str, Any], data: Any) -> AsOfHandle:
    """A worker's as-of handle for ``desc``, cached as the other handles are, opened again only when the
    descriptor changed."""
    h = executor.handle(settings, desc, data, opener=opener, key=handle_key(settings))
    assert isinstance(h, AsOfHandle)
    return h


def handle_key(settings: Settings) -> Any:
    """Where a worker keeps a view's as-of handle (beside its latest-value one, under the view's settings)."""
    return (settings, "as_of")


def arrow_args(settings: Settings, as_of: str, error_col: str | None) -> dict[str, Any]:
    """What ``executor.arrow_fn`` takes for an as-of join: the as-of handle (kept beside the latest-value one),
    the time column and the reason's column."""
    return {"opener": opener, "key": handle_key(settings), "as_of": as_of, "error_col": error_col}


def as_of_udf_fn(settings: Settings, desc_bc: Any, data_bc: Any) -> Callable[[pa.Array, pa.Array], pa.Array]:
    """Body of the as-of Arrow UDF: (keys, times) become struct<value, timestamp, error> (why a row got no
    answer). An Arrow UDF, not a pandas one: pandas UDFs get timestamps as naive wall times of the session's zone,
    which a change of daylight saving time makes ambiguous."""

    # Spark picks the Arrow UDF's kind from these type hints: every parameter a pa.Array.
    def run(keys: pa.Array, times: pa.Array) -> pa.Array:
        value, ts, reason = handle(settings, desc_bc.value, data_bc).at(binary_keys(keys), times)
        return pa.StructArray.from_arrays([value, ts, reason], names=["value", "timestamp", "error"])

    return run


def as_of_type_ok(kind: Any) -> bool:
    """Whether a Spark column type can be an as-of time: a timestamp (with or without zone) or an integer (ms)."""
    from pyspark.sql.types import IntegralType, TimestampNTZType, TimestampType

    return isinstance(kind, TimestampType | TimestampNTZType | IntegralType)


def check_table(view: Any) -> None:
    """AsOfRefusedError when the view's table keeps no versions, or its descriptor's snapshot refuses them."""
    name = view.table.name
    if not view.table.versioned:
        raise AsOfRefusedError(f"table {name} keeps no versions: declare history in its [[tables]] entry "
                               "(docs/as-of.md) for as-of lookups")
    view._current()
    snapshot = (view.descriptor or {}).get("snapshot")
    # No sidecar on the driver's host: the executors resolve (and say it). A snapshot answered once is not opened
    # again (a join a micro-batch, foreach_batch: the same snapshot until a refresh moves it).
    if snapshot is None or view.__dict__.get("_as_of_checked") == snapshot:
        return
    from globald.snapshot.reader import open_snapshot

    with open_snapshot(view.config.state_dir, name, snapshot) as snap:
        why = refusal(name, snap.history)
    if why is not None:
        raise AsOfRefusedError(why)
    view.__dict__["_as_of_checked"] = snapshot


def check_join(view: Any, df: Any, as_of: str) -> None:
    """An as-of join's checks: the column and its type, then the table (``check_table``)."""
    if as_of not in df.columns:
        raise ValueError(f"join: no as_of column {as_of!r} in {df.columns}")
    kind = df.schema[as_of].dataType
    if not as_of_type_ok(kind):
        raise TypeError(f"join: as_of column {as_of!r} must be a timestamp or a long of epoch milliseconds, not "
                        f"{kind.simpleString()}")
    check_table(view)


def udf(view: Any, as_of: str) -> Callable[[Any], Any]:
    """``view.udf(as_of=...)``: an Arrow UDF of (key, time), bound to the time column ``as_of`` by name; the
    result is a function of the key column (a name or a Column)."""
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    check_table(view)
    F = functions(view.spark)
    if typed.is_typed(view):
        fn = typed.udf(view, as_of=True)
    else:
        versions.require(versions.ARROW_UDF, "view.udf(as_of=...) (an Arrow UDF)",
                         "view.join(df, key_column, as_of=...) reads the same values on this PySpark")
        desc_bc, data_bc = view._broadcasts(as_of=True)
        kind = StructType([StructField("value", BinaryType(), True), StructField("timestamp", LongType(), True),
                           StructField("error", StringType(), True)])
        fn = F.arrow_udf(as_of_udf_fn(view.settings, desc_bc, data_bc), kind)

    def call(key: Any) -> Any:
        return fn(key, F.col(as_of))

    return call
