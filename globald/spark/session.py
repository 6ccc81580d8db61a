"""What differs between a classic PySpark session and a Spark Connect one, kept in one place.

A Connect session has no SparkContext, broadcast variables, accumulators or RDDs. So on Connect the descriptor
(and, in small-table mode, the content) travels inside the function Spark ships to the executors (``Carried``),
and fallbacks are counted through ``DataFrame.observe`` metrics on both kinds of session (``Fallbacks``): the
lookup function emits a hidden per-task count column, observed and dropped before the caller sees the frame.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from globald.common.errors import GlobaldError

log = logging.getLogger(__name__)

FALLBACK_COL = "__globald_fallback"  # hidden: 1 on one row of each task that read another version than asked
MAX_PENDING = 1024  # observations of DataFrames never run are forgotten past this many


def is_connect(spark: Any) -> bool:
    """A Spark Connect client session (``SparkSession.builder.remote(...)``, ``spark.api.mode=connect``), judged
    by its class, not by the process-wide ``SPARK_CONNECT_MODE_ENABLED`` a classic session may live beside."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class ConnectUnsupportedError(GlobaldError, NotImplementedError):
    """This call needs a classic session (an RDD, a SparkContext). On Spark Connect use the DataFrame API instead:
    ``view.join(df, key_column)`` or ``view.udf()``, which the message names."""


class Carried:
    """A value shipped inside the executor function's closure, read like a broadcast (``.value``): how a tiny
    descriptor, or a small table's content, reaches executors where there are no broadcast variables."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def unpersist(self, blocking: bool = False) -> None:
        """Nothing to free: the value lives as long as the functions that carry it."""


def functions(spark: Any) -> Any:
    """Column functions for the session's kind: Connect's own module on Connect; on a classic session
    ``pyspark.sql.functions``, which builds classic columns unless a Connect session in the same process set
    ``SPARK_CONNECT_MODE_ENABLED`` (PySpark has no classic-only module to ask instead)."""
    if is_connect(spark):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions as sql_functions

    return sql_functions


def observation(spark: Any, name: str | None = None) -> Any:
    """A new ``Observation`` (named ``name``, else by Spark) of the session's own kind (PySpark otherwise picks by
    a process-wide variable)."""
    if is_connect(spark):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        return ConnectObservation(name)
    from pyspark.sql.observation import Observation

    obs = object.__new__(Observation)  # Observation.__new__ would pick Connect's class by the process variable
    Observation.__init__(obs, name)
    return obs


def _ready(obs: Any) -> int | None:
    """The observed count once the DataFrame's first action finished, else None (never blocks)."""
    try:
        jo = getattr(obs, "_jo", None)
        if jo is not None:  # classic: the JVM's Observation completes a future when the action ends
            if not jo.future().isCompleted():
                return None
            return int(obs.get.get("n") or 0)
        got = obs.get  # Connect: an empty dict until the action has returned its metrics
        return int(got.get("n") or 0) if got else None
    except Exception as e:  # a failed action completes the observation with its error: nothing was counted
        log.debug("fallback observation unreadable: %s", e)
        return 0


class Fallbacks:
    """How many tasks read a version other than the one their descriptor asked for (policy "newest").

    ``value`` adds up the observed counts of every DataFrame from ``join`` whose first action has finished (only
    a DataFrame's first action is observed, as Spark's ``observe`` does), plus, on a classic session,
    ``lookup_partitions``' count (an accumulator: RDDs exist only there). The pandas UDF returns a column, which
    no observation can be attached to: its fallbacks are logged on the executor, not counted.
    """

    def __init__(self) -> None:
        self._pending: deque[Any] = deque(maxlen=MAX_PENDING)
        self._counted = 0
        self.accumulator: Any = None
        self._sum: tuple[Any, Any] | None = None  # (session, its metric column): built once, not per join

    def watch(self, df: Any, spark: Any, name: str | None = None, metrics: Sequence[Any] = ()) -> Any:
        """``df`` (with the hidden count column) observed and with that column dropped. ``name`` and ``metrics``:
        the observation's name and other metrics of its own (a join's lineage, ``globald.spark.lineage``), so
        that one observation carries both: each is a node evaluated on every row of the query."""
        if self._sum is None or self._sum[0] is not spark:  # each column costs round trips to the JVM
            F = functions(spark)
            self._sum = (spark, F.coalesce(F.sum(F.col(FALLBACK_COL)), F.lit(0)).alias("n"))
        obs = observation(spark, name)
        self._pending.append(obs)
        return df.observe(obs, *metrics, self._sum[1]).drop(FALLBACK_COL)

    @property
    def value(self) -> int:
        for obs in list(self._pending):
            got = _ready(obs)
            if got is not None:
                self._counted += got
                self._pending.remove(obs)
        extra = 0 if self.accumulator is None else int(self.accumulator.value)
        return self._counted + extra

    def __getstate__(self) -> dict[str, Any]:
        # Observations and accumulators belong to this process's session; a copy (foreachBatch on a Connect
        # server) counts from the fallbacks already read.
        return {"counted": self.value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._counted = int(state["counted"])
