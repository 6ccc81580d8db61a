"""A Spark job on a host that just bootstrapped from an export reads the same version as a host that replayed the
topic (issue 34, Tests), with real PySpark (local mode), two real daemons, a real broker and real RocksDB.

Host A restores from the topic and exports to a local directory (``file://``); more records follow (the tail);
host B starts with an empty state_dir, installs A's export and tails the topic. A ``GlobalTableView`` on each
host's config, refreshed at the same offsets, names a snapshot at those offsets on each, and the same job joined
through either view returns the same rows: the oracle fold at those offsets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.spark import GlobalTableView
from tests.harness import Broker, DaemonProcess, oracle_at, random_records
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.integration.test_export import FAST, REFRESH_MS, _export_at, _export_conf, _exporter
from tests.integration.test_spark import check_rows, keys_df, spark

__all__ = ["spark"]  # a fixture, used by name

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.long]  # two daemons and a Spark session: > 30 s

Daemon = Callable[..., DaemonProcess]


def _read(view: GlobalTableView, spark: Any, keys: list[bytes | None], ends: dict[int, int]) -> tuple[dict, list]:
    desc = view.refresh(ends)
    rows = view.join(keys_df(spark, keys), "k", snapshot_col="snap").collect()
    assert {r["snap"] for r in rows} == {desc["snapshot"]}, desc  # one version per job
    return desc, sorted(((r["k"], r["value"] and bytes(r["value"]), r["timestamp"]) for r in rows),
                        key=lambda r: (r[0] is None, r[0] or ""))


def test_a_job_on_a_bootstrapped_host_reads_the_version_a_replaying_host_reads(
        spark: Any, broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, root, replayed = _exporter(daemon, broker, topic, tmp_path, 4_000, 700, 3401)
    exported = _export_at(replayed, root, broker.admin.end_offsets(t))
    broker.admin.produce(t, random_records(600, keys=900, seed=3402, tombstones=0.1))  # the tail after the export
    ends = broker.admin.end_offsets(t)

    bootstrapped = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=REFRESH_MS,
                          export=_export_conf(root), state_dir=tmp_path / "state-bootstrapped")
    doc = bootstrapped.wait_running({"tbl": ends}, timeout=120)
    origin = doc["tables"]["tbl"]["origin"]
    assert origin["kind"] == "export" and origin["export"] == exported["export"] and origin["tail"] >= 600, origin

    want = {str(p): o for p, o in ends.items()}
    for d in (replayed, bootstrapped):
        wait_snapshot_at(d, "tbl", ends, timeout=120)
    keys: list[bytes | None] = [b"key-%06d" % i for i in range(950)] + [None]
    views = [GlobalTableView(spark, d.config, "tbl") for d in (replayed, bootstrapped)]
    try:
        (desc_a, rows_a), (desc_b, rows_b) = (_read(v, spark, keys, ends) for v in views)
    finally:
        for v in views:
            v.close()
    assert desc_a["offsets"] == desc_b["offsets"] == want and desc_a["exact"] is desc_b["exact"] is True
    assert rows_a == rows_b and len(rows_a) == len(keys)
    expected = oracle_at(broker, t, want)
    assert 0 < check_rows([{"k": k, "value": v, "timestamp": ts} for k, v, ts in rows_b], expected) < len(keys)
