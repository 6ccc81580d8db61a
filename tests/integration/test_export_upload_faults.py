"""An export's upload to the S3 emulator under faults (issue 40 item 4, export storage): the daemon's storage is a
bucket of moto's S3 server behind the chaos campaign's front (``tests.chaos.s3_faults``), which answers the writes
of the table's files with 503 Slow Down or 500, never answers them, or takes half a body and drops the connection
(a torn write).

What must hold while the fault lasts: the daemon keeps serving (same PID, RUNNING, its store equals the fold), the
failed export is reported (status ``export.failures``, ``last_error``) and tried again on its schedule, and no
manifest in the bucket names a file that is missing or not whole. Once healed, a later export succeeds, every file
its manifest names is whole, and a new host bootstraps from it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ci import require_module
from tests.harness import Broker, DaemonProcess, oracle_at, random_records, values_only

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
FAST = {"interval_ms": 200, "retain": 2}
FAILED_S = 120.0  # the first export tried and reported failed (the SDK retries a 5xx for ~6 s before)
EXPORTED_S = 120.0  # a later export written once healed


@pytest.fixture(scope="module")
def front() -> Iterator[Any]:
    require_module("moto.server", "test")
    from tests.chaos.s3_faults import S3Front

    started = S3Front().start()
    try:
        yield started
    finally:
        started.stop()


def whole_exports(direct: str, table: str) -> list[str]:
    """The ids of the bucket's exports of ``table``, each checked whole (``s3_faults.whole_exports``)."""
    from tests.chaos import s3_faults

    ids, problems = s3_faults.whole_exports(direct, table)
    assert not problems, problems
    return ids


def run_upload_fault(broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path, front: Any,
                     mode: str, monkeypatch: pytest.MonkeyPatch, **export: Any) -> None:
    from tests.chaos import s3_faults

    for k, v in s3_faults.CREDENTIALS.items():
        monkeypatch.setenv(k, v)  # the daemons' environment: credentials from the environment only
    t = topic()
    broker.admin.produce(t, random_records(800, keys=200, seed=461, tombstones=0.1))
    bucket = front.new_bucket()
    front.fail(mode, front.uploads("tbl"), s3_faults.UPLOAD)
    try:
        conf = {"uri": front.uri(bucket), "interval_s": 1, "keep": 2, "bootstrap": False, **export}
        d = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=300, export=conf, state_dir=tmp_path / "state")
        ends = broker.admin.end_offsets(t)
        d.wait_running({"tbl": ends}, timeout=120)
        pid = d.pid
        doc = d.wait_for(lambda s: s["tables"]["tbl"]["export"]["failures"] >= 1, FAILED_S,
                         "the export under the fault reported failed")
        exp = doc["tables"]["tbl"]["export"]
        assert exp["exports"] == 0 and exp["last_error"], exp
        assert front.failed > 0  # the fault met the upload
        assert whole_exports(front.uri(bucket, direct=True), "tbl") == []  # no manifest without its files
        # Tried again on its schedule (interval_s = 1), each failure counted; serving all along.
        d.wait_for(lambda s: s["tables"]["tbl"]["export"]["failures"] >= 2, FAILED_S, "the export tried again")
        assert whole_exports(front.uri(bucket, direct=True), "tbl") == []
        table = d.status()["tables"]["tbl"]
        assert d.pid == pid and d.alive() and table["state"] == "RUNNING"
        assert values_only(d.dump("tbl")) == oracle_at(broker, t, table["offsets"])
    finally:
        front.heal()
    doc = d.wait_for(lambda s: s["tables"]["tbl"]["export"]["exports"] >= 1, EXPORTED_S, "an export once healed")
    ids = whole_exports(front.uri(bucket, direct=True), "tbl")
    assert doc["tables"]["tbl"]["export"]["last"]["export"] in ids and d.pid == pid
    assert d.stop() == 0
    # A new host starts from it, and equals the fold.
    fresh = daemon({"tbl": t}, snapshots=FAST, export={"uri": front.uri(bucket), "interval_s": 0},
                   state_dir=tmp_path / "state-new")
    table = fresh.wait_running({"tbl": ends}, timeout=120)["tables"]["tbl"]
    assert table["origin"]["kind"] == "export" and table["origin"]["export"] in ids, table["origin"]
    assert values_only(fresh.dump("tbl")) == oracle_at(broker, t, table["offsets"])


@pytest.mark.long  # two daemons' starts, each failed export retried by the SDK for ~6 s: ~37 s (5xx)
@pytest.mark.parametrize("mode", ["5xx", "cut"])  # 500 as 503 (the SDK retries both): the campaign has it
def test_an_upload_refused_or_torn_is_reported_retried_and_never_named(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path, front: Any, mode: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_upload_fault(broker, topic, daemon, tmp_path, front, mode, monkeypatch)


@pytest.mark.long  # as above
def test_an_upload_the_storage_never_answers_is_given_up_within_its_bound(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path, front: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage that takes the upload and never answers held the export worker without end (the SDK retries its
    timeouts; measured: still blocked after 40 s), every table's exports with it, with nothing reported: status
    said busy, failures 0. Past ``upload_timeout_s`` the export is given up, counted failed, tried again."""
    run_upload_fault(broker, topic, daemon, tmp_path, front, "silent", monkeypatch, upload_timeout_s=5)
