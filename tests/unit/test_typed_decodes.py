"""The daemon's decode processes (globald.ops.decoding) driven tick by tick on a clock of the test's own, with real
decode processes (``python -m globald.typed.decode_snapshot``) on real RocksDB snapshots, and no broker.

What the throttle promises: no decode starts while a table restores; a snapshot is decoded once; the next decode
of a table waits ``decode_interval_ms`` from the end of the previous one and at least as long as that one lasted;
failures are counted and wait twice as long each time; a decode past its time limit, or in flight when the daemon
stops, is stopped and leaves no process, lease or file behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from globald.common import swallowed
from globald.common.states import State
from globald.engine.events import TableAdded, TableDropped
from globald.ops import decoding
from globald.ops.decoding import SnapshotDecodes
from globald.settings.config import TableConfig, load
from globald.snapshot import leases
from globald.snapshot import manifest as manifests
from globald.snapshot.manifest import Manifest
from globald.snapshot.reader import open_snapshot
from globald.status.document import DaemonStatus, DecodeStatus, SnapshotStatus, TableStatus
from globald.store.codec import encode_value
from globald.store.names import SNAPSHOT_CURRENT, snapshots_dir
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from globald.typed import load_table
from globald.typed.columnar import ensure_columnar
from tests.harness import write_config
from tests.stores import write_records
from tests.unit.typed_fixtures import FIXTURES, avro_payload, confluent, customer_v1

SECTION = """[tables.value]
format = "avro"
schema = "schemas/customer_reader.avsc"
framing = "confluent"
writer_schemas = "schemas/ids"
"""
INTERVAL_S = 10.0
GOOD = confluent(1, avro_payload("customer_v1.avsc", customer_v1(3)))
VALUES = {b"a": GOOD, b"b": GOOD, b"bad-id": confluent(9, GOOD[5:]), b"cut": GOOD[:-4], b"magic": b"\x01" + GOOD[1:]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, SnapshotDecodes, Clock]:
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    cfg = write_config(tmp_path / "globald.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"},
                       {"tbl": "topic"}, snapshots={"decode_interval_ms": int(INTERVAL_S * 1000)})
    cfg.write_text(cfg.read_text() + SECTION)
    clock = Clock()
    return tmp_path / "state", SnapshotDecodes(load(cfg), clock=clock), clock


def publish(state: Path, sid: str, values: dict[bytes, bytes], with_db: bool = True) -> Path:
    """A snapshot of the table holding ``values``, made CURRENT (without its database: one that cannot be opened)."""
    store = TableStore.open(state, "tbl", "topic", StoreOptions()).store
    write_records(store, {k: encode_value(1_700_000_000_000, v) for k, v in values.items()}, {0: len(values)})
    directory = snapshots_dir(state, "tbl") / sid
    directory.mkdir(parents=True)
    if with_db:
        store.checkpoint(directory / "db")
    store.close()
    manifests.write(directory, Manifest(table="tbl", topic="topic", id=sid, offsets={0: len(values)},
                                        created=time.time(), daemon_state="RUNNING", table_state="RUNNING",
                                        records=len(values)))
    (directory.parent / SNAPSHOT_CURRENT).write_text(sid + "\n")
    return directory


def doc(current: str, state: str = "RUNNING") -> DaemonStatus:
    """The status document the loop hands the decodes: the table's state and CURRENT are all they read of it."""
    return DaemonStatus(state=State.RUNNING, pid=os.getpid(), tables={"tbl": TableStatus(
        state=state, topic="topic", snapshot=SnapshotStatus(current, {0: 1}, None, False, None))})


def status(d: SnapshotDecodes) -> DecodeStatus:
    s = d.status("tbl")
    assert s is not None
    return s


def finish(d: SnapshotDecodes, current: str) -> DecodeStatus:
    """Tick (the test's clock standing still) until the decode in flight has been collected."""
    deadline = time.monotonic() + 120
    while status(d).running_pid is not None:
        assert time.monotonic() < deadline, "the decode process did not end"
        time.sleep(0.05)
        d.tick(doc(current))
    return status(d)


def started(d: SnapshotDecodes, current: str, state: str = "RUNNING") -> bool:
    d.tick(doc(current, state))
    return status(d).running_pid is not None


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if "columnar-" in p.name)


def decode_leases(state: Path) -> list[leases.Lease]:
    return [lease for lease in leases.read_all(snapshots_dir(state, "tbl"))[0] if "decode" in lease.holder]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (its cmdline may still be empty while it execs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_each_snapshot_is_decoded_once_and_the_next_waits_the_interval_and_the_last_decodes_length(
        setup: tuple[Path, SnapshotDecodes, Clock]) -> None:
    state, d, clock = setup
    s1 = publish(state, "1700000000000001", VALUES)
    assert not started(d, s1.name, state="RESTORING")  # never beside a restore, the daemon's busiest time
    assert started(d, s1.name)
    s = finish(d, s1.name)
    assert (s.snapshot, s.values, s.errors, s.runs, s.failures, s.written) == (s1.name, 5, 3, 1, 0, True)
    assert len(files(s1)) == 1 and not [f for f in files(s1) if f.startswith(".")]
    assert not decode_leases(state)  # released at the end

    clock.now = 9999.0
    assert not started(d, s1.name)  # decoded already: nothing to do however long it waits
    clock.now = 1000.0
    s2 = publish(state, "1700000000000002", {b"c": GOOD})
    clock.now = 1000.0 + INTERVAL_S - 0.1
    assert not started(d, s2.name)
    clock.now = 1000.0 + INTERVAL_S
    assert started(d, s2.name)
    clock.now += 50  # this decode lasts 50 s on the throttle's clock: the next waits 50 s, not 10
    s = finish(d, s2.name)
    assert (s.snapshot, s.values, s.errors, s.runs) == (s2.name, 6, 3, 2)
    end = clock.now
    s3 = publish(state, "1700000000000003", {b"d": GOOD})
    clock.now = end + 49.9
    assert not started(d, s3.name)
    clock.now = end + 50
    assert started(d, s3.name)
    assert finish(d, s3.name).snapshot == s3.name


def test_a_failed_decode_is_counted_and_each_failure_in_a_row_waits_twice_as_long(
        setup: tuple[Path, SnapshotDecodes, Clock]) -> None:
    state, d, clock = setup
    broken = publish(state, "1700000000000001", VALUES, with_db=False)  # its database cannot be opened
    before = swallowed.SWALLOWED.counts().get("snapshot_decode", 0)
    waits = []
    assert started(d, broken.name)
    for failures in (1, 2, 3):
        s = finish(d, broken.name)
        assert (s.failures, s.runs, s.snapshot) == (failures, 0, None) and s.last_error, s
        assert swallowed.SWALLOWED.counts().get("snapshot_decode", 0) == before + failures
        end = clock.now
        while not started(d, broken.name):
            clock.now += 1.0
        waits.append(clock.now - end)
    assert waits == [INTERVAL_S, 2 * INTERVAL_S, 4 * INTERVAL_S]
    finish(d, broken.name)

    good = publish(state, "1700000000000002", VALUES)  # CURRENT moves to a snapshot that opens
    clock.now += 16 * INTERVAL_S
    assert started(d, good.name)
    s = finish(d, good.name)
    assert (s.snapshot, s.runs, s.failures, s.last_error) == (good.name, 1, 4, None)


def test_a_typed_key_table_gets_the_very_file_its_readers_look_for(tmp_path: Path) -> None:
    """With [tables.key] the file is indexed on the decoded keys and has a name of its own (both decoders'
    fingerprint): the daemon must write that one, which a reader then maps without decoding again."""
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    cfg = write_config(tmp_path / "globald.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:9"},
                       {"tbl": "topic"}, snapshots={"decode_interval_ms": int(INTERVAL_S * 1000)})
    key_section = ('[tables.key]\nformat = "avro"\nschema = "schemas/key.avsc"\nframing = "confluent"\n'
                   'writer_schemas = "schemas/keyids"\n')
    cfg.write_text(cfg.read_text() + key_section + SECTION)
    d = SnapshotDecodes(load(cfg))
    keys = {confluent(1, avro_payload("key.avsc", f"cust-{i}")): GOOD for i in range(6)}  # type: ignore[arg-type]
    keys[confluent(9, b"\x02a")] = GOOD  # schema id 9: a key that does not decode
    keys[confluent(2, avro_payload("key.avsc", "cust-bad"))] = GOOD[:-4]  # type: ignore[arg-type]
    snap = publish(tmp_path / "state", "1700000000000001", keys)
    assert started(d, snap.name)
    s = finish(d, snap.name)
    assert (s.values, s.key_errors, s.errors, s.written) == (7, 1, 1, True), s
    [daemons] = files(snap)

    key_decoder, value_decoder = load_table(load(cfg), "tbl")
    with open_snapshot(tmp_path / "state", "tbl") as opened:
        mapped = ensure_columnar(opened, value_decoder, key_decoder)
    assert mapped.path == snap / daemons and mapped.meta["key_errors"] == 1
    assert mapped.lookup(pa.array(["cust-3", "cust-bad"])).error_count == 1
    assert files(snap) == [daemons]  # mapped, not decoded again under another name


@contextlib.contextmanager
def host_lock(directory: Path) -> Iterator[None]:
    """Held as a reader of the host holds it while it decodes: the decode process waits for it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


def wait_leased(state: Path, sid: str) -> None:
    deadline = time.monotonic() + 60
    while not any(lease.snapshot == sid for lease in decode_leases(state)):
        assert time.monotonic() < deadline, "the decode process never took its lease"
        time.sleep(0.05)


def test_a_decode_past_its_limit_or_in_flight_at_close_is_stopped_and_leaves_nothing(
        setup: tuple[Path, SnapshotDecodes, Clock]) -> None:
    state, d, clock = setup
    s1 = publish(state, "1700000000000001", VALUES)
    with host_lock(s1):
        assert started(d, s1.name)
        pid = status(d).running_pid
        assert pid is not None and alive(pid)
        wait_leased(state, s1.name)
        clock.now += decoding.TIMEOUT_S - 1
        d.tick(doc(s1.name))
        assert status(d).running_pid == pid  # within its limit: left alone
        clock.now += 2
        d.tick(doc(s1.name))  # past it: told to stop (SIGTERM), never waited for on the loop
        s = finish(d, s1.name)
        assert s.failures == 1 and "(exit 143)" in (s.last_error or ""), s  # it ended on SIGTERM, cleanly
        assert not alive(pid) and not decode_leases(state) and files(s1) == []

        clock.now += 10 * decoding.TIMEOUT_S
        assert started(d, s1.name)
        pid = status(d).running_pid
        assert pid is not None
        wait_leased(state, s1.name)
        d.close()  # the daemon stopping
        assert not alive(pid) and not decode_leases(state) and files(s1) == []
        assert status(d).running_pid is None and status(d).failures == 1  # stopping is no failure


def test_the_decode_status_reads_back_leniently() -> None:
    full = DecodeStatus(snapshot="1700000000000001", offsets={0: 5, 2: 7}, created=1.5, values=9, errors=2,
                        decode_seconds=0.25, written=True, runs=3, failures=1, running_pid=42, last_error="x")
    assert DecodeStatus.from_json(full.to_json()) == full
    damaged = {**full.to_json(), "errors": "many", "written": 1, "runs": True, "offsets": {"zero": 1}}
    assert DecodeStatus.from_json(damaged) == DecodeStatus(
        snapshot="1700000000000001", created=1.5, values=9, decode_seconds=0.25, failures=1, running_pid=42,
        last_error="x")
    assert DecodeStatus.from_json(None) is None
    written = doc("1700000000000001").to_json()  # a status.json with the table's decode section
    written["tables"]["tbl"]["decode"] = full.to_json()
    read = DaemonStatus.from_json(written).tables["tbl"]
    assert read.decode == full and read.snapshot is not None



def started_afresh(d: SnapshotDecodes, current: str, old_pid: int) -> None:
    """Tick until a decode of the table added back starts: the first ticks may still be collecting the dropped
    table's process (which records nothing), however long it takes on a loaded machine."""
    deadline = time.monotonic() + 120
    while status(d).running_pid is None:
        assert time.monotonic() < deadline, "no decode started for the table added back"
        d.tick(doc(current))
        assert status(d).failures == 0 and status(d).last_error is None, status(d)
        if status(d).running_pid is None:
            time.sleep(0.05)
    assert status(d).running_pid != old_pid


def reload(d: SnapshotDecodes, tc: TableConfig) -> None:
    """A reload that replaces the table with ``tc``, as the engine tells it (``engine.tables_change``)."""
    d.on_event(TableDropped(tc.name, replaced=True))
    d.on_event(TableAdded(tc))


@contextlib.contextmanager
def dropped_while_decoding(state: Path, d: SnapshotDecodes) -> Iterator[tuple[Path, int]]:
    """A snapshot whose decode runs (held on the host lock), then "tbl" made raw by a reload: (snapshot, the
    decode's pid), inside the lock."""
    typed = d.config
    s1 = publish(state, "1700000000000001", VALUES)
    with host_lock(s1):
        assert started(d, s1.name)
        pid = status(d).running_pid
        assert pid is not None
        wait_leased(state, s1.name)
        reload(d, replace(typed.tables[0], value=None))  # "tbl" is raw now
        yield s1, pid


def test_a_reload_drops_a_table_while_its_decode_runs_and_adds_it_back(
        setup: tuple[Path, SnapshotDecodes, Clock]) -> None:
    """A reload's table events: the decode of a dropped table is stopped, never waited for, and its end records
    nothing; a typed table added is decoded from then on."""
    state, d, _ = setup
    typed = d.config
    with dropped_while_decoding(state, d) as (s1, pid):
        assert d.status("tbl") is None and not d.enabled
        deadline = time.monotonic() + 120
        while alive(pid) or decode_leases(state):  # told to stop at once; collected by the loop's tick
            assert time.monotonic() < deadline, "the dropped table's decode did not end"
            time.sleep(0.05)
            d.tick(doc(s1.name))
        d.tick(doc(s1.name))
        assert d.status("tbl") is None and files(s1) == []
    reload(d, typed.tables[0])  # typed again: decoded as a table just added
    assert status(d).runs == 0
    started_afresh(d, s1.name, pid)
    assert finish(d, s1.name).runs == 1 and files(s1) != []


def test_a_table_added_back_before_its_dropped_decode_is_collected_inherits_nothing_of_it(
        setup: tuple[Path, SnapshotDecodes, Clock]) -> None:
    """Dropped, then added again by the next reload before the loop's tick collected the stopped process: that
    process's end (exit 143) is no failure of the table added back (it was counted as one, seen under load in
    ``make test``), and the new table's decodes start afresh."""
    state, d, _ = setup
    typed = d.config
    with dropped_while_decoding(state, d) as (s1, pid):
        deadline = time.monotonic() + 120
        while alive(pid):  # it ends on its own SIGTERM; no tick collects it meanwhile
            assert time.monotonic() < deadline, "the dropped table's decode did not end"
            time.sleep(0.05)
        reload(d, typed.tables[0])
        assert status(d).running_pid is None  # the old process is not the new table's
        started_afresh(d, s1.name, pid)
    assert finish(d, s1.name).runs == 1 and status(d).failures == 0 and files(s1) != []
