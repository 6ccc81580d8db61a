"""``history`` removed from a versioned table by ``globald reload``, end to end (issue 45): taken in place, as a new
window is (same process, the table RUNNING throughout, nothing replayed), its latest values byte for byte the fold
of the topic, and from then on a plain table's everywhere: status, ``/metrics``, ``get --as-of``, the snapshots
published after. Added back by a reload, its ``since`` starts from then (a replay's), not from before the removal.
On the modern-protocol lane: only its records carry the timestamps a history needs to have a ``since`` at all."""

from __future__ import annotations

import functools
import random
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.cli import readview
from globald.embedded.admin import TimedRecord
from globald.embedded.oracle import records
from globald.settings import config as configmod
from globald.snapshot import manifest as manifests
from globald.snapshot.reader import current_id
from globald.store import layout
from globald.store.names import HISTORY_CF, SNAPSHOT_DB_DIR, db_dir, snapshots_dir
from tests.harness import Broker, DaemonProcess, globald
from tests.tansu.data import expected_table, timed_records, wait_for_table
from tests.tansu.test_as_of import _check_as_of, _table_state, reload_history

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]
METRIC = 'globald_table_history_since_seconds{table="rates"}'


def _metrics(d: DaemonProcess) -> str:
    http = d.status()["http"]
    with urllib.request.urlopen(f"http://{http['host']}:{http['port']}/metrics", timeout=30) as r:
        return r.read().decode()


def _current(d: DaemonProcess) -> manifests.Manifest | None:
    sid = current_id(d.state_dir, "rates")
    return None if sid is None else manifests.read(snapshots_dir(d.state_dir, "rates") / sid, "rates")


def _hooked(events: Path) -> list[str]:
    """The table's state changes the on_state_change hook saw, in order ("STATE reason")."""
    text = events.read_text() if events.exists() else ""
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("rates ")]


def test_a_reload_removes_history_in_place_and_adding_it_back_starts_since_then(broker: Broker, daemon: Daemon,
                                                                                tmp_path: Path) -> None:
    t = f"unversioned{time.monotonic_ns()}"
    broker.admin.create(t)  # no min.compaction.lag.ms: unknown, taken as 0 (a re-add's since is its replay's start)
    events = tmp_path / "events.txt"
    hook = ["sh", "-c", f'echo "$GLOBALD_TABLE $GLOBALD_STATE $GLOBALD_REASON" >> {events}']
    d = daemon({"rates": t}, start=False, snapshots={"interval_ms": 200}, hooks={"on_state_change": hook},
               http={"port": 0})
    d.config.write_text(d.config.read_text() + 'history = "30d"\n')  # the [[tables]] entry, last in the file
    d.start()
    now = int(time.time() * 1000)
    produced: list[TimedRecord] = list(timed_records(300, keys=25, seed=45, base_ts=now - 300_000, null_keys=0.0))
    broker.admin.produce(t, produced)
    wait_for_table(d, "rates", expected_table(produced))
    every = records(broker.settings, t, broker.admin.end_offsets(t))
    state = _table_state(d.wait_for(
        lambda s: _table_state(s).get("state") == "RUNNING" and (_table_state(s).get("history") or {}).get("since")
        is not None, timeout=120, what="rates versioned, with a since"))
    d.wait_for(lambda s: (m := _current(d)) is not None and m.since is not None, timeout=120,
               what="a versioned snapshot")
    d.wait_for(lambda s: s["state"] == "RUNNING" and any(h.startswith("RUNNING") for h in _hooked(events)),
               timeout=120, what="the daemon RUNNING, heard by the hook")
    assert METRIC in _metrics(d)  # a versioned table's, so that its absence below says something
    before = expected_table(produced)  # what the dump showed (wait_for_table): values and timestamps, byte for byte

    reload_to = functools.partial(reload_history, d)
    pid, applied, mark, heard = d.pid, (state["records"], state["wipes"]), d.log_size(), len(_hooked(events))
    removed_at = int(time.time() * 1000)
    state = reload_to(None, 2)
    assert d.pid == pid and (state["records"], state["wipes"]) == applied, state
    assert d.dump("rates") == before  # byte for byte, the fold of the topic: nothing replayed, nothing lost
    assert HISTORY_CF not in layout.families(db_dir(d.state_dir, "rates"))
    assert METRIC not in _metrics(d)
    r = globald("get", "--config", str(d.config), "--table", "rates", "--key-format", "hex", every[0].key.hex(),
                "--as-of", str(now))
    assert r.returncode == 3 and "keeps no versions: declare history" in r.stderr, (r.returncode, r.stderr)
    d.wait_for(lambda s: (c := _current(d)) is not None and c.history_ms is None, timeout=120,
               what="a plain snapshot published after the removal")
    m = _current(d)
    assert m is not None and m.since is None
    assert HISTORY_CF not in layout.families(snapshots_dir(d.state_dir, "rates") / m.id / SNAPSHOT_DB_DIR)
    said = d.log_since(mark, 200)
    assert "history (30d) of rates removed in place" in said, said
    assert "RESTORING" not in said and "WIPE" not in said, said

    # Added back: a replacement, replayed from the topic, whose since is proven from then on (the lag unknown: 0).
    state = reload_to("30d", 3)
    assert state["history"]["since"] >= removed_at and state["history"]["compaction_lag_ms"] is None, state
    since = state["history"]["since"]
    with readview.open_view(configmod.load(d.config), "rates") as view:  # as get --as-of reads it, in-process
        refused = view.history_refusal(removed_at - 1)
    assert refused is not None and "before its history's since" in refused, refused
    more: list[TimedRecord] = list(timed_records(60, keys=25, seed=46, base_ts=since + 10_000, null_keys=0.0))
    broker.admin.produce(t, more)
    wait_for_table(d, "rates", expected_table(produced + more))
    _check_as_of(d, records(broker.settings, t, broker.admin.end_offsets(t)), since, random.Random(45))
    # The hook saw nothing of the table between the removal and the re-add's own drop and restore.
    d.wait_for(lambda s: any(h.startswith("RUNNING") for h in _hooked(events)[heard:]), timeout=120,
               what="the re-add's RUNNING, hooked")
    assert _hooked(events)[heard] == "PENDING_SHUTDOWN dropped by a reload", _hooked(events)
