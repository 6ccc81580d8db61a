"""Snapshots against a real broker, the real daemon and real RocksDB: content equals the oracle fold at the
manifest offsets, retention and leases, exact-offset requests and their refusals, stale-while-rebuilding."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.common.errors import SnapshotStaleError
from globald.snapshot import exact_requests, leases, open_snapshot
from globald.snapshot.exact_requests import Code
from globald.store.names import snapshots_dir
from tests import midway
from tests.harness import (
    POLL_INTERVAL,
    SLOW_FETCH,
    Broker,
    DaemonProcess,
    globald,
    oracle_at,
    random_records,
    write_config,
)
from tests.integration.snapshot_helpers import (
    manifest_of,
    recreate_smaller_while_paused,
    snapshot_values,
    snapshots_json,
    snapshots_listed,
    stale,
    wait_snapshot_at,
    wait_status,
)

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
FAST = {"interval_ms": 200, "retain": 2}


def test_periodic_snapshots_equal_oracle_and_are_listed(broker: Broker, topic: Callable[..., str],
                                                        daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(4_000, keys=800, seed=21, tombstones=0.1))
    d = daemon({"tbl": t}, snapshots=FAST)
    cur = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))
    listed = snapshots_json(d, "tbl")
    assert all(set(s) == {"id", "offsets", "created", "stale", "current"} for s in listed)
    assert [s["id"] for s in listed] == sorted((s["id"] for s in listed), reverse=True)
    assert [s["current"] for s in listed].count(True) == 1 and listed[0]["current"]
    expected = oracle_at(broker, t, cur["offsets"])
    assert snapshot_values(d, "tbl", cur["id"]) == expected
    r = globald("dump", "--config", str(d.config), "--table", "tbl", "--snapshot", "1234")
    assert r.returncode == 1 and "not a snapshot id" in r.stderr
    m = manifest_of(d, "tbl", cur["id"])
    assert (m.kind, m.table_state, m.topic) == ("periodic", "RUNNING", t) and m.records > 0

    # The reader API: get, batched multi-get, prefix and range scans, iteration; values carry timestamps.
    state = d.state_dir
    with open_snapshot(state, "tbl") as snap:
        assert snap.id == cur["id"]
        keys = sorted(expected)
        assert snap.get(keys[0]) is not None and snap.get(keys[0])[0] == expected[keys[0]]
        got = snap.multi_get([*keys[:50], b"no-such-key"])
        assert [g[0] for g in got[:50] if g] == [expected[k] for k in keys[:50]] and got[50] is None
        assert all(isinstance(g[1], int) for g in got[:50] if g)
        assert [k for k, _, _ in snap.prefix(b"key-0001")] == [k for k in keys if k.startswith(b"key-0001")]
        assert [k for k, _, _ in snap.items(keys[10], keys[20])] == keys[10:20]
        assert {k: v for k, v, _ in snap} == expected

    # A leased snapshot outlives retention and never changes; released, it is collected.
    first = cur
    leases.take(snapshots_dir(state, "tbl"), "test-holder", first["id"], 120)
    for seed in (22, 23, 24):
        broker.admin.produce(t, random_records(500, keys=800, seed=seed))
        wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t))
    # Retention trims to `retain` plus the leased one (a sweep a publish or so after the last): wait for the trim,
    # the leased snapshot present in every listing on the way.
    deadline = time.monotonic() + 60
    ids = [s["id"] for s in snapshots_listed(d, "tbl")]
    while len(ids) > FAST["retain"] + 1:
        assert first["id"] in ids, ids
        assert time.monotonic() < deadline, f"retention never trimmed to retain + the leased one: {ids}"
        time.sleep(POLL_INTERVAL)
        ids = [s["id"] for s in snapshots_listed(d, "tbl")]
    assert first["id"] in ids, ids
    assert snapshot_values(d, "tbl", first["id"]) == expected
    leases.release(snapshots_dir(state, "tbl"), "test-holder")
    deadline = time.monotonic() + 10
    while first["id"] in [s["id"] for s in snapshots_listed(d, "tbl")] and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    assert first["id"] not in [s["id"] for s in snapshots_json(d, "tbl")]


def test_exact_offset_requests_are_identical_across_sidecars(broker: Broker, topic: Callable[..., str],
                                                             daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(3_000, keys=500, seed=31, tombstones=0.1))
    ends_a = broker.admin.end_offsets(t)
    # A second sidecar, as on another host: it saw the topic at ends_a, so its build starts from that snapshot.
    cfg2 = write_config(tmp_path / "other.toml", tmp_path / "other-state", broker.settings, {"tbl": t},
                        commit_interval_ms=200, http={"enabled": False}, snapshots=FAST)
    other = DaemonProcess(cfg2, tmp_path / "other.log").start()
    try:
        wait_snapshot_at(other, "tbl", ends_a)
        broker.admin.produce(t, random_records(3_000, keys=500, seed=32, tombstones=0.1))
        ends_b = broker.admin.end_offsets(t)
        d = daemon({"tbl": t}, snapshots=FAST)
        live = wait_snapshot_at(d, "tbl", ends_b)
        wait_snapshot_at(other, "tbl", ends_b)
        target = {p: (ends_a[p] + ends_b[p]) // 2 for p in ends_b}
        dumps = []
        for sidecar in (d, other):
            resp = exact_requests.request(sidecar.state_dir, "tbl", target, timeout=60)
            assert resp.code == Code.READY, resp
            assert resp.snapshot is not None
            m = manifest_of(sidecar, "tbl", resp.snapshot)
            assert m.offsets == target and m.kind == "exact"
            dumps.append(sidecar.dump("tbl", snapshot=resp.snapshot))
            again = exact_requests.request(sidecar.state_dir, "tbl", target, timeout=30)
            assert again.snapshot == resp.snapshot  # served from the one already built
        assert dumps[0] == dumps[1]
        assert {k: v for k, (v, _) in dumps[0].items()} == oracle_at(broker, t, {str(p): o for p, o in target.items()})
        # A second build on the same sidecar (its consumer reused) is just as exact.
        earlier = {p: (ends_a[p] + o) // 2 for p, o in target.items()}
        resp = exact_requests.request(d.state_dir, "tbl", earlier, timeout=60)
        assert resp.code == Code.READY and resp.snapshot is not None
        assert snapshot_values(d, "tbl", resp.snapshot) == oracle_at(broker, t, {str(p): o for p, o in earlier.items()})
    finally:
        other.stop()

    state = d.state_dir
    same = exact_requests.request(state, "tbl", ends_b, timeout=30)
    assert same.code == Code.READY and same.snapshot == live["id"]
    beyond = exact_requests.request(state, "tbl", {p: o + 5 for p, o in ends_b.items()}, timeout=30)
    assert beyond.code == Code.BEYOND_END and "beyond the end" in beyond.message
    wrong = exact_requests.request(state, "tbl", {0: 1}, timeout=30)
    assert wrong.code == Code.INVALID
    # A garbage request file gets an answer too, and the daemon carries on.
    bad = snapshots_dir(state, "tbl") / "requests" / "garbage.json"
    bad.write_bytes(b'{"id": "garbage", "offs')
    resp = exact_requests.wait(state, exact_requests.Request("garbage", "tbl", {0: 0}), timeout=30)
    assert resp.code == Code.INVALID
    # Ahead of the live table: the daemon reads up to exactly the target.
    broker.admin.produce(t, random_records(2_000, keys=500, seed=33))
    ends_c = broker.admin.end_offsets(t)
    resp = exact_requests.request(state, "tbl", ends_c, timeout=60)
    assert resp.code == Code.READY and resp.snapshot is not None
    assert snapshot_values(d, "tbl", resp.snapshot) == oracle_at(broker, t, {str(p): o for p, o in ends_c.items()})
    assert d.alive()


def test_a_request_at_the_live_offsets_is_answered_from_the_live_store_before_any_commit(
        broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    """Records applied but not yet committed are in the live store, and a checkpoint holds them durably: a reader
    asking for exactly those offsets (a Spark refresh right after a produce) gets the live store's snapshot at once,
    not an exact build that reads them from Kafka again."""
    t = topic(partitions=2)
    broker.admin.produce(t, random_records(300, keys=100, seed=61))
    d = daemon({"tbl": t}, commit_interval_ms=600_000, snapshots={"interval_ms": 600_000, "retain": 2})
    ends = broker.admin.end_offsets(t)
    wait_status(d, lambda doc: doc["tables"]["tbl"]["state"] == "RUNNING")
    broker.admin.produce(t, random_records(50, keys=100, seed=62))
    target = broker.admin.end_offsets(t)
    assert target != ends
    want = {str(p): o for p, o in target.items()}
    wait_status(d, lambda doc: doc["tables"]["tbl"]["offsets"] == want)  # applied; the next commit is minutes away
    resp = exact_requests.request(d.state_dir, "tbl", target, timeout=60)
    assert resp.code == Code.READY and resp.snapshot is not None, resp
    m = manifest_of(d, "tbl", resp.snapshot)
    assert m.offsets == target and m.kind == "periodic", m  # a checkpoint of the live store, not a build
    assert snapshot_values(d, "tbl", resp.snapshot) == oracle_at(broker, t, want)


def test_request_below_log_start_is_refused(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=300, seed=41))
    ends = broker.admin.end_offsets(t)
    d = daemon({"tbl": t}, snapshots=FAST)
    wait_snapshot_at(d, "tbl", ends)
    lows = broker.admin.advance_log_start(t)
    assert all(lows[p] > ends[p] - 10 for p in ends)
    resp = exact_requests.request(d.state_dir, "tbl", {p: o - 10 for p, o in ends.items()}, timeout=60)
    assert resp.code == Code.BELOW_LOG_START, resp
    assert d.alive()


def test_request_needing_compacted_records_is_refused(broker: Broker, topic: Callable[..., str],
                                                      daemon: Daemon) -> None:
    admin = broker.admin
    if not hasattr(admin, "_topic_command"):
        pytest.skip("forcing compaction needs the embedded broker's topic tools")
    t = topic(partitions=1)
    admin._topic_command("--alter", "--topic", t, "--config", "segment.ms=100",  # type: ignore[attr-defined]
                         "--config", "min.cleanable.dirty.ratio=0.01")
    admin.produce(t, [(b"k", b"old")] + [(b"x%d" % i, b"v") for i in range(50)], partition=0)
    middle = admin.end_offsets(t)[0]
    time.sleep(0.3)
    admin.produce(t, [(b"k", b"new")], partition=0)
    deadline = time.monotonic() + 60
    while oracle_at(broker, t, {"0": middle}).get(b"k") == b"old":  # until the cleaner has removed k=old
        assert time.monotonic() < deadline, "the broker did not compact the topic"
        time.sleep(0.3)
        admin.produce(t, [(b"roll", b"r")], partition=0)  # rolls the active segment so it can be cleaned
    d = daemon({"tbl": t}, snapshots=FAST)
    wait_snapshot_at(d, "tbl", admin.end_offsets(t))
    resp = exact_requests.request(d.state_dir, "tbl", {0: middle}, timeout=60)
    assert resp.code == Code.COMPACTED, resp


def test_stale_while_rebuilding(broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(45_000, keys=45_000, seed=51))
    d = daemon({"tbl": t}, start=False, snapshots={"interval_ms": 200, "retain": 3}, consume_batch_size=500,
               # the identity check that vouches for the old snapshot (wait_vouched) runs at each refresh
               metadata_refresh_ms=500, kafka=SLOW_FETCH)
    # The daemon stops itself a third into the rebuild, to be looked at: however fast this machine rebuilds.
    arm_file = tmp_path / "arm.json"
    midway.arm(d, arm_file)
    d.start()
    before = wait_snapshot_at(d, "tbl", broker.admin.end_offsets(t), timeout=90)
    old = oracle_at(broker, t, before["offsets"])

    midway.freeze_at_restore(arm_file, "tbl", 0.3)
    recreate_smaller_while_paused(broker, d, t, 30_000, seed=52)
    midway.wait_frozen(d, arm_file)
    assert d.proc is not None
    try:
        doc = wait_status(d, lambda _: True, timeout=5)  # as the daemon last published it, before the freeze
        snap = doc["tables"]["tbl"]["snapshot"]
        # Either check may see the smaller topic first: the fetch's invalid offset, or the fingerprint's mismatch.
        assert snap["current"] == before["id"], snap
        assert "invalid_offset" in snap["stale_reason"] or "topic_recreated" in snap["stale_reason"], snap
        assert doc["tables"]["tbl"]["state"] == "RESTORING"
        listed = snapshots_json(d, "tbl")
        assert listed[0]["id"] == before["id"] and listed[0]["current"] and listed[0]["stale"]
        assert "rebuilding" in (manifest_of(d, "tbl", before["id"]).stale_reason or "")
        with open_snapshot(d.state_dir, "tbl") as s:  # readers still get the whole old table
            assert s.id == before["id"] and {k: v for k, v, _ in s} == old
        with pytest.raises(SnapshotStaleError):
            open_snapshot(d.state_dir, "tbl", serve_stale=False)
        req = exact_requests.submit(d.state_dir, "tbl", {p: 1 for p in range(3)})
    finally:
        d.proc.send_signal(signal.SIGCONT)
    assert exact_requests.wait(d.state_dir, req, timeout=30).code == Code.REBUILDING

    new_ends = broker.admin.end_offsets(t)
    fresh = wait_snapshot_at(d, "tbl", new_ends, timeout=90)
    assert fresh["id"] != before["id"]
    assert snapshot_values(d, "tbl", fresh["id"]) == oracle_at(broker, t, fresh["offsets"])
    doc = wait_status(d, lambda s: not stale("tbl")(s), timeout=10)
    assert doc["tables"]["tbl"]["snapshot"]["current"] == fresh["id"]
