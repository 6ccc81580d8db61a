"""As-of joins in Spark (issue 45) with real PySpark, the real daemon and a modern-protocol broker (the only one here
whose records carry timestamps): ``view.join(df, on, as_of=...)`` and ``view.udf(as_of=...)`` answer every row as
the as-of fold of the topic's records (``globald.embedded.oracle.as_of``) at that row's own time, on raw and typed
tables, in snapshot and small-table modes, with out-of-order timestamps, ties, tombstones, NUL bytes in keys and
times before ``since`` (null, and a reason; never a guess), with no shuffle of the joined DataFrame. The
latest-value join answers as the latest fold, its timestamp column each value's record CreateTime, on a plain
table and on a versioned one alike (this replaces test_spark_timestamps's own daemon and session: same claim).

The modes and tables are one union, collected by one Spark action, on one daemon: ``make test`` has little room.
The Connect form of the same union runs in the long lane."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from globald.embedded.admin import TimedRecord
from globald.embedded.oracle import Record, as_of, records
from globald.spark import GlobalTableView
from globald.spark.asof import AsOfRefusedError
from tests.harness import Broker, DaemonProcess
from tests.integration.test_spark import spark  # noqa: F401 - the module-scoped session fixture
from tests.support.spark_connect import connect_mode, connect_server, connect_session  # noqa: F401 - fixtures

pytestmark = [pytest.mark.kafka, pytest.mark.tansu, pytest.mark.spark]

Daemon = Callable[..., DaemonProcess]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR = 3_600_000


def _produce(broker: Broker, topics: list[str], base: int, rng: random.Random) -> tuple[list[bytes], int]:
    """Versions of 30 keys (half with NUL and 0xff bytes, which the history escapes) at times wandering +-5 s around
    1 s steps, 10% tombstones, and a tie (two versions of a key at one time); JSON values (a typed table reads
    them too), the same to each topic. Returns the keys and the tie's time."""
    keys = [b"\x00\xff" + i.to_bytes(2, "big") if i % 2 else b"fx-%02d" % i for i in range(30)]
    produced: list[TimedRecord] = []
    for i in range(500):
        value = None if rng.random() < 0.1 else json.dumps({"v": f"r{i}"}).encode()
        produced.append((rng.choice(keys), value, base + i * 1_000 + rng.randrange(-5_000, 5_000), None))
    tie = base + 123_456
    produced += [(keys[0], b'{"v": "tie-first"}', tie, None), (keys[0], b'{"v": "tie-second"}', tie, None)]
    for t in topics:
        broker.admin.produce(t, produced)
    return keys, tie


def _asks(keys: list[bytes], every: list[Record], since: int, tie: int, rng: random.Random) -> list[tuple]:
    """(id, key, time) rows: exact record times, times in between, the tie, before since, and nulls."""
    stamps = sorted(r.timestamp for r in every)
    rows: list[tuple[int, bytes | None, int | None]] = [(0, keys[0], tie), (1, keys[1], since - 1),
                                                          (2, keys[2], since - HOUR), (3, keys[3], None),
                                                          (4, None, stamps[-1]), (5, b"never-produced", stamps[-1])]
    for i in range(6, 206):
        at = rng.choice(stamps) if i % 2 else rng.randint(stamps[0] - 2_000, stamps[-1] + 2_000)
        rows.append((i, rng.choice(keys), at))
    return rows


def _frame(session: Any, rows: list[tuple]) -> Any:
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType, TimestampType

    schema = StructType([StructField("id", LongType()), StructField("k", BinaryType()),
                         StructField("ts", TimestampType()), StructField("ms", LongType())])
    return session.createDataFrame([(i, k, None if at is None else EPOCH + timedelta(milliseconds=at), at)
                                    for i, k, at in rows], schema)


@pytest.fixture
def versioned(broker: Broker, topic: Callable[..., str], daemon: Daemon,
              tmp_path: Any) -> Iterator[tuple[DaemonProcess, list[tuple], list[Record], int, int, dict[int, int]]]:
    """One daemon mirroring the same records as a raw versioned table (rates), a typed one (trates: JSON values)
    and a plain one (plain), each from its own topic; the asks and the oracle's records."""
    t, typed_t, plain_t = topic(), topic(), topic()
    d = daemon({"plain": plain_t, "rates": t, "trates": typed_t}, start=False, snapshots={"interval_ms": 200})
    (d.config.parent / "v.ddl").write_text("v STRING")
    text = d.config.read_text()
    text = re.sub(r'(name = "rates"\ntopic = "[^"]+"\n)', r'\1history = "30d"\n', text)
    d.config.write_text(text + 'history = "30d"\n[tables.value]\nformat = "json"\nschema = "v.ddl"\n')
    d.start()
    d.wait_running()
    started = int(time.time() * 1000)
    rng = random.Random(4545)
    keys, tie = _produce(broker, [t, typed_t, plain_t], started + HOUR, rng)  # times after the replay: past since
    ends = broker.admin.end_offsets(t)
    assert broker.admin.end_offsets(typed_t) == broker.admin.end_offsets(plain_t) == ends
    since = d.wait_for(lambda doc: doc["tables"]["rates"].get("history", {}).get("since") is not None,
                       what="the history's since")["tables"]["rates"]["history"]["since"]
    every = sorted(records(broker.settings, t, ends), key=lambda r: (r.partition, r.offset))
    # The same records at the same offsets in both topics: one oracle.
    assert sorted(records(broker.settings, typed_t, ends), key=lambda r: (r.partition, r.offset)) == every
    yield d, _asks(keys, every, since, tie, rng), every, since, tie, ends


def _union(session: Any, d: DaemonProcess, df: Any, ends: dict[int, int]) -> tuple[Any, list[GlobalTableView]]:
    """Every as-of form as (id, form, value, timestamp, error) rows, unioned: one action runs them all."""
    from pyspark.sql import functions as F

    raw = GlobalTableView(session, d.config, "rates")
    small = GlobalTableView(session, d.config, "rates", mode="broadcast")
    typed = GlobalTableView(session, d.config, "trates")
    typed_small = GlobalTableView(session, d.config, "trates", mode="broadcast")
    plain = GlobalTableView(session, d.config, "plain")
    views = [raw, small, typed, typed_small, plain]
    for v in views:  # the data's ends, given: the view's default target is the broker's end offsets, wrong on Tansu
        desc = v.refresh(offsets=ends, timeout=120.0)  # waits for the daemon's snapshot at the ends
        assert desc["exact"] is True and desc["offsets"] == {str(p): o for p, o in ends.items()}
    # Both views of a table are in the one union below: their joins' observations are named apart (lineage).
    cols = ["id", "form", "value", "timestamp", "error"]

    def raw_rows(j: Any, form: str) -> Any:
        return j.select("id", F.lit(form).alias("form"), F.col("value").cast("string").alias("value"),
                        "timestamp", F.col("err").alias("error"))

    def typed_rows(j: Any, form: str) -> Any:
        return j.select("id", F.lit(form).alias("form"), F.col("value.v").alias("value"), "timestamp",
                        F.col("err").alias("error"))

    parts = [
        raw_rows(small.join(df, "k", as_of="ms", error_col="err"), "small"),
        typed_rows(typed.join(df, "k", as_of="ts", error_col="err"), "typed"),
        typed_rows(typed_small.join(df, "k", as_of="ms", error_col="err"), "typed-small"),
        df.select("id", F.lit("udf").alias("form"), raw.udf(as_of="ts")("k").alias("r")).select(
            "id", "form", F.col("r.value").cast("string").alias("value"), "r.timestamp", "r.error"),
        df.select("id", F.lit("typed-udf").alias("form"), typed.udf(as_of="ms")("k").alias("r")).select(
            "id", "form", F.col("r.value.v").alias("value"), "r.timestamp", "r.error"),
        _foreach_batch_rows(raw, df, raw_rows),  # the raw snapshot-mode join, as a foreach_batch function runs it
        # The latest-value join of a versioned table is unchanged: checked against the latest fold below.
        *(v.join(df, "k").select("id", F.lit(form).alias("form"), F.col("value").cast("string").alias("value"),
                                 "timestamp", F.lit(None).cast("string").alias("error"))
          for v, form in ((raw, "latest"), (plain, "latest-plain"))),
    ]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.select(*cols), views


def _foreach_batch_rows(view: GlobalTableView, df: Any, rows_of: Callable[[Any, str], Any]) -> Any:
    """What a ``foreach_batch`` function joining its batch as of its rows' times makes of ``df`` as a batch: the
    wrapper runs it against the view's one descriptor (no refresh: the interval is not due), lazily, so the
    union's one action runs it too."""
    made: list[Any] = []
    run = view.foreach_batch(lambda batch, _: made.append(view.join(batch, "k", as_of="ts", error_col="err")),
                             min_interval_s=1e9)
    run(df, 0)
    assert view.refreshes == 1  # the descriptor the union's other forms read
    return rows_of(made[0], "foreach_batch")


def _check(rows: list[Any], asks: list[tuple], every: list[Record], since: int, tie: int) -> None:
    latest: dict[bytes, tuple[bytes, int]] = {}
    for r in sorted(every, key=lambda r: (r.partition, r.offset)):
        if r.value is None:
            latest.pop(r.key, None)
        else:
            latest[r.key] = (r.value, r.timestamp)
    by_id = {i: (k, at) for i, k, at in asks}
    # The fold once an ask (it reads every record), not once a form.
    folds = {i: None if k is None or at is None else as_of(every, k, at) for i, k, at in asks}
    forms = {"small", "typed", "typed-small", "udf", "typed-udf", "foreach_batch", "latest",
             "latest-plain"}
    assert {r["form"] for r in rows} == forms and len(rows) == len(asks) * len(forms)
    for r in rows:
        key, at = by_id[r["id"]]
        got = (r["value"], r["timestamp"])
        if r["form"].startswith("latest"):
            want_latest = latest.get(key) if key is not None else None
            assert got == ((None, None) if want_latest is None else (want_latest[0].decode(), want_latest[1])), r
            continue
        if at is not None and at < since:  # never a guess: null, and the reason
            assert got == (None, None) and "since" in (r["error"] or ""), r
            continue
        want = folds[r["id"]]
        if want is not None and r["form"].startswith("typed"):
            want = (json.loads(want[0])["v"].encode(), want[1])
        assert got == ((None, None) if want is None else (want[0].decode(), want[1])), (r, key, at, want)
        if at is None:
            assert r["error"] == "the as-of time is null", r
        else:
            assert r["error"] is None, r
        if (key, at) == (by_id[0][0], tie):
            assert "tie-second" in (r["value"] or ""), r  # a tie: the later offset


def test_as_of_joins_answer_as_the_as_of_fold_in_every_mode(spark: Any, broker: Broker,  # noqa: F811
                                                           versioned: tuple) -> None:
    d, asks, every, since, tie, ends = versioned
    df = _frame(spark, asks)
    union, views = _union(spark, d, df, ends)
    # The plan: every form is a map over df's own partitions, no Exchange (no shuffle of df, nothing collected).
    plan = union._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan and "MapInArrow" in plan, plan
    _check(union.collect(), asks, every, since, tie)
    assert all(v.fallbacks.value == 0 for v in views)
    with pytest.raises(AsOfRefusedError, match="keeps no versions"):
        GlobalTableView(spark, d.config, "plain").join(df, "k", as_of="ts")
    with pytest.raises(TypeError, match="timestamp or a long"):
        views[0].join(df.withColumn("s", df["id"].cast("string")), "k", as_of="s")
    for v in views:
        v.close()


@pytest.mark.long
def test_as_of_joins_on_spark_connect(connect_session: Any, broker: Broker,  # noqa: F811
                                      versioned: tuple) -> None:
    d, asks, every, since, tie, ends = versioned
    with connect_mode(True):
        df = _frame(connect_session, asks)
        union, views = _union(connect_session, d, df, ends)
        _check(union.collect(), asks, every, since, tie)
        for v in views:
            v.close()
