"""Small-table mode (``GlobalTableView(..., mode="broadcast")``): the driver reads one snapshot whole and ships its
content, so executors need no sidecar.

Contract: a ``SmallTable`` holds exactly the content of one snapshot (every key with its value and timestamp),
read once on the driver (the Connect client, for a Connect session) when a refresh moves the view to that
snapshot. Every lookup path answers as a lookup in that snapshot would: null value and timestamp for an absent or
null key (a string key is looked up as its UTF-8 bytes). Two ways to join:

- ``small_join="index"`` (default): the content travels with the lookup function — a broadcast of the Arrow table on
  a classic session, inside the function's closure on Connect — and each Python worker indexes it once per snapshot
  (``globald.spark.memindex``); ``join`` is then the same mapInArrow as snapshot mode. The pandas UDF and
  ``lookup_partitions`` use the same index.
- ``small_join="spark"``: Spark's own broadcast hash join against the content as a DataFrame (left outer, keys
  compared as bytes). No Python runs per row and executors need not even have globald installed, but Spark
  re-plans, re-collects and re-broadcasts the table at every query (see docs/spark-connect.md for the figures).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from globald.common.errors import GlobaldError
from globald.snapshot.reader import open_snapshot
from globald.spark.session import Carried, functions, is_connect
from globald.typed.arrow import Origin, OriginLookup

KEY = "key"
PARTITION, OFFSET = "partition", "offset"  # a typed table's content: where each value came from
SMALL_JOINS = ("index", "spark")


@dataclass
class SmallTable:
    snapshot: str
    table: pa.Table  # key: binary, value: binary, timestamp: int64 (a typed table's: partition, offset too)
    _frames: dict[int, Any] = field(default_factory=dict, repr=False)  # per session: the content as a DataFrame
    _carriers: dict[Hashable, Any] = field(default_factory=dict, repr=False)  # per session: broadcast or Carried
    versions: pa.Table | None = None  # the as-of table (globald.spark.asof), read when an as-of join first asks

    def carrier(self, spark: Any) -> Any:
        """The content as the lookup functions receive it: broadcast once (classic) or carried in the closure."""
        got = self._carriers.get(id(spark))
        if got is None:
            got = Carried(self.table) if is_connect(spark) else spark.sparkContext.broadcast(self.table)
            self._carriers[id(spark)] = got
        return got

    def versions_carrier(self, spark: Any, state_dir: Path, table: str) -> Any:
        """The snapshot's as-of table as the as-of lookups receive it, read from the snapshot the first time
        (``globald.spark.asof.build``: its versions parsed once, on the driver) and shipped as ``carrier`` ships
        the content."""
        if self.versions is None:
            from globald.spark import asof

            with open_snapshot(state_dir, table, self.snapshot, lease_s=60.0) as snap:
                self.versions = asof.build(snap)
        got = self._carriers.get((id(spark), "versions"))
        if got is None:
            got = Carried(self.versions) if is_connect(spark) else spark.sparkContext.broadcast(self.versions)
            self._carriers[(id(spark), "versions")] = got
        return got

    def frame(self, spark: Any) -> Any:
        """The content as a DataFrame, built once per session: for Spark's own broadcast join."""
        got = self._frames.get(id(spark))
        if got is None:
            got = spark.createDataFrame(self.table) if is_connect(spark) else cached_frame(spark, self.table)
            self._frames[id(spark)] = got
        return got

    def release(self) -> None:
        """Frees the cached DataFrames and broadcasts; a job still using them recomputes or re-fetches them."""
        for frame in self._frames.values():
            if not is_connect(frame.sparkSession):
                frame.unpersist(blocking=False)
        for carrier in self._carriers.values():
            carrier.unpersist(blocking=False)
        self._frames.clear()
        self._carriers.clear()

    def __getstate__(self) -> dict[str, Any]:
        # Frames and broadcasts stay with their session.
        return {"snapshot": self.snapshot, "table": self.table, "versions": self.versions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["snapshot"], state["table"], versions=state.get("versions"))  # type: ignore[misc]


def load(state_dir: Path, table: str, snapshot: str, max_keys: int) -> SmallTable:
    """Read ``snapshot`` whole into an Arrow table."""
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
        origins = snap.origins(keys, values, stamps)
    columns = {KEY: pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
               "timestamp": pa.array(stamps, pa.int64())}
    if any(o is not None for o in origins):  # a typed table's: a value that does not decode is named by them
        columns[PARTITION] = pa.array([None if o is None else o[0] for o in origins], pa.int32())
        columns[OFFSET] = pa.array([None if o is None else o[1] for o in origins], pa.int64())
    return SmallTable(snapshot, pa.table(columns))


def content_origins(content: pa.Table) -> OriginLookup | None:
    """Where the rows of a shipped content came from, as its snapshot recorded them; None when it did not."""
    if PARTITION not in content.schema.names:
        return None
    rows: dict[bytes, int] = {}

    def lookup(keys: Sequence[bytes], values: Sequence[bytes], stamps: Sequence[int]) -> list[Origin | None]:
        if not rows:  # only once a value fails to decode
            rows.update((k, i) for i, k in enumerate(content.column(KEY).to_pylist()))
        partitions, offsets = content.column(PARTITION), content.column(OFFSET)
        found = [rows.get(k) for k in keys]
        return [None if i is None or not partitions[i].is_valid else (partitions[i].as_py(), offsets[i].as_py())
                for i in found]

    return lookup


def cached_frame(spark: Any, data: pa.Table) -> Any:
    """``data`` as a cached DataFrame whose plan does not hold the rows (materialized now). Classic sessions only.

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
    spark = df.sparkSession
    F = functions(spark)
    tag = "__globald_key"
    while tag in df.columns:
        tag += "_"
    right = small.frame(spark).select(F.col(KEY).alias(tag), F.col("value").alias(value_col),
                                      F.col("timestamp").alias(timestamp_col))
    joined = df.join(F.broadcast(right), df[on].cast("binary") == right[tag], "left").drop(tag)
    if snapshot_col is not None:
        joined = joined.withColumn(snapshot_col, F.lit(small.snapshot))
    return joined
