"""The loop's idle wait ends when the cluster worker answers, and a turn that planned a table does not idle: a
table's plan, and an empty table's RUNNING, come without waiting out a poll (issue 44: the first plan waited one
idle poll). On the real loop, state manager and cluster worker, without a broker: the consumer fetches nothing,
and ``poll_timeout_ms`` is far longer than any deadline here, so a wait that is not cut short fails the test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from globald.common.states import State
from globald.engine.events import EventBus, RebuildRequests
from globald.engine.identity import PlanFacts
from globald.engine.loop import Loop, LoopParts
from globald.engine.state_manager import StateManager
from globald.engine.table import TableRuntime
from globald.engine.thread import GlobalThread
from globald.settings.config import parse
from globald.settings.ref import ConfigRef

POLL_TIMEOUT_MS = 60_000  # the longest a config allows: an idle wait not cut short outlasts the deadline below
DEADLINE_S = 45.0


class Consumer:
    """A consumer with nothing to fetch."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:  # poll, consume, assign...: nothing, at once
        return lambda *_, **__: None


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    ref = ConfigRef(parse({"state_dir": str(tmp_path / "state"), "poll_timeout_ms": POLL_TIMEOUT_MS,
                           "kafka": {"bootstrap.servers": "127.0.0.1:9"}, "tables": [{"name": "a", "topic": "ta"}]}))
    bus = EventBus()
    manager = StateManager(ref, bus.emit)
    thread = GlobalThread(ref, manager, bus.emit, consumer_factory=cast(Any, Consumer))
    stored, refused = manager.open_all()
    assert refused == {}
    thread.machine.to(State.RESTORING, "starting")  # as ``GlobalThread.run`` does
    parts = LoopParts(ref, manager, thread.worker, thread.identity, thread.problems, thread.stats, (), bus.emit,
                      RebuildRequests(), thread.machine, threading.Event())
    loop = Loop(parts, cast(Any, Consumer), stored)
    try:
        yield loop
    finally:
        loop.stop.set()
        manager.close(clean=True)
        thread.worker.close()


def test_an_answer_of_the_cluster_worker_ends_the_loop_s_idle_wait(loop: Loop) -> None:
    done = threading.Event()

    def poll() -> None:
        loop._poll_one()
        done.set()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    loop.worker.ask("question", lambda _: 1)
    assert done.wait(DEADLINE_S), "the idle wait went on after the cluster worker answered"
    answer = loop.worker.take("question")
    assert answer is not None and answer.result() == 1


def test_a_turn_that_planned_an_empty_table_makes_the_daemon_running_without_an_idle_poll(loop: Loop) -> None:
    def plan_answer(rt: TableRuntime) -> PlanFacts:  # what the cluster says of an empty topic
        return PlanFacts([0, 1], {0: (0, 0), 1: (5, 5)}, None, None)

    loop.identity.plan_answer = plan_answer  # type: ignore[method-assign]
    turned = threading.Event()

    def turn() -> None:
        loop.turn()
        turned.set()

    started = time.monotonic()
    threading.Thread(target=turn, daemon=True).start()
    assert turned.wait(DEADLINE_S), "the turn that planned the table waited out an idle poll"
    assert loop.machine.state == State.RUNNING and loop.tables["a"].machine.state == State.RUNNING
    assert time.monotonic() - started < DEADLINE_S
