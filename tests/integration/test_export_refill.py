"""Bootstrap after a wipe while the daemon runs (issue 34, ``engine.refill``): a store a KIP-406 wipe emptied
starts again from the newest usable export, with the checks of a new host's bootstrap, and equals the oracle fold;
an export it cannot use is refused with its reason and the table replays the topic, in the same process."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.common import exitcodes
from tests.harness import Broker, DaemonProcess, random_records, values_only
from tests.integration.test_export import STOP_BOUND_S, _equals_fold, _export_at, _export_conf, _exporter, _fresh
from tests.integration.test_reload import reload
from tests.reliability.test_recreated_topic import FETCH_WAIT_MS, frozen

pytestmark = [pytest.mark.kafka, pytest.mark.long]  # two daemons, restores and the broker's JVM tools: over 30 s

Daemon = Callable[..., DaemonProcess]


def test_a_store_wiped_for_an_invalid_offset_is_refilled_from_a_usable_export(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 2_000, 400, 361, compact=False)
    written = random_records(2_000, keys=400, seed=361, tombstones=0.1)  # what _exporter produced
    # Host B replays the topic (there is no export yet), then stops.
    b, table = _fresh(daemon, broker, t, root, tmp_path, "state-b")
    assert table["origin"]["kind"] == "topic", table["origin"]
    b.stop()
    # Retention drops every record B's store holds offsets in: its offsets are invalid (KIP-406) ...
    written += random_records(500, keys=400, seed=362, tombstones=0.0)
    broker.admin.produce(t, written[2_000:])
    broker.admin.advance_log_start(t)  # it also writes b"__roll__" records
    # ... while the exporter, which kept up, exports above the new log start.
    done = _export_at(exporter, root, broker.admin.end_offsets(t))
    tail = random_records(300, keys=400, seed=363, tombstones=0.0)
    broker.admin.produce(t, tail)  # the tail after the export
    b.start()
    doc = b.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    table = doc["tables"]["tbl"]
    assert table["wipes"] == 1, table  # the store was wiped by the plan (an invalid offset), in this process
    origin = table["origin"]
    assert origin["kind"] == "export" and origin["export"] == done["export"], origin
    assert origin["bytes_downloaded"] > 0
    end = broker.admin.end_offsets(t)
    assert origin["tail"] == sum(end.values()) - sum(origin["offsets"].values()) >= 300
    log_text = b.log.read_text(errors="replace")
    assert "WIPE (invalid_offset)" in log_text and "store refilled from" in log_text, b.tail()
    # The oracle over every record ever written below the offsets: retention (this topic is not compacted)
    # dropped the records below the log start from the broker, not from the fold a host that kept up holds.
    assert values_only(b.dump("tbl")) == _fold([*written, (b"__roll__", b"x"), *tail])
    assert not list((b.state_dir / "tables").glob(".bootstrap-*"))


def _fold(records: list[tuple[bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    table: dict[bytes, bytes] = {}
    for key, value in records:
        if key is None:
            continue
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


def test_a_store_wiped_for_a_recreated_topic_while_running_refuses_the_old_export(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 400, 100, 364, partitions=1)
    _export_at(exporter, root, broker.admin.end_offsets(t))
    exporter.stop()
    b = daemon({"tbl": t}, metadata_refresh_ms=300, export=_export_conf(root), state_dir=tmp_path / "state-b",
               kafka={"fetch.wait.max.ms": FETCH_WAIT_MS})
    first = b.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)["tables"]["tbl"]
    assert first["origin"]["kind"] == "export", first["origin"]
    pid = b.pid
    # Frozen while the topic is replaced: a daemon that saw the new topic before its 900 records (empty, or short of
    # the export's offset 400) would refuse the export as "past the log end", not by its fingerprints.
    with frozen(pid):
        broker.admin.delete(t)
        broker.admin.create(t, partitions=1)
        broker.admin.produce(t, random_records(900, keys=100, seed=365, tombstones=0.0))  # past the export's offsets
    doc = b.wait_for(lambda s: s["tables"]["tbl"]["wipes"] == 1 and s["state"] == "RUNNING"
                     and s["tables"]["tbl"]["origin"]["kind"] == "topic"
                     and s["tables"]["tbl"]["offsets"] == {str(p): o for p, o in broker.admin.end_offsets(t).items()},
                     timeout=120, what="the recreated topic restored from the topic")
    table = doc["tables"]["tbl"]
    assert "is not the one exported" in table["origin"]["fallback"], table["origin"]
    assert b.pid == pid and doc["pid"] == pid
    _equals_fold(broker, t, b, table)


def test_a_refill_from_slow_storage_holds_one_table_is_stopped_without_waiting_and_falls_back_after_its_bound(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, u = topic(partitions=1), topic(partitions=1)
    broker.admin.produce(t, random_records(300, keys=100, seed=366, tombstones=0.1))
    broker.admin.produce(u, random_records(300, keys=100, seed=367, tombstones=0.1))
    state = tmp_path / "state"
    first = daemon({"tbl": t, "other": u}, state_dir=state)  # the stores exist: no bootstrap at start after this
    first.wait_running({"tbl": broker.admin.end_offsets(t), "other": broker.admin.end_offsets(u)})
    assert first.stop() == 0
    # Storage that never answers within the bound: an S3 endpoint that takes connections and never replies.
    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # the kernel accepts; nothing ever reads
    slow = f"s3://bucket/exports?endpoint_override=127.0.0.1:{silent.getsockname()[1]}&scheme=http&region=us-east-1"
    d = daemon({"tbl": t, "other": u}, metadata_refresh_ms=300, state_dir=state,
               export={"uri": slow, "interval_s": 0, "bootstrap_timeout_s": 600})
    d.wait_running({"tbl": broker.admin.end_offsets(t), "other": broker.admin.end_offsets(u)})
    broker.admin.delete(t)
    broker.admin.create(t, partitions=1)
    broker.admin.produce(t, random_records(200, keys=100, seed=368, tombstones=0.1))
    doc = d.wait_for(lambda s: "looking for an export" in str(s["tables"]["tbl"]["origin"]["fallback"]),
                     timeout=120, what="the wiped table's refill under way")
    assert doc["tables"]["tbl"]["state"] == "RESTORING" and doc["tables"]["other"]["state"] == "RUNNING", doc
    # Waited for, not timed (see test_export's stop during a bootstrap): the refill's bound is 600 s.
    assert d.stop(timeout=STOP_BOUND_S) == 0
    assert "exiting without waiting for export storage calls still in flight" in d.log.read_text(errors="replace")
    # Restarted with the store still empty (the refill never installed): it looks again, and past its bound
    # restores from the topic, saying why.
    again = daemon({"tbl": t, "other": u}, metadata_refresh_ms=300, state_dir=state,
                   export={"uri": slow, "interval_s": 0, "bootstrap_timeout_s": 3})
    doc = again.wait_running({"tbl": broker.admin.end_offsets(t), "other": broker.admin.end_offsets(u)}, timeout=120)
    origin = doc["tables"]["tbl"]["origin"]
    assert origin["kind"] == "topic" and "emptied (empty_store)" in origin["fallback"], origin
    assert "bootstrap_timeout_s = 3" in origin["fallback"], origin
    assert doc["tables"]["other"]["origin"]["kind"] == "store"
    _equals_fold(broker, t, again, doc["tables"]["tbl"])
    silent.close()


def exported_and_another(broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path,
                         seed: int) -> tuple[str, str, Path, dict[str, Any]]:
    """A topic exported to ``tmp_path/exports`` (its exporter stopped) with 200 records after the export, and a
    one-partition topic for another table: (topic, other topic, export root, the export)."""
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 1_500, 300, seed)
    done = _export_at(exporter, root, broker.admin.end_offsets(t))
    exporter.stop()
    broker.admin.produce(t, random_records(200, keys=300, seed=seed + 1, tombstones=0.1))  # the tail after it
    u = topic(partitions=1)
    broker.admin.produce(u, random_records(200, keys=50, seed=seed + 2, tombstones=0.1))
    return t, u, root, done


def add_from_export(broker: Broker, d: DaemonProcess, t: str, u: str, done: dict[str, Any]) -> None:
    """Add table ``tbl`` (topic ``t``) to ``d`` (table ``other`` on ``u``) by a reload: it starts from the export
    ``done``, replays only the tail and equals the fold, in the same process."""
    pid = d.pid
    d.config.write_text(d.config.read_text() + f'[[tables]]\nname = "tbl"\ntopic = "{t}"\n')
    r = reload(d)
    assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t), "other": broker.admin.end_offsets(u)}, timeout=120)
    table = doc["tables"]["tbl"]
    assert table["origin"]["kind"] == "export" and table["origin"]["export"] == done["export"], table["origin"]
    assert table["origin"]["tail"] >= 200 and doc["pid"] == pid
    _equals_fold(broker, t, d, table)


def test_a_table_added_by_a_reload_bootstraps_from_an_export_and_a_dropped_one_is_no_longer_exported(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, u, root, done = exported_and_another(broker, topic, daemon, tmp_path, 369)
    d = daemon({"other": u}, metadata_refresh_ms=300, export=_export_conf(root), state_dir=tmp_path / "state-b")
    d.wait_running({"other": broker.admin.end_offsets(u)})
    pid, one_table = d.pid, d.config.read_text()
    add_from_export(broker, d, t, u, done)
    d.config.write_text(one_table)  # drop it again: no longer exported, the others untouched
    r = reload(d)
    assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
    doc = d.status()
    assert set(doc["tables"]) == {"other"} and doc["tables"]["other"]["state"] == "RUNNING" and doc["pid"] == pid
