"""A typed table's Avro reader schema changed by ``globald reload`` while a real PySpark session (local mode) holds
a view of the previous version (issue 35 item 2): the held view keeps reading that version with the old schema,
never a mix, and after ``refresh()`` the session reads the new version the daemon published with the new schema.
Every value equals fastavro's decode of the oracle fold at the descriptor's offsets with the schema of the view."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.common import exitcodes
from globald.spark import GlobalTableView
from tests.harness import Broker, DaemonProcess, oracle_at
from tests.integration.test_reload import edit, reload
from tests.integration.test_reload_typed import decoded_with, reader_v2
from tests.integration.test_spark import keys_df, spark
from tests.integration.test_spark_typed import as_key, rows_of
from tests.integration.test_typed import READER, SECTION, records
from tests.unit.typed_fixtures import FIXTURES

__all__ = ["spark"]  # a fixture, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

Daemon = Callable[..., DaemonProcess]


def joined(view: Any, spark: Any, oracle: dict[bytes, bytes], reader: Any) -> list[dict[str, Any]]:
    """The view's join of every key of ``oracle`` (and one absent), each row checked against ``reader``'s decode."""
    keys: list[bytes | None] = [*sorted(oracle), b"cust-absent"]
    # One task a stage, so the one Python worker that decoded the held version is the one reused after the reload:
    # a worker started after it cannot rebuild the older declaration and fails the held view's task by design
    # (TypedDeclarationError, docs/typed-tables.md), which would test Spark's scheduling, not the reload.
    rows = rows_of(view.join(keys_df(spark, keys).coalesce(1), "k", error_col="err"))
    assert len(rows) == len(keys)
    for r in rows:
        k = as_key(r["k"])
        want = decoded_with(oracle[k], reader) if k in oracle else None
        assert r["value"] == want, (r["k"], r["value"], want)
        assert (r["err"] is not None) == (k in oracle and want is None), r
    return rows


@pytest.mark.long  # a Spark session, a typed restore, a reload and a new version decoded: ~40 s
def test_a_reader_schema_reloaded_under_a_held_spark_view(spark: Any, broker: Broker, topic: Callable[..., str],
                                                          daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, records(600, keys=150, seed=64))
    shutil.copytree(FIXTURES, tmp_path / "schemas", dirs_exist_ok=True)
    (tmp_path / "schemas" / "reader_v2.avsc").write_text(json.dumps(reader_v2()))
    d = daemon({"cust": t}, start=False, snapshots={"interval_ms": 500})
    d.config.write_text(d.config.read_text() + SECTION)
    d.start()
    d.wait_running({"cust": broker.admin.end_offsets(t)})

    held = GlobalTableView(spark, d.config, "cust")
    before = held.refresh()
    old = oracle_at(broker, t, before["offsets"])
    first = joined(held, spark, old, READER)
    assert {"tags", "balance"} <= set(next(r["value"] for r in first if r["value"] is not None))

    edit(d.config, r'^schema = "schemas/customer_reader.avsc"$', 'schema = "schemas/reader_v2.avsc"')
    r = reload(d)
    assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
    # The daemon publishes a new version though no record arrived: the first one of the new schema.
    doc = d.wait_for(lambda s: s["tables"]["cust"]["snapshot"]["current"] != before["snapshot"], timeout=120,
                     what="a new version after the reload")
    assert doc["tables"]["cust"]["state"] == "RUNNING"

    # The held view: the version it refreshed, the schema it refreshed with, whatever the config says now.
    assert joined(held, spark, old, READER) == first

    after = held.refresh()
    assert after["snapshot"] != before["snapshot"] and after["decoder"] != before["decoder"]
    new = oracle_at(broker, t, after["offsets"])
    rows = joined(held, spark, new, reader_v2())
    values = [r["value"] for r in rows if r["value"] is not None]
    assert values and all(set(v) == {"id", "name", "tier", "visits", "loyalty"} and v["loyalty"] == 7
                          for v in values)
    held.close()
