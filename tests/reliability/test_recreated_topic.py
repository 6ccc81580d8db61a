"""A topic deleted and recreated with MORE records than the stored offsets: every offset check passes, and only
the fingerprints of the records applied (globald.kafka.identity) tell the new topic from the old one.

Three ways it happens: while the daemon is stopped; while it runs and sees the topic vanish; and while it runs but
is frozen, so that it never sees the topic missing and its consumer resumes in the middle of the new topic. Each
must end with the store equal to the NEW topic's fold, rebuilt in-process under the reason ``topic_recreated``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from globald.embedded.oracle import Table, fold
from globald.settings.config import load
from globald.settings.ref import ConfigRef
from globald.snapshot import leases
from globald.snapshot import manifest as manifests
from globald.snapshot.builder import Builder, BuildRefused
from globald.snapshot.exact_requests import Code
from globald.snapshot.manifest import Manifest
from globald.snapshot.reader import current_id, manifests_of
from globald.store.fingerprint import ladders_in
from globald.store.names import META_CF, META_FINGERPRINT_PREFIX, snapshots_dir
from globald.store.reader import StoreReader
from tests import midway
from tests.harness import Broker, DaemonProcess, random_records
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.reliability import hold_refresh
from tests.reliability.checks import check_store, diff, explain, live, read_store, same_process
from tests.reliability.conftest import running
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]

OLD = 3_000  # records in the old topic (1,000 per partition)
FETCH_WAIT_MS = 100  # the longest the broker holds a fetch of the frozen daemon's (librdkafka: 500 by default)
NEW = 6_000  # records in the new one: every stored offset is inside it


def replace_topic(broker: Broker, topic: str, seed: int, partitions: int = 3) -> None:
    """Delete ``topic`` and create it again with NEW records of other values, same keys."""
    broker.admin.delete(topic)
    broker.admin.create(topic, partitions=partitions)
    broker.admin.produce(topic, random_records(NEW, keys=300, seed=seed, tombstones=0.1))


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) while the topic is replaced, so that it never sees it missing. A fetch sent just
    before the freeze is answered by the broker within fetch.wait.max.ms (``FETCH_WAIT_MS`` in these tests' config):
    that answer must come from the old topic. Answered after the replacement (topic commands take 0.1 s, not
    seconds), the new partition says "out of range", and the daemon would see the change by that, not by the
    fingerprints these tests are about."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(10 * FETCH_WAIT_MS / 1000)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def rebuilt_equal(broker: Broker, d: DaemonProcess, topic: str, row: FaultRow, pid: int,
                  reasons: tuple[str, ...] = ("topic_recreated",)) -> None:
    ends = broker.admin.end_offsets(topic)
    assert all(o > OLD // 3 for o in ends.values()), f"the new topic must reach past the old offsets: {ends}"
    doc = d.wait_for(lambda s: s.get("pid") == pid and s["state"] == "RUNNING"
                     and s["tables"]["tbl"]["wipes"] >= 1
                     and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
                     timeout=120, what=f"rebuilt and RUNNING at {ends}")
    row.pid_changes += same_process(d, pid)
    check = check_store(broker, d.state_dir, "tbl", topic)
    assert check.readable and not check.invalid_offsets, check
    assert row.diverged(check.divergences) == 0, check
    assert check.keys > 0 and len(live(d, "tbl")) == check.keys
    log = d.log.read_text()
    assert any(f"WIPE ({reason})" in log for reason in reasons), d.tail()
    assert doc["tables"]["tbl"]["wipes"] >= 1 and row.pid_changes == 0


def test_recreated_with_more_records_while_stopped(broker: Broker, topic: Topic, daemon: Daemon,
                                                   fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("topic recreated with more records while the daemon is stopped",
                "fingerprints differ at start: wiped (topic_recreated), equal to the new topic")
    t = topic()
    d = running(broker, daemon, t, random_records(OLD, keys=300, seed=60))
    assert d.stop() == 0
    replace_topic(broker, t, seed=61)
    row.injected += 1
    d.start()
    rebuilt_equal(broker, d, t, row, d.pid)


def test_recreated_with_more_records_while_running(broker: Broker, topic: Topic, daemon: Daemon,
                                                   fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("topic recreated with more records while the daemon runs",
                "rebuilt in-process (topic_recreated), equal to the new topic")
    t = topic()
    d = running(broker, daemon, t, random_records(OLD, keys=300, seed=62), metadata_refresh_ms=500)
    pid = d.pid
    replace_topic(broker, t, seed=63)
    row.injected += 1
    # A fetch that lands while the new topic is still shorter than the old offsets sees them out of range: that
    # rebuild is as right as the one the fingerprints cause. What must never happen is a resume in the new topic.
    rebuilt_equal(broker, d, t, row, pid, reasons=("topic_recreated", "invalid_offset"))


@pytest.mark.parametrize("refresh_ms", [500, 10_000], ids=["refresh_500ms", "frozen_before_the_first_check"])
def test_recreated_with_more_records_unseen(broker: Broker, topic: Topic, daemon: Daemon,
                                            fault: Callable[[str, str], FaultRow], refresh_ms: int) -> None:
    """Frozen while the topic is replaced, the daemon never sees it missing: its consumer goes on fetching at the
    old offsets of the new topic, and only reading back the fingerprints at the next refresh can tell. With 10 s
    between refreshes the freeze lands before the first check after the restore, which has no verified records:
    those applied after the replacement are the new topic's and match it; only the older ones restored before it
    tell (a clean-clone run lost that race at 500 ms: the store kept the old keys)."""
    row = fault(f"topic recreated with more records while the daemon is frozen (never seen missing), refresh "
                f"{refresh_ms} ms",
                "fingerprints differ at the next refresh: rebuilt in-process, equal to the new topic")
    t = topic()
    d = running(broker, daemon, t, random_records(OLD, keys=300, seed=64), metadata_refresh_ms=refresh_ms,
                kafka={"fetch.wait.max.ms": FETCH_WAIT_MS})
    pid = d.pid
    with frozen(pid):
        replace_topic(broker, t, seed=65)
    row.injected += 1
    rebuilt_equal(broker, d, t, row, pid)


def test_an_exact_build_never_adds_a_new_topic_to_an_old_base(broker: Broker, topic: Topic, daemon: Daemon,
                                                               tmp_path: Path) -> None:
    """The exact-snapshot builder starts from a published snapshot and reads the records past it: after a
    recreation those records are the new topic's, and the result would hold both. It must refuse instead."""
    t = topic()
    d = running(broker, daemon, t, random_records(OLD, keys=300, seed=66))
    d.wait_for(lambda s: s["tables"]["tbl"]["snapshot"]["offsets"] == s["tables"]["tbl"]["offsets"],
               what="a snapshot at the log end")
    assert d.stop() == 0
    base = manifests_of(d.state_dir, "tbl")[0]
    replace_topic(broker, t, seed=67)
    config = load(d.config)
    builder = Builder(ConfigRef(config), threading.Event())
    try:
        with pytest.raises(BuildRefused) as refused:
            builder.build(config.tables[0], broker.admin.end_offsets(t), base.offsets,
                          snapshots_dir(d.state_dir, "tbl") / base.id, tmp_path / "work", time.monotonic() + 60)
    finally:
        builder.close()
    assert refused.value.code == Code.REBUILDING and "recreated" in str(refused.value), refused.value


def test_recreated_with_fewer_partitions_while_running(broker: Broker, topic: Topic, daemon: Daemon,
                                                       fault: Callable[[str, str], FaultRow]) -> None:
    """A topic never loses partitions: one listed with fewer was recreated, and its table is rebuilt from it. The
    topic is missing for about 0.1 s, less than a metadata refresh: a fetch that lands first sees the old offsets
    out of range, which rebuilds it as rightly (as in ``test_recreated_with_more_records_while_running``)."""
    row = fault("topic recreated with fewer partitions while the daemon runs",
                "rebuilt in-process (topic_recreated or invalid_offset), equal to the new topic")
    t = topic()
    d = running(broker, daemon, t, random_records(OLD, keys=300, seed=68), metadata_refresh_ms=500)
    pid = d.pid
    replace_topic(broker, t, seed=69, partitions=1)
    row.injected += 1
    rebuilt_equal(broker, d, t, row, pid, reasons=("topic_recreated", "invalid_offset"))


def held(daemon: Daemon, tmp_path: Path, t: str, ends: dict[int, int], arm_file: Path | None = None,
         **config: object) -> tuple[DaemonProcess, Path]:
    """A daemon whose metadata refreshes the test holds back (``hold_refresh``), RUNNING at ``ends``, after one
    refresh checked the topic there; with ``arm_file``, the chaos hooks of ``tests.midway`` too."""
    hold = tmp_path / "hold-refresh"
    d = daemon({"tbl": t}, start=False, metadata_refresh_ms=500, kafka={"fetch.wait.max.ms": FETCH_WAIT_MS},
               **config)
    if arm_file is not None:
        midway.arm(d, arm_file)
    d.module, d.env = hold_refresh.__name__, {**(d.env or {}), hold_refresh.HOLD_ENV: str(hold)}
    d.start()
    d.wait_running({"tbl": ends})
    refreshed = hold_refresh.made(hold)
    d.wait_for(lambda s: hold_refresh.made(hold) > refreshed, what="a refresh's check of the old topic at its end")
    return d, hold


def replace_in_the_window(broker: Broker, d: DaemonProcess, hold: Path, t: str, seed: int) -> tuple[dict[int, int],
                                                                                                      str]:
    """Replace ``t`` while no check can run, and return once the daemon applied and published the new topic from
    the old offsets: (the new ends, the id of the snapshot there, which mixes both topics)."""
    hold.touch()  # no check from now on: the window between two refreshes, held open
    d.wait_for(lambda s: hold_refresh.made(hold, "held") > 0, what="a refresh held back (none under way)")
    with frozen(d.pid):  # the daemon never sees the topic missing
        replace_topic(broker, t, seed=seed)
    new_ends = broker.admin.end_offsets(t)
    mixed = wait_snapshot_at(d, "tbl", new_ends)["id"]
    assert d.status()["tables"]["tbl"]["wipes"] == 0, "the recreation was found before the window was published"
    data = read_store(snapshots_dir(d.state_dir, "tbl") / mixed / "db")[1]
    assert diff(data, fold(broker.settings, t, new_ends)) > 0, "the snapshot taken in the window is not mixed"
    return new_ends, mixed


def test_stopped_inside_the_window_the_next_start_finds_the_recreation(broker: Broker, topic: Topic, daemon: Daemon,
                                                                       tmp_path: Path,
                                                                       fault: Callable[[str, str], FaultRow]) -> None:
    """Stopped after it applied the new topic from the old offsets and before a check found it, the store's newest
    fingerprints are the new topic's and would vouch for themselves: the first check of the next run reads the
    older ones back too, finds the old topic's record differ, and rebuilds. No snapshot of this run is verified,
    so none is served meanwhile."""
    row = fault("topic recreated, applied, then the daemon stopped before its check",
                "the next start finds it by an older fingerprint: rebuilt (topic_recreated), equal to the new topic")
    t = topic()
    broker.admin.produce(t, random_records(OLD, keys=3_000, seed=72))
    old_ends = broker.admin.end_offsets(t)
    d, hold = held(daemon, tmp_path, t, old_ends)
    replace_in_the_window(broker, d, hold, t, seed=73)
    row.injected += 1
    assert d.stop() == 0, d.tail()
    hold.unlink()
    d.start()
    rebuilt_equal(broker, d, t, row, d.pid)


def exact_build_on_a_mixed_base(d: DaemonProcess, tmp_path: Path, mixed: Path, verified: Path) -> None:
    """The mixed snapshot's newest fingerprints are the new topic's: as a base of an exact build they vouch for
    themselves. The fingerprints the daemon's last check verified (those of the old snapshot here), read back first,
    refuse it."""
    with StoreReader(verified / "db") as r:
        meta = r._family(META_CF)
        assert meta is not None
        ladders, _ = ladders_in(meta.items(from_key=META_FINGERPRINT_PREFIX))
        del meta
    m = manifests.read(mixed, "tbl")
    config = load(d.config)
    builder = Builder(ConfigRef(config), threading.Event())
    try:
        builder.build(config.tables[0], m.offsets, m.offsets, mixed, tmp_path / "unchecked", time.monotonic() + 60)
        with pytest.raises(BuildRefused) as refused:
            builder.build(config.tables[0], m.offsets, m.offsets, mixed, tmp_path / "checked", time.monotonic() + 60,
                          {p: ladder.rungs for p, ladder in ladders.items()})
    finally:
        builder.close()
    assert refused.value.code == Code.REBUILDING and "recreated" in str(refused.value), refused.value


def unverified(m: Manifest) -> bool:
    """Marked as possibly mixing two topics (``globald.snapshot.recreated``; spelled out so that this test runs
    against a globald from before it too)."""
    return m.stale and (m.stale_reason or "").startswith("unverified")


def named_snapshots(broker: Broker, d: DaemonProcess, t: str, old_ends: dict[int, int], old_fold: Table,
                    leased: set[str]) -> str | None:
    """Every snapshot CURRENT or a listed manifest names equals the oracle fold of the topic it claims at its
    manifest's offsets: the old topic's for one published before the wipe (stale), the new topic's for one
    published since. One marked unverified (it may mix both) is allowed only while the test's reader holds it, and
    never as CURRENT. Returns CURRENT's id."""
    cur = current_id(d.state_dir, "tbl")
    found = manifests_of(d.state_dir, "tbl")
    assert cur is None or cur in {m.id for m in found}, (cur, found)
    for m in found:
        if unverified(m):
            assert m.id in leased and m.id != cur, f"unverified snapshot {m.id} listed unleased or CURRENT: {m}"
            continue
        data = read_store(snapshots_dir(d.state_dir, "tbl") / m.id / "db")[1]
        if m.stale:  # of the old topic: published before the recreation was found
            assert m.offsets == old_ends, f"stale snapshot {m.id} past the old topic's end {old_ends}: {m}"
            expected = old_fold
        else:
            expected = fold(broker.settings, t, m.offsets)
        assert diff(data, expected) == 0, f"snapshot {m.id} at {m.offsets} (current {cur}): {explain(data, expected)}"
    return cur


@pytest.mark.parametrize("retain", [10, 1])
def test_snapshots_of_both_topics_are_never_served(broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path,
                                                   fault: Callable[[str, str], FaultRow], retain: int) -> None:
    """The daemon applies and publishes the new topic from the old offsets before its next check can tell (the
    refresh held back while the topic is replaced and read): a snapshot that mixes both topics is CURRENT. Once the
    check finds the recreation, only a snapshot at or below the offsets it last verified may stay CURRENT (the old
    one, kept by ``retain = 10``), or none at all (``retain = 1`` deleted it); the mixed one a reader leased stays on
    disk for its lease, marked unverified and never CURRENT, and goes once released."""
    row = fault(f"topic recreated and its records published before the check finds it (retain {retain})",
                "only snapshots at or below the verified offsets stay CURRENT during the rebuild; == oracle")
    t = topic()
    broker.admin.produce(t, random_records(OLD, keys=3_000, seed=70))  # keys the new topic lacks: mixed shows
    old_ends = broker.admin.end_offsets(t)
    old_fold = fold(broker.settings, t, old_ends)
    arm_file = tmp_path / "arm.json"
    d, hold = held(daemon, tmp_path, t, old_ends, arm_file, snapshots={"retain": retain})
    before = wait_snapshot_at(d, "tbl", old_ends)["id"]
    pid = d.pid
    new_ends, mixed = replace_in_the_window(broker, d, hold, t, seed=71)
    row.injected += 1
    root = snapshots_dir(d.state_dir, "tbl")
    leases.take(root, "test-reader", mixed, 600)
    if retain > 1:
        exact_build_on_a_mixed_base(d, tmp_path, root / mixed, root / before)

    midway.freeze_at_restore(arm_file, "tbl", 0.5)  # look at the snapshots in the middle of the rebuild
    hold.unlink()
    midway.wait_frozen(d, arm_file)
    try:
        cur = named_snapshots(broker, d, t, old_ends, old_fold, {mixed})
        assert cur == (before if retain > 1 else None), (cur, before, manifests_of(d.state_dir, "tbl"))
        assert (root / mixed).is_dir(), "a leased snapshot was deleted"
        if cur is None:
            reason = d.status()["tables"]["tbl"]["snapshot"]["stale_reason"] or ""
            assert "no snapshot served" in reason, reason
    finally:
        os.kill(pid, signal.SIGCONT)
    rebuilt_equal(broker, d, t, row, pid)
    wait_snapshot_at(d, "tbl", new_ends)
    named_snapshots(broker, d, t, old_ends, old_fold, {mixed})
    leases.release(root, "test-reader")
    d.wait_for(lambda s: not (root / mixed).exists(), what=f"the unverified snapshot {mixed} deleted once released")
    named_snapshots(broker, d, t, old_ends, old_fold, set())
