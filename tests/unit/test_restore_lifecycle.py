"""The state manager owns a restore, from its targets to RUNNING; the loop only reports the progress of polls."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from globald.common.errors import StoreIOError
from globald.common.states import State
from globald.engine.events import RestoreEnded, StateChanged
from globald.engine.state_manager import StateManager
from globald.engine.table import Restore, TableRuntime
from globald.engine.thread import GlobalThread
from globald.settings.config import parse
from globald.settings.ref import ConfigRef
from tests.stores import write_records


@contextmanager
def _restoring(tmp_path: Path, targets: dict[int, int]) -> Iterator[tuple[StateManager, TableRuntime, list[object]]]:
    """A state manager whose one table is RESTORING, assigned, with ``targets`` to reach; closed afterwards."""
    cfg = parse({"state_dir": str(tmp_path), "kafka": {"bootstrap.servers": "127.0.0.1:9"},
                 "tables": [{"name": "tbl", "topic": "topic"}]})
    heard: list[object] = []
    ref = ConfigRef(cfg)
    manager = StateManager(ref, heard.append)
    GlobalThread(ref, manager, heard.append)  # hands the manager the topics' identity, as the daemon's does
    assert manager.open_all() == ({"tbl": {}}, {})
    rt = manager.tables["tbl"]
    try:
        manager.restoring(rt, "starting")
        rt.partitions, rt.restore, rt.assigned = sorted(targets), Restore(dict(targets)), True
        yield manager, rt, heard
    finally:
        manager.close(clean=True)


def test_a_restore_ends_through_a_verified_commit_then_the_table_is_running(tmp_path: Path) -> None:
    with _restoring(tmp_path, {0: 2, 1: 1}) as (manager, rt, heard):
        write_records(rt.store, {b"a": b"\0" * 8 + b"1"}, {0: 1, 1: 1})
        manager.restore_progress(rt, {0: 1, 1: 1}, {0: 1}, lambda s: heard.append(("durable", s)))
        assert rt.machine.state == State.RESTORING and rt.restore is not None and rt.restore.targets == {0: 2}
        assert [e.partition for e in heard if isinstance(e, RestoreEnded)] == [1]

        write_records(rt.store, {b"b": b"\0" * 8 + b"2"}, {0: 2, 1: 1})
        manager.restore_progress(rt, {0: 2, 1: 1}, {0: 1}, lambda s: heard.append(("durable", s)))
        assert rt.machine.state == State.RUNNING and rt.restore is None and rt.store.complete
        # The caller hears that the restore is durable before anyone hears of RUNNING.
        order = [e[0] if isinstance(e, tuple) else type(e).__name__ for e in heard
                 if isinstance(e, tuple) or (isinstance(e, StateChanged) and e.new == State.RUNNING)]
        assert order == ["durable", "StateChanged"]


def test_a_restore_whose_offsets_are_not_durable_stays_restoring(tmp_path: Path) -> None:
    with _restoring(tmp_path, {0: 2}) as (manager, rt, _):
        write_records(rt.store, {b"a": b"\0" * 8 + b"1"}, {0: 1})  # the store holds less than the task applied
        with pytest.raises(StoreIOError, match="durable offsets"):
            manager.restore_progress(rt, {0: 2}, {0: 2}, lambda s: pytest.fail("not durable"))
        assert rt.machine.state == State.RESTORING and not rt.store.complete


def test_a_wipe_for_a_recreated_topic_carries_the_offsets_the_last_check_verified(tmp_path: Path) -> None:
    """What a refresh's check verified travels to the snapshots: Verified as it happens, Wiped.verified with a
    wipe for topic_recreated (and only then); a partition whose check could not be made is not moved on."""
    from globald.engine.events import Verified, Wiped
    from globald.kafka.identity import Verdict
    from globald.store.fingerprint import Fingerprint, Ladder

    with _restoring(tmp_path, {0: 2, 1: 1}) as (manager, rt, heard):
        def ladder(*offsets: int) -> Ladder:
            return Ladder(tuple(Fingerprint(o, b"\0" * 8) for o in offsets))

        manager.identity.checked(rt, {0: ladder(9, 4), 1: ladder(7)},
                                 Verdict("topic", unverifiable={1: "compacted"}))
        verified = [e for e in heard if isinstance(e, Verified)]
        assert verified[-1].offsets == {0: 10} and verified[-1].fingerprints[0][0].offset == 9
        manager.identity.checked(rt, {0: ladder(5)}, Verdict("topic"))  # never moves back
        assert [e for e in heard if isinstance(e, Verified)][-1].offsets == {0: 10}
        manager.wipe(rt, "topic_recreated", "the record at offset 9 differs")
        manager.wipe(rt, "operator_reset", "asked")
        wiped = [e for e in heard if isinstance(e, Wiped)]
        assert wiped[0].verified == {0: 10}  # the offsets of the last check, handed over
        assert wiped[1].verified is None  # no doubt about the topic: nothing to restrict


def test_a_problem_lasts_from_its_first_report_until_any_path_resolves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer is replaced once the cluster's problem has lasted 30 s (engine.cluster_watch): the clock starts at
    the problem's first report, whoever reports it, and stops at its resolution, whoever resolves it. Before, a
    start left over from an earlier outage made the loop replace a healthy consumer at the next outage's first
    failed probe (an accelerated soak: 6 replacements in 25 minutes of 3-second faults)."""
    from globald.engine import problems as problems_module
    from globald.engine.problems import KAFKA, Problems

    clock = [100.0]
    monkeypatch.setattr(problems_module.time, "monotonic", lambda: clock[0])
    p = Problems()
    assert p.lasted(KAFKA) == 0.0
    p.report(KAFKA, "metadata refresh failed")  # reported by the refresh, not by the probe
    clock[0] += 10
    p.failed(KAFKA, "unreachable")  # the probe's failure does not restart the clock
    clock[0] += 25
    assert p.lasted(KAFKA) == 35.0
    p.resolved(KAFKA)  # by whichever path
    clock[0] += 100
    assert p.lasted(KAFKA) == 0.0
    p.failed(KAFKA, "unreachable", quiet=True)
    clock[0] += 3
    assert p.lasted(KAFKA) == 3.0
