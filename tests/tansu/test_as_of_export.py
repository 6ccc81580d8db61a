"""A versioned table's history across an export (issue 45, "Beyond the compacted log"), end to end on the modern
broker (the one whose records carry timestamps): host A exports the table, host B bootstraps from the export and
keeps A's ``since``, its versions below the export's offsets never read from the topic, and answers as the as-of
fold of every record produced at times from ``since`` on."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.admin import TimedRecord
from globald.embedded.oracle import records
from globald.export.bootstrap import Bootstrap, Install
from globald.export.target import Target
from globald.settings.config import parse
from globald.snapshot.reader import manifests_of
from tests.harness import Broker, DaemonProcess, globald
from tests.tansu.data import expected_table, timed_records, wait_for_table
from tests.tansu.test_as_of import _check_as_of

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]
LAG_MS = 86_400_000  # the topic's min.compaction.lag.ms: an export younger than it is tailed without a gap


def _versioned(d: DaemonProcess, window: str = "30d") -> DaemonProcess:
    d.config.write_text(d.config.read_text() + f'history = "{window}"\n')  # the last [[tables]] entry's
    return d.start()


def _rates(doc: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = doc["tables"].get("rates") or {}
    return table


def test_a_host_bootstrapped_from_an_export_keeps_its_since_and_answers_as_the_fold(
        broker: Broker, daemon: Daemon, tmp_path: Path) -> None:
    t = f"asofx{time.monotonic_ns()}"
    broker.admin.create(t, config={"min.compaction.lag.ms": str(LAG_MS)})
    root = tmp_path / "exports"
    export = {"uri": root.as_uri(), "interval_s": 0, "keep": 2}
    a = _versioned(daemon({"rates": t}, start=False, snapshots={"interval_ms": 200}, metadata_refresh_ms=300,
                          export=export, state_dir=tmp_path / "state-a"))
    now = int(time.time() * 1000)
    # Record times from 5 minutes back wandering forward (out of order by up to 5 s), tombstones, on 3 partitions.
    first: list[TimedRecord] = list(timed_records(300, keys=30, seed=451, base_ts=now - 300_000, null_keys=0.0))
    broker.admin.produce(t, first)
    wait_for_table(a, "rates", expected_table(first))
    r = globald("export", "--config", str(a.config), "--table", "rates", "--json", "--timeout", "120", timeout=180)
    assert r.returncode == 0, f"{r.stderr}\n{a.tail()}"
    exported = json.loads(Target(root.as_uri()).read("rates", "exports", f"{json.loads(r.stdout)['export']}.json",
                                                     limit=1 << 24))
    # The manifest says the export carries the history: the window, and the since A's store proved at the
    # export's offsets, which the exported snapshot's own manifest reports too.
    hist = exported["history"]
    assert hist["window_ms"] == 30 * 86_400_000 and hist["untimed"] is None, hist
    since = hist["since"]
    assert isinstance(since, int) and since <= now - 300_000 - 5_000, hist  # before every record's time
    snap = next(m for m in manifests_of(a.state_dir, "rates") if m.id == exported["snapshot"])
    assert (snap.since, snap.history_ms) == (since, hist["window_ms"])
    exported_records = sum(exported["offsets"].values())
    assert exported_records > 0, exported

    # The tail after the export: new versions of the same keys, some at times before the exported ones.
    tail: list[TimedRecord] = list(timed_records(200, keys=30, seed=452, base_ts=now - 200_000, null_keys=0.0))
    for p in range(3):  # each alone in its batch: Tansu then reports each partition's end right
        tail.append((b"end-%d" % p, b"end", now, None))
    broker.admin.produce(t, tail[:-3])
    for p in range(3):
        broker.admin.produce(t, [tail[-3 + p]], partition=p)
    a.stop()

    # A host declaring another window refuses the export, with its reason, before it asks the broker or downloads.
    c = parse({"state_dir": str(tmp_path / "state-c"), "kafka": dict(broker.settings), "export": export,
               "tables": [{"name": "rates", "topic": t, "history": "7d"}]})
    refused = Bootstrap(c, c.tables[0], Target(root.as_uri()), threading.Event(), Install()).run()
    assert refused.kind == "topic" and refused.bytes_downloaded == 0, refused
    assert f"export {exported['id']}: its history was kept under a window of" in (refused.fallback or ""), refused

    b = _versioned(daemon({"rates": t}, start=False, snapshots={"interval_ms": 200}, metadata_refresh_ms=300,
                          export=export, state_dir=tmp_path / "state-b"))
    wait_for_table(b, "rates", expected_table(first + tail), timeout=120)
    table = _rates(b.wait_for(lambda s: (_rates(s).get("history") or {}).get("since") is not None
                              and _rates(s).get("state") == "RUNNING", timeout=120, what="B's history"))
    origin = table["origin"]
    assert origin["kind"] == "export" and origin["export"] == exported["id"], origin
    assert origin["history"] == {"since": since, "exported_since": since, "moved": None}, origin
    # B read from the topic only what follows the export's offsets: the versions below came from the export.
    every = records(broker.settings, t, broker.admin.end_offsets(t))
    assert len(every) == len(first) + len(tail)
    assert origin["offsets"] == exported["offsets"] and origin["tail"] == len(every) - exported_records, origin
    assert table["history"]["since"] == since and table["history"]["refused"] is None, table["history"]
    _check_as_of(b, every, since, random.Random(45))
