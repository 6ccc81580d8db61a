"""As-of lookups of a versioned table (issue 45) end to end on a modern-protocol broker, the only one here whose
records carry timestamps: the real daemon keeps every version, and ``globald get --as-of`` and ``dump --as-of``
answer as the as-of fold of the topic's records (``globald.embedded.oracle.as_of``) at random times and keys,
with out-of-order timestamps, ties and tombstones; a time before the table's ``since`` is refused, never guessed."""

from __future__ import annotations

import base64
import functools
import json
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from globald.cli import readview
from globald.embedded.admin import TimedRecord
from globald.embedded.oracle import Record, as_of, as_of_table, records
from globald.settings import config as configmod
from globald.settings.config import parse
from globald.settings.ref import ConfigRef
from globald.snapshot.builder import Builder
from globald.store import layout
from globald.store.names import HISTORY_CF, SNAPSHOT_DB_DIR, db_dir
from globald.store.reader import StoreReader
from tests.harness import Broker, DaemonProcess, globald
from tests.tansu.data import expected_table, timed_records, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]


def _get_as_of(d: DaemonProcess, key: bytes, at: int | str) -> tuple[int, dict[str, object] | None, str]:
    r = globald("get", "--config", str(d.config), "--table", "rates", "--key-format", "hex", key.hex(),
                "--as-of", str(at), "--json")
    assert r.returncode in (0, 1, 3), r.stderr
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None, r.stderr


def test_get_and_dump_as_of_answer_as_the_as_of_fold(broker: Broker, topic: Callable[..., str],
                                                     daemon: Daemon) -> None:
    t = topic()
    d = daemon({"rates": t}, start=False, snapshots={"interval_ms": 200})
    d.config.write_text(d.config.read_text() + 'history = "30d"\n')  # the last [[tables]] entry's
    d.start()
    d.wait_running()
    started = int(time.time() * 1000)
    # Record times after the replay began (the daemon proves its history from there), wandering back and forth
    # (timed_records: +-5 s around 1 s steps), with tombstones; then ties: two versions of a key at one time.
    base = started + 3_600_000
    produced: list[TimedRecord] = list(timed_records(600, keys=40, seed=45, base_ts=base, null_keys=0.0))
    tie_key, tie_ts = produced[0][0], base + 100_000
    assert tie_key is not None
    produced += [(tie_key, b"tie-first", tie_ts, None), (tie_key, b"tie-second", tie_ts, None)]
    broker.admin.produce(t, produced)
    wait_for_table(d, "rates", expected_table(produced))  # the latest values, as for a plain table
    history = d.wait_for(lambda doc: doc["tables"]["rates"].get("history", {}).get("versions", 0) > 0,
                         what="the history in status")["tables"]["rates"]["history"]
    since = history["since"]
    assert history["refused"] is None and history["bytes"] > 0, history
    assert started - 60_000 <= since <= base - 5_000, history  # the replay's start, before every record's time

    every = records(broker.settings, t, broker.admin.end_offsets(t))
    assert len(every) == len(produced)
    rng = random.Random(45)
    keys = sorted({r.key for r in every})
    stamps = sorted(r.timestamp for r in every)
    # Each ask is a process (~0.5 s of CPU): few of them, the random ones drawn among exact record times and
    # times in between, ISO 8601 for one of them.
    asks: list[tuple[bytes, int | str]] = [(tie_key, tie_ts)]
    asks += [(rng.choice(keys), rng.choice([rng.randint(stamps[0] - 1000, stamps[-1] + 1000), rng.choice(stamps)]))
             for _ in range(4)]
    mid = stamps[len(stamps) // 2] // 1000 * 1000
    asks.append((rng.choice(keys), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mid / 1000))))
    for key, at in asks:
        code, doc, err = _get_as_of(d, key, at)
        want = as_of(every, key, mid if isinstance(at, str) else at)
        assert doc is not None, err
        assert code == (0 if want is not None else 1), (key, at, doc, err)
        got = (base64.b64decode(str(doc["value_base64"])), doc["timestamp"]) if doc["found"] else None
        assert got == want, (key, at, got, want)
        if (key, at) == (tie_key, tie_ts):
            assert got == (b"tie-second", tie_ts)  # a tie: the later offset

    # A time before since is refused with one line, exit 3: versions from before it may be gone.
    code, doc, err = _get_as_of(d, keys[0], since - 1)
    assert code == 3 and doc is None and len(err.strip().splitlines()) == 1 and "since" in err, err

    at = stamps[len(stamps) // 3]
    r = globald("dump", "--config", str(d.config), "--table", "rates", "--as-of", str(at))
    assert r.returncode == 0, r.stderr
    dumped = {base64.b64decode(doc["key"]): (base64.b64decode(doc["value"]), doc["timestamp"])
              for doc in map(json.loads, r.stdout.splitlines())}
    assert dumped == as_of_table(every, at)


def _table_state(doc: dict[str, Any]) -> dict[str, Any]:
    return cast("dict[str, Any]", doc["tables"].get("rates") or {})


def _published(d: DaemonProcess, since: int, _: object) -> bool:
    """The table's published version, as readers see it, has this ``since``."""
    with readview.open_view(configmod.load(d.config), "rates") as view:
        marks = view._reader.history
        return marks is not None and marks.since == since


def _check_as_of(d: DaemonProcess, every: list[Record], since: int, rng: random.Random) -> None:
    """As-of answers of the published version, read as ``get --as-of`` reads them (in this process: a CLI call per
    ask would cost ~0.5 s of CPU each): the as-of fold's at random keys and times from ``since`` on; refused
    before it."""
    keys = sorted({r.key for r in every})
    stamps = sorted(r.timestamp for r in every if r.timestamp >= since)
    with readview.open_view(configmod.load(d.config), "rates") as view:
        assert view.history_refusal(since) is None and view.history_refusal(since - 1) is not None
        for at in [since, *rng.sample(stamps, 5), stamps[-1] + 1]:
            assert {k: (v, ts) for k, v, ts in view.items_as_of(at)} == as_of_table(every, at), at
            for key in rng.sample(keys, 5):
                assert view.as_of(key, at) == as_of(every, key, at), (key, at)


def reload_history(d: DaemonProcess, history: str | None, generation: int) -> dict[str, Any]:
    """Reload ``d`` with table rates's ``history`` set to ``history`` (None: removed), and wait for the reload's
    generation to show it RUNNING with it (with a since) or without it; its status."""
    text = re.sub(r'^history = .*\n', "", d.config.read_text(), flags=re.M)
    d.config.write_text(text + (f'history = "{history}"\n' if history else ""))  # the last [[tables]] entry's
    r = globald("reload", "--config", str(d.config), timeout=300)
    assert r.returncode == 0, r.stderr
    return _table_state(d.wait_for(
        lambda s: s["config"]["generation"] == generation and _table_state(s).get("state") == "RUNNING"
        and (history is None) == ("history" not in _table_state(s))
        and (history is None or _table_state(s)["history"]["since"] is not None),
        timeout=120, what=f"the reload to history {history}"))


def test_a_reload_adds_changes_and_removes_history(broker: Broker, daemon: Daemon) -> None:
    """A table with data gains ``history`` by a reload: it is replayed (no operator step), with since = the
    replay's start less the topic's min.compaction.lag.ms (read from the topic's config); as-of answers are the
    as-of fold's from since on and refused before. A reload changing the window takes it in place, in the same
    process and with nothing replayed: shrunk, since moves forward at once to the newest record time less the
    window; grown, since stays. One removing history drops the family in place, the latest values unchanged.
    Added again at a restart, over the store with data, it is rebuilt in-process (wipe ``history_added``), with
    no operator step."""
    lag = 600_000
    t = f"lag{time.monotonic_ns()}"
    broker.admin.create(t, config={"min.compaction.lag.ms": str(lag)})
    d = daemon({"rates": t}, snapshots={"interval_ms": 200})
    now = int(time.time() * 1000)
    # Record times from 5 minutes back (within the lag) wandering forward over ~10 minutes, with tombstones.
    produced: list[TimedRecord] = list(timed_records(400, keys=30, seed=7, base_ts=now - 300_000, null_keys=0.0))
    broker.admin.produce(t, produced)
    for p in range(3):  # each alone in its batch: Tansu then reports each partition's end right (the restart)
        marker: TimedRecord = (b"end-%d" % p, b"end", now, None)
        broker.admin.produce(t, [marker], partition=p)
        produced.append(marker)
    wait_for_table(d, "rates", expected_table(produced))
    every = records(broker.settings, t, broker.admin.end_offsets(t))
    rng = random.Random(7)

    reload_to = functools.partial(reload_history, d)
    before = int(time.time() * 1000)
    state = reload_to("30d", 2)
    after = int(time.time() * 1000)
    hist = state["history"]
    assert hist["compaction_lag_ms"] == lag and hist["refused"] is None, hist
    assert before - lag <= hist["since"] <= after - lag, (before, hist, after)
    _check_as_of(d, every, hist["since"], rng)

    # A window of 2 minutes, then of an hour: in place (same process, nothing restored or replayed, the records
    # applied unchanged). Shrunk, since is the newest record time less the window at once; grown, it stays.
    d.wait_for(lambda s: s["state"] == "RUNNING", timeout=120, what="the daemon RUNNING")  # its restore logged
    pid, applied, mark = d.pid, (state["records"], state["wipes"]), d.log_size()
    newest = max(r.timestamp for r in every)
    for window, window_ms, since in (("2m", 120_000, newest - 120_000), ("1h", 3_600_000, newest - 120_000)):
        state = reload_to(window, 3 if window == "2m" else 4)
        assert d.pid == pid and (state["records"], state["wipes"]) == applied, state
        assert state["history"]["since"] == since and state["history"]["window_ms"] == window_ms, state
        d.wait_for(functools.partial(_published, d, since), timeout=120, what=f"a version with since {since}")
        _check_as_of(d, every, since, rng)
    said = d.log_since(mark, 400)
    assert "RESTORING" not in said and "WIPE" not in said, said
    assert "history window of rates changed 30d -> 2m in place; since moved to" in said, said
    assert "history window of rates changed 2m -> 1h in place; since kept at" in said, said

    reload_to(None, 5)
    assert HISTORY_CF not in layout.families(db_dir(d.state_dir, "rates"))
    wait_for_table(d, "rates", expected_table(produced))

    # Added at a restart, over the store with data: rebuilt in-process at its plan (a wipe of its own), no reset.
    assert d.stop() == 0
    d.config.write_text(d.config.read_text() + 'history = "30d"\n')
    before = int(time.time() * 1000)
    d.start()
    hist = _table_state(d.wait_for(lambda s: (_table_state(s).get("history") or {}).get("since") is not None
                                   and _table_state(s).get("state") == "RUNNING", timeout=120,
                                   what="the rebuild with history"))["history"]
    assert before - lag <= hist["since"] <= int(time.time() * 1000) - lag, hist
    assert "WIPE (history_added)" in d.tail(400)
    _check_as_of(d, every, hist["since"], rng)


def test_an_exact_build_of_a_versioned_table_holds_the_as_of_fold_at_its_offsets(broker: Broker,
                                                                                 tmp_path: Path) -> None:
    """An exact-offset snapshot build (``view.refresh(offsets=...)``'s) of a versioned table folds the records below
    its target into versions as the live store does: its history answers as the as-of fold of exactly those
    records, none past the target, from its since on. Built from the log start, its since is a replay's: the
    build's start less the topic's min.compaction.lag.ms (the live table's, passed in), not the build's time."""
    lag = 600_000
    t = f"exactlag{time.monotonic_ns()}"
    broker.admin.create(t, config={"min.compaction.lag.ms": str(lag)})
    base = int(time.time() * 1000) + 3_600_000  # record times after the build's since (the time it reads them)
    produced = list(timed_records(600, keys=40, seed=46, base_ts=base, null_keys=0.0))
    broker.admin.produce(t, produced)
    for p in range(3):  # each alone in its batch: Tansu then reports each partition's end right
        broker.admin.produce(t, [(b"end", b"end", base + 900_000, None)], partition=p)
    every = records(broker.settings, t, broker.admin.end_offsets(t))
    ends = {p: 1 + max(r.offset for r in every if r.partition == p) for p in range(3)}
    target = {p: end // 2 for p, end in ends.items()}  # mid-way: versions past it must not be there
    below = [r for r in every if r.offset < target[r.partition]]
    config = parse({"state_dir": str(tmp_path / "state"), "kafka": dict(broker.settings),
                    "tables": [{"name": "rates", "topic": t, "history": "30d"}]})
    builder = Builder(ConfigRef(config), threading.Event())
    started = int(time.time() * 1000)
    try:
        built = builder.build(config.tables[0], target, None, None, tmp_path / "work", time.monotonic() + 120,
                              lag_ms=lag)
    finally:
        builder.close()
    ended = int(time.time() * 1000)
    assert built.offsets == target and built.consumed == len(below)
    rng = random.Random(46)
    stamps = sorted(r.timestamp for r in every)
    with StoreReader(tmp_path / "work" / SNAPSHOT_DB_DIR) as reader:
        assert reader.offsets() == target
        assert reader.history is not None and reader.history.refusal("rates") is None
        since = reader.history.since
        assert since is not None and started - lag <= since <= ended - lag, (started, reader.history, ended)
        keys = sorted({r.key for r in every})
        for at in [since, *rng.sample(stamps, 6), stamps[-1] + 1]:
            assert {k: (v, ts) for k, v, ts in reader.items_as_of(at)} == as_of_table(below, at), at
            for key in rng.sample(keys, 5):
                v = reader.as_of(key, at)
                assert (None if v is None or v.value is None else (v.value, v.timestamp)) == as_of(below, key, at)
