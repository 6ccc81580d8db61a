"""Helpers shared by the snapshot and Spark integration tests (real broker, real daemon)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from globald.embedded.oracle import Table
from globald.settings.config import load
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest
from globald.snapshot.reader import listing
from globald.store.names import SNAPSHOT_CURRENT, SNAPSHOT_VERIFIED, snapshots_dir
from tests.harness import POLL_INTERVAL, Broker, DaemonProcess, globald, random_records


def snapshots_json(d: DaemonProcess, table: str) -> list[dict[str, Any]]:
    """``globald snapshots --json`` run as a process, for the tests of the command itself; waits use
    ``snapshots_listed``."""
    r = globald("snapshots", "--config", str(d.config), "--table", table, "--json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert isinstance(doc, list) and (r.returncode == 1) == (doc == []), (r.returncode, doc)  # 1: none (yet)
    return doc


def snapshots_listed(d: DaemonProcess, table: str) -> list[dict[str, Any]]:
    """The document ``globald snapshots --json`` prints, made in this process by the function the command prints
    (as ``DaemonProcess.status``): a subprocess per poll cost ~0.2-0.5 s of CPU, taken from the daemon waited for."""
    return cast(list[dict[str, Any]], json.loads(json.dumps(listing(d.state_dir, table))))


def manifest_of(d: DaemonProcess, table: str, sid: str) -> Manifest:
    return manifests.read(snapshots_dir(load(d.config).state_dir, table) / sid, table)


def wait_snapshot_at(d: DaemonProcess, table: str, ends: dict[int, int], timeout: float = 60.0) -> dict[str, Any]:
    """The CURRENT entry of ``globald snapshots`` once its offsets reach ``ends``."""
    want = {str(p): o for p, o in ends.items()}
    deadline = time.monotonic() + timeout
    last: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        last = snapshots_listed(d, table)
        cur = [s for s in last if s["current"]]
        if cur and cur[0]["offsets"] == want and not cur[0]["stale"]:
            return cur[0]
        time.sleep(POLL_INTERVAL)
    raise AssertionError(f"no fresh CURRENT snapshot at {want}; snapshots {last}; log:\n{d.tail()}")


def snapshot_values(d: DaemonProcess, table: str, sid: str) -> Table:
    return {k: v for k, (v, _) in d.dump(table, snapshot=sid).items()}


def wait_vouched(d: DaemonProcess, sid: str | None = None, table: str = "tbl", timeout: float = 120.0) -> str:
    """Wait until the daemon's identity check has vouched for snapshot ``sid`` (default: CURRENT), i.e.
    ``snapshots/<t>/VERIFIED`` names it, and return its id. Once a topic is found recreated only a vouched snapshot
    is served (``snapshot.recreated``), and the first snapshot is published at the turn its table reaches RUNNING,
    which can be before any check: a test that recreates the topic and expects the old snapshot served waits here
    first."""
    where = snapshots_dir(d.state_dir, table)
    deadline = time.monotonic() + timeout
    while True:
        try:
            want = sid or (where / SNAPSHOT_CURRENT).read_text().strip()
            if want in json.loads((where / SNAPSHOT_VERIFIED).read_text())["snapshots"]:
                return want
        except (OSError, ValueError, KeyError):
            pass
        assert time.monotonic() < deadline, f"no identity check vouched for snapshot {sid or 'CURRENT'} of {table}"
        time.sleep(POLL_INTERVAL)


def recreate_smaller_while_paused(broker: Broker, d: DaemonProcess, topic: str, records: int, seed: int) -> None:
    """Delete and recreate ``topic`` with fewer records while the daemon is frozen, then let it go on.

    Freezing makes the daemon find the whole new topic at once, so its rebuild takes long enough to be observed.
    The snapshot CURRENT before is vouched for first, so that it is the one served during the rebuild.
    """
    assert d.proc is not None
    wait_vouched(d)
    d.proc.send_signal(signal.SIGSTOP)
    try:
        broker.admin.delete(topic)
        broker.admin.create(topic, partitions=3)
        broker.admin.produce(topic, random_records(records, keys=records, seed=seed))
    finally:
        d.proc.send_signal(signal.SIGCONT)


def wait_status(d: DaemonProcess, pred: Callable[[dict[str, Any]], bool], timeout: float = 60.0,
                poll: float = 0.02) -> dict[str, Any]:
    """The daemon's status once ``pred`` holds, read from status.json directly: a ``globald status`` subprocess
    per poll is too slow to catch a short window such as a rebuild."""
    path = load(d.config).state_dir / "status.json"
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            doc = {}
        if doc.get("pid") == d.pid and doc.get("tables") and pred(doc):
            return doc
        if not d.alive():
            raise AssertionError(f"daemon exited; log:\n{d.tail()}")
        time.sleep(poll)
    raise AssertionError(f"timed out; last status {doc}; log:\n{d.tail()}")


def stale(table: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: bool(s["tables"][table].get("snapshot", {}).get("stale"))


def table_on_topic(broker: Broker, topic: Callable[..., str], daemon: Callable[..., DaemonProcess], records: int,
                   seed: int, keys: int | None = None, **daemon_args: Any) -> tuple[str, DaemonProcess]:
    """A fresh topic with ``records`` random records and a daemon mirroring it as table "tbl", with a fresh
    snapshot at the topic's end."""
    t = topic()
    broker.admin.produce(t, random_records(records, keys=keys or records, seed=seed))
    d = daemon({"tbl": t}, **{"snapshots": {"interval_ms": 200, "retain": 3}, **daemon_args})
    wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t), timeout=90)
    return t, d
