"""A versioned table's since across a restart (issue 45: never a since earlier than provable), end to end on the
modern-protocol broker, whose topics carry min.compaction.lag.ms: a daemon down for longer than a topic's lag may
have missed versions the log cleaner removed meanwhile, so that table's since moves to the restart less the lag
and an as-of lookup before it is refused (exit 3); a table whose topic's lag is longer than the downtime keeps its
since and answers."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from globald.embedded.admin import TimedRecord
from tests.harness import Broker, DaemonProcess, globald

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

SHORT_LAG_MS = 500
LONG_LAG_MS = 86_400_000


def _history(doc: dict[str, Any], table: str) -> dict[str, Any]:
    return dict(doc["tables"].get(table, {}).get("history") or {})


def _get_as_of(d: DaemonProcess, table: str, key: bytes, at: int) -> tuple[int, str]:
    r = globald("get", "--config", str(d.config), "--table", table, "--key-format", "hex", key.hex(),
                "--as-of", str(at), "--json")
    return r.returncode, r.stderr


def test_a_restart_after_the_topics_lag_moves_since_and_one_within_keeps_it(
        broker: Broker, daemon: Callable[..., DaemonProcess]) -> None:
    short, long = f"lagshort{time.monotonic_ns()}", f"laglong{time.monotonic_ns()}"
    broker.admin.create(short, config={"min.compaction.lag.ms": str(SHORT_LAG_MS)})
    broker.admin.create(long, config={"min.compaction.lag.ms": str(LONG_LAG_MS)})
    d = daemon({"moves": short, "keeps": long}, start=False)
    d.config.write_text(re.sub(r'^(topic = .*)$', r'\1\nhistory = "30d"', d.config.read_text(), flags=re.M))
    d.start()
    now = int(time.time() * 1000)
    produced: list[TimedRecord] = [(b"k%d" % i, b"v%d" % i, now - 1_000 + i, None) for i in range(20)]
    markers: list[TimedRecord] = [(b"end-%d" % p, b"end", now + 100 + p, None) for p in range(3)]
    for t in (short, long):
        broker.admin.produce(t, produced)
        for p, marker in enumerate(markers):  # each alone in its batch: Tansu then reports each partition's end
            broker.admin.produce(t, [marker], partition=p)  # right, which the restart checks its offsets against
    total = len(produced) + len(markers)

    def applied(s: dict[str, Any], table: str) -> bool:  # every record in, and a since proven
        t = s["tables"].get(table, {})
        return sum(t.get("offsets", {}).values()) == total and _history(s, table).get("since") is not None

    doc = d.wait_for(lambda s: applied(s, "moves") and applied(s, "keeps"), timeout=120, what="both tables")
    since = {t: _history(doc, t)["since"] for t in ("moves", "keeps")}
    at = since["moves"]  # a time both tables answer at before the restart

    assert d.stop() == 0
    stopped = int(time.time() * 1000)
    # Down for longer than the short lag (the stop's own mark is before ``stopped``): the wall clock, not a race.
    time.sleep(SHORT_LAG_MS / 1000 + 0.2)
    restarted = int(time.time() * 1000)
    assert restarted - SHORT_LAG_MS > stopped
    d.start()
    doc = d.wait_for(lambda s: (_history(s, "moves").get("since") or 0) > since["moves"]
                     and _history(s, "keeps").get("since") is not None
                     and all(s["tables"][t].get("state") == "RUNNING" for t in ("moves", "keeps")),
                     timeout=120, what="since moved by the restart")
    moved, kept = _history(doc, "moves"), _history(doc, "keeps")
    assert moved["since"] >= restarted - SHORT_LAG_MS and moved["moved"] is not None, moved
    assert "did not read its topic" in moved["moved"], moved
    assert kept["since"] == since["keeps"] <= at and kept["moved"] is None, kept  # so answered at ``at``
    code, err = _get_as_of(d, "moves", b"k19", at)  # before the moved since: refused, never guessed
    assert code == 3 and "since" in err, err
    assert "since moved at a resume after a restart" in d.tail(400)
