"""As-of joins in Spark (issue 45) with real PySpark, the real daemon and a modern-protocol broker (the only one here
whose records carry timestamps): ``view.join(df, on, as_of=...)`` and ``view.udf(as_of=...)`` answer every row as
the as-of fold of the topic's records (``globald.embedded.oracle.as_of``) at that row's own time, on raw and typed
tables (a typed key too: an Avro long joined on a long column, each integer written under two byte strings, as the
fold over the decoded key), in snapshot and small-table modes, with out-of-order timestamps, ties, tombstones, NUL
bytes in keys and times before ``since`` (null, and a reason; never a guess), with no shuffle of the joined
DataFrame. The latest-value join answers as the latest fold, its timestamp column each value's record CreateTime,
on a plain table and on a versioned one alike (this replaces test_spark_timestamps's own daemon and session: same
claim).

The modes and tables are one union, collected by one Spark action, on one daemon: ``make test`` has little room.
The Connect form of the same union runs in the long lane."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
from tests.unit.test_spark_asof_keys import encodings

pytestmark = [pytest.mark.kafka, pytest.mark.tansu, pytest.mark.spark]

Daemon = Callable[..., DaemonProcess]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR = 3_600_000
KEYS = [b"\x00\xff" + i.to_bytes(2, "big") if i % 2 else b"fx-%02d" % i for i in range(30)]
ABSENT = 99  # the typed-key table's number of b"never-produced"


def number(key: bytes | None) -> int | None:
    """The typed-key table's key (an Avro long) for a raw table's key: -15 to 14 (0 stored as b"\x00")."""
    return None if key is None else KEYS.index(key) - 15 if key in KEYS else ABSENT


def _keyed(produced: list[TimedRecord]) -> list[TimedRecord]:
    """The same records keyed by ``number`` as Avro longs, every third (and the tie's second) written with an
    overlong varint: one decoded key stored under two byte strings, the overlong one later in key order."""
    out: list[TimedRecord] = []
    for i, (key, value, ts, headers) in enumerate(produced):
        plain, overlong = encodings(number(key))  # type: ignore[arg-type]
        out.append((overlong if i % 3 == 0 or i == len(produced) - 1 else plain, value, ts, headers))
    if len(out) > 1:
        out[-2] = (encodings(number(produced[-2][0]))[0], *out[-2][1:])  # type: ignore[arg-type]
    return out


def _produce(broker: Broker, topics: list[str], keyed: str, base: int, rng: random.Random
             ) -> tuple[list[bytes], int]:
    """Versions of 30 keys (half with NUL and 0xff bytes, which the history escapes) at times wandering +-5 s around
    1 s steps, 10% tombstones, and a tie (two versions of a key at one time); JSON values (a typed table reads
    them too), the same to each topic, and to ``keyed`` under typed keys (``_keyed``). Returns the keys and the
    tie's time."""
    keys = KEYS
    produced: list[TimedRecord] = []
    for i in range(500):
        value = None if rng.random() < 0.1 else json.dumps({"v": f"r{i}"}).encode()
        produced.append((rng.choice(keys), value, base + i * 1_000 + rng.randrange(-5_000, 5_000), None))
    tie = base + 123_456
    produced += [(keys[0], b'{"v": "tie-first"}', tie, None), (keys[0], b'{"v": "tie-second"}', tie, None)]
    for t in topics:
        broker.admin.produce(t, produced)
    broker.admin.produce(keyed, _keyed(produced))
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
                         StructField("ts", TimestampType()), StructField("ms", LongType()),
                         StructField("n", LongType())])
    return session.createDataFrame([(i, k, None if at is None else EPOCH + timedelta(milliseconds=at), at,
                                     number(k)) for i, k, at in rows], schema)


@dataclass
class Versioned:
    d: DaemonProcess
    asks: list[tuple]
    every: list[Record]
    keyed: list[Record]  # ktrates' records, their keys decoded (canonical form: the integer's decimal text)
    since: dict[str, int]
    tie: int
    ends: dict[int, int]
    keyed_ends: dict[int, int]


@pytest.fixture
def versioned(broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Any) -> Iterator[Versioned]:
    """One daemon mirroring the same records as a raw versioned table (rates), a typed one (trates: JSON values),
    one whose key is typed too (ktrates: Avro longs, ``_keyed``) and a plain one (plain), each from its own topic;
    the asks and the oracle's records."""
    # One partition for the typed keys: a key's two encodings would land in two, whose offsets order no tie.
    t, typed_t, plain_t, keyed_t = topic(), topic(), topic(), topic(partitions=1)
    d = daemon({"plain": plain_t, "rates": t, "trates": typed_t, "ktrates": keyed_t}, start=False,
               snapshots={"interval_ms": 200})
    (d.config.parent / "v.ddl").write_text("v STRING")
    (d.config.parent / "long.avsc").write_text('"long"')
    value = '[tables.value]\nformat = "json"\nschema = "v.ddl"\n'
    text = d.config.read_text()
    for name, extra in (("rates", ""), ("trates", value),
                        ("ktrates", '[tables.key]\nformat = "avro"\nschema = "long.avsc"\n' + value)):
        text = re.sub(rf'(name = "{name}"\ntopic = "[^"]+"\n)', r'\1history = "30d"\n' + extra, text)
    d.config.write_text(text)
    d.start()
    d.wait_running()
    started = int(time.time() * 1000)
    rng = random.Random(4545)
    keys, tie = _produce(broker, [t, typed_t, plain_t], keyed_t, started + HOUR, rng)  # after the replay: past since
    ends = broker.admin.end_offsets(t)
    assert broker.admin.end_offsets(typed_t) == broker.admin.end_offsets(plain_t) == ends
    keyed_ends = broker.admin.end_offsets(keyed_t)
    versioned_tables = ("rates", "trates", "ktrates")
    doc = d.wait_for(lambda doc: all(doc["tables"][n].get("history", {}).get("since") is not None
                                     for n in versioned_tables), what="the histories' since")
    since = {n: doc["tables"][n]["history"]["since"] for n in versioned_tables}
    every = sorted(records(broker.settings, t, ends), key=lambda r: (r.partition, r.offset))
    # The same records at the same offsets in both topics: one oracle.
    assert sorted(records(broker.settings, typed_t, ends), key=lambda r: (r.partition, r.offset)) == every
    keyed = _decoded(records(broker.settings, keyed_t, keyed_ends))
    yield Versioned(d, _asks(keys, every, since["rates"], tie, rng), every, keyed, since, tie, ends, keyed_ends)


def _decoded(keyed: list[Record]) -> list[Record]:
    """``keyed`` with each key's canonical form. The oracle's fold orders a tie by offset, the typed-key as-of
    search between two encodings by key order (docs/as-of.md): the data is checked to make them agree."""
    canon = {e: str(n).encode() for n in range(-15, 15) for e in encodings(n)}
    out = sorted((Record(canon[r.key], r.value, r.timestamp, r.partition, r.offset) for r in keyed),
                 key=lambda r: (r.partition, r.offset))
    by_time: dict[tuple[bytes, int], list[Record]] = {}
    for raw, r in zip(sorted(keyed, key=lambda r: (r.partition, r.offset)), out, strict=True):
        by_time.setdefault((r.key, r.timestamp), []).append(Record(raw.key, r.value, r.timestamp, r.partition,
                                                                   r.offset))
    for tied in by_time.values():
        assert max(tied, key=lambda r: r.offset) == max(tied, key=lambda r: (r.key, r.offset)), tied
    return out


def _union(session: Any, v: Versioned, df: Any) -> tuple[Any, list[GlobalTableView]]:
    """Every as-of form as (id, form, value, timestamp, error) rows, unioned: one action runs them all."""
    from pyspark.sql import functions as F

    d = v.d
    raw = GlobalTableView(session, d.config, "rates")
    small = GlobalTableView(session, d.config, "rates", mode="broadcast")
    typed = GlobalTableView(session, d.config, "trates")
    typed_small = GlobalTableView(session, d.config, "trates", mode="broadcast")
    plain = GlobalTableView(session, d.config, "plain")
    keyed = GlobalTableView(session, d.config, "ktrates")
    keyed_small = GlobalTableView(session, d.config, "ktrates", mode="broadcast")
    views = [raw, small, typed, typed_small, plain, keyed, keyed_small]
    for view in views:  # the data's ends, given: the view's default target is the broker's end offsets, wrong on Tansu
        ends = v.keyed_ends if view.table.name == "ktrates" else v.ends
        desc = view.refresh(offsets=ends, timeout=120.0)  # waits for the daemon's snapshot at the ends
        assert desc["exact"] is True and desc["offsets"] == {str(p): o for p, o in ends.items()}
    # Both views of a table are in the one union below: their joins' observations are named apart (lineage).
    cols = ["id", "form", "value", "timestamp", "error"]

    def raw_rows(j: Any, form: str) -> Any:
        return j.select("id", F.lit(form).alias("form"), F.col("value").cast("string").alias("value"),
                        "timestamp", F.col("err").alias("error"))

    def typed_rows(j: Any, form: str) -> Any:
        return j.select("id", F.lit(form).alias("form"), F.col("value.v").alias("value"), "timestamp",
                        F.col("err").alias("error"))

    def udf_rows(r: Any, form: str, value: Any) -> Any:
        return df.select("id", F.lit(form).alias("form"), r.alias("r")).select(
            "id", "form", value.alias("value"), "r.timestamp", "r.error")

    parts = [
        raw_rows(small.join(df, "k", as_of="ms", error_col="err"), "small"),
        typed_rows(typed.join(df, "k", as_of="ts", error_col="err"), "typed"),
        typed_rows(typed_small.join(df, "k", as_of="ms", error_col="err"), "typed-small"),
        udf_rows(raw.udf(as_of="ts")("k"), "udf", F.col("r.value").cast("string")),
        udf_rows(typed.udf(as_of="ms")("k"), "typed-udf", F.col("r.value.v")),
        _foreach_batch_rows(raw, df, "k", raw_rows, "foreach_batch"),  # the raw snapshot-mode join, in foreach_batch
        # A typed key, joined on a long column: in foreach_batch (snapshot mode), small-table mode and the UDF.
        _foreach_batch_rows(keyed, df, "n", typed_rows, "keyed"),
        typed_rows(keyed_small.join(df, "n", as_of="ms", error_col="err"), "keyed-small"),
        udf_rows(keyed.udf(as_of="ts")("n"), "keyed-udf", F.col("r.value.v")),
        # The latest-value join of a versioned table is unchanged: checked against the latest fold below.
        *(view.join(df, "k").select("id", F.lit(form).alias("form"), F.col("value").cast("string").alias("value"),
                                    "timestamp", F.lit(None).cast("string").alias("error"))
          for view, form in ((raw, "latest"), (plain, "latest-plain"))),
    ]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.select(*cols), views


def _foreach_batch_rows(view: GlobalTableView, df: Any, on: str, rows_of: Callable[[Any, str], Any],
                        form: str) -> Any:
    """What a ``foreach_batch`` function joining its batch as of its rows' times makes of ``df`` as a batch: the
    wrapper runs it against the view's one descriptor (no refresh: the interval is not due), lazily, so the
    union's one action runs it too."""
    made: list[Any] = []
    run = view.foreach_batch(lambda batch, _: made.append(view.join(batch, on, as_of="ts", error_col="err")),
                             min_interval_s=1e9)
    run(df, 0)
    assert view.refreshes == 1  # the descriptor the union's other forms read
    return rows_of(made[0], form)


def _check(rows: list[Any], v: Versioned) -> None:
    latest: dict[bytes, tuple[bytes, int]] = {}
    for r in sorted(v.every, key=lambda r: (r.partition, r.offset)):
        if r.value is None:
            latest.pop(r.key, None)
        else:
            latest[r.key] = (r.value, r.timestamp)
    by_id = {i: (k, at) for i, k, at in v.asks}
    # The fold once an ask (it reads every record), not once a form; a typed key's over its decoded form.
    folds = {i: None if k is None or at is None else as_of(v.every, k, at) for i, k, at in v.asks}
    keyed_folds = {i: None if k is None or at is None else as_of(v.keyed, str(number(k)).encode(), at)
                   for i, k, at in v.asks}
    forms = {"small", "typed", "typed-small", "udf", "typed-udf", "foreach_batch", "keyed", "keyed-small",
             "keyed-udf", "latest", "latest-plain"}
    assert {r["form"] for r in rows} == forms and len(rows) == len(v.asks) * len(forms)
    for r in rows:
        form = r["form"]
        key, at = by_id[r["id"]]
        got = (r["value"], r["timestamp"])
        if form.startswith("latest"):
            want_latest = latest.get(key) if key is not None else None
            assert got == ((None, None) if want_latest is None else (want_latest[0].decode(), want_latest[1])), r
            continue
        since = v.since["ktrates" if form.startswith("keyed") else "trates" if form.startswith("typed") else "rates"]
        if at is not None and at < since:  # never a guess: null, and the reason
            assert got == (None, None) and "since" in (r["error"] or ""), r
            continue
        want = (keyed_folds if form.startswith("keyed") else folds)[r["id"]]
        if want is not None and form.startswith(("typed", "keyed")):
            want = (json.loads(want[0])["v"].encode(), want[1])
        assert got == ((None, None) if want is None else (want[0].decode(), want[1])), (r, key, at, want)
        if at is None:
            assert r["error"] == "the as-of time is null", r
        else:
            assert r["error"] is None, r
        if (key, at) == (by_id[0][0], v.tie):
            assert "tie-second" in (r["value"] or ""), r  # a tie: the later offset (of a typed key: key too)


def _check_get(v: Versioned, capsys: pytest.CaptureFixture[str]) -> None:
    """``globald get --decode KEY --as-of TIME`` of the typed key answers the same fold: once by the command, then
    at the first 30 asks from since on (the tie among them) as it reads. In this process: a CLI process costs
    ~0.5 s of CPU to start, and each ask decodes every stored key."""
    from globald.cli.main import main
    from globald.cli.read import _find_decoded
    from globald.cli.readview import open_view
    from globald.settings.config import load
    from globald.spark.typed import decoders

    since = v.since["ktrates"]
    asks = [(str(number(k)).encode(), at) for _, k, at in v.asks if k is not None and at is not None and at >= since]
    text, at = next((t, at) for t, at in asks if as_of(v.keyed, t, at) is not None)
    capsys.readouterr()
    code = main(["get", "--config", str(v.d.config), "--table", "ktrates", "--decode", "--as-of", str(at), "--json",
                 text.decode()])
    out, err = capsys.readouterr()
    want = as_of(v.keyed, text, at)
    assert code == 0 and want is not None, err
    assert (json.loads(out)["value"], json.loads(out)["timestamp"]) == (json.loads(want[0]), want[1])
    key_decoder = decoders(str(v.d.config), "ktrates")[0]
    with open_view(load(v.d.config), "ktrates") as view:
        for text, at in asks[:30]:
            assert _find_decoded(view, text, key_decoder, at)[1] == as_of(v.keyed, text, at), (text, at)


def test_as_of_joins_answer_as_the_as_of_fold_in_every_mode(spark: Any, broker: Broker,  # noqa: F811
                                                           versioned: Versioned,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    df = _frame(spark, versioned.asks)
    union, views = _union(spark, versioned, df)
    # The plan: every form is a map over df's own partitions, no Exchange (no shuffle of df, nothing collected).
    plan = union._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan and "MapInArrow" in plan, plan
    _check(union.collect(), versioned)
    assert all(v.fallbacks.value == 0 for v in views)
    _check_get(versioned, capsys)
    with pytest.raises(AsOfRefusedError, match="keeps no versions"):
        GlobalTableView(spark, versioned.d.config, "plain").join(df, "k", as_of="ts")
    with pytest.raises(TypeError, match="timestamp or a long"):
        views[0].join(df.withColumn("s", df["id"].cast("string")), "k", as_of="s")
    for v in views:
        v.close()


@pytest.mark.long
def test_as_of_joins_on_spark_connect(connect_session: Any, broker: Broker,  # noqa: F811
                                      versioned: Versioned) -> None:
    with connect_mode(True):
        df = _frame(connect_session, versioned.asks)
        union, views = _union(connect_session, versioned, df)
        _check(union.collect(), versioned)
        for v in views:
            v.close()
