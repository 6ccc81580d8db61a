"""A reload's two phases (``service.two_phase``) and its table events (``engine.tables_change``), on the real parts
without a broker: a state manager and a loop on stores in tmp_path, a consumer that is never asked for a record,
the real snapshot publisher subscribed to the bus."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from globald.common.states import State
from globald.engine.events import (
    Event,
    EventBus,
    RebuildRequests,
    StateChanged,
    TableAdded,
    TableDropped,
    TableRedeclared,
)
from globald.engine.loop import Loop, LoopParts
from globald.engine.state_manager import StateManager
from globald.engine.thread import GlobalThread
from globald.service import two_phase
from globald.settings.changes import Delta, delta
from globald.settings.config import Config, parse
from globald.settings.ref import ConfigRef
from globald.snapshot.builder import Builder
from globald.snapshot.publisher import SnapshotPublisher
from globald.status.document import ConfigStatus
from globald.status.statusfile import config_line
from globald.store import layout
from globald.store.names import HISTORY_CF, db_dir, snapshots_dir

AVRO = '{"type": "record", "name": "V", "fields": [{"name": "a", "type": "long"}]}'


class Consumer:
    """A consumer the loop never polls in these tests; ``closed`` once the cluster worker closed it."""

    made: list[Consumer] = []

    def __init__(self, *_: Any, **__: Any) -> None:
        self.closed = threading.Event()
        Consumer.made.append(self)

    def close(self) -> None:
        self.closed.set()

    def __getattr__(self, name: str) -> Callable[..., None]:  # assign, unassign, pause, resume: nothing to do
        return lambda *_, **__: None


def config(tmp_path: Path, tables: dict[str, str], typed: tuple[str, ...] = (), client_id: str = "a",
           history: dict[str, str] | None = None) -> Config:
    schema = tmp_path / "v.avsc"
    schema.write_text(AVRO)
    return parse({"state_dir": str(tmp_path / "state"),
                  "kafka": {"bootstrap.servers": "127.0.0.1:9", "client.id": client_id},
                  "tables": [{"name": n, "topic": t, **({"value": {"format": "avro", "schema": str(schema)}}
                                                        if n in typed else {}),
                              **({"history": (history or {})[n]} if n in (history or {}) else {})}
                             for n, t in tables.items()]})


@dataclass
class Engine:
    """The engine and the publisher as the daemon wires them: the publisher first on the bus, then ``heard``."""

    ref: ConfigRef
    thread: GlobalThread
    snapshots: SnapshotPublisher
    heard: list[Event] = field(default_factory=list)
    # At each StateChanged of a table the engine has, what status asks the publisher of it (``Daemon.status``)
    status_failures: list[str] = field(default_factory=list)

    def on_event(self, event: Event) -> None:
        self.heard.append(event)
        if isinstance(event, StateChanged) and event.table is not None and \
                self.thread.manager.table_view(event.table) is not None:
            try:
                self.snapshots.status(event.table)
            except KeyError:
                self.status_failures.append(f"{event.table} {event.new.value}")


@pytest.fixture
def engine(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """``request.param``: the tables' ``history`` (none unless a test asks, indirectly)."""
    Consumer.made = []
    ref = ConfigRef(config(tmp_path, {"a": "ta", "b": "tb", "c": "tc", "r": "tr"}, typed=("r",),
                           history=getattr(request, "param", None)))
    bus = EventBus()
    manager = StateManager(ref, bus.emit)
    thread = GlobalThread(ref, manager, bus.emit, consumer_factory=Consumer)
    snapshots = SnapshotPublisher(ref, manager)
    e = Engine(ref, thread, snapshots)
    bus.connect(snapshots.on_event, e.on_event)
    stored, refused = manager.open_all()
    assert refused == {}
    snapshots.start()
    parts = LoopParts(ref, manager, thread.worker, thread.identity, thread.problems, thread.stats, (), bus.emit,
                      RebuildRequests(), thread.machine, threading.Event())
    thread._loop = Loop(parts, Consumer, stored)  # the loop the daemon runs, without its turns
    e.heard.clear()
    try:
        yield e
    finally:
        snapshots.close()
        manager.close(clean=True)
        thread.worker.close()


def reload_to(e: Engine, tmp_path: Path) -> Delta:
    """Adds "n", drops "a", replaces "c" (another topic), redeclares "r" (another schema), changes [kafka]."""
    new = config(tmp_path, {"b": "tb", "c": "tc2", "r": "tr", "n": "tn"}, typed=("r",), client_id="b")
    schema2 = tmp_path / "v2.avsc"
    schema2.write_text(AVRO.replace('"V"', '"W"'))
    r = next(t for t in new.tables if t.name == "r")
    assert r.value is not None
    new = replace(new, tables=[replace(r, value=replace(r.value, schema=schema2)) if t is r else t
                               for t in new.tables])
    d = delta(e.ref.now, new)
    assert ([t.name for t in d.added], d.dropped, [t.name for t in d.replaced], [t.name for t in d.redeclared]) == \
        (["n"], ("a",), ["c"], ["r"]) and d.kafka_changed
    return d


def table_events(heard: list[Event], table: str) -> list[str]:
    out = []
    for ev in heard:
        match ev:
            case StateChanged(table=t, new=new) if t == table:
                out.append(new.value)
            case TableAdded() | TableDropped() | TableRedeclared() if ev.table == table:
                out.append(type(ev).__name__ + ("(replaced)" if isinstance(ev, TableDropped) and ev.replaced else ""))
    return out


def test_a_reload_s_tables_are_events_each_before_or_after_the_table_s_state(engine: Engine, tmp_path: Path) -> None:
    d = reload_to(engine, tmp_path)
    two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread))
    assert engine.ref.generation == 2
    assert table_events(engine.heard, "n") == ["TableAdded", State.RESTORING.value]
    assert table_events(engine.heard, "a") == [State.PENDING_SHUTDOWN.value, State.NOT_RUNNING.value, "TableDropped"]
    assert table_events(engine.heard, "c") == [State.PENDING_SHUTDOWN.value, State.NOT_RUNNING.value,
                                               "TableDropped(replaced)", "TableAdded", State.RESTORING.value]
    assert table_events(engine.heard, "r") == ["TableRedeclared"]
    kinds = [type(ev).__name__ for ev in engine.heard if not isinstance(ev, StateChanged)]
    assert kinds == ["TableRedeclared", "TableDropped", "TableDropped", "TableAdded", "TableAdded"]  # r; a, c; n, c
    # Every part has a table whenever the engine does: status never asks the publisher of one it does not know
    assert engine.status_failures == []
    assert [t.name for t in engine.thread.manager.table_views()] == ["b", "r", "n", "c"]
    assert engine.snapshots.status("n") is not None and engine.snapshots.status("c") is not None
    with pytest.raises(KeyError):
        engine.snapshots.status("a")
    assert engine.thread.manager.tables["r"].config.value == next(t for t in d.config.tables if t.name == "r").value
    assert len(Consumer.made) == 2 and engine.thread._loop is not None and \
        engine.thread._loop.consumer is Consumer.made[1]  # [kafka] changed: the prepared consumer took over


@pytest.mark.parametrize("engine", [{"b": "30d", "r": "7d"}], indirect=True)
def test_a_new_history_window_is_taken_in_place_and_redeclared_once(engine: Engine, tmp_path: Path) -> None:
    """Raw "b" and typed "r" (its schema changed too) get new windows: each store takes its window in place and
    each table is redeclared once; nothing is dropped, added or restored."""
    new = config(tmp_path, {"a": "ta", "b": "tb", "c": "tc", "r": "tr"}, typed=("r",), history={"b": "1d", "r": "30d"})
    d = delta(engine.ref.now, new)
    assert [t.name for t in d.windowed] == ["b", "r"] and [t.name for t in d.redeclared] == ["r"]
    assert d.replaced == d.added == () and d.dropped == ()
    two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread))
    assert table_events(engine.heard, "b") == table_events(engine.heard, "r") == ["TableRedeclared"]
    tables = engine.thread.manager.tables
    windows = [(tables[n].store.history_status() or {}).get("window_ms") for n in ("b", "r")]  # the stores'
    assert windows == [86_400_000, 30 * 86_400_000], windows
    assert (tables["b"].config.history, tables["r"].config.history) == (86_400_000, 30 * 86_400_000)


@pytest.mark.parametrize("engine", [{"b": "30d", "r": "7d"}], indirect=True)
def test_history_removed_is_taken_in_place_and_redeclared_once(engine: Engine, tmp_path: Path) -> None:
    """Raw "b" and typed "r" lose history: each store drops it in place and each table is redeclared once, with no
    state change; nothing is dropped, added or restored."""
    new = config(tmp_path, {"a": "ta", "b": "tb", "c": "tc", "r": "tr"}, typed=("r",))
    d = delta(engine.ref.now, new)
    assert [t.name for t in d.unversioned] == ["b", "r"] and d.redeclared == d.windowed == d.replaced == ()
    two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread))
    assert table_events(engine.heard, "b") == table_events(engine.heard, "r") == ["TableRedeclared"]
    tables = engine.thread.manager.tables
    for n in ("b", "r"):
        assert tables[n].config.history is None and tables[n].store.history_status() is None
        assert HISTORY_CF not in layout.families(db_dir(engine.ref.now.state_dir, n))


class Refuses:
    """A part whose prepare fails, as a new HTTP address in use does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare(self, delta: Delta) -> None:
        self.calls.append("prepare")
        raise OSError("address in use")

    def commit(self) -> list[Callable[[], None]]:
        self.calls.append("commit")
        return []

    def abort(self) -> None:
        self.calls.append("abort")


def test_a_prepare_that_fails_aborts_every_part_and_changes_nothing(engine: Engine, tmp_path: Path) -> None:
    d = reload_to(engine, tmp_path)
    refuses, after = Refuses(), Refuses()
    with pytest.raises(OSError, match="address in use"):
        two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread, refuses, after))
    assert refuses.calls == ["prepare", "abort"] and after.calls == ["abort"]  # every part aborts, none commits
    assert engine.ref.generation == 1 and engine.ref.now is not d.config
    assert engine.heard == []  # no table changed, no state moved
    assert [t.name for t in engine.thread.manager.table_views()] == ["a", "b", "c", "r"]
    loop = engine.thread._loop
    assert loop is not None and loop.consumer is Consumer.made[0]
    assert len(Consumer.made) == 2 and Consumer.made[1].closed.wait(60)  # the prepared consumer was closed
    assert not Consumer.made[0].closed.is_set()
    # The publisher's prepare made the added table's folder; nothing of "n" is published, and a later reload that
    # does apply starts from it as from a folder it made itself
    assert snapshots_dir(d.config.state_dir, "n").is_dir()
    with pytest.raises(KeyError):
        engine.snapshots.status("n")
    later = two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread))
    assert later == [] and engine.ref.generation == 2 and engine.snapshots.status("n") is not None


def test_each_part_that_makes_kafka_clients_shows_the_generation_they_were_made_from(engine: Engine,
                                                                                    tmp_path: Path) -> None:
    # What status shows as config.clients (``Daemon._clients``): every part at 1, then a reload applied moves the
    # engine's consumer at once, the cluster worker at its next follow (each turn of the loop), the exact builds'
    # builder at its next build; a refused reload moves none.
    thread = engine.thread
    assert (thread.consumer_generation, thread.worker.generation, engine.snapshots.builds_generation()) == (1, 1, None)
    d = reload_to(engine, tmp_path)
    with pytest.raises(OSError):
        two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread, Refuses()))
    thread.worker.follow()
    assert (thread.consumer_generation, thread.worker.generation) == (1, 1)
    two_phase.apply(d, engine.ref, (engine.snapshots, engine.thread))
    assert thread.consumer_generation == 2 and thread.worker.generation == 1
    thread.worker.follow()  # the loop's turn
    assert thread.worker.generation == 2

    builder = Builder(engine.ref, threading.Event())
    try:
        assert builder.generation is None  # no client yet: the next build makes them from the config in force
        builder._in_force()
        builder._client()
        assert builder.generation == 2
        engine.ref.set(replace(engine.ref.now, tables=list(engine.ref.now.tables)))
        builder._in_force()  # a build's first step: clients of an earlier generation are closed
        assert builder.generation is None
        builder._client()
        assert builder.generation == 3
    finally:
        builder.close()

    clients: dict[str, int | None] = {"consumer": 3, "cluster_worker": 3, "exact_builds": None}
    status = ConfigStatus(3, "ab", "/etc/globald.toml", None, clients)
    assert ConfigStatus.from_json(json.loads(json.dumps(status.to_json()))) == status
    assert "(clients: consumer 3, cluster_worker 3, exact_builds -)" in config_line(status)
