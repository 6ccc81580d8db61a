"""Typed tables and live reconfiguration (issue 35 item 2), against the real daemon, broker and RocksDB: a typed
table's reader schema changed in place by ``globald reload`` is decoded with the new schema from the next snapshot
version on, a version the daemon publishes at once though no record arrived, with nothing replayed; the decode
process never decodes with a file the daemon did not apply; typed tables are added and dropped live. Every claim is
checked against fastavro's own decode of the oracle fold at the snapshot's offsets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.common import exitcodes
from globald.settings.config import load
from globald.store.names import snapshots_dir, table_dir
from globald.typed import load_table
from globald.typed.arrow import python_rows
from globald.typed.columnar import ColumnarTable, columnar_path
from tests.harness import Broker, DaemonProcess, oracle_at
from tests.integration.test_reload import StateWatch, edit, reload
from tests.integration.test_typed import READER, SECTION, records, reference
from tests.integration.test_typed_daemon import columnar_files, decoded_current, typed_daemon
from tests.unit.typed_fixtures import FIXTURES

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def reader_v2() -> dict[str, Any]:
    """customer_reader.avsc narrowed to a few fields, with one the writers never had (its default)."""
    schema = json.loads((FIXTURES / "customer_reader.avsc").read_text())
    keep = [f for f in schema["fields"] if f["name"] in ("id", "name", "tier", "visits")]
    return {**schema, "fields": [*keep, {"name": "loyalty", "type": "int", "default": 7}]}


def decoded_with(value: bytes, reader: Any) -> dict[str, Any] | None:
    """fastavro's decode of a Confluent-framed value with ``reader``; None where it cannot be decoded."""
    return reference(value, reader) if value[:1] == b"\x00" else None


def check_decoded(broker: Broker, d: DaemonProcess, doc: dict[str, Any], table: str, topic: str,
                  reader: Any) -> tuple[str, str]:
    """The daemon's columnar file of ``table``'s CURRENT (named by the declaration in force in d.config) against
    fastavro's decode of the oracle fold at the snapshot's offsets with ``reader``; returns (snapshot, file)."""
    decode = doc["tables"][table]["decode"]
    sid = decode["snapshot"]
    config = load(d.config)
    decoder = load_table(config, table)[1]
    path = columnar_path(snapshots_dir(config.state_dir, table) / sid, decoder)
    assert path.name in columnar_files(d.state_dir, table, sid), (path.name, columnar_files(d.state_dir, table, sid))
    offsets = {int(p): o for p, o in decode["offsets"].items()}
    oracle = oracle_at(broker, topic, offsets)
    got = ColumnarTable.open(path, decoder.fingerprint)
    assert got.keys.to_pylist() == sorted(oracle)
    assert python_rows(got.values) == [decoded_with(oracle[k], reader) for k in sorted(oracle)]
    return str(sid), path.name


@pytest.mark.long  # a typed restore, three reloads, four daemon decodes: ~45 s
def test_a_reader_schema_changed_by_reload_is_decoded_from_the_next_version_and_a_refused_file_never(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    typed_topic, raw_topic = topic(), topic()
    broker.admin.produce(typed_topic, records(1_500, keys=300, seed=61))
    broker.admin.produce(raw_topic, [(b"k%d" % i, b"raw %d" % i) for i in range(50)])
    d = typed_daemon(daemon, {"plain": raw_topic, "cust": typed_topic}, "cust", tmp_path,
                     snapshots={"decode_interval_ms": 500, "interval_ms": 500})
    (tmp_path / "schemas" / "reader_v2.avsc").write_text(json.dumps(reader_v2()))
    narrower = {**reader_v2(), "fields": reader_v2()["fields"][:2]}
    (tmp_path / "schemas" / "reader_v3.avsc").write_text(json.dumps(narrower))
    d.start()
    ends = {"plain": broker.admin.end_offsets(raw_topic), "cust": broker.admin.end_offsets(typed_topic)}
    d.wait_running(ends)
    doc = d.wait_for(lambda s: decoded_current(s, "cust"), timeout=120, what="CURRENT decoded with reader v1")
    first, v1_file = check_decoded(broker, d, doc, "cust", typed_topic, READER)
    pid = doc["pid"]

    with StateWatch(d) as watch:
        # The reader schema changed in place: live, no replay; a new version though no record arrived.
        edit(d.config, r'^schema = "schemas/customer_reader.avsc"$', 'schema = "schemas/reader_v2.avsc"')
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        assert "tables.cust" in d.tail(200)
        doc = d.wait_for(lambda s: decoded_current(s, "cust") and s["tables"]["cust"]["decode"]["snapshot"] != first,
                         timeout=120, what="a new version decoded with reader v2")
        second, v2_file = check_decoded(broker, d, doc, "cust", typed_topic, reader_v2())
        assert doc["tables"]["cust"]["snapshot"]["offsets"] == {str(p): o for p, o in ends["cust"].items()}
        assert doc["tables"]["cust"]["wipes"] == 0 and v2_file != v1_file  # nothing replayed; another file
        # The version readers held keeps its own file, the old declaration's (unless retention took it since).
        held = snapshots_dir(d.state_dir, "cust") / first
        assert not held.exists() or v1_file in columnar_files(d.state_dir, "cust", first)

        # A file the daemon refuses ([store] needs a restart) naming reader v3: never decoded with.
        applied = d.config.read_bytes()
        edit(d.config, r'^schema = "schemas/reader_v2.avsc"$', 'schema = "schemas/reader_v3.avsc"')
        edit(d.config, r"^\[kafka\]$", "[store]\nblock_cache_mb = 99\n[kafka]")
        refused = d.config.read_bytes()
        r = reload(d)
        assert r.returncode == exitcodes.USAGE and "store.block_cache_mb: cannot change" in r.stderr, r.stderr
        broker.admin.produce(typed_topic, records(200, keys=300, seed=62))
        ends["cust"] = broker.admin.end_offsets(typed_topic)
        doc = d.wait_for(lambda s: s["tables"]["cust"]["snapshot"]["offsets"] ==
                         {str(p): o for p, o in ends["cust"].items()} and
                         (s["tables"]["cust"]["decode"].get("failures") or 0) >= 1,
                         timeout=120, what="a new version, and its decode refused to read a file not in force")
        third = doc["tables"]["cust"]["snapshot"]["current"]
        assert columnar_files(d.state_dir, "cust", third) == []
        assert "is not the config in force" in d.tail(400)
        d.config.write_bytes(applied)  # the file in force again: decoded with reader v2
        doc = d.wait_for(lambda s: s["tables"]["cust"]["decode"]["snapshot"] == third, timeout=180,
                         what="the new version decoded once the file in force is back")
        assert check_decoded(broker, d, doc, "cust", typed_topic, reader_v2()) == (third, v2_file) and third != second
        assert refused != applied

    assert watch.pids == {pid}
    assert watch.seen and all(states == {"plain": "RUNNING", "cust": "RUNNING"} for states in watch.seen), \
        [s for s in watch.seen if set(s.values()) != {"RUNNING"}][:3]



def test_a_typed_table_added_and_dropped_live_is_decoded_then_forgotten(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    typed_topic, raw_topic = topic(), topic()
    broker.admin.produce(typed_topic, records(800, keys=200, seed=63))
    broker.admin.produce(raw_topic, [(b"k%d" % i, b"raw %d" % i) for i in range(50)])
    d = typed_daemon(daemon, {"plain": raw_topic}, "plain", tmp_path, snapshots={"decode_interval_ms": 500})
    first = d.config.read_text().removesuffix(SECTION)  # "plain" stays raw: the typed table comes with a reload
    d.config.write_text(first)
    d.start()
    pid = d.wait_running({"plain": broker.admin.end_offsets(raw_topic)})["pid"]

    with StateWatch(d) as watch:
        d.config.write_text(first + f'[[tables]]\nname = "cust"\ntopic = "{typed_topic}"\n' + SECTION)
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        ends = {"plain": broker.admin.end_offsets(raw_topic), "cust": broker.admin.end_offsets(typed_topic)}
        d.wait_running(ends, timeout=120)
        doc = d.wait_for(lambda s: decoded_current(s, "cust"), timeout=120, what="the added typed table decoded")
        check_decoded(broker, d, doc, "cust", typed_topic, READER)

        d.config.write_text(first)
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        doc = d.status()
        assert set(doc["tables"]) == {"plain"} and not table_dir(d.state_dir, "cust").exists()
        assert "table cust dropped by a reload" in d.tail(200)

    assert watch.pids == {pid}
    assert all(states.get("plain") == "RUNNING" for states in watch.seen)
    assert any(states.get("cust") == "RESTORING" for states in watch.seen) or "table cust state CREATED -> " \
        "RESTORING (added by a reload)" in d.tail(400)


@pytest.mark.long  # a raw restore, a reload, the typed restore and the daemon's decode: ~40 s
def test_a_raw_table_made_typed_by_a_reload_is_replaced_and_decoded(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    raw_topic, typed_topic = topic(), topic()
    broker.admin.produce(raw_topic, [(b"k%d" % i, b"raw %d" % i) for i in range(50)])
    broker.admin.produce(typed_topic, records(600, keys=150, seed=64))
    d = typed_daemon(daemon, {"plain": raw_topic, "cust": typed_topic}, "cust", tmp_path,
                     snapshots={"decode_interval_ms": 500})
    typed = d.config.read_text()
    d.config.write_text(typed.removesuffix(SECTION))  # "cust" starts raw: the same topic's bytes, undecoded
    d.start()
    ends = {"plain": broker.admin.end_offsets(raw_topic), "cust": broker.admin.end_offsets(typed_topic)}
    pid = d.wait_running(ends)["pid"]
    raw_snapshot = d.wait_for(lambda s: s["tables"]["cust"]["snapshot"]["current"], timeout=60,
                              what="the raw table's snapshot")["tables"]["cust"]["snapshot"]["current"]

    with StateWatch(d) as watch:
        d.config.write_text(typed)  # raw -> avro: its store cannot follow in place, so the table is replaced
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        d.wait_running(ends, timeout=120)
        doc = d.wait_for(lambda s: decoded_current(s, "cust"), timeout=120, what="the replaced table decoded")
        check_decoded(broker, d, doc, "cust", typed_topic, READER)
        assert doc["tables"]["cust"]["snapshot"]["current"] != raw_snapshot  # a new version, in the new format

    log = d.tail(400)
    assert "table cust dropped by a reload" in log and "cust state CREATED -> RESTORING (added by a reload)" in log
    assert watch.pids == {pid} and doc["pid"] == pid
    assert all(states.get("plain") == "RUNNING" for states in watch.seen), watch.seen
