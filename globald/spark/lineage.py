"""Lineage: which version of a global table each query or micro-batch read, so a run can be audited and repeated.

Every ``join``, ``udf``, ``lookup_partitions`` and ``foreach_batch`` micro-batch of a view records a ``Read``: the
table, the snapshot id and the offsets of the descriptor it captured (the one its executors are told to read), in
the view's ``lineage()``, newest last. A ``join`` also carries its read on the DataFrame as a named observation
(``globald:<table>:<id>``, unique: Spark refuses two observations of one name in a plan, and one query
may join two views of a table; it also carries the join's fallback count ``n``, ``globald.spark.session``),
which Spark's UI (the plan's CollectMetrics node), ``QueryExecutionListener``\\s and a
stream's ``lastProgress.observedMetrics`` show. ``view.refresh(offsets=read.offsets)`` reads that version again,
built at exactly those offsets if no snapshot holds them any more (exact builds).

A read records what the driver shipped. A task whose sidecar could not serve it and was allowed another version
(policy "newest") is counted in ``view.fallbacks``, and its rows name the version they read in ``snapshot_col``.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from globald.snapshot.manifest import Offsets, offsets_from_json
from globald.spark.typed import DESCRIPTOR_KEY

MAX_READS = 10_000  # a long-running stream's reads beyond this many are forgotten, oldest first
READ_KINDS = ("join", "udf", "lookup_partitions", "foreach_batch")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Read:
    """One query's or micro-batch's version of the table: what ``view.refresh(offsets=...)`` needs to repeat it.

    ``snapshot`` is None when the driver's host has no sidecar (executors then resolve ``offsets`` on theirs);
    ``exact`` says the snapshot holds exactly ``offsets`` (not a newer one the policy allowed)."""

    table: str
    topic: str
    kind: str
    snapshot: str | None
    offsets: Offsets
    exact: bool | None
    seq: int  # the view's descriptor number: reads with the same seq read the same descriptor
    at: float  # wall-clock time of the read, for people
    batch_id: int | None = None  # foreach_batch: the micro-batch
    observation: str | None = None  # join: the name of the DataFrame's observation
    declaration: str | None = None  # typed tables: the fingerprint of the declaration its rows decode with

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (offsets keyed by partition text, as descriptors are)."""
        return {"table": self.table, "topic": self.topic, "kind": self.kind, "snapshot": self.snapshot,
                "offsets": {str(p): o for p, o in sorted(self.offsets.items())}, "exact": self.exact,
                "seq": self.seq, "at": self.at, "batch_id": self.batch_id, "observation": self.observation,
                "declaration": self.declaration}


class Lineage:
    """A view's reads, newest last, safe to record from a refresh timer's thread and a query's at once."""

    def __init__(self) -> None:
        self._reads: deque[Read] = deque(maxlen=MAX_READS)
        self._lock = threading.Lock()
        self._metrics: tuple[int, Any, list[Any]] | None = None  # (seq, session, the observation's metrics)

    def record(self, desc: dict[str, Any], kind: str, *, batch_id: int | None = None,
               observe: bool = False) -> Read:
        """The read of ``desc`` by one ``kind`` call, recorded; ``observe`` names an observation for it."""
        if kind not in READ_KINDS:
            raise ValueError(f"lineage: kind must be one of {READ_KINDS}, not {kind!r}")
        with self._lock:
            name = None
            if observe:
                name = f"globald:{desc['table']}:{uuid.uuid4().hex[:16]}"
            read = Read(table=desc["table"], topic=desc["topic"], kind=kind, snapshot=desc.get("snapshot"),
                        offsets=offsets_from_json(desc["offsets"]), exact=desc.get("exact"), seq=desc["seq"],
                        at=time.time(), batch_id=batch_id, observation=name,
                        declaration=desc.get(DESCRIPTOR_KEY))
            self._reads.append(read)
            return read

    def reads(self) -> list[Read]:
        with self._lock:
            return list(self._reads)

    def metrics(self, read: Read, spark: Any) -> list[Any]:
        """``read``'s literal metrics (``read_metrics``), built once per descriptor and session: each column is
        driver round trips to the JVM (about 8 ms a join on a classic session, issue 44.3), and reads of one
        descriptor (``seq``) have the same table, snapshot and offsets."""
        with self._lock:
            if self._metrics is not None and self._metrics[0] == read.seq and self._metrics[1] is spark:
                return self._metrics[2]
        built = read_metrics(read, spark)
        with self._lock:
            self._metrics = (read.seq, spark, built)
        return built


def read_metrics(read: Read, spark: Any) -> list[Any]:
    """The columns a join's observation of ``read`` carries: literals, so they are the same however many rows (or
    none) the query has."""
    from globald.spark.session import functions

    fns = functions(spark)
    return [fns.lit(read.table).alias("table"), fns.lit(read.snapshot).cast("string").alias("snapshot"),
            fns.lit(json.dumps(read.to_json()["offsets"])).alias("offsets"), fns.lit(read.seq).alias("seq")]


def observe_read(df: Any, read: Read, fallbacks: Any = None, metrics: list[Any] | None = None) -> Any:
    """``df`` with ``read`` attached as the named observation ``read.observation`` (its ``metrics``, built when not
    given: ``read_metrics``). With ``fallbacks`` (``globald.spark.session.Fallbacks``), ``df`` still has the hidden
    fallback column, which the same observation adds up (metric ``n``) and drops: one node on every row of the
    query instead of two (issue 44.3)."""
    if metrics is None:
        metrics = read_metrics(read, df.sparkSession)
    if fallbacks is not None:
        return fallbacks.watch(df, df.sparkSession, read.observation, metrics)
    return df.observe(read.observation, *metrics)


def recorded(kind: str, *, observe: bool = False) -> Callable[[F], F]:
    """A view method's calls recorded in its lineage after they built their result (which captured the
    descriptor); with ``observe``, the DataFrame it returns carries its read as a named observation (which also
    counts the fallbacks of a DataFrame the call left its hidden column on: ``view._unwatched``)."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def call(view: Any, *args: Any, **kwargs: Any) -> Any:
            out = method(view, *args, **kwargs)
            read = view._record(kind, observe=observe)
            if not observe:
                return out
            return observe_read(out, read, view._unwatched(), view._lineage.metrics(read, out.sparkSession))

        return call  # type: ignore[return-value]

    return wrap
