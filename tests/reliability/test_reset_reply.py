"""``globald reset`` against a running daemon answers once the wipe ran, or with its error (issue 21, item 5).

It used to answer ``ok`` as soon as the daemon had queued the request, before its loop tried the wipe: a wipe that
then failed was reported to nobody. Here the table's directory is a read-only mount when the reset comes, so the
wipe can neither delete the store nor open it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from globald.common import exitcodes
from globald.store.names import table_dir
from tests.harness import Broker, DaemonProcess, globald, oracle_at, random_records, values_only
from tests.reliability.checks import check_store, same_process
from tests.reliability.ledger import FaultRow
from tests.reliability.test_store_faults import read_only

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def test_reset_answers_after_the_wipe_and_reports_a_failed_one(broker: Broker, topic: Callable[..., str],
                                                               daemon: Daemon,
                                                               fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("globald reset while the table's directory is a read-only mount (the wipe fails)",
                "reset exits 5 with the wipe's error, daemon recovers; a working reset answers after the wipe")
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=500, seed=120))
    ends = broker.admin.end_offsets(t)
    d = daemon({"tbl": t})
    pid = d.pid
    d.wait_running({"tbl": ends})
    folder = table_dir(d.state_dir, "tbl")

    with read_only(folder):
        r = globald("reset", "--config", str(d.config), "--table", "tbl", "--yes", "--json")
        row.injected += 1
    assert r.returncode == exitcodes.FAILED, f"a failed wipe answered ok: {r.stdout}{r.stderr}; log:\n{d.tail()}"
    assert "did not reset table tbl" in r.stderr and "Read-only file system" in r.stderr, r.stderr

    # The daemon rides it out like any store fault: the store it could not touch is reopened as it was.
    d.wait_for(lambda s: s["state"] == "RUNNING" and not s.get("degraded")
               and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
               timeout=120, what="recovered after the failed wipe")
    row.pid_changes += same_process(d, pid)
    check = check_store(broker, d.state_dir, "tbl", t)
    assert row.diverged(check.divergences) == 0 and check.readable, check

    # A reset that works answers once the store is gone: a file the wipe deletes is already gone at the answer.
    marker = folder / "deleted-by-the-wipe"
    marker.write_text("x")
    wipes = d.status()["tables"]["tbl"]["wipes"]
    r = globald("reset", "--config", str(d.config), "--table", "tbl", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"by": "daemon", "had_store": True, "pid": pid, "table": "tbl"}
    assert not marker.exists(), "reset answered before the daemon wiped the table"
    doc = d.wait_for(lambda s: s["tables"]["tbl"]["wipes"] == wipes + 1 and s["state"] == "RUNNING"
                     and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
                     timeout=120, what="rebuilt after the reset")
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, doc["tables"]["tbl"]["offsets"])
    assert d.stop() == 0
