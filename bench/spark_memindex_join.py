"""Today's raw join before issue 34, in the same run as the mapped one: each Python worker reads the snapshot into
its own in-memory index (``globald.spark.memindex``, what ``SnapshotHandle`` did until the raw table was mapped
from one file per host), then looks every batch up there. The same descriptor, snapshot, handle cache and per-batch
path as ``view.join`` (``executor.handle``, ``lookup_arrow``); only the lookup structure differs, so the two modes
of ``bench.spark`` compare the mapped file with the per-worker index per core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from globald.spark import executor
from globald.spark.batch import lookup_arrow
from globald.spark.executor import ContentHandle, Handle, Settings, SnapshotHandle

Batches = Iterator[pa.RecordBatch]


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
    """``view.join(df, on)``'s value and timestamp columns, looked up in a per-worker in-memory index."""
    settings = view.settings
    desc_bc, data_bc = view._broadcasts()

    def run(batches: Batches) -> Batches:
        h = executor.handle(settings, desc_bc.value, data_bc, opener=_index_handle, key=(settings, "memindex"))
        for batch in batches:
            value, timestamp = lookup_arrow(h.columns, batch.column(on))
            yield pa.RecordBatch.from_arrays([*batch.columns, value, timestamp],
                                             names=[*batch.schema.names, "value", "timestamp"])

    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    fn: Callable[[Batches], Batches] = run
    schema = StructType([*df.schema.fields, StructField("value", BinaryType()), StructField("timestamp", LongType())])
    return df.mapInArrow(fn, schema)
