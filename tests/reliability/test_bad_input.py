"""Bad input the daemon must take without dying or diverging: odd keys and values, floods of tiny records,
garbage .checkpoint and status.json files, a second daemon with another config, and names aimed outside the
state directory. Extends tests/integration/test_core.py (empty value, null keys, second daemon refused).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.store import checkpoint_file
from globald.store.codec import encode_value
from globald.store.names import LOCK_FILE, STATUS_FILE, checkpoint_path, table_dir
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.harness import Broker, DaemonProcess, globald, random_records, write_config
from tests.reliability.checks import check_store, live, same_process
from tests.reliability.ledger import FaultRow
from tests.stores import write_records

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
Topic = Callable[..., str]


def settled(broker: Broker, d: DaemonProcess, topic: str, row: FaultRow, table: str = "tbl") -> dict:
    doc = d.wait_running({table: broker.admin.end_offsets(topic)}, timeout=120)
    check = check_store(broker, d.state_dir, table, topic)
    assert row.diverged(check.divergences) == 0 and check.readable and not check.invalid_offsets, check
    return doc


def test_binary_keys_and_empty_values_versus_tombstones(broker: Broker, topic: Topic, daemon: Daemon,
                                                         fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("binary / non-UTF-8 keys, empty values vs tombstones", "stored byte-exact, equal to the oracle")
    t = topic()
    keys = [bytes([b]) for b in range(256)] + [b"\x00", b"\x00\x00\x01", b"\xff\xfe\xfd", b"\xc3\x28",
                                             b"caf\xc3\xa9", b"\xed\xa0\x80", b"k" * 10_000, b"a\nb\tc\r"]
    records: list[tuple[bytes | None, bytes | None]] = [(k, b"v:" + k[:8]) for k in keys]
    records += [(b"empty-then-gone", b""), (b"empty-then-gone", None),  # an empty value, then a tombstone
                (b"gone-then-empty", b"x"), (b"gone-then-empty", None), (b"gone-then-empty", b""),
                (b"\xff\xfe\xfd", None), (b"\x00", b"")]
    broker.admin.produce(t, records)
    d = daemon({"tbl": t})
    row.injected += len(records)
    settled(broker, d, t, row)
    dump = live(d, "tbl")
    assert dump[b"gone-then-empty"] == b"" and b"empty-then-gone" not in dump
    # An empty key is a key, a missing one is not; a compacted topic on a 0.9 broker refuses both, so these
    # come from a topic with delete retention.
    loose = topic(compact=False)
    # One partition: the default partitioner scatters empty keys at random, and order holds only within one.
    broker.admin.produce(loose, [(b"", b"empty key"), (None, b"no key"), (b"", b"empty key, again")], partition=0)
    d.stop()
    d2 = daemon({"tbl": t, "loose": loose})
    row.injected += 3
    doc = settled(broker, d2, loose, row, table="loose")
    assert live(d2, "loose") == {b"": b"empty key, again"}
    assert doc["tables"]["loose"]["null_keys"] == 1
    assert dump[b"\x00"] == b"" and b"\xff\xfe\xfd" not in dump and dump[b"k" * 10_000] == b"v:kkkkkkkk"
    assert dump[b"\xc3\x28"] == b"v:\xc3\x28"


def test_a_flood_of_tiny_records(broker: Broker, topic: Topic, daemon: Daemon,
                                 fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("300,000 tiny records (1-3 byte keys, 0-1 byte values)", "equal to the oracle")
    t = topic()
    # 100,000 distinct keys of 1-3 bytes, each written three times.
    records: list[tuple[bytes | None, bytes | None]] = [
        ((i % 100_000).to_bytes(3, "big").lstrip(b"\x00") or b"\x00", b"" if i % 3 else bytes([i % 256]))
        for i in range(300_000)]
    broker.admin.produce(t, records)
    d = daemon({"tbl": t})
    row.injected += len(records)
    doc = settled(broker, d, t, row)
    assert doc["tables"]["tbl"]["records"] == len(records)


@pytest.mark.parametrize("content", [b"", b"0\n", b"0\n2\nTOPIC 0 5\n", b"\x00\xff\xfe garbage", b"0\n1\nTOPIC 0 -4\n",
                                     b"0\n1\nTOPIC 0 99999999999\n", b"7\n1\nTOPIC 0 1\n"])
def test_garbage_checkpoint_file_is_never_trusted(broker: Broker, topic: Topic, daemon: Daemon,
                                                 fault: Callable[[str, str], FaultRow], content: bytes) -> None:
    row = fault("truncated / garbage / impossible .checkpoint file", "ignored or invalid offsets wiped; == oracle")
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=500, seed=80))
    d = daemon({"tbl": t}, start=False)
    state = d.state_dir
    # A store with data but no offsets: the one case where the daemon imports a .checkpoint file.
    store = TableStore.open(state, "tbl", t, StoreOptions()).store
    write_records(store, {b"stale-key": encode_value(-1, b"from another tool")}, {})
    store.close()
    checkpoint_path(state, "tbl").write_bytes(content.replace(b"TOPIC", t.encode()))
    row.injected += 1
    d.start()
    doc = settled(broker, d, t, row)
    assert d.alive() and doc["pid"] == d.pid
    assert b"stale-key" not in live(d, "tbl")
    # What the daemon writes back is a well-formed file at the stored offsets.
    assert d.stop() == 0
    found = checkpoint_file.read(checkpoint_path(state, "tbl"))
    assert {p: o for (_, p), o in found.items()} == {int(p): o for p, o in doc["tables"]["tbl"]["offsets"].items()}


def _impostor() -> subprocess.Popen[bytes]:
    """A live process whose command line says globald, as a recycled pid might."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "globald"])


GARBAGE_STATUS = [b'{"state": "RUNNING", "pid": 1', b"[1, 2, 3]", b'"RUNNING"', b"\xff\xfe\x00",
                  b'{"state": "RUNNING", "pid": PID, "tables": ["x"]}',
                  b'{"state": "RUNNING", "pid": PID, "tables": {"t": {"state": "RUNNING", "offsets": [1]}}}',
                  b'{"state": 7, "pid": PID}', b'{"state": "RUNNING", "pid": "PID"}', b""]


def test_garbage_status_file_is_never_trusted(broker: Broker, topic: Topic, daemon: Daemon,
                                             fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("truncated / garbage / foreign status.json", "status falls back to the stores; daemon replaces it")
    t = topic()
    broker.admin.produce(t, random_records(200, keys=50, seed=81))
    d = daemon({"tbl": t})
    settled(broker, d, t, row)
    assert d.stop() == 0
    impostor = _impostor()
    try:
        for content in GARBAGE_STATUS:
            (d.state_dir / STATUS_FILE).write_bytes(content.replace(b"PID", str(impostor.pid).encode()))
            row.injected += 1
            r = globald("status", "--config", str(d.config))
            # no daemon holds the state_dir, whatever the file says: exit 5 (issue 42), one line, no traceback
            assert r.returncode == 5 and "Traceback" not in r.stderr, (content, r.stderr)
            doc = json.loads(globald("status", "--config", str(d.config), "--json").stdout)
            assert doc["state"] == "NOT_RUNNING" and doc["tables"]["tbl"]["source"] == "store", content
    finally:
        impostor.kill()
        impostor.wait()
    d.start()
    doc = settled(broker, d, t, row)
    assert doc["pid"] == d.pid


def test_second_daemon_with_another_config_touches_nothing(broker: Broker, topic: Topic, daemon: Daemon,
                                                           tmp_path: Path,
                                                           fault: Callable[[str, str], FaultRow]) -> None:
    row = fault("second daemon, other tables, same state_dir", "refused (exit 4, names the owner); first untouched")
    t, other = topic(), topic()
    broker.admin.produce(t, random_records(1_000, keys=100, seed=82))
    first = daemon({"tbl": t})
    settled(broker, first, t, row)
    state = first.state_dir
    before = {p.name: p.read_bytes() for p in (state / LOCK_FILE, checkpoint_path(state, "tbl"))}
    cfg = write_config(tmp_path / "globald-other.toml", state, broker.settings, {"other": other},
                       http={"enabled": False})
    second = DaemonProcess(cfg, tmp_path / "second.log").start()
    assert second.proc is not None and second.proc.wait(30) == 4  # refused (globald.common.exitcodes.REFUSED)
    row.injected += 1
    said = second.log.read_text().strip().splitlines()
    assert len(said) == 1 and f"pid {first.pid}" in said[0], said
    assert not table_dir(state, "other").exists()
    assert (state / LOCK_FILE).read_bytes() == before[LOCK_FILE]
    row.pid_changes += same_process(first, first.pid)
    assert row.pid_changes == 0
    broker.admin.produce(t, random_records(100, keys=100, seed=83))
    settled(broker, first, t, row)


@pytest.mark.parametrize("name", ["../../etc", "/etc/passwd", "..", ".", "a/../../b", "tbl/../../x", "..\\x"])
def test_table_names_outside_the_state_dir_are_refused_by_every_command(
        broker: Broker, tmp_path: Path, fault: Callable[[str, str], FaultRow], name: str) -> None:
    row = fault("table name escaping the state_dir (--table, config)", "refused: exit 2, nothing read or created")
    state = tmp_path / "state"
    good = write_config(tmp_path / "globald.toml", state, broker.settings, {"tbl": "whatever"})
    bad = write_config(tmp_path / "globald-bad.toml", state, broker.settings, {name: "whatever"})
    runs = [globald("dump", "--config", str(good), "--table", name)]
    runs += [globald(cmd, "--config", str(bad)) for cmd in ("check-config", "run", "status")]
    for r in runs:
        row.injected += 1
        assert r.returncode == 2, (r.args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not state.exists()
