"""The Spark join's timestamp column carries each value's record CreateTime (real PySpark, local mode), for binary
keys too; absent and deleted keys give nulls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from globald.spark import GlobalTableView
from tests.harness import Broker, DaemonProcess
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.integration.test_spark import keys_df, spark  # noqa: F401 - the module-scoped session fixture
from tests.tansu.data import expected_table, timed_records

pytestmark = [pytest.mark.kafka, pytest.mark.tansu, pytest.mark.spark]


def test_join_timestamp_column_is_the_create_time(spark: Any, broker: Broker,  # noqa: F811 - the fixture
                                                  topic: Callable[..., str],
                                                  daemon: Callable[..., DaemonProcess]) -> None:
    t = topic()
    records = timed_records(2_000, keys=300, seed=180)
    broker.admin.produce(t, records)
    want = expected_table(records)
    deleted = {k for k, *_ in records if k is not None and k not in want}
    assert deleted
    d = daemon({"tbl": t}, snapshots={"interval_ms": 200, "retain": 3})
    ends = broker.admin.end_offsets(t)
    wait_snapshot_at(d, "tbl", ends)
    view = GlobalTableView(spark, d.config, "tbl")
    # The data's ends, given explicitly: the view's default target is the broker's end offsets, wrong on Tansu.
    desc = view.refresh(offsets=ends)
    assert desc["exact"] is True and desc["offsets"] == {str(p): o for p, o in ends.items()}
    keys: list[bytes | None] = [*sorted(want), *sorted(deleted), b"never-produced", None]
    rows = view.join(keys_df(spark, keys, binary=True), "k").collect()
    assert len(rows) == len(keys)
    for r in rows:
        k = bytes(r["k"]) if r["k"] is not None else None
        value, ts = want.get(k, (None, None)) if k is not None else (None, None)
        assert (bytes(r["value"]) if r["value"] is not None else None) == value, r
        assert r["timestamp"] == ts, r
    assert view.fallbacks.value == 0
    view.close()
