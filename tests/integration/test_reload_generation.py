"""One reload that adds a table, drops one and changes ``[kafka]`` at once (issue 43's "done means"), against the
real daemon and broker: every part of the daemon takes the same generation of the config.

The status shows the config's generation (``config.generation``) and, per part that makes Kafka clients, the
generation its clients were made from (``config.clients``): the engine's consumer, the cluster worker and, after a
build, the exact builds' builder all show 2. What each part took is shown too by what it does under the new config:

- the reloader: the generation moved once, 1 to 2, and never showed another value;
- the engine and the snapshot publisher: the added table C restores to its log end, equals the fold of its topic and
  is published; the dropped table B is gone from the status and its store folder is removed;
- the loop: table A serves on in the same process, RUNNING throughout, its offsets advancing under a producer, and
  equals the fold of its topic at the end;
- the exact builds: a build of C (a table the start's config did not have) at past offsets answers READY and equals
  the fold there;
- every Kafka client (the loop's new consumer, the cluster worker's new reader, the builder's): none made after the
  reload carries the start's ``client.id``, shown by the lines the clients themselves log (issue 40's rule: the
  clients, not the config object), as ``test_reload_kafka`` tells them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from globald.common import exitcodes
from globald.snapshot import exact_requests
from globald.snapshot.exact_requests import Code
from globald.store.names import table_dir
from tests.harness import Broker, DaemonProcess, oracle_at, random_records, values_only
from tests.integration.snapshot_helpers import snapshot_values
from tests.integration.test_reload import Background, Producer, edit, reload
from tests.integration.test_reload_kafka import NEW_ID, _debug_daemon, _no_old_client_after_the_reload

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


class Watch(Background):
    """Every (pid, config generation, A's state) the status shows while the test runs."""

    def __init__(self, d: DaemonProcess) -> None:
        super().__init__()
        self.d = d
        self.seen: list[tuple[Any, Any, Any]] = []

    def step(self) -> None:
        doc = self.d.status()
        self.seen.append((doc.get("pid"), doc["config"]["generation"], doc["tables"]["A"]["state"]))


def _advanced(before: dict[str, int], after: dict[str, int]) -> bool:
    return sum(after.values()) > sum(before.values())


@pytest.mark.long  # a daemon with every client's DEBUG lines, a reload that restores a table, an exact build: ~25 s
def test_one_reload_adds_drops_and_changes_kafka_and_every_part_takes_it(broker: Broker, topic: Callable[..., str],
                                                                         daemon: Daemon) -> None:
    a, b, c = topic(), topic(), topic()
    for t, seed in ((a, 440), (b, 441), (c, 442)):
        broker.admin.produce(t, random_records(1_500, keys=300, seed=seed, tombstones=0.1))
    snapshots = {"interval_ms": 200, "retain": 5, "build_timeout_ms": 20_000}
    d = _debug_daemon(daemon, {"A": a, "B": b}, broker.settings["bootstrap.servers"], snapshots=snapshots)
    doc = d.wait_running({"A": broker.admin.end_offsets(a), "B": broker.admin.end_offsets(b)}, timeout=120)
    pid, state = d.pid, d.state_dir
    assert doc["config"]["generation"] == 1 and table_dir(state, "B").is_dir()
    # No exact build yet: the builder holds no client (it makes them from the config in force at its first build)
    assert doc["config"]["clients"] == {"consumer": 1, "cluster_worker": 1, "exact_builds": None}, doc["config"]
    c_ends = broker.admin.end_offsets(c)  # C's topic takes no more records: its log end is this

    with Producer(broker, [a], seed=450), Watch(d) as watch:
        # One edit of the file, one reload: B's table becomes C's, and client.id changes.
        text = d.config.read_text()
        b_block = f'[[tables]]\nname = "B"\ntopic = "{b}"\n'
        assert b_block in text, text
        d.config.write_text(text.replace(b_block, f'[[tables]]\nname = "C"\ntopic = "{c}"\n'))
        edit(d.config, r'^"client\.id" = .*$', f'"client.id" = "{NEW_ID}"')
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        assert "applied, config generation 2" in r.stdout, r.stdout

        # B: gone from the status, its store folder removed.
        doc = d.status()
        assert doc["config"]["generation"] == 2 and doc["pid"] == pid
        assert "B" not in doc["tables"] and not table_dir(state, "B").exists(), sorted(doc["tables"])
        # C: restored to its log end and published.
        doc = d.wait_for(lambda s: s["tables"]["C"]["state"] == "RUNNING" and s["tables"]["C"]["snapshot"]["current"]
                         and all(s["tables"]["C"]["offsets"].get(str(p), -1) >= o for p, o in c_ends.items()),
                         timeout=120, what="C added, RUNNING at its log end and published")
        # A: served on by the loop, its offsets advancing under the producer after the reload.
        a_then = doc["tables"]["A"]["offsets"]
        d.wait_for(lambda s: _advanced(a_then, s["tables"]["A"]["offsets"]), timeout=120,
                   what="A's offsets advancing after the reload")

    assert values_only(d.dump("C")) == oracle_at(broker, c, {str(p): o for p, o in c_ends.items()})
    # An exact build of the added table at past offsets: the builder's clients, made under generation 2.
    target = {p: o // 2 for p, o in c_ends.items()}
    resp = exact_requests.request(state, "C", target, timeout=60)
    assert resp.code == Code.READY and resp.snapshot is not None, f"{resp}\n{d.tail()}"
    assert snapshot_values(d, "C", resp.snapshot) == oracle_at(broker, c, {str(p): o for p, o in target.items()})
    # Every part's clients are generation 2's: the consumer's and the cluster worker's since the reload's turn, the
    # builder's since this build (the status is written at least once a second)
    every = {"consumer": 2, "cluster_worker": 2, "exact_builds": 2}
    d.wait_for(lambda s: s["config"]["clients"] == every, timeout=60, what=f"config.clients {every}")

    doc = d.wait_running({"A": broker.admin.end_offsets(a), "C": c_ends}, timeout=120)
    assert doc["pid"] == pid and doc["config"]["generation"] == 2 and set(doc["tables"]) == {"A", "C"}
    assert values_only(d.dump("A")) == oracle_at(broker, a, doc["tables"]["A"]["offsets"])
    # The generation moved once, 1 then 2; A was RUNNING in the same process throughout.
    generations = [g for _, g, _ in watch.seen]
    assert generations == sorted(generations) and set(generations) <= {1, 2} and generations[-1] == 2, generations
    assert {p for p, _, _ in watch.seen} == {pid} and {s for _, _, s in watch.seen} == {"RUNNING"}, watch.seen

    assert d.stop() == 0
    # The loop's new consumer, the cluster worker's new reader, the builder's consumer: all with the new client.id.
    _no_old_client_after_the_reload(d, 0, "", at_least=3)
