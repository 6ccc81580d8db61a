"""Today's raw join before issue 34, in the same run as the mapped one: each Python worker reads the snapshot into
its own in-memory index (``globald.spark.memindex``, what ``SnapshotHandle`` did until the raw table was mapped
from one file per host), then looks every batch up there. The same descriptor, snapshot, handle cache and per-batch
path as ``view.join`` (``executor.arrow_fn``, its hidden fallback column and observation); only the lookup
structure differs, so the two modes of ``bench.spark`` compare the mapped file with the per-worker index per core.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from globald.spark import executor
from globald.spark.executor import ContentHandle, Handle, Settings, SnapshotHandle
from globald.spark.session import FALLBACK_COL


def _index_handle(settings: Settings, desc: dict[str, Any], data: Any) -> Handle:
    raw = executor._open(dataclasses.replace(settings, memory_index_mb=0), desc, data)  # the snapshot, open
    assert isinstance(raw, SnapshotHandle) and raw.snap is not None
    keys, values, stamps = [], [], []
    for k, v, ts in raw.snap.items():
        keys.append(k)
        values.append(v)
        stamps.append(ts)
    content = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                        "timestamp": pa.array(stamps, pa.int64())})
    h = ContentHandle(content, raw.snapshot)  # MemoryIndex.of_table: the index SnapshotHandle built
    raw.close()
    return h


def memory_index_join(view: Any, df: Any, on: str) -> Any:
    """``view.join(df, on)`` exactly (the same ``arrow_fn``, hidden fallback column and observation), its values
    looked up in a per-worker in-memory index instead of the mapped file."""
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    desc_bc, data_bc = view._broadcasts()
    fn = executor.arrow_fn(view.settings, desc_bc, data_bc, on, "value", "timestamp", None, True,
                           opener=_index_handle, key=(view.settings, "memindex"))
    schema = StructType([*df.schema.fields, StructField("value", BinaryType(), True),
                         StructField("timestamp", LongType(), True), StructField(FALLBACK_COL, LongType(), False)])
    return view.fallbacks.watch(df.mapInArrow(fn, schema), df.sparkSession)
