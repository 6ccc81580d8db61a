"""A ``[kafka]`` reload reaches every Kafka client the daemon makes (issue 40 item 1), against the real daemon and
broker: a daemon started with ``bootstrap.servers`` at a dead port is fixed by ``globald reload``; then an exact
build at past offsets answers READY and equals the fold, a table a later reload adds starts from a usable export,
and a table wiped after the reload (its offsets made invalid by retention) is refilled from one. A reload that
changes one client property alone (``client.id``) reaches the exact builds' clients too. No client made after the
reload carries the old settings: shown by what the clients themselves log.

How the clients are told apart: librdkafka names each client ``<client.id>#<consumer|producer>-<n>`` in every line it
logs, ``n`` counting the clients made in the process (one counter for both kinds), and with ``debug = "broker"``
every client names its bootstrap brokers (``127.0.0.1:PORT/bootstrap``) when it starts (the daemon runs as
``tests.support.client_debug``, which lets those DEBUG lines into its log). The reload changes both the address and
``client.id``, so a client's settings show in its own lines; every client made with the old ones must come before
every client made with the new ones.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.common import exitcodes
from globald.snapshot import exact_requests
from globald.snapshot.exact_requests import Code
from tests.harness import Broker, DaemonProcess, oracle_at, random_records, values_only
from tests.integration.snapshot_helpers import snapshot_values
from tests.integration.test_export import _export_at, _export_conf, _exporter, _fresh
from tests.integration.test_export_refill import _fold, add_from_export, exported_and_another
from tests.integration.test_reload import edit, reload

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
OLD_ID, NEW_ID = "globald-before-reload", "globald-after-reload"
# librdkafka's client name in each of its lines, e.g. "[globald-before-reload#consumer-3]"
_CLIENT = re.compile(r"\[([\w.-]+)#(?:consumer|producer)-(\d+)\]")


# Bound and never listening, kept open until the session ends: a connection to the port is refused, and no other
# socket (another xdist worker's daemon, broker or S3 emulator binding port 0) can take it meanwhile, as it could
# once a socket bound only to learn a free port was closed: the test would then wait for a refusal that never came.
_HELD: list[socket.socket] = []


def _dead_port() -> int:
    """A loopback port nobody listens on, and nobody can listen on while the tests run."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])


def _broken(broker: Broker, daemon: Daemon, tables: dict[str, str], **top: Any) -> tuple[DaemonProcess, int]:
    """A daemon whose [kafka] names a dead port, once its clients were seen failing to reach it."""
    dead = _dead_port()
    d = _debug_daemon(daemon, tables, f"127.0.0.1:{dead}", **top)
    d.wait_for(lambda _: f"Connect to ipv4#127.0.0.1:{dead} failed" in d.log.read_text(errors="replace"),
               what="the daemon's clients failing to reach the dead port")
    return d, dead


def _debug_daemon(daemon: Daemon, tables: dict[str, str], address: str, **top: Any) -> DaemonProcess:
    """A daemon started with ``client.id`` OLD_ID and every client's DEBUG lines in its log."""
    d = daemon(tables, kafka={"bootstrap.servers": address, "client.id": OLD_ID, "debug": "broker"}, start=False,
               **top)
    d.module = "tests.support.client_debug"  # globald run, with librdkafka's DEBUG lines in its log
    d.start()
    return d


def _fix(broker: Broker, d: DaemonProcess, address: bool = True) -> None:
    """``globald reload`` with a new client.id, and (``address``) the broker's real address: applied, generation 2."""
    if address:
        live = broker.settings["bootstrap.servers"]
        edit(d.config, r'^"bootstrap\.servers" = .*$', f'"bootstrap.servers" = "{live}"')
    edit(d.config, r'^"client\.id" = .*$', f'"client.id" = "{NEW_ID}"')
    r = reload(d)
    assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
    assert "applied, config generation 2" in r.stdout, r.stdout


def _clients(log: Path, dead: int, live: str) -> tuple[dict[int, str], dict[int, str]]:
    """The clients (by number) whose own lines show the old settings and those whose lines show the new ones, each
    with a line that shows it."""
    old: dict[int, str] = {}
    new: dict[int, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = _CLIENT.search(line)
        if m is None or "globald.librdkafka" not in line:
            continue
        n = int(m.group(2))
        if m.group(1) == OLD_ID or (dead and f"127.0.0.1:{dead}/" in line):
            old.setdefault(n, line)
        if m.group(1) == NEW_ID or (live and f"{live}/bootstrap" in line):
            new.setdefault(n, line)
    return old, new


def _no_old_client_after_the_reload(d: DaemonProcess, dead: int, live: str, at_least: int) -> None:
    """Every client made with the old settings was made before every client made with the new ones (the daemon is
    stopped: every client was closed, and has logged what librdkafka queued for it)."""
    old, new = _clients(d.log, dead, live)
    assert old, "no client logged the start's settings: the check would see nothing"
    both = sorted(set(old) & set(new))
    assert not both, f"clients with old and new settings at once: {[old[n] for n in both]}"
    assert len(new) >= at_least, f"only {len(new)} client(s) made after the reload: {sorted(new)}"
    late = [line for n, line in sorted(old.items()) if n > min(new)]
    assert not late, f"{len(late)} client(s) made after the reload with the old settings, e.g. {late[0]}"


@pytest.mark.parametrize("change", ["address", "client property"])
def test_a_kafka_reload_reaches_the_exact_builds_clients(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                         change: str) -> None:
    """``address``: started at a dead port, fixed by the reload; ``client property``: started at the right address,
    the reload changes ``client.id`` alone (as rotated credentials would change a property and nothing else)."""
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=400, seed=401, tombstones=0.1))
    first = broker.admin.end_offsets(t)
    snapshots = {"interval_ms": 200, "retain": 5, "build_timeout_ms": 20_000}
    if change == "address":
        d, dead = _broken(broker, daemon, {"tbl": t}, snapshots=snapshots)
    else:
        d, dead = _debug_daemon(daemon, {"tbl": t}, broker.settings["bootstrap.servers"], snapshots=snapshots), 0
        d.wait_running({"tbl": first})
    pid = d.pid
    _fix(broker, d, address=change == "address")
    doc = d.wait_running({"tbl": first})
    assert doc["pid"] == pid and doc["config"]["generation"] == 2

    # From the log start: the builder's consumer.
    target = {p: o // 2 for p, o in first.items()}
    resp = exact_requests.request(d.state_dir, "tbl", target, timeout=60)
    assert resp.code == Code.READY and resp.snapshot is not None, f"{resp}\n{d.tail()}"
    assert snapshot_values(d, "tbl", resp.snapshot) == oracle_at(broker, t, {str(p): o for p, o in target.items()})
    # From a base snapshot (the one just built, or one of the live store): the builder's identity check reads the
    # base's records back with a client of its own.
    broker.admin.produce(t, random_records(600, keys=400, seed=402, tombstones=0.1))
    second = broker.admin.end_offsets(t)
    target = {p: (first[p] + o) // 2 for p, o in second.items()}
    resp = exact_requests.request(d.state_dir, "tbl", target, timeout=60)
    assert resp.code == Code.READY and resp.snapshot is not None, f"{resp}\n{d.tail()}"
    assert snapshot_values(d, "tbl", resp.snapshot) == oracle_at(broker, t, {str(p): o for p, o in target.items()})

    assert d.stop() == 0
    # The loop's new consumer, the cluster worker's new reader, the builder's consumer (and its reader); told apart by
    # their address too when it changed (by client.id alone when it did not: both settings' clients name it).
    live = broker.settings["bootstrap.servers"] if change == "address" else ""
    _no_old_client_after_the_reload(d, dead, live, at_least=3)


@pytest.mark.long  # an exporter daemon, its export, a second daemon and two reloads: over 30 s
def test_a_table_added_after_a_kafka_reload_starts_from_a_usable_export(broker: Broker, topic: Callable[..., str],
                                                                        daemon: Daemon, tmp_path: Path) -> None:
    t, u, root, done = exported_and_another(broker, topic, daemon, tmp_path, 403)
    d, dead = _broken(broker, daemon, {"other": u}, metadata_refresh_ms=300, export=_export_conf(root),
                      state_dir=tmp_path / "state-b")
    _fix(broker, d)
    d.wait_running({"other": broker.admin.end_offsets(u)})
    # Its bootstrap asks the broker about the export with the [kafka] settings in force, not the start's.
    add_from_export(broker, d, t, u, done)

    assert d.stop() == 0
    # The loop's new consumer, the cluster worker's new reader, the bootstrap's consumer and reader
    _no_old_client_after_the_reload(d, dead, broker.settings["bootstrap.servers"], at_least=4)


@pytest.mark.long  # an exporter, a host that replays, retention, an export and a reload: over 30 s
def test_a_table_wiped_after_a_kafka_reload_is_refilled_from_a_usable_export(broker: Broker, topic: Callable[..., str],
                                                                            daemon: Daemon, tmp_path: Path) -> None:
    """A store whose offsets retention made invalid, on a daemon started at a dead port: once the reload fixes the
    address, the table is wiped (KIP-406) and refilled from the export, checked against Kafka with the settings in
    force, not the start's."""
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 2_000, 400, 404, compact=False)
    written = random_records(2_000, keys=400, seed=404, tombstones=0.1)  # what _exporter produced
    b, _ = _fresh(daemon, broker, t, root, tmp_path, "state-b")
    assert b.stop() == 0
    written += random_records(500, keys=400, seed=405, tombstones=0.0)
    broker.admin.produce(t, written[2_000:])
    broker.admin.advance_log_start(t)  # every offset b's store holds is now below the log start; rolls b"__roll__"
    done = _export_at(exporter, root, broker.admin.end_offsets(t))
    exporter.stop()
    tail = random_records(300, keys=400, seed=406, tombstones=0.0)
    broker.admin.produce(t, tail)
    d, dead = _broken(broker, daemon, {"tbl": t}, metadata_refresh_ms=300, export=_export_conf(root),
                      state_dir=b.state_dir)
    _fix(broker, d)
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    table = doc["tables"]["tbl"]
    assert table["wipes"] == 1, table
    assert table["origin"]["kind"] == "export" and table["origin"]["export"] == done["export"], table["origin"]
    assert values_only(d.dump("tbl")) == _fold([*written, (b"__roll__", b"x"), *tail])

    assert d.stop() == 0
    # The loop's new consumer, the cluster worker's new reader, the refill's consumer and reader
    _no_old_client_after_the_reload(d, dead, broker.settings["bootstrap.servers"], at_least=4)
