"""A versioned table's since after a gap in reading (issue 45: never a since earlier than provable): the rule
(``store.gaps.since_after_gap``), and the loop's marks (``engine.reading``) on a real store: a restart after downtime
longer than the topic's min.compaction.lag.ms, or a stall while running, moves since to the resume less the lag;
a table that tails without a gap keeps it. The wall clock is the module's ``now_ms``, set by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from globald.common.states import StateMachine
from globald.engine.reading import STALL_TOLERANCE_MS, ReadingMarks
from globald.engine.table import TableRuntime
from globald.engine.update_task import UpdateTask
from globald.settings.config import TableConfig
from globald.store import gaps, history
from globald.store.gaps import since_after_gap
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.unit.test_update_task import Event

LAG = 60_000
SINCE = 1_000_000


GAPS = [gaps.RESUME, gaps.BOOTSTRAP]


# The one rule of a gap in reading (``store.gaps.since_after_gap``), each edge for both gaps: a resume after a restart,
# an outage, a pause or a stall (from the read mark), and a bootstrap from an export (from its snapshot's time).

@pytest.mark.parametrize("gap", GAPS)
def test_a_gap_within_the_lag_keeps_since(gap: gaps.Gap) -> None:
    start = SINCE + 500_000
    assert since_after_gap(SINCE, start, start, LAG, gap) == (SINCE, None)
    assert since_after_gap(SINCE, start, start + LAG, LAG, gap) == (SINCE, None)  # every record appended is there


@pytest.mark.parametrize("gap", GAPS)
def test_a_gap_longer_than_the_lag_moves_since_to_the_end_less_the_lag(gap: gaps.Gap) -> None:
    start = SINCE + 500_000
    now = start + LAG + 1
    moved, why = since_after_gap(SINCE, start, now, LAG, gap)
    assert moved == now - LAG and why is not None and gap.span.format(gap=LAG + 1) in why and "60000 ms" in why
    assert why.endswith(f"so since moves to {gap.end} less the lag")
    # A since already later than what the end proves stays.
    assert since_after_gap(now, start, now, LAG, gap) == (now, None)


@pytest.mark.parametrize("gap", GAPS)
def test_an_unknown_lag_is_0_so_any_gap_moves_since_to_the_end(gap: gaps.Gap) -> None:
    start = SINCE + 500_000
    moved, why = since_after_gap(SINCE, start, start + 1, None, gap)
    assert moved == start + 1 and why is not None and "unknown, taken as 0" in why
    # No gap at all: nothing can be gone. (A bootstrap kept nothing here before the rule was one: an export's
    # snapshot dated the very millisecond of its bootstrap; the same proof holds for it.)
    assert since_after_gap(SINCE, start, start, None, gap) == (SINCE, None)


@pytest.mark.parametrize("gap", GAPS)
def test_no_start_recorded_or_a_start_after_the_end_moves_since(gap: gaps.Gap) -> None:
    now = SINCE + 500_000
    moved, why = since_after_gap(SINCE, None, now, LAG, gap)
    assert moved == now - LAG and why is not None and f"nothing records {gap.start}" in why
    # The start is in the future: the wall clock stepped back (or an exporting host's clock is ahead), and the
    # gap's real length is unknown: on doubt, move, even within the lag. (A bootstrap kept since here before the
    # rule was one; docs/as-of.md, Exports and bootstraps.)
    moved, why = since_after_gap(SINCE, now + 5, now, LAG, gap)
    assert moved == now - LAG and why is not None and f"5 ms behind {gap.start} ({gap.behind})" in why


@pytest.mark.parametrize("gap", GAPS)
def test_a_gap_within_the_tolerance_is_no_gap(gap: gaps.Gap) -> None:
    start = SINCE + 500_000
    assert since_after_gap(SINCE, start, start + 5_000, None, gap, tolerance_ms=10_000) == (SINCE, None)
    assert since_after_gap(SINCE, start, start + 10_001, None, gap, tolerance_ms=10_000)[0] == start + 10_001
    assert since_after_gap(SINCE, start, start + LAG, LAG, gap, tolerance_ms=10_000) == (SINCE, None)  # lag longer


def test_a_resume_says_how_long_the_table_did_not_read() -> None:
    read = SINCE + 500_000
    why = since_after_gap(SINCE, read, read + LAG + 1, LAG, gaps.RESUME)[1]
    assert why is not None and "the table did not read its topic for 60001 ms" in why
    why = since_after_gap(SINCE, read + 5, read, LAG, gaps.RESUME)[1]
    assert why is not None and "stepped back" in why


# -- the loop's marks on a real store ------------------------------------------------------------------------


class Clock:
    """The wall clock (``now``) and the time elapsed (``history.elapsed_ms``): ``now`` moved moves both, ``step``
    only the wall clock, as NTP or a resumed VM's step does."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.stepped = 0

    def __call__(self) -> int:
        return self.now

    def elapsed(self) -> int:
        return self.now - self.stepped

    def step(self, ms: int) -> None:
        self.now += ms
        self.stepped += ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock(10**12)
    monkeypatch.setattr(history, "now_ms", c)
    monkeypatch.setattr(history, "elapsed_ms", c.elapsed, raising=False)
    return c


def _runtime(tmp_path: Path) -> TableRuntime:
    store = TableStore.open(tmp_path, "tbl", "t", StoreOptions(), history_ms=10**12).store
    store.compaction_lag_ms = LAG
    return TableRuntime(config=TableConfig("tbl", "t", history=10**12), store=store,
                        machine=StateMachine(lambda *a: None, "tbl"))


def _since(rt: TableRuntime) -> int:
    status = rt.store.history_status()
    assert status is not None and status["since"] is not None, status
    return int(status["since"])


def _reading(rt: TableRuntime) -> bool:
    return True


def _restarted(tmp_path: Path, rt: TableRuntime) -> TableRuntime:
    rt.store.close()
    again = _runtime(tmp_path)
    assert again.store.history_read_mark() is not None
    return again


def _tailing(rt: TableRuntime) -> tuple[ReadingMarks, UpdateTask, int]:
    """The loop's marks and update task on ``rt``, seen reading and a first record applied: its since."""
    marks = ReadingMarks()
    marks.turn({"tbl": rt}, _reading)
    task = UpdateTask({"tbl": rt})
    task.start("tbl", {})
    task.update([Event(0, 0, _key=b"a", _value=b"1", _ts=5)])  # type: ignore[list-item]
    return marks, task, _since(rt)


def test_a_restart_after_downtime_longer_than_the_lag_moves_since(tmp_path: Path, clock: Clock) -> None:
    rt = _runtime(tmp_path)
    marks, _, since = _tailing(rt)
    assert since == clock.now - LAG  # the replay's
    clock.now += 1_000
    marks.turn({"tbl": rt}, _reading)  # tailing: kept
    assert _since(rt) == since
    stopped = clock.now
    # Down for less than the lag: kept, across the restart.
    rt = _restarted(tmp_path, rt)
    clock.now = stopped + LAG
    ReadingMarks().turn({"tbl": rt}, _reading)
    status = rt.store.history_status()
    assert status is not None and status["since"] == since and status["moved"] is None
    # Down for longer than the lag: since = the restart less the lag, said in status.
    stopped = clock.now
    rt = _restarted(tmp_path, rt)
    clock.now = stopped + LAG + 1
    ReadingMarks().turn({"tbl": rt}, _reading)
    status = rt.store.history_status()
    assert status is not None and status["since"] == clock.now - LAG, status
    assert status["moved"] is not None and "did not read its topic" in status["moved"]
    rt.store.close()


def test_a_stall_while_running_moves_since_and_the_batch_carries_the_loops_mark(tmp_path: Path,
                                                                                clock: Clock) -> None:
    rt = _runtime(tmp_path)
    rt.store.compaction_lag_ms = None  # unknown: the running loop's tolerance holds
    marks, task, since = _tailing(rt)
    seen = clock.now
    # Not reading (an outage): no mark moves; a batch written then carries the last reading, not its own time.
    clock.now += STALL_TOLERANCE_MS * 3
    marks.turn({"tbl": rt}, lambda _: False)
    task.update([Event(0, 1, _key=b"a", _value=b"2", _ts=6)])  # type: ignore[list-item]
    assert rt.store.history_read_mark() == seen and _since(rt) == since
    # Reading again: the gap is longer than the tolerance, since moves to the resume (the lag is 0).
    marks.turn({"tbl": rt}, _reading)
    assert _since(rt) == clock.now and rt.store.history_read_mark() == clock.now
    # Turns within the tolerance keep it.
    clock.now += STALL_TOLERANCE_MS
    marks.turn({"tbl": rt}, _reading)
    assert _since(rt) == clock.now - STALL_TOLERANCE_MS
    rt.store.close()


def test_a_wall_clock_step_while_tailing_is_no_gap_and_keeps_since(tmp_path: Path, clock: Clock) -> None:
    """A table that tails without a gap keeps its since, whatever the wall clock does meanwhile: the running loop
    measures its gaps on a clock that steps do not move. Found by the chaos campaign's versioned lane: a +1 day step
    was taken as a day-long stall, since moved a day past every record time, and every as-of lookup was refused
    for that day, though nothing had been missed."""
    rt = _runtime(tmp_path)
    rt.store.compaction_lag_ms = None  # unknown (0): any gap past the loop's tolerance would move since
    marks, _, since = _tailing(rt)
    for step in (86_400_000, -86_400_000, 3_600_000):
        clock.step(step)
        marks.turn({"tbl": rt}, _reading)
        assert _since(rt) == since, step
        clock.now += 1_000
        marks.turn({"tbl": rt}, _reading)
        assert _since(rt) == since, step
    # A real stall, with a step inside it, still moves since: to the resume (the lag is 0).
    clock.now += STALL_TOLERANCE_MS * 3
    clock.step(-60_000)
    marks.turn({"tbl": rt}, _reading)
    assert _since(rt) == max(since, clock.now)
    rt.store.close()


def test_after_a_crash_the_downtime_is_measured_from_the_last_batch(tmp_path: Path, clock: Clock) -> None:
    rt = _runtime(tmp_path)
    marks, task, since = _tailing(rt)
    written = clock.now
    # Crashed right after a batch, back within the lag: kept.
    rt.store.close(clean=False)
    rt = _runtime(tmp_path)
    clock.now = written + LAG
    marks = ReadingMarks()
    marks.turn({"tbl": rt}, _reading)
    assert _since(rt) == since
    task = UpdateTask({"tbl": rt})
    task.start("tbl", rt.store.offsets())
    task.update([Event(0, 1, _key=b"a", _value=b"2", _ts=6)])  # type: ignore[list-item]
    written = clock.now
    # Idle and reading for longer than the lag, then a crash: only the clean stop records the idle reading, so the
    # restart measures from the last batch, and moves since (on doubt, move).
    for _ in range(LAG // (STALL_TOLERANCE_MS // 2) + 1):  # turns within the tolerance: nothing written
        clock.now += STALL_TOLERANCE_MS // 2
        marks.turn({"tbl": rt}, _reading)
    rt.store.close(clean=False)
    rt = _runtime(tmp_path)
    assert rt.store.history_read_mark() == written
    clock.now += 1
    ReadingMarks().turn({"tbl": rt}, _reading)
    assert _since(rt) == clock.now - LAG
    rt.store.close()
