"""Pure snapshot logic: manifest validation, leases and retention, request files, build targets, lookups."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from globald.common.errors import ManifestError, SnapshotNotFoundError, SnapshotStaleError
from globald.snapshot import exact_requests, leases, listing, open_snapshot
from globald.snapshot import manifest as manifests
from globald.snapshot.builder import BuildRefused, check_target
from globald.snapshot.exact_requests import Code, Request, Response
from globald.snapshot.manifest import Manifest
from globald.snapshot.reader import find_exact
from globald.snapshot.resolve import Policy, resolve
from globald.store.names import SNAPSHOT_CURRENT, SNAPSHOT_MANIFEST, snapshots_dir

ID1, ID2, ID3 = "1700000000000001", "1700000000000002", "1700000000000003"


def make(sid: str = ID1, **kw: Any) -> Manifest:
    fields: dict[str, Any] = {"table": "tbl", "topic": "topic", "id": sid, "offsets": {0: 10, 1: 0},
                              "created": 1.5, "daemon_state": "RUNNING", "table_state": "RUNNING", "records": 7}
    fields.update(kw)
    return Manifest(**fields)


def publish(state: Path, m: Manifest, current: bool = False) -> Path:
    d = snapshots_dir(state, m.table) / m.id
    d.mkdir(parents=True)
    manifests.write(d, m)
    if current:
        (d.parent / SNAPSHOT_CURRENT).write_text(m.id + "\n")
    return d


# -- manifests ----------------------------------------------------------------------------------------------------


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = make(kind="exact", request="r1", stale=True, stale_reason="wiped")
    d = publish(tmp_path, m)
    assert manifests.read(d, "tbl") == m
    assert manifests.read(d).marked_stale("x").stale_reason == "x"


BAD_FIELDS: list[tuple[str, Any]] = [
    ("format", 2), ("table", ""), ("table", 5), ("id", "123"), ("offsets", [1]), ("offsets", {"a": 1}),
    ("offsets", {"0": -1}), ("offsets", {"0": True}), ("offsets", {"0": 1.5}), ("created", "now"),
    ("created", float("inf")), ("records", True), ("records", -1), ("kind", "weekly"), ("stale", "no"),
    ("daemon_state", "DANCING"), ("stale_reason", 3),
]


@pytest.mark.parametrize(("key", "value"), BAD_FIELDS)
def test_manifest_rejects_bad_fields(tmp_path: Path, key: str, value: Any) -> None:
    doc = make().to_json()
    doc[key] = value
    with pytest.raises(ManifestError):
        Manifest.from_json(json.loads(json.dumps(doc, allow_nan=True)), "tbl", ID1)


def test_manifest_must_match_its_location(tmp_path: Path) -> None:
    doc = make().to_json()
    with pytest.raises(ManifestError, match="directory"):
        Manifest.from_json(doc, "tbl", ID2)
    with pytest.raises(ManifestError, match="lives under"):
        Manifest.from_json(doc, "other", ID1)
    for key in ("offsets", "records", "created", "stale"):
        partial = dict(doc)
        del partial[key]
        with pytest.raises(ManifestError):
            Manifest.from_json(partial, "tbl", ID1)


@pytest.mark.parametrize("content", [b"", b"{", b"\x00\xff garbage", b"[1, 2]", b'"text"', b"null",
                                     json.dumps(make().to_json()).encode()[:40], b" " * (2 << 20)])
def test_truncated_or_garbage_manifest_files_raise_manifest_error(tmp_path: Path, content: bytes) -> None:
    d = tmp_path / ID1
    d.mkdir()
    (d / SNAPSHOT_MANIFEST).write_bytes(content)
    with pytest.raises(ManifestError):
        manifests.read(d, "tbl")


def test_unreadable_snapshots_are_not_listed(tmp_path: Path) -> None:
    publish(tmp_path, make(ID1))
    publish(tmp_path, make(ID3), current=True)
    broken = snapshots_dir(tmp_path, "tbl") / ID2
    broken.mkdir()
    (broken / SNAPSHOT_MANIFEST).write_text('{"format": 1, "table": "tb')
    (snapshots_dir(tmp_path, "tbl") / "not-an-id").mkdir()
    assert [(s["id"], s["current"]) for s in listing(tmp_path, "tbl")] == [(ID3, True), (ID1, False)]


def test_new_ids_increase_even_when_the_clock_does_not() -> None:
    future = "1999999999999999"  # a clock set back by years must not reuse or reorder ids
    assert manifests.new_id(future) == "2000000000000000"
    a = manifests.new_id(None)
    assert manifests.valid_id(a) and manifests.new_id(a) > a


# -- leases and retention -----------------------------------------------------------------------------------------


class Clocks:
    """The daemon's two clocks, moved by hand: ``mono`` only forward, ``wall`` stepped either way."""

    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, 1_700_000_000.0

    def clock(self, table_dir: Path) -> leases.LeaseClock:
        return leases.LeaseClock(table_dir, monotonic=lambda: self.mono, wall=lambda: self.wall)


def test_leases_pin_until_they_expire(tmp_path: Path) -> None:
    c = Clocks()
    held = c.clock(tmp_path)
    leases.take(tmp_path, "reader-1", ID1, 60)
    leases.take(tmp_path, "reader-2", ID2, 0)
    found, garbage = leases.read_all(tmp_path)
    assert garbage == [] and {x.holder for x in found} == {"reader-1", "reader-2"}
    assert held.refresh() == {ID1}
    leases.take(tmp_path, "reader-1", ID3, 60)  # a holder pins one snapshot: the new one replaces the old
    assert held.refresh() == {ID3}
    leases.release(tmp_path, "reader-1")
    assert held.refresh() == set()


def test_a_lease_lives_on_the_daemons_monotonic_clock_whatever_the_wall_clocks_do(tmp_path: Path) -> None:
    """Issue 21, item 4: a lease is a heartbeat timed from when the daemon saw it, not a wall-clock deadline."""
    c = Clocks()
    held = c.clock(tmp_path)
    leases.take(tmp_path, "reader", ID1, 600)
    assert held.refresh() == {ID1}
    c.wall += 7200  # the daemon's wall clock stepped +2 h: nothing changes
    c.mono += 599
    assert held.refresh() == {ID1} and held.sweep() == 0
    c.wall -= 7200
    c.mono += 1  # 600 s of the daemon's own time since it saw the lease: expired, and its file goes
    assert held.refresh() == set() and held.sweep() == 1
    assert leases.read_all(tmp_path) == ([], [])


def test_a_renewal_is_seen_even_when_the_readers_clock_went_back(tmp_path: Path) -> None:
    c = Clocks()
    held = c.clock(tmp_path)
    first = leases.take(tmp_path, "reader", ID1, 100)
    held.refresh()
    c.mono += 90
    path = tmp_path / "leases" / "reader.json"
    doc = json.loads(path.read_text())
    again = leases.take(tmp_path, "reader", ID1, 100)
    # As written by a reader whose wall clock was stepped back an hour: an earlier expiry, the same content else.
    manifests.write_json(path, {**doc, "expires": first.expires - 3600, "renewal": again.renewal}, durable=False)
    assert held.refresh() == {ID1}
    c.mono += 99  # 189 s after the first write, 99 s after the renewal
    assert held.refresh() == {ID1}
    c.mono += 1
    assert held.refresh() == set()


def test_a_daemon_that_starts_treats_every_lease_as_just_renewed(tmp_path: Path) -> None:
    c = Clocks()
    leases.take(tmp_path, "reader", ID1, 30)
    c.mono += 10_000  # whatever happened before: the new daemon has no history
    c.wall += 86_400
    held = c.clock(tmp_path)
    assert held.refresh() == {ID1}
    c.mono += 30
    assert held.refresh() == set()


def test_a_lease_in_the_previous_format_holds_for_what_was_left_of_it_when_seen(tmp_path: Path) -> None:
    """Readers before the ttl_s format wrote only an absolute expiry: it is read once on the daemon's wall clock,
    then counted on its monotonic clock, so a later step does not move it."""
    c = Clocks()
    held = c.clock(tmp_path)
    folder = tmp_path / "leases"
    folder.mkdir()
    (folder / "old-reader.json").write_text(json.dumps(
        {"holder": "old-reader", "snapshot": ID1, "expires": c.wall + 120}))
    (folder / "old-expired.json").write_text(json.dumps(
        {"holder": "old-expired", "snapshot": ID2, "expires": c.wall - 1}))
    assert held.refresh() == {ID1}
    assert held.sweep() == 1
    c.wall += 7200
    c.mono += 119
    assert held.refresh() == {ID1}
    c.mono += 1
    assert held.refresh() == set()


def test_a_reader_renews_at_half_life_on_its_monotonic_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader whose wall clock steps back must still renew on time: the daemon times the lease from its writes."""
    from globald.snapshot import reader as reader_module
    from globald.store.options import StoreOptions
    from globald.store.table_store import TableStore
    from tests.stores import write_records

    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store
    write_records(store, {b"k": b"\0" * 8 + b"v"}, {0: 10, 1: 0})
    folder = snapshots_dir(tmp_path, "tbl") / ID1
    folder.mkdir(parents=True)
    store.checkpoint(folder / "db")
    store.close(clean=True)
    manifests.write(folder, make(ID1))

    class Clock:
        mono, wall = 100.0, 1_700_000_000.0

        @classmethod
        def monotonic(cls) -> float:
            return cls.mono

        @classmethod
        def time(cls) -> float:
            return cls.wall

    monkeypatch.setattr(reader_module, "time", Clock)
    lease_file = snapshots_dir(tmp_path, "tbl") / "leases" / "reader.json"

    def renewal() -> str:
        return str(json.loads(lease_file.read_text())["renewal"])

    snap = reader_module.Snapshot(tmp_path, "tbl", ID1, reader_module.OpenOptions(lease_s=10, holder="reader"))
    try:
        first = renewal()
        Clock.wall -= 86_400  # stepped back a day
        Clock.mono += 4.9
        snap.renew()
        assert renewal() == first
        Clock.mono += 0.1  # half of the lease has run out on the monotonic clock
        snap.renew()
        second = renewal()
        assert second != first
        Clock.wall += 2 * 86_400  # stepped forward: no early renewal either
        Clock.mono += 1
        snap.renew()
        assert renewal() == second
    finally:
        snap.close(release=True)
    assert not lease_file.exists()


def test_lease_sweep_removes_expired_and_old_garbage_only(tmp_path: Path) -> None:
    c = Clocks()
    held = c.clock(tmp_path)
    leases.take(tmp_path, "live", ID1, 600)
    leases.take(tmp_path, "dead", ID2, 0)
    folder = tmp_path / "leases"
    (folder / "garbage.json").write_text('{"holder": "someone-else", "snapshot": "x"}')
    (folder / ".writing.json.tmp").write_text("{half")
    held.refresh()
    assert held.sweep() == 1  # the expired lease; garbage gets a grace period on the daemon's clock
    c.mono += leases.GARBAGE_GRACE_S - 1
    (folder / "fresh-garbage.json").write_text("{not json")
    held.refresh()
    assert held.sweep() == 0
    c.mono += 1
    held.refresh()
    assert held.sweep() == 1
    assert sorted(p.name for p in folder.iterdir()) == [".writing.json.tmp", "fresh-garbage.json", "live.json"]


def test_an_expired_lease_renewed_before_the_sweep_is_kept(tmp_path: Path) -> None:
    c = Clocks()
    held = c.clock(tmp_path)
    leases.take(tmp_path, "reader", ID1, 10)
    held.refresh()
    c.mono += 10
    assert held.refresh() == set()
    leases.take(tmp_path, "reader", ID1, 10)  # renewed between the daemon's read and its sweep
    assert held.sweep() == 0
    assert held.refresh() == {ID1}


@pytest.mark.parametrize("holder", ["", ".hidden", "a/b", "../x", "x" * 200])
def test_lease_holders_are_safe_file_names(tmp_path: Path, holder: str) -> None:
    with pytest.raises(ValueError):
        leases.take(tmp_path, holder, ID1, 10)
    with pytest.raises(ValueError):
        leases.take(tmp_path, "ok", "../../etc", 10)


def test_retention_keeps_newest_and_pinned() -> None:
    ids = [f"17000000000000{i:02d}" for i in range(10)]
    assert leases.doomed(ids, 3, set()) == ids[:7][::-1]
    keep = {ids[0], ids[5]}
    assert set(leases.doomed(ids, 3, keep)) == set(ids[:7]) - keep
    assert leases.doomed([*ids, "junk"], 20, set()) == []


# -- exact requests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [
    {"id": "other", "table": "tbl", "offsets": {"0": 1}},
    {"id": "r1", "table": "x", "offsets": {"0": 1}},
    {"id": "r1", "table": "tbl", "offsets": {}},
    {"id": "r1", "table": "tbl", "offsets": {"0": -4}},
    {"id": "r1", "table": "tbl", "offsets": {"0": 1}, "lease_s": -1},
    {"id": "r1", "table": "tbl", "offsets": {"0": 1}, "lease_s": True},
])
def test_bad_requests_are_rejected(doc: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Request.from_json(doc, "r1", "tbl")


def test_pending_requests_parse_or_become_invalid_answers(tmp_path: Path) -> None:
    good = exact_requests.submit(tmp_path, "tbl", {0: 5, 1: 6}, lease_s=30)
    folder = snapshots_dir(tmp_path, "tbl") / "requests"
    (folder / "broken.json").write_bytes(b"\x00\x01")
    (folder / "bad name!.json").write_text("{}")
    (folder / ".in-progress.json").write_text("{}")
    taken = exact_requests.take_pending(tmp_path, "tbl")
    assert taken[0] == Response("broken", Code.INVALID, taken[0].message)  # type: ignore[union-attr]
    assert taken[1] == Request(good.id, "tbl", {0: 5, 1: 6}, 30.0)
    assert [p.name for p in folder.iterdir()] == [".in-progress.json"]


def test_responses_must_answer_the_request() -> None:
    assert Response.from_json({"request": "r1", "code": "ready", "snapshot": ID1}, "r1").snapshot == ID1
    for doc in ({"request": "r2", "code": "ready", "snapshot": ID1}, {"request": "r1", "code": "ready"},
                {"request": "r1", "code": "maybe"}):
        with pytest.raises(ValueError):
            Response.from_json(doc, "r1")


def test_no_daemon_is_answered_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    resp = exact_requests.request(tmp_path, "tbl", {0: 1}, timeout=30)
    assert resp.code == Code.NO_DAEMON and time.monotonic() - started < 5


def test_resolve_policies_without_a_daemon(tmp_path: Path) -> None:
    publish(tmp_path, make(ID1, offsets={0: 3}))
    publish(tmp_path, make(ID2, offsets={0: 9}, stale=True, stale_reason="wiped"), current=True)
    exact = resolve(tmp_path, "tbl", {0: 3}, timeout=1)
    assert (exact.snapshot, exact.exact) == (ID1, True)
    with pytest.raises(Exception, match="no_daemon"):
        resolve(tmp_path, "tbl", {0: 4}, timeout=1)
    newest = resolve(tmp_path, "tbl", {0: 4}, timeout=1, policy=Policy.NEWEST)
    assert (newest.snapshot, newest.exact, newest.stale) == (ID2, False, True)
    assert newest.note is not None and "no_daemon" in newest.note and "stale" in newest.note
    with pytest.raises(SnapshotStaleError):
        resolve(tmp_path, "tbl", {0: 4}, timeout=1, policy=Policy.NEWEST, serve_stale=False)


# -- exact builds and reading -------------------------------------------------------------------------------------


def test_build_targets() -> None:
    marks = {0: (0, 100), 1: (50, 60)}
    assert check_target({0: 40, 1: 55}, marks, None) == {0: 0, 1: 50}
    assert check_target({0: 40, 1: 55}, marks, {0: 30, 1: 55}) == {0: 30, 1: 55}
    cases: list[tuple[dict[int, int], dict[int, int] | None, Code]] = [
        ({0: 101, 1: 55}, None, Code.BEYOND_END),
        ({0: 10, 1: 20}, None, Code.BELOW_LOG_START),  # records below 50 are gone
        ({0: 40, 1: 55}, {0: 10, 1: 40}, Code.BELOW_LOG_START),  # the base needs 40..50
        ({0: 40}, None, Code.INVALID),
        ({0: 40, 1: 55}, {0: 41, 1: 55}, Code.INVALID),
    ]
    for target, base, code in cases:
        with pytest.raises(BuildRefused) as e:
            check_target(target, marks, base)
        assert e.value.code == code, (target, base)


def test_find_exact_prefers_hint_then_newest_fresh(tmp_path: Path) -> None:
    publish(tmp_path, make(ID1, offsets={0: 5}))
    publish(tmp_path, make(ID2, offsets={0: 5}, stale=True, stale_reason="wiped"))
    assert find_exact(tmp_path, "tbl", {0: 5}).id == ID1  # type: ignore[union-attr]
    assert find_exact(tmp_path, "tbl", {0: 5}, hint=ID2).id == ID2  # type: ignore[union-attr]
    assert find_exact(tmp_path, "tbl", {0: 6}) is None


def test_open_refuses_missing_bad_and_stale(tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFoundError):
        open_snapshot(tmp_path, "tbl")
    with pytest.raises(SnapshotNotFoundError):
        open_snapshot(tmp_path, "tbl", "../../etc")
    publish(tmp_path, make(ID1, stale=True, stale_reason="wiped"), current=True)
    with pytest.raises(SnapshotStaleError, match="wiped"):
        open_snapshot(tmp_path, "tbl", serve_stale=False)
    with pytest.raises(SnapshotNotFoundError):  # a manifest without a database
        open_snapshot(tmp_path, "tbl")


# -- retention under disk faults (regressions found by the chaos campaign, seed 0, faults 21 and 29) ------------


def _publisher(state: Path, **snapshots: Any) -> Any:
    from globald.engine.state_manager import StateManager
    from globald.settings.config import parse
    from globald.settings.ref import ConfigRef
    from globald.snapshot.publisher import SnapshotPublisher

    cfg = parse({"state_dir": str(state), "kafka": {"bootstrap.servers": "127.0.0.1:9"},
                 "tables": [{"name": "tbl", "topic": "topic"}], "snapshots": {"retain": 1, **snapshots}})
    ref = ConfigRef(cfg)
    return SnapshotPublisher(ref, StateManager(ref, lambda event: None))


def test_retention_keeps_a_snapshot_whose_manifest_the_disk_cannot_read(tmp_path: Path) -> None:
    """An I/O error reading a manifest (ENOSPC, EIO) says nothing about the snapshot: it is kept, not deleted."""
    old = publish(tmp_path, make(ID1))
    publish(tmp_path, make(ID2))
    publish(tmp_path, make(ID3), current=True)
    (old / SNAPSHOT_MANIFEST).unlink()
    (old / SNAPSHOT_MANIFEST).mkdir()  # reading it now fails with an OSError, as under an armed failure point
    with pytest.raises(manifests.ManifestIOError):
        manifests.read(old, "tbl")
    pub = _publisher(tmp_path)
    pub._retention.sweep(pub._tables["tbl"])
    assert old.exists()  # kept for a later sweep
    assert not (old.parent / ID2).exists()  # retention still applies to snapshots it can read (retain = 1)


def test_retention_never_deletes_a_leased_snapshot_with_an_invalid_manifest(tmp_path: Path) -> None:
    leased = publish(tmp_path, make(ID1))
    publish(tmp_path, make(ID2), current=True)
    leases.take(leased.parent, "reader-1", ID1, 900)
    (leased / SNAPSHOT_MANIFEST).write_bytes(b"{garbage")
    pub = _publisher(tmp_path)
    pub._retention.sweep(pub._tables["tbl"])
    assert leased.exists()


def test_an_answer_the_disk_refuses_does_not_stop_the_publisher(tmp_path: Path) -> None:
    """Regression (chaos campaign, seed 0, fault 12): a response file that cannot be written (a full disk) killed
    the exact-build worker, and no exact request was ever answered again."""
    pub = _publisher(tmp_path, interval_ms=3_600_000)
    responses = snapshots_dir(tmp_path, "tbl") / "responses"
    responses.parent.mkdir(parents=True)
    pub.tick()  # retention's first sweep (the next, an hour away, would trip on the file placed below)
    responses.write_text("a file where the folder should be")  # every write below it fails with an OSError
    # Asked as a reader asks; the table is not started, so the desk answers REBUILDING at once.
    exact_requests.submit(tmp_path, "tbl", {0: 1})
    pub.tick()  # the answer's write fails: logged, not raised
    responses.unlink()
    second = exact_requests.submit(tmp_path, "tbl", {0: 1})
    pub.tick()
    assert (responses / f"{second.id}.json").exists()


# -- a recreated topic: only snapshots at or below the offsets last verified stay CURRENT -------------------------


def _wiped(pub: Any, verified: dict[int, int] | None) -> None:
    from globald.engine.events import Wiped

    pub.start()
    try:
        pub.on_event(Wiped("tbl", "topic_recreated", "the record at offset 9 differs", verified))
    finally:
        pub.close()


def test_a_recreated_topic_moves_current_back_to_the_newest_verified_snapshot(tmp_path: Path) -> None:
    old = publish(tmp_path, make(ID1, offsets={0: 10, 1: 4}))
    leased = publish(tmp_path, make(ID2, offsets={0: 15, 1: 4}))  # past the verified offsets in partition 0
    mixed = publish(tmp_path, make(ID3, offsets={0: 20, 1: 6}), current=True)
    leases.take(leased.parent, "reader-1", ID2, 900)
    pub = _publisher(tmp_path)
    _wiped(pub, {0: 10, 1: 5})
    assert (old.parent / SNAPSHOT_CURRENT).read_text().strip() == ID1
    assert not mixed.exists()  # nobody held it: gone
    kept = manifests.read(leased, "tbl")  # its reader keeps it for the lease, marked, never CURRENT
    assert kept.stale and (kept.stale_reason or "").startswith("unverified"), kept
    assert manifests.read(old, "tbl").stale
    status = pub.status("tbl")
    assert status.current == ID1 and status.stale
    leases.release(leased.parent, "reader-1")
    pub._retention.sweep(pub._tables["tbl"])
    assert not leased.exists()  # released: an unverified snapshot goes, whatever retention says
    assert old.exists()


def test_a_recreated_topic_with_no_verified_snapshot_serves_none(tmp_path: Path) -> None:
    publish(tmp_path, make(ID1, offsets={0: 12, 1: 0}), current=True)
    pub = _publisher(tmp_path)
    _wiped(pub, {})  # found by the first check of this run: nothing verified
    assert not (snapshots_dir(tmp_path, "tbl") / SNAPSHOT_CURRENT).exists()
    status = pub.status("tbl")
    assert status.current is None and "no snapshot served" in (status.stale_reason or ""), status
    assert not pub.servable("tbl")


def test_other_wipes_keep_current_as_it_was(tmp_path: Path) -> None:
    publish(tmp_path, make(ID1, offsets={0: 12, 1: 0}), current=True)
    pub = _publisher(tmp_path)
    _wiped(pub, None)
    assert (snapshots_dir(tmp_path, "tbl") / SNAPSHOT_CURRENT).read_text().strip() == ID1
    assert pub.status("tbl").stale


def test_a_crash_inside_the_drop_leaves_an_unverified_current_that_the_next_run_unnames(tmp_path: Path) -> None:
    publish(tmp_path, make(ID1, stale=True, stale_reason="unverified: taken past ..."), current=True)
    pub = _publisher(tmp_path)
    pub.start()
    pub.close()
    assert not (snapshots_dir(tmp_path, "tbl") / SNAPSHOT_CURRENT).exists()
    assert pub.status("tbl").current is None
