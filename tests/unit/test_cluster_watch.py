"""The cluster watch's decisions from answers (engine.cluster_watch): pure logic, with the worker's answers given."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from globald.engine import cluster_watch
from globald.engine.cluster_watch import ClusterWatch, LoopFacts, Renew
from globald.engine.identity import RefreshFacts
from globald.engine.problems import Problems
from globald.kafka.identity import Verdict


class _Identity:
    """Hands the watch one refresh answer per table, and says every check found the same topic."""

    def __init__(self, facts: RefreshFacts) -> None:
        self.facts: RefreshFacts | None = facts

    def vanished(self, table: str) -> bool:
        return False

    def back(self, table: str) -> bool:
        return False

    def refresh_answer(self, rt: Any) -> RefreshFacts | None:
        facts, self.facts = self.facts, None
        return facts

    def changed_id(self, rt: Any, now: str | None) -> None:
        return None

    def judge(self, rt: Any, verdict: Verdict, checked: Any) -> None:
        return None

    def checked(self, rt: Any, applied: Any, verdict: Verdict) -> None:
        pass

    def ask_refresh(self, rt: Any, applied: Any) -> None:
        pass


class _Worker:
    def asked(self, key: str) -> bool:
        return False

    def take(self, key: str) -> None:
        return None

    def ask(self, key: str, fn: Any) -> None:
        pass


def _watch(ends: dict[int, int], now: float, monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterWatch, Any]:
    monkeypatch.setattr(cluster_watch.time, "monotonic", lambda: now)
    rt = SimpleNamespace(name="t", topic="t", partitions=[0, 1], assigned=True, last_error=None)
    facts = RefreshFacts([0, 1], {}, ends, None, Verdict("t"), {})
    watch = ClusterWatch({"t": rt}, _Identity(facts), _Worker(), Problems(), 3600.0)  # type: ignore[arg-type]
    return watch, rt


def _loop(positions: dict[int, int], last_progress: float) -> LoopFacts:
    return LoopFacts({"t": {}}, {"t": positions}, {"t": {}}, last_progress)


def test_a_consumer_that_fetched_nothing_for_30s_while_the_cluster_holds_more_is_renewed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster answers the worker (its refresh came back), and holds records past where the table stands, but
    the loop's consumer has fetched nothing for 31 s: replaced (an accelerated soak saw one silent for 9 minutes
    after a broker restart while new clients were answered)."""
    now = time.monotonic() + 1000
    watch, _ = _watch({0: 100, 1: 50}, now, monkeypatch)
    decisions = watch.turn(_loop({0: 90, 1: 50}, last_progress=now - 31))
    assert decisions == [Renew(pytest.approx(31))]


@pytest.mark.parametrize(("positions", "quiet_s"), [({0: 100, 1: 50}, 300), ({0: 90, 1: 50}, 10)],
                         ids=["at the log end, however long idle", "behind but fetching lately"])
def test_an_idle_or_a_fetching_consumer_is_kept(monkeypatch: pytest.MonkeyPatch, positions: dict[int, int],
                                               quiet_s: float) -> None:
    now = time.monotonic() + 1000
    watch, _ = _watch({0: 100, 1: 50}, now, monkeypatch)
    assert watch.turn(_loop(positions, last_progress=now - quiet_s)) == []


def test_a_renewal_is_not_repeated_within_its_period(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.monotonic() + 1000
    watch, _ = _watch({0: 100, 1: 50}, now, monkeypatch)
    watch.renewed()  # just now
    assert watch.turn(_loop({0: 90, 1: 50}, last_progress=now - 60)) == []
