"""Upgrade, downgrade and Kafka Streams import with the real daemon, a real broker and real RocksDB.

Stores of other formats are fixtures built by ``tests.layouts`` from the documented layouts with rocksdict (the plain
layout of an older globald, Kafka Streams' global store and its .checkpoint), filled with the oracle fold of the topic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.embedded.oracle import fold
from globald.store import checkpoint_file
from globald.store.names import FORMAT_TIMESTAMPED, FORMAT_VERSION, checkpoint_path, db_dir, tables_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.harness import Broker, DaemonProcess, globald, oracle_at, random_records, values_only
from tests.layouts import write_kafka_streams_store, write_plain_store
from tests.unit.test_formats import _bump_format

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def _matches_oracle(broker: Broker, d: DaemonProcess, table: str, topic: str) -> dict[bytes, tuple[bytes, int]]:
    dump = d.dump(table)
    assert values_only(dump) == oracle_at(broker, topic, d.status()["tables"][table]["offsets"])
    return dump


def _wait_for_log(d: DaemonProcess, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in d.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{d.tail()}"
        time.sleep(0.2)


def _older_globald_store(broker: Broker, topic: str, state_dir: Path) -> dict[int, int]:
    """The store an older globald left: the fold as plain values, its offsets only in the .checkpoint beside it."""
    ends = broker.admin.end_offsets(topic)
    write_plain_store(db_dir(state_dir, "tbl"), fold(broker.settings, topic, ends))
    checkpoint_file.write(checkpoint_path(state_dir, "tbl"), {(topic, p): o for p, o in ends.items()})
    return ends


def test_plain_store_is_upgraded_in_place(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(4_000, keys=1_500, seed=60, tombstones=0.1))
    d = daemon({"tbl": t}, start=False)
    _older_globald_store(broker, t, d.state_dir)
    newer = random_records(600, keys=1_500, seed=61, tombstones=0.2)
    broker.admin.produce(t, newer)

    d.start()
    ends = broker.admin.end_offsets(t)
    doc = d.wait_running({"tbl": ends})
    assert doc["tables"]["tbl"]["records"] == len(newer)  # resumed at the old offsets: only newer records fetched
    assert doc["tables"]["tbl"]["wipes"] == 0
    _matches_oracle(broker, d, "tbl", t)
    _wait_for_log(d, "upgrade complete")
    dump = _matches_oracle(broker, d, "tbl", t)
    if not broker.has_timestamps:
        assert {ts for _, ts in dump.values()} == {-1}
    assert d.stop() == 0

    # A clean close leaves a consolidated Kafka-format .checkpoint that agrees with the store.
    with StoreReader(db_dir(d.state_dir, "tbl")) as r:
        assert r.format_version() == FORMAT_TIMESTAMPED
        assert r.offsets() == ends
    assert checkpoint_file.read(checkpoint_path(d.state_dir, "tbl")) == {(t, p): o for p, o in ends.items()}


@pytest.mark.parametrize("case", ["newer_format", "older_globald_meets_mixed_store"])
def test_store_of_a_format_it_cannot_read_is_rebuilt(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                     case: str) -> None:
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=300, seed=62))
    d = daemon({"tbl": t}, start=False)
    if case == "newer_format":
        d.start()
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        assert d.stop() == 0
        _bump_format(db_dir(d.state_dir, "tbl"), FORMAT_VERSION + 1)  # as a newer globald would leave it
        expected = f"store format {FORMAT_VERSION + 1} is newer than this globald reads"
    else:
        # This build stamps a plain store as format 2 on first open; a release that reads format 1 only must not
        # serve it (it would miss the plain values), so it rebuilds.
        _older_globald_store(broker, t, d.state_dir)
        opened = TableStore.open(d.state_dir, "tbl", t, StoreOptions())
        assert opened.store.upgrading
        opened.store.close()
        d.module = "tests.old_globald"
        expected = "store format 2 is newer than this globald reads (it reads formats 1)"
    broker.admin.produce(t, random_records(100, keys=300, seed=63))
    d.start()
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})
    assert doc["tables"]["tbl"]["wipes"] == 1 and doc["pid"] == d.pid and d.alive()
    log = d.log.read_text()
    assert "WIPE (corrupt_store)" in log and expected in log
    _matches_oracle(broker, d, "tbl", t)


def _import(d: DaemonProcess, ks: Path, *extra: str) -> tuple[int, str, str]:
    r = globald("import-kafka-streams", "--config", str(d.config), "--state-dir", str(ks), "--application-id",
                "app-1", "--store", "customers-store", "--table", "customers", *extra)
    return r.returncode, r.stdout, r.stderr


def _files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.is_file()}


@pytest.mark.parametrize("layout", ["timestamped", "plain"])
def test_import_kafka_streams_store_then_resume(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                tmp_path: Path, layout: str) -> None:
    t = topic()
    broker.admin.produce(t, random_records(5_000, keys=2_000, seed=70, tombstones=0.1))
    at_import = broker.admin.end_offsets(t)
    stamped = {k: (v, 1_600_000_000_000 + i)
               for i, (k, v) in enumerate(sorted(fold(broker.settings, t, at_import).items()))}
    ks = tmp_path / "ks"
    offsets = {(t, p): o for p, o in at_import.items()} | {("another-global-topic", 0): 99}
    source = write_kafka_streams_store(ks, "app-1", "customers-store", stamped, offsets,
                                       timestamped=layout == "timestamped")
    before = _files(source)
    newer = random_records(700, keys=2_000, seed=71, tombstones=0.2)
    broker.admin.produce(t, newer)

    d = daemon({"customers": t}, start=False)
    code, out, err = _import(d, ks, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["offsets"] == {str(p): o for p, o in at_import.items()}
    assert (report["timestamped_values"], report["plain_values"]) == (
        (len(stamped), 0) if layout == "timestamped" else (0, len(stamped)))
    assert _files(source) == before  # the Kafka Streams store is only read
    assert [p.name for p in tables_dir(d.state_dir).iterdir()] == ["customers"]  # no staging left behind

    d.start()
    doc = d.wait_running({"customers": broker.admin.end_offsets(t)})
    assert doc["tables"]["customers"]["records"] == len(newer)  # resumed at the imported offsets
    assert doc["tables"]["customers"]["wipes"] == 0
    dump = _matches_oracle(broker, d, "customers", t)
    untouched = set(stamped) - {k for k, _ in newer}
    assert untouched
    want_ts = {k: stamped[k][1] if layout == "timestamped" else -1 for k in untouched}
    assert {k: dump[k][1] for k in untouched} == want_ts  # Kafka Streams' timestamps survive the import
    if layout == "plain":
        _wait_for_log(d, "upgrade complete")
        _matches_oracle(broker, d, "customers", t)
    assert d.stop() == 0


def test_import_kafka_streams_validates_before_switching(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                         tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(1_000, keys=200, seed=72))
    ends = broker.admin.end_offsets(t)
    values = {k: (v, 1) for k, v in fold(broker.settings, t, ends).items()}
    d = daemon({"customers": t}, start=False)

    def ks_store(name: str, offsets: dict[int, int]) -> Path:
        write_kafka_streams_store(tmp_path / name, "app-1", "customers-store", values,
                                  {(t, p): o for p, o in offsets.items()})
        return tmp_path / name

    code, _, err = _import(d, ks_store("beyond", {**ends, 0: ends[0] + 1_000}))
    assert code == 4 and f"partition 0 offset {ends[0] + 1_000} is outside the log" in err
    code, _, err = _import(d, ks_store("partial", {p: o for p, o in ends.items() if p != 2}))
    assert code == 4 and "partition 2 is not in the checkpoint" in err
    assert not tables_dir(d.state_dir).exists() or not any(tables_dir(d.state_dir).iterdir())

    d.start()
    d.wait_running({"customers": ends})
    good = ks_store("good", ends)
    code, _, err = _import(d, good)
    assert code == 4 and "owned by another globald" in err  # never under a running daemon
    assert d.stop() == 0
    code, _, err = _import(d, good)
    assert code == 4 and "already has a store; pass --replace" in err
    code, _, err = _import(d, good, "--replace")
    assert code == 0, err
    d.start()
    doc = d.wait_running({"customers": ends})
    assert doc["tables"]["customers"]["records"] == 0 and doc["tables"]["customers"]["wipes"] == 0
    assert {k: v for k, v in d.dump("customers").items()} == values  # the imported store, not the old one
