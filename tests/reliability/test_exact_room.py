"""An exact-offset build checks the room it needs before it starts (issue 21, item 2), on a real small disk.

A build links its base snapshot (no new bytes), writes the records it reads, and a compaction of its database may
rewrite both: it needs the base's size + twice the records read (``globald.snapshot.space.BuildNeed``). With less
free, globald frees what it owns (leftovers, snapshots no reader holds beyond CURRENT and the base); if it is still
short, the request is refused with ``no_room`` naming the bytes missing, before anything is written. Here, on a
tmpfs: a build that cannot fit is refused and leaves nothing; the same build once an unleased older snapshot holds
the missing room frees it and succeeds, equal to the oracle fold.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.oracle import fold
from globald.snapshot import exact_requests
from globald.snapshot import manifest as manifests
from globald.snapshot.exact_builds import base_for
from globald.snapshot.exact_requests import Code
from globald.snapshot.reader import manifests_of
from globald.snapshot.space import build_need
from globald.store.names import snapshots_dir
from globald.store.space import MB
from tests.harness import Broker, DaemonProcess, random_records
from tests.reliability.checks import diff, explain, read_store
from tests.reliability.disk import copy_what_fits, fill, tmpfs
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]

FIRST, SECOND = 6_000, 12_000  # records of ~1 KB, keys all distinct: the base is the first, the build reads 90 %
VALUE_SIZE = 1_000
DISK_MB = 128


def caught_up(d: DaemonProcess, ends: dict[int, int]) -> None:
    """RUNNING at ``ends``; not ``wait_running``, whose readiness needs a periodic snapshot this test does without."""
    d.wait_for(lambda s: s.get("state") == "RUNNING" and s.get("pid") == d.pid
               and all(s["tables"]["tbl"]["offsets"].get(str(p), -1) >= o for p, o in ends.items()),
               timeout=60, what=f"RUNNING at {ends}")


def settled(d: DaemonProcess) -> dict[str, Any]:
    """Status once the table's space figures held still for 2 s (no merge, no republish under way)."""
    seen: list[tuple[int, int]] = []

    def still(doc: dict[str, Any]) -> bool:
        fig = doc["disk"]["tables"]["tbl"]
        seen.append((fig["live_bytes"], fig["snapshot_bytes"]))
        return len(seen) >= 10 and len(set(seen[-10:])) == 1

    return d.wait_for(still, timeout=90, what="the table's disk figures settled")


def test_an_exact_build_without_room_is_refused_and_one_that_fits_after_freeing_is_built(
        broker: Broker, topic: Topic, daemon: Daemon, tmp_path: Path, fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("exact build on a disk without room for it, then with an unleased older snapshot holding the room",
                "refused no_room (bytes missing), nothing left; then freed and built, == oracle")
    t = topic()
    keys = (FIRST + SECOND) * 50
    broker.admin.produce(t, random_records(FIRST, keys=keys, seed=2131, tombstones=0.0, value_size=VALUE_SIZE))
    first = broker.admin.end_offsets(t)
    with tmpfs(tmp_path / "disk", DISK_MB) as disk:
        # No periodic snapshot: one published while the daemon consumed SECOND would be the build's base instead
        # (seen on a loaded CI machine). The base is an exact snapshot at FIRST, the only snapshot there is.
        d = daemon({"tbl": t}, state_dir=disk / "state", snapshots={"retain": 5, "interval_ms": 3_600_000})
        caught_up(d, first)
        made = exact_requests.request(d.state_dir, "tbl", first, timeout=120)
        assert made.code == Code.READY and made.snapshot, (made, d.tail())
        base_id = made.snapshot
        broker.admin.produce(t, random_records(SECOND, keys=keys, seed=2132, tombstones=0.0, value_size=VALUE_SIZE))
        second = broker.admin.end_offsets(t)
        caught_up(d, second)
        live = settled(d)["disk"]["tables"]["tbl"]["live_bytes"]
        target = {p: first[p] + (second[p] - first[p]) * 9 // 10 for p in first}
        root = snapshots_dir(d.state_dir, "tbl")
        found = manifests_of(d.state_dir, "tbl")
        base = base_for(found, target)
        assert base is not None and base.id == base_id, (base, found)
        need = build_need(d.state_dir, "tbl", target, base, root / base.id, found[0].records).total
        assert need > live + 6 * MB, f"the build must need more than the live store: need {need}, live {live}"
        # Room for the table's own next step, not for the build; freeing a copy of the base (below) makes it fit.
        copy_bytes = sum(f.stat().st_size for f in (root / base.id / "db").iterdir() if f.is_file())
        leave = need - copy_bytes // 2
        assert leave > live + 2 * MB, (leave, live, need, copy_bytes)

        filler = fill(disk, leave=leave)
        row.injected += 1
        refused = exact_requests.request(d.state_dir, "tbl", target, timeout=60)
        assert refused.code == Code.NO_ROOM, refused
        missing = int(re.search(r"(\d+) bytes", refused.message).group(1))  # type: ignore[union-attr]
        assert abs(missing - (need - leave)) < 3 * MB, (missing, need, leave, refused.message)
        assert not [p for p in root.iterdir() if p.name.startswith(".build-")], list(root.iterdir())
        assert all(m.offsets != target for m in manifests_of(d.state_dir, "tbl"))
        d.wait_for(lambda s: s["tables"]["tbl"]["snapshot"]["refused"].get("no_room") == 1, timeout=10,
                   what="the refusal counted in status")
        assert "refused: no_room" in d.log.read_text(), d.tail()
        filler.unlink()

        # An older snapshot of globald's own, a copy of the base (not links), nobody's.
        cur = manifests.read(root / found[0].id, "tbl")
        older = str(int(base.id) - 1_000_000)
        work = root / "spare-in-progress"
        work.mkdir()
        manifests.write(work, dataclasses.replace(cur, id=older, offsets={p: o - 1 for p, o in cur.offsets.items()}))
        assert copy_what_fits(root / cur.id / "db", work / "db") > 0  # a full disk is what the test wants next
        work.rename(root / older)
        fill(disk, leave=leave)
        ready = exact_requests.request(d.state_dir, "tbl", target, timeout=120)
        assert ready.code == Code.READY and ready.snapshot, (ready, d.tail())
        assert not (root / older).exists(), "the unleased older snapshot was not freed for the build"
        data = read_store(root / ready.snapshot / "db")[1]
        expected = fold(broker.settings, t, target)
        assert diff(data, expected) == 0, explain(data, expected)
        assert "for an exact build" in d.log.read_text(), d.tail()
        assert d.stop() == 0, d.tail()
