"""Driver side of ``globald.spark``: a view of one global table whose version the driver picks and ships.

Every refresh picks target offsets (by default the topic's end offsets at that moment, so the view holds every
record committed before the refresh) and makes a small descriptor naming them: broadcast on a classic session
(the previous broadcast is unpersisted), carried inside each lookup function on Spark Connect, which has no
broadcast variables (``globald.spark.session``). A DataFrame or RDD built from the view captures the descriptor
current at that moment, so one batch never mixes two versions; a refresh that cannot be served keeps the previous
descriptor and says why. The same code runs on both kinds of session; only ``lookup_partitions`` (an RDD) is
classic-only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException

from globald.common.errors import GlobaldError
from globald.kafka.clients import TransientKafkaError, make_consumer, partitions, watermarks
from globald.settings.config import load
from globald.snapshot.manifest import Offsets, offsets_to_json
from globald.snapshot.resolve import Policy, resolve
from globald.spark import asof_driver, small, typed, versions
from globald.spark.executor import (
    MODE_BROADCAST,
    MODE_SNAPSHOT,
    Settings,
    arrow_fn,
    pandas_fn,
    partitions_fn,
)
from globald.spark.lineage import Lineage, Read, recorded
from globald.spark.memindex import DEFAULT_MEMORY_INDEX_MB
from globald.spark.session import FALLBACK_COL, Carried, ConnectUnsupportedError, Fallbacks, is_connect
from globald.status import statusfile

log = logging.getLogger(__name__)

DEFAULT_SMALL_TABLE_MAX_KEYS = 2_000_000


class GlobalTableView:
    """A global table as Spark jobs see it: ``refresh()`` moves it forward, ``join``/``udf``/``lookup_partitions``
    read it. ``mode="broadcast"`` ships the content itself (small tables) instead of reading executor sidecars;
    ``small_join`` picks how its ``join`` runs (``globald.spark.small``). ``spark`` is a classic or a Spark Connect
    session; ``fallbacks.value`` counts tasks that read another version than asked on both.

    In snapshot mode a raw snapshot of up to ``memory_index_mb`` (its keys and values, and the file's 48 bytes a
    key) is mapped by every Python worker from one file per snapshot and host (``globald.spark.mapped``): one copy
    in the page cache, however many workers; a larger one, or any with 0, is read by batched multi-gets.

    ``config_path`` is the driver's config: its Kafka settings and the table's topic make the descriptor. Executors
    read their own host's sidecar, through ``$GLOBALD_CONFIG`` in their environment when set, else this same path.
    """

    def __init__(self, spark: Any, config_path: str | Path, table: str, *, mode: str = MODE_SNAPSHOT,
                 wait_timeout_s: float = 30.0, on_timeout: str = Policy.FAIL.value, lease_s: float = 600.0,
                 batch_size: int = 1024, small_table_max_keys: int = DEFAULT_SMALL_TABLE_MAX_KEYS,
                 memory_index_mb: int = DEFAULT_MEMORY_INDEX_MB, small_join: str = "index") -> None:
        versions.require(versions.MINIMUM, "globald.spark")
        if mode not in (MODE_SNAPSHOT, MODE_BROADCAST):
            raise ValueError(f"mode must be {MODE_SNAPSHOT!r} or {MODE_BROADCAST!r}, not {mode!r}")
        if small_join not in small.SMALL_JOINS:
            raise ValueError(f"small_join must be one of {small.SMALL_JOINS}, not {small_join!r}")
        if memory_index_mb < 0:
            raise ValueError(f"memory_index_mb must be 0 (never) or more, not {memory_index_mb}")
        self.spark = spark
        self.config_path = str(Path(config_path).resolve())
        self.config = load(self.config_path)
        self.table = self.config.table(table)
        self.mode = mode
        self.settings = Settings(self.config_path, self.table.name, wait_timeout_s, Policy(on_timeout).value,
                                 lease_s, batch_size, memory_index_mb)
        self.small_table_max_keys = small_table_max_keys
        self.small_join = small_join
        self.fallbacks = Fallbacks()  # tasks that had to read another snapshot than asked
        self.refreshes = 0
        self._refresh_lock = threading.Lock()
        self._lock = threading.Lock()
        self._desc: dict[str, Any] | None = None
        self._desc_bc: Any = None
        self._small: small.SmallTable | None = None  # small-table mode: the content of the descriptor's snapshot
        self._seq = 0
        self._consumer: Consumer | None = None
        self._timer: threading.Thread | None = None
        self._timer_stop = threading.Event()
        self._lineage = Lineage()
        self._captured = threading.local()  # per calling thread: the descriptor its last lookup call captured

    @property
    def connect(self) -> bool:
        """Whether the view's session is a Spark Connect client (no SparkContext, broadcasts or RDDs)."""
        return is_connect(self.spark)

    def _carry(self, desc: dict[str, Any]) -> Any:
        return Carried(desc) if self.connect else self.spark.sparkContext.broadcast(desc)

    # -- pickling: foreach_batch on Spark Connect runs on the Connect server, in a copy of this view ------------

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"config_path": self.config_path, "table": self.table.name, "mode": self.mode,
                    "settings": self.settings, "small_table_max_keys": self.small_table_max_keys,
                    "small_join": self.small_join, "fallbacks": self.fallbacks, "desc": self._desc,
                    "small": self._small, "seq": self._seq, "refreshes": self.refreshes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Bound to a session again by the first batch it runs (foreach_batch); the config is read on this host.
        self.__dict__.update(spark=None, config_path=state["config_path"], mode=state["mode"],
                             settings=state["settings"], small_table_max_keys=state["small_table_max_keys"],
                             small_join=state["small_join"], fallbacks=state["fallbacks"], refreshes=state["refreshes"],
                             _refresh_lock=threading.Lock(), _lock=threading.Lock(),
                             _desc=state["desc"], _desc_bc=None, _small=state["small"], _seq=state["seq"],
                             _consumer=None, _timer=None, _timer_stop=threading.Event(),
                             _lineage=Lineage(), _captured=threading.local())
        self.config = load(self.config_path)
        self.table = self.config.table(state["table"])

    # -- refresh ----------------------------------------------------------------------------------------------

    def end_offsets(self) -> Offsets:
        """The topic's end offset per partition, asked of the broker now."""
        if self._consumer is None:
            self._consumer = make_consumer(self.config)
        topic = self.table.topic
        return {p: watermarks(self._consumer, topic, p)[1] for p in partitions(self._consumer, topic)}

    def refresh(self, offsets: Offsets | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Move the view to ``offsets`` (default: the end offsets now) and broadcast its descriptor.

        Raises (keeping the previous descriptor) when the policy is "fail" and the local sidecar cannot provide
        the snapshot within ``timeout`` (default: the view's wait_timeout_s).
        """
        with self._refresh_lock:
            target = dict(offsets) if offsets is not None else self.end_offsets()
            desc = self._describe(target, self.settings.wait_timeout_s if timeout is None else timeout)
            table = self._small
            if self.mode == MODE_BROADCAST and (table is None or table.snapshot != desc["snapshot"]):
                table = small.load(self.config.state_dir, self.table.name, desc["snapshot"],
                                   self.small_table_max_keys)
            self._install(desc, table)
            self.refreshes += 1
            return dict(desc)

    def _install(self, desc: dict[str, Any], table: small.SmallTable | None = None) -> None:
        """Make ``desc`` (and its content) the one new DataFrames capture; free the previous ones."""
        desc_bc = self._carry(desc)
        with self._lock:
            old_bc, old_table = self._desc_bc, (self._small if self._small is not table else None)
            self._desc, self._desc_bc, self._small = desc, desc_bc, table
        if old_bc is not None:
            old_bc.unpersist(blocking=False)  # jobs still holding it re-fetch it from the driver
        if old_table is not None:
            old_table.release()

    def _describe(self, target: Offsets, timeout: float) -> dict[str, Any]:
        self._seq += 1
        desc: dict[str, Any] = {"table": self.table.name, "topic": self.table.topic, "mode": self.mode,
                                "seq": self._seq, "created": time.time(), "requested": offsets_to_json(target)}
        if self.table.typed:  # the declaration in force now: jobs of this version decode with it, on every host
            desc.update(typed.declaration(self.config_path, self.table.name))
        state_dir = self.config.state_dir
        if self.mode == MODE_SNAPSHOT and statusfile.read_live(state_dir) is None:
            # No sidecar on the driver's host: executors resolve the offsets against their own sidecars.
            return {**desc, "offsets": offsets_to_json(target), "snapshot": None, "exact": None, "stale": False,
                    "note": "no sidecar on the driver host; executors resolve the offsets"}
        res = resolve(state_dir, self.table.name, target, timeout=timeout, policy=Policy(self.settings.policy),
                      serve_stale=self.config.snapshots.serve_stale)
        if res.note:
            log.warning("refresh: %s", res.note)
        return {**desc, "offsets": offsets_to_json(res.offsets), "snapshot": res.snapshot, "exact": res.exact,
                "stale": res.stale, "note": res.note}

    @property
    def descriptor(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._desc is None else dict(self._desc)

    def _current(self) -> tuple[Any, small.SmallTable | None]:
        """The descriptor's carrier and (small-table mode) the content it names, refreshing first if none yet."""
        with self._lock:
            if self._desc_bc is None and self._desc is not None:  # a copy made by pickling: same descriptor
                self._desc_bc = self._carry(self._desc)
            if self._desc_bc is not None:
                self._captured.desc = self._desc
                return self._desc_bc, self._small
        self.refresh()
        with self._lock:
            self._captured.desc = self._desc
            return self._desc_bc, self._small

    def _broadcasts(self, as_of: bool = False) -> tuple[Any, Any]:
        """Descriptor and content carriers for the Python lookup paths (content only in small-table mode; for
        ``as_of`` lookups, the snapshot's versions)."""
        desc_bc, table = self._current()
        with self._lock:
            if table is None:
                return desc_bc, None
            if as_of:
                return desc_bc, table.versions_carrier(self.spark, self.config.state_dir, self.table.name)
            return desc_bc, table.carrier(self.spark)

    # -- lookups ------------------------------------------------------------------------------------------------

    def lineage(self) -> list[Read]:
        """Which version each ``join``, ``udf``, ``lookup_partitions`` call and ``foreach_batch`` micro-batch of this
        view read, newest last (``globald.spark.lineage``): ``view.refresh(offsets=read.offsets)`` reads one again.
        A copy of the view (``foreach_batch`` on Spark Connect runs on the server) records in its own process."""
        return self._lineage.reads()

    def _record(self, kind: str, *, batch_id: int | None = None, observe: bool = False) -> Read:
        """The read of the descriptor this thread's last lookup call captured (``_current``)."""
        desc = getattr(self._captured, "desc", None)
        if desc is None:
            raise RuntimeError(f"lineage: {kind} captured no descriptor")  # every lookup path goes through _current
        self._captured.desc = None
        return self._lineage.record(desc, kind, batch_id=batch_id, observe=observe)

    def _unwatched(self) -> Fallbacks | None:
        """The view's fallbacks when this thread's last ``join`` left the hidden fallback column for its lineage
        observation to count (``globald.spark.lineage.observe_read``), else None."""
        left = getattr(self._captured, "unwatched", False)
        self._captured.unwatched = False
        return self.fallbacks if left else None

    @recorded("join", observe=True)
    def join(self, df: Any, on: str, value_col: str = "value", timestamp_col: str = "timestamp",
             snapshot_col: str | None = None, *, flatten: bool | str = False, error_col: str | None = None,
             as_of: str | None = None) -> Any:
        """``df`` left-joined with the table as of the current descriptor: ``value_col`` (binary) and
        ``timestamp_col`` (long) are null where the key is absent. ``on`` may be a binary or string column (or an
        integer one, on a table whose declared key decodes to integers).

        A typed table (``[tables.value]``) makes ``value_col`` a struct of the schema's type; ``flatten`` (True, or
        a prefix) puts its fields at top level, ``error_col`` says why a value did not decode, and
        ``decode_errors`` counts them per query (``globald.spark.typed``).

        Snapshot mode: a mapInArrow looking each Arrow batch up at once in the executors' sidecar snapshots; its
        fallbacks are observed (``fallbacks``). Small-table mode: the same mapInArrow against the shipped content
        (``small_join="index"``), or Spark's own broadcast hash join against it (``"spark"``; ``small``).

        ``as_of`` (a versioned table's, ``[[tables]] history``): a timestamp column, or a long column of epoch ms;
        each row gets its key's value as of that time (the as-of fold) and the version's own timestamp, answered on
        the executor from the host's snapshot (``globald.spark.asof``; small-table mode: from the shipped
        versions). A row whose time is before the snapshot's ``since`` gets nulls, and a reason in ``error_col``
        when one is named (a raw table takes ``error_col`` then too); a typed key by its decoded form (the fold
        over it: ``globald.spark.asof_keys``). A table without history, or whose history is refused, raises
        AsOfRefusedError here, before any job."""
        from pyspark.sql.types import BinaryType, IntegralType, LongType, StringType, StructField, StructType

        if on not in df.columns:
            raise ValueError(f"join: no column {on!r} in {df.columns}")
        kind = df.schema[on].dataType
        # A typed key is matched by the canonical form of its decoded value (globald.typed.keys): an integer
        # column then matches an integer key by its decimal text. Raw keys are bytes: only bytes or text match.
        integral = isinstance(kind, IntegralType) and self.table.key is not None and self.table.key.typed
        if not (isinstance(kind, BinaryType | StringType) or integral):
            raise TypeError(f"join: key column {on!r} must be binary or string (or an integer, for a table whose "
                            f"[tables.key] declares an integer key), not {kind.simpleString()}")
        if as_of is not None:
            asof_driver.check_join(self, df, as_of)
        added = [c for c in (value_col, timestamp_col, error_col if as_of else None, snapshot_col) if c is not None]
        clash = [c for c in added if c in df.columns]
        if typed.is_typed(self):
            return typed.join(self, df, on, value_col, timestamp_col, snapshot_col, flatten, error_col, as_of)
        if flatten or (error_col is not None and as_of is None):
            raise ValueError(f"join: flatten and error_col need a typed table (or error_col, an as_of join); "
                             f"{self.table.name} is raw bytes")
        if clash or len(set(added)) != len(added):
            raise ValueError(f"join: output columns {added} clash with each other or with {df.columns}")
        fields = [*df.schema.fields, StructField(value_col, BinaryType(), True),
                  StructField(timestamp_col, LongType(), True)]
        if as_of is not None and error_col is not None:
            fields.append(StructField(error_col, StringType(), True))
        if snapshot_col is not None:
            fields.append(StructField(snapshot_col, StringType(), True))
        if self.mode == MODE_BROADCAST and self.small_join == "spark" and as_of is None:
            _, table = self._current()
            assert table is not None
            return small.join(df, table, on, value_col, timestamp_col, snapshot_col)  # no Python per row
        desc_bc, data_bc = self._broadcasts(as_of is not None)
        count = self.mode == MODE_SNAPSHOT  # shipped content is the version asked for: nothing to count
        extra = {} if as_of is None else asof_driver.arrow_args(self.settings, as_of, error_col)
        fn = arrow_fn(self.settings, desc_bc, data_bc, on, value_col, timestamp_col, snapshot_col, count, **extra)
        if not count:
            return df.mapInArrow(fn, StructType(fields))
        # The hidden column is counted and dropped by the read's observation (``recorded``): one observation, a
        # node run on every row, instead of two.
        self._captured.unwatched = True
        return df.mapInArrow(fn, StructType([*fields, StructField(FALLBACK_COL, LongType(), False)]))

    @recorded("lookup_partitions")
    def lookup_partitions(self, rdd: Any, key: Callable[[Any], object] | None = None) -> Any:
        """``rdd`` mapped per partition to (element, value or None, timestamp or None), in batched multi-gets.
        Classic sessions only: Spark Connect has no RDDs (ConnectUnsupportedError names the alternative)."""
        if self.connect:
            raise ConnectUnsupportedError(
                "lookup_partitions needs an RDD, which Spark Connect does not have: on a DataFrame use "
                "view.join(df, key_column), or df.select(view.udf()(key_column))")
        desc_bc, data_bc = self._broadcasts()
        if self.fallbacks.accumulator is None:
            self.fallbacks.accumulator = self.spark.sparkContext.accumulator(0)
        return rdd.mapPartitions(partitions_fn(self.settings, desc_bc, data_bc, self.fallbacks.accumulator, key))

    @recorded("udf")
    def udf(self, as_of: str | None = None) -> Any:
        """A pandas UDF: key column -> struct<value: binary, timestamp: bigint> (null fields when absent).

        It reads the descriptor current when ``udf()`` is called: call it again after a refresh. On a typed table
        it is an Arrow UDF returning struct<value: the schema's struct, timestamp: bigint, error: string>.

        ``as_of`` (a versioned table's): the name of the time column (timestamp, or long of epoch ms) of the
        DataFrame the UDF is used on; the result is then a function of the key column giving
        struct<value, timestamp, error>, each row's key as of its time, as ``join(..., as_of=...)`` answers it
        (``error``: why a row got no answer). An Arrow UDF: PySpark 4.1 or newer.
        """
        from pyspark.sql.functions import pandas_udf

        if as_of is not None:
            return asof_driver.udf(self, as_of)
        if typed.is_typed(self):
            return typed.udf(self)

        desc_bc, data_bc = self._broadcasts()
        # PySpark's stubs overload pandas_udf only on an explicit functionType; the UDF kind is inferred here from
        # pandas_fn's type hints, the form PySpark recommends, which no overload describes.
        return pandas_udf(pandas_fn(self.settings, desc_bc, data_bc),  # type: ignore[call-overload]
                          "struct<value:binary,timestamp:bigint>")

    @property
    def decode_errors(self) -> Fallbacks:
        """Typed tables: values that did not decode, in the rows of every joined DataFrame whose first action
        finished (``.value``), on both kinds of session."""
        return typed.counter(self)

    # -- refresh helpers ----------------------------------------------------------------------------------------

    def foreach_batch(self, fn: Callable[[Any, int], None], every: int = 1,
                      min_interval_s: float = 0.0) -> Callable[[Any, int], None]:
        """A Structured Streaming ``foreachBatch`` function: refresh (every ``every`` batches, at most once per
        ``min_interval_s``), then run ``fn(batch_df, batch_id)`` against that one descriptor. A refresh that fails
        keeps the previous descriptor, so the stream goes on with the last good version.

        On Spark Connect, Spark runs this function on the Connect server, in a Python process of its own: it gets a
        copy of this view (and of ``fn``), which refreshes there, against the config at ``config_path`` on the
        server's host. What ``fn`` records must go somewhere both can see (a table, a file), not this process."""
        state = {"n": 0, "last": 0.0}

        def run(batch_df: Any, batch_id: int) -> None:
            if self.spark is None:  # a copy on the Connect server: bind it to the session the batch came from
                self.spark = batch_df.sparkSession
            due = state["n"] % max(every, 1) == 0 and time.monotonic() - state["last"] >= min_interval_s
            state["n"] += 1
            if due or self._desc is None:
                self._refresh_or_keep()
                state["last"] = time.monotonic()
            self._current()  # this batch's descriptor, which its joins capture too (unless a timer refreshes)
            self._record("foreach_batch", batch_id=batch_id)
            fn(batch_df, batch_id)

        return run

    def _refresh_or_keep(self) -> None:
        try:
            self.refresh()
        except (GlobaldError, TransientKafkaError, KafkaException, OSError) as e:
            if self._desc is None:
                raise
            log.warning("refresh of %s failed, keeping snapshot %s: %s", self.table.name,
                        (self._desc or {}).get("snapshot"), e)

    def start_refresh_timer(self, interval_s: float) -> None:
        """Refresh every ``interval_s`` seconds on a background thread until ``stop_refresh_timer``."""
        if self._timer is not None:
            raise RuntimeError("the refresh timer is already running")
        self._timer_stop.clear()

        def loop() -> None:
            while not self._timer_stop.wait(interval_s):
                try:
                    self._refresh_or_keep()
                except Exception:
                    log.exception("refresh of %s failed", self.table.name)

        self._timer = threading.Thread(target=loop, name=f"globald-refresh-{self.table.name}", daemon=True)
        self._timer.start()

    def stop_refresh_timer(self) -> None:
        self._timer_stop.set()
        if self._timer is not None:
            self._timer.join(timeout=60)
            self._timer = None

    def close(self) -> None:
        self.stop_refresh_timer()
        with self._lock:
            bc, table, self._desc_bc, self._small, self._desc = self._desc_bc, self._small, None, None, None
        if bc is not None:
            bc.unpersist(blocking=False)
        if table is not None:
            table.release()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
