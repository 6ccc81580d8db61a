"""State and restore callbacks, in-process on a real broker: order, arguments, and raising callbacks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.common.states import Listeners, State
from globald.engine.thread import GlobalThread
from globald.settings import config as configmod
from tests.harness import Broker, random_records, write_config

pytestmark = pytest.mark.kafka


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_restore_start(self, table: str, partition: int, start: int, end: int) -> None:
        self.events.append(("start", table, partition, start, end))

    def on_batch_restored(self, table: str, partition: int, batch_end: int, count: int) -> None:
        self.events.append(("batch", table, partition, batch_end, count))

    def on_restore_end(self, table: str, partition: int, total: int) -> None:
        self.events.append(("end", table, partition, total))


def test_callbacks_fire_in_order_with_arguments(broker: Broker, topic: Callable[..., str], tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(30_000, keys=3_000, seed=20))
    ends = broker.admin.end_offsets(t)
    cfg = configmod.load(write_config(tmp_path / "g.toml", tmp_path / "state", broker.settings, {"tbl": t},
                                      consume_batch_size=1000))
    listeners = Listeners()
    states: list[tuple[State, State, str]] = []
    table_states: list[tuple[str, State, State]] = []
    rec = Recorder()

    def boom(*args: object) -> None:
        raise RuntimeError("a broken operator callback")

    listeners.state.append(boom)  # registered first: must not stop the ones after it
    listeners.state.append(lambda new, old, reason: states.append((new, old, reason)))
    listeners.table_state.append(lambda table, new, old, reason: table_states.append((table, new, old)))
    listeners.restore.append(rec)
    thread = GlobalThread.standalone(cfg, listeners)
    runner = threading.Thread(target=thread.run)
    runner.start()
    deadline = time.monotonic() + 60
    while thread.state != State.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    thread.stop()
    runner.join(30)

    assert [(n, o) for n, o, _ in states] == [
        (State.RESTORING, State.CREATED), (State.RUNNING, State.RESTORING),
        (State.PENDING_SHUTDOWN, State.RUNNING), (State.NOT_RUNNING, State.PENDING_SHUTDOWN)]
    assert all(isinstance(reason, str) and reason for _, _, reason in states)
    assert table_states[:2] == [("tbl", State.RESTORING, State.CREATED), ("tbl", State.RUNNING, State.RESTORING)]
    assert listeners.failures == 4  # boom, once per daemon transition

    for p, end in ends.items():
        mine = [e for e in rec.events if e[2] == p]
        assert mine[0] == ("start", "tbl", p, 0, end)
        assert mine[-1] == ("end", "tbl", p, end)
        batches = [e for e in mine if e[0] == "batch"]
        assert sum(e[4] for e in batches) == end
        assert [e[3] for e in batches] == sorted(e[3] for e in batches)  # batch ends only move forward
        assert batches[-1][3] == end
        assert len(batches) > 1  # batches of at most 1000 records
    # Every restore ended before the table went RUNNING (the RUNNING event's index is after every "end").
    assert len([e for e in rec.events if e[0] == "end"]) == len(ends)
