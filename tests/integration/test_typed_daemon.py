"""The daemon decodes a typed table's CURRENT snapshot into its columnar file in a process of its own, and exports
what the file says (globald.ops.decoding): a real broker, the real daemon, real RocksDB. The file appears with no
reader at all, its rows equal fastavro's own decode of the oracle fold at the snapshot's offsets, and the decode
error gauge equals the keys of that fold whose value does not decode (truncated, unknown schema id, wrong magic
byte). A decode in flight holds its snapshot against retention and holds nothing else: the daemon ingests and
publishes meanwhile, starts no second decode, and stopping it leaves no process, no file and no temporary."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald.embedded.oracle import fold
from globald.settings.config import load
from globald.snapshot import leases
from globald.store.names import SNAPSHOT_CURRENT, snapshots_dir
from globald.typed import load_table
from globald.typed.arrow import python_rows
from globald.typed.columnar import ColumnarTable, columnar_path
from tests.harness import Broker, DaemonProcess, globald
from tests.integration.test_ops_http import HTTP, metric, port_of, scrape
from tests.integration.test_typed import SECTION, records, reference
from tests.unit.test_typed_decodes import alive, host_lock
from tests.unit.typed_fixtures import FIXTURES, avro_payload, confluent, customer_v1

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def bad_records(start: int) -> list[tuple[bytes, bytes | None]]:
    """Keys whose last value is each kind of bad record, after a good one; and bad ones a good value replaces."""
    good = confluent(1, avro_payload("customer_v1.avsc", customer_v1(start)))
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(4):
        out.append((b"bad-magic-%d" % i, good))
        out.append((b"bad-magic-%d" % i, b"\x01" + good[1:]))  # magic byte 1: not Confluent framing
        out.append((b"bad-id-%d" % i, confluent(7, good[5:])))  # schema id 7: not in writer_schemas
        out.append((b"bad-trunc-%d" % i, good[:-4]))  # the payload cut short
        out.append((b"healed-%d" % i, good[:3]))  # bad, then replaced by a good value: not an error in the fold
        out.append((b"healed-%d" % i, good))
    return out


def expected_value(value: bytes) -> dict[str, Any] | None:
    """fastavro's decode (test_typed.reference) of a value in the Confluent wire format, whose magic byte is 0."""
    return reference(value) if value[:1] == b"\x00" else None


def typed_daemon(daemon: Daemon, tables: dict[str, str], typed: str, tmp_path: Path, **top: Any) -> DaemonProcess:
    """A daemon whose table ``typed`` (the last of ``tables``) has the Avro declaration of test_typed."""
    shutil.copytree(FIXTURES, tmp_path / "schemas", dirs_exist_ok=True)
    d = daemon(tables, start=False, **top)
    assert list(tables)[-1] == typed
    d.config.write_text(d.config.read_text() + SECTION)  # the [[tables]] entry is the file's last
    return d


def columnar_files(state_dir: Path, table: str, snapshot: str) -> list[str]:
    return sorted(p.name for p in (snapshots_dir(state_dir, table) / snapshot).iterdir() if "columnar-" in p.name)


def decoded_current(doc: dict[str, Any], table: str) -> bool:
    t = doc["tables"][table]
    decode = t.get("decode") or {}
    return decode.get("snapshot") is not None and decode["snapshot"] == (t.get("snapshot") or {}).get("current")


def test_the_daemon_decodes_current_without_a_reader_and_counts_its_decode_errors(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    typed_topic, raw_topic = topic(), topic()
    broker.admin.produce(typed_topic, records(1_200, keys=300, seed=42) + bad_records(1))
    broker.admin.produce(raw_topic, [(b"k%d" % i, b"raw %d" % i) for i in range(50)])
    ends = {"plain": broker.admin.end_offsets(raw_topic), "cust": broker.admin.end_offsets(typed_topic)}
    d = typed_daemon(daemon, {"plain": raw_topic, "cust": typed_topic}, "cust", tmp_path, http=HTTP,
                     snapshots={"decode_interval_ms": 1000})
    d.start()
    port = port_of(d)
    d.wait_running(ends)
    # Nothing here opens a snapshot: the file must come from the daemon alone.
    doc = d.wait_for(lambda s: decoded_current(s, "cust") and s["tables"]["cust"]["snapshot"]["offsets"] ==
                     {str(p): o for p, o in ends["cust"].items()}, timeout=120, what="CURRENT decoded by the daemon")
    decode = doc["tables"]["cust"]["decode"]
    sid = decode["snapshot"]
    assert decode["written"] is True and decode["runs"] >= 1 and decode["failures"] == 0, decode
    assert "decode" not in doc["tables"]["plain"]  # a raw table is left alone
    plain = doc["tables"]["plain"]["snapshot"]["current"]
    assert plain and columnar_files(d.state_dir, "plain", plain) == []

    # The file's rows against fastavro's own decode of the oracle fold at the snapshot's offsets.
    config = load(d.config)
    decoder = load_table(config, "cust")[1]
    path = columnar_path(snapshots_dir(config.state_dir, "cust") / sid, decoder)
    assert columnar_files(d.state_dir, "cust", sid) == [path.name]  # the whole file, no temporary beside it
    offsets = {int(p): o for p, o in decode["offsets"].items()}
    oracle = fold(broker.settings, typed_topic, offsets)
    table = ColumnarTable.open(path, decoder.fingerprint)
    assert table.keys.to_pylist() == sorted(oracle)
    expected = [expected_value(oracle[k]) for k in sorted(oracle)]
    assert python_rows(table.values) == expected
    bad = {k for k, v in oracle.items() if expected_value(v) is None}
    assert {b"bad-magic-0", b"bad-id-0", b"bad-trunc-0"} <= bad and not any(k.startswith(b"healed-") for k in bad)
    found = table.lookup(pa.array(sorted(bad), pa.binary()))
    assert found.error_count == len(bad) == table.error_count

    # What the daemon exports is the file's own count.
    assert decode["errors"] == len(bad) and decode["values"] == len(oracle)
    samples = scrape(port)
    assert metric(samples, "globald_table_decode_errors", table="cust") == len(bad)
    assert metric(samples, "globald_table_decoded_values", table="cust") == len(oracle)
    assert (metric(samples, "globald_table_decodes_total", table="cust") or 0) >= 1
    assert metric(samples, "globald_table_decode_failures_total", table="cust") == 0
    assert metric(samples, "globald_table_decode_errors", table="plain") is None
    age = metric(samples, "globald_table_decoded_snapshot_age_seconds", table="cust")
    assert age is not None and age >= 0
    text = globald("status", "--config", str(d.config))
    assert text.returncode == 0, text.stderr
    assert f"decoded: snapshot {sid}, {len(oracle):,} values, {len(bad):,} decode errors" in text.stdout, text.stdout




def test_a_decode_in_flight_holds_its_snapshot_not_the_daemon_and_stops_with_it(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, records(6_000, keys=3_000, seed=7) + bad_records(2))
    d = typed_daemon(daemon, {"cust": t}, "cust", tmp_path, snapshots={"decode_interval_ms": 0, "retain": 1})
    d.start()
    first = d.wait_running({"cust": broker.admin.end_offsets(t)})
    assert "decode" not in first["tables"]["cust"]  # decode_interval_ms = 0: the daemon does not decode
    d.stop()
    state = d.state_dir
    table_dir = snapshots_dir(state, "cust")
    held = (table_dir / SNAPSHOT_CURRENT).read_text().strip()
    assert columnar_files(state, "cust", held) == []  # decoding was off: no reader, no file yet

    # A reader of the host holds the host lock (it is writing CURRENT's file) when the next daemon starts: the
    # daemon's decode process opens CURRENT under its lease, decodes it for itself and waits for the lock to write.
    with host_lock(table_dir / held):
        d2 = typed_daemon(daemon, {"cust": t}, "cust", tmp_path, snapshots={"decode_interval_ms": 1000, "retain": 1})
        d2.start()
        doc = d2.wait_for(lambda s: (s["tables"]["cust"].get("decode") or {}).get("running_pid"), timeout=60,
                          what="a decode process")
        pid = doc["tables"]["cust"]["decode"]["running_pid"]
        d2.wait_for(lambda s: any(lease.snapshot == held for lease in leases.read_all(table_dir)[0]
                                  if "decode" in lease.holder), what="the decode process's lease on CURRENT")
        os.kill(pid, signal.SIGSTOP)  # decoding or waiting for the lock: it cannot write its file while we hold it
        try:
            # Meanwhile the daemon ingests and publishes: CURRENT moves on, several times (retain = 1), and the held
            # snapshot stays for the lease; no second decode starts while this one is in flight.
            for batch in range(3):
                broker.admin.produce(t, records(300, keys=3_000, seed=100 + batch))
                ends = {str(p): o for p, o in broker.admin.end_offsets(t).items()}
                doc = d2.wait_for(lambda s: s["tables"]["cust"]["snapshot"]["offsets"] == ends,  # noqa: B023
                                  what="the new records in a published snapshot")
            assert doc["tables"]["cust"]["snapshot"]["current"] != held
            assert doc["tables"]["cust"]["decode"]["running_pid"] == pid and alive(pid)
            assert (table_dir / held).is_dir()

            # Stopping the daemon stops the decode in flight (SIGTERM, with SIGCONT: it is stopped), and SIGKILLs it
            # when it has not ended within the stop's bound (issue 40; a loaded host may not run it that soon).
            assert d2.stop() == 0
            assert not alive(pid), "the decode process outlived the daemon"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # should the daemon have left it stopped
    assert columnar_files(state, "cust", held) == []  # neither a file nor a temporary
    assert not [lease for lease in leases.read_all(table_dir)[0] if "decode" in lease.holder]
    log = d2.log.read_text()
    # It ended on SIGTERM cleaning up after itself, or was SIGKILLed and the daemon cleaned up after it: either way
    # neither a file nor a lease is left (above).
    assert "stopped with the daemon (exit 143)" in log or "stopped with the daemon (exit -9" in log, log[-3000:]
