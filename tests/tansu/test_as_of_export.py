"""A versioned table's history across an export (issue 45, "Beyond the compacted log"), end to end on the modern
broker (the one whose records carry timestamps): host A exports the table, host B bootstraps from the export and
keeps A's ``since``, its versions below the export's offsets never read from the topic, and answers as the as-of
fold of every record produced at times from ``since`` on. Replaced by a reload, its emptied store is refilled from
an export only under its own window, and keeps the export's ``since`` then."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.admin import TimedRecord
from globald.embedded.oracle import Record, records
from globald.export.target import Target
from globald.snapshot.reader import manifests_of
from tests.harness import Broker, DaemonProcess, globald
from tests.tansu.data import expected_table, timed_records, wait_for_table
from tests.tansu.test_as_of import _check_as_of

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]
DAY = 86_400_000
WINDOWS = {"7d": 7 * DAY, "30d": 30 * DAY}
LAG_MS = DAY  # the topic's min.compaction.lag.ms: an export younger than it is tailed without a gap


@dataclass
class Exported:
    topic: str
    export: dict[str, Any]  # the [export] section
    manifest: dict[str, Any]  # the export's manifest, as stored
    since: int  # the since it carries
    every: list[Record]  # every record of the topic: the export's and the tail after it


def _versioned(d: DaemonProcess, window: str = "30d") -> DaemonProcess:
    d.config.write_text(d.config.read_text() + f'history = "{window}"\n')  # the last [[tables]] entry's
    return d.start()


def _rates(doc: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = doc["tables"].get("rates") or {}
    return table


def _exported(broker: Broker, daemon: Daemon, tmp_path: Path) -> Exported:
    """Host A's export of versioned table ``rates`` (30 days), then a tail produced after it; A stopped."""
    t = f"asofx{time.monotonic_ns()}"
    broker.admin.create(t, config={"min.compaction.lag.ms": str(LAG_MS)})
    root = tmp_path / "exports"
    export = {"uri": root.as_uri(), "interval_s": 0, "keep": 3}
    a = _versioned(daemon({"rates": t}, start=False, snapshots={"interval_ms": 200}, metadata_refresh_ms=300,
                          export=export, state_dir=tmp_path / "state-a"))
    now = int(time.time() * 1000)
    # Record times from 5 minutes back wandering forward (out of order by up to 5 s), tombstones, on 3 partitions.
    first: list[TimedRecord] = list(timed_records(300, keys=30, seed=451, base_ts=now - 300_000, null_keys=0.0))
    broker.admin.produce(t, first)
    a.wait_running()
    # Exported until the export holds every record produced so far: `globald export` exports the newest snapshot
    # an identity check vouched for, which may be one from before them (checks every metadata_refresh_ms).
    deadline = time.monotonic() + 120
    while True:
        r = globald("export", "--config", str(a.config), "--table", "rates", "--json", "--timeout", "120",
                    timeout=180)
        assert r.returncode == 0, f"{r.stderr}\n{a.tail()}"
        manifest = json.loads(Target(root.as_uri()).read("rates", "exports", f"{json.loads(r.stdout)['export']}.json",
                                                         limit=1 << 24))
        if sum(manifest["offsets"].values()) == len(first):
            break
        assert time.monotonic() < deadline, f"no export of all {len(first)} records; last {manifest['offsets']}"
        time.sleep(0.5)
    # The manifest says the export carries the history: the window, and the since A's store proved at the
    # export's offsets, which the exported snapshot's own manifest reports too.
    hist = manifest["history"]
    assert hist["window_ms"] == WINDOWS["30d"] and hist["untimed"] is None, hist
    since = hist["since"]
    assert isinstance(since, int) and since <= now - 300_000 - 5_000, hist  # before every record's time
    snap = next(m for m in manifests_of(a.state_dir, "rates") if m.id == manifest["snapshot"])
    assert (snap.since, snap.history_ms) == (since, hist["window_ms"])

    # The tail after the export: new versions of the same keys, some at times before the exported ones.
    tail: list[TimedRecord] = list(timed_records(200, keys=30, seed=452, base_ts=now - 200_000, null_keys=0.0))
    broker.admin.produce(t, tail)
    for p in range(3):  # each alone in its batch: Tansu then reports each partition's end right
        marker: TimedRecord = (b"end-%d" % p, b"end", now, None)
        broker.admin.produce(t, [marker], partition=p)
        tail.append(marker)
    a.stop()
    every = records(broker.settings, t, broker.admin.end_offsets(t))
    assert len(every) == len(first) + len(tail)
    return Exported(t, export, manifest, since, every)


def test_a_host_bootstrapped_from_an_export_keeps_its_since_and_answers_as_the_fold(
        broker: Broker, daemon: Daemon, tmp_path: Path) -> None:
    x = _exported(broker, daemon, tmp_path)
    b = _versioned(daemon({"rates": x.topic}, start=False, snapshots={"interval_ms": 200}, metadata_refresh_ms=300,
                          export=x.export, state_dir=tmp_path / "state-b"))
    table = _rates(b.wait_for(lambda s: _rates(s).get("state") == "RUNNING"
                              and (_rates(s).get("history") or {}).get("since") is not None
                              and (_rates(s)["origin"] or {}).get("tail") is not None, timeout=120,
                              what="B's history"))
    origin = table["origin"]
    assert origin["kind"] == "export" and origin["export"] == x.manifest["id"], origin
    assert origin["history"] == {"since": x.since, "exported_since": x.since, "moved": None}, origin
    # B read from the topic only what follows the export's offsets: the versions below came from the export.
    assert origin["offsets"] == x.manifest["offsets"], origin
    assert origin["tail"] == len(x.every) - sum(x.manifest["offsets"].values()), origin
    assert table["history"]["since"] == x.since and table["history"]["refused"] is None, table["history"]
    wait_for_table(b, "rates", expected_table([(r.key, r.value, r.timestamp, None) for r in x.every]))
    _check_as_of(b, x.every, x.since, random.Random(45))


@pytest.mark.long  # two daemons, an export and a reload (a check-config child): ~8 s, past make test's budget
def test_a_versioned_table_uses_only_an_export_kept_under_its_window(broker: Broker, daemon: Daemon,
                                                                      tmp_path: Path) -> None:
    """Under 7 days, host B refuses the 30-day export at its start, with the reason, and replays the topic (since:
    the replay's). Replaced by a reload to 30 days, its emptied store is refilled from the export in the same
    process and keeps the export's since."""
    x = _exported(broker, daemon, tmp_path)
    before = int(time.time() * 1000)
    b = _versioned(daemon({"rates": x.topic}, start=False, snapshots={"interval_ms": 200}, metadata_refresh_ms=300,
                          export=x.export, state_dir=tmp_path / "state-b"), "7d")
    table = _rates(b.wait_for(lambda s: _rates(s).get("state") == "RUNNING"
                              and (_rates(s).get("history") or {}).get("since") is not None, timeout=120,
                              what="B's history"))
    assert table["origin"]["kind"] == "topic", table["origin"]
    assert "its history was kept under a window of 2592000000 ms, the table declares 604800000" in \
        table["origin"]["fallback"], table["origin"]
    assert before - LAG_MS <= table["history"]["since"] <= int(time.time() * 1000) - LAG_MS, table["history"]
    assert "not used: its history was kept under a window" in b.tail(400)

    pid, since = b.pid, table["history"]["since"]
    b.config.write_text(re.sub(r'^history = .*$', 'history = "30d"', b.config.read_text(), flags=re.M))
    r = globald("reload", "--config", str(b.config), timeout=300)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{b.tail()}"
    # A longer window is applied in place (no replacement, so no refill): the store and its since are kept, since
    # the versions before it were never read, and the export is not taken again.
    table = _rates(b.wait_for(lambda s: s["config"]["generation"] == 2 and _rates(s).get("state") == "RUNNING"
                              and _rates(s)["history"]["window_ms"] == WINDOWS["30d"], timeout=120,
                              what="the reload to 30 days"))
    assert table["origin"]["kind"] == "topic" and table["history"]["since"] == since and b.pid == pid, table
    _check_as_of(b, x.every, since, random.Random(46))
