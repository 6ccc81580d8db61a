"""Small-table mode (``GlobalTableView(..., mode="broadcast")``): the driver reads one snapshot whole and Spark
joins against it natively, with no Python per row.

Contract: a ``SmallTable`` holds exactly the content of one snapshot (every key with its value and timestamp),
read once on the driver when a refresh moves the view to that snapshot. ``join`` is Spark's own broadcast hash
join (left outer, keys compared as bytes: a string key as its UTF-8 encoding) against a cached DataFrame of that
content, so its answers equal a lookup in the snapshot: null value and timestamp for an absent or null key.
Where Spark's join does not apply — the pandas UDF and ``lookup_partitions`` on an RDD — executors look keys up
in a broadcast dict of the same content, made on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from globald.errors import GlobaldError
from globald.snapshot.reader import open_snapshot
from globald.store.codec import encode_value

KEY = "key"


@dataclass
class SmallTable:
    snapshot: str
    table: pa.Table  # key: binary, value: binary, timestamp: int64
    frame: Any  # the cached Spark DataFrame of ``table``
    _content: Any = field(default=None, repr=False)  # broadcast dict key -> stored value, made on first use

    def content(self, sc: Any) -> Any:
        """The broadcast dict of this snapshot, for the lookup paths Spark's join does not cover."""
        if self._content is None:
            keys, values, stamps = (self.table.column(c).to_pylist() for c in (KEY, "value", "timestamp"))
            self._content = sc.broadcast({k: encode_value(t, v) for k, v, t in zip(keys, values, stamps,
                                                                                    strict=True)})
        return self._content

    def release(self) -> None:
        """Frees the cached DataFrame and the broadcast; a job still using them recomputes or re-fetches them."""
        self.frame.unpersist(blocking=False)
        if self._content is not None:
            self._content.unpersist(blocking=False)


def load(spark: Any, state_dir: Path, table: str, snapshot: str, max_keys: int) -> SmallTable:
    """Read ``snapshot`` whole into Arrow and a cached DataFrame (materialized now, so joins find it ready)."""
    keys: list[bytes] = []
    values: list[bytes] = []
    stamps: list[int] = []
    with open_snapshot(state_dir, table, snapshot, lease_s=60.0) as snap:
        if snap.manifest.records > max_keys:
            raise GlobaldError(f"table {table} has ~{snap.manifest.records} keys, more than "
                               f"small_table_max_keys={max_keys}; use mode='snapshot'")
        for k, v, ts in snap:
            keys.append(k)
            values.append(v)
            stamps.append(ts)
    data = pa.table({KEY: pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                     "timestamp": pa.array(stamps, pa.int64())})
    return SmallTable(snapshot, data, cached_frame(spark, data))


def cached_frame(spark: Any, data: pa.Table) -> Any:
    """``data`` as a cached DataFrame whose plan does not hold the rows (materialized now).

    ``createDataFrame`` of an Arrow table is a LocalRelation: its rows sit in the logical plan, and every join
    against it pays for them again (building the DataFrame, then looking its plan up in the cache, which hashes
    and compares the plan: ~120 ms a query at 100k keys). Re-rooting it on an RDD of its rows keeps the plan a
    leaf that names the RDD, so the per-query cost is independent of the table's size; the RDD's lineage still
    holds the rows, so a job started after ``release`` recomputes them.
    """
    from pyspark.sql import DataFrame

    local = spark.createDataFrame(data)._jdf
    frame = DataFrame(spark._jsparkSession.createDataFrame(local.javaRDD(), local.schema()), spark).cache()
    frame.count()
    return frame


def join(df: Any, small: SmallTable, on: str, value_col: str, timestamp_col: str,
         snapshot_col: str | None) -> Any:
    """``df`` left-joined with ``small`` by Spark's broadcast hash join; ``on`` is a binary or string column."""
    from pyspark.sql import functions as F

    tag = "__globald_key"
    while tag in df.columns:
        tag += "_"
    right = small.frame.select(F.col(KEY).alias(tag), F.col("value").alias(value_col),
                               F.col("timestamp").alias(timestamp_col))
    joined = df.join(F.broadcast(right), df[on].cast("binary") == right[tag], "left").drop(tag)
    if snapshot_col is not None:
        joined = joined.withColumn(snapshot_col, F.lit(small.snapshot))
    return joined
