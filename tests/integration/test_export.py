"""Exports and bootstraps (issue 34) against a real broker, the real daemon and real RocksDB, with a local
directory as the export storage: a second daemon with an empty state_dir starts from the export, tails the topic
and equals the oracle fold; exports it cannot use are refused with their reason and the topic is used instead.
Retention, the damaged and torn exports and two exporters at once run on both a local directory (``file://``) and
a bucket of the S3 emulator (moto), where an object is written in place and a move is a copy (issue 40 item 5.7)."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from globald.export import retention
from globald.export.bootstrap import Bootstrap, Install
from globald.export.exporter import live_manifests
from globald.export.target import Target
from globald.settings.config import load
from globald.store.reader import StoreReader
from tests.ci import require_module
from tests.harness import Broker, DaemonProcess, globald, oracle_at, random_records, values_only, write_config

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
FAST = {"interval_ms": 200, "retain": 2}
REFRESH_MS = 300  # identity checks often: a snapshot is exportable once a check has vouched for its offsets
STOP_BOUND_S = 60.0  # a stop held by storage calls takes ~95 s (exit waiting on them, measured) or the 600 s bound
MANIFEST_LIMIT = 1 << 24
# An export storage: a local directory, or the URI of one elsewhere (a bucket of the S3 emulator).
Root = Path | str


def _uri(root: Root) -> str:
    return root.as_uri() if isinstance(root, Path) else root


def _export_conf(root: Root, **over: Any) -> dict[str, Any]:
    return {"uri": _uri(root), "interval_s": 0, "keep": 2, **over}


def _export_now(d: DaemonProcess, table: str = "tbl") -> dict[str, Any]:
    r = globald("export", "--config", str(d.config), "--table", table, "--json", "--timeout", "120", timeout=180)
    assert r.returncode == 0, f"{r.stderr}\n{d.tail()}"
    return json.loads(r.stdout)


def _exported(root: Root, export_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Target(_uri(root)).read("tbl", "exports", f"{export_id}.json",
                                                             limit=MANIFEST_LIMIT))
    return doc


def _export_at(d: DaemonProcess, root: Root, end: dict[int, int], timeout: float = 120.0,
               made: list[str] | None = None) -> dict[str, Any]:
    """Export until the export is of the snapshot at ``end`` (one the daemon's identity checks vouched for). The
    id of every export written on the way, the earlier snapshots' too, is appended to ``made``."""
    deadline = time.monotonic() + timeout
    while True:
        done = _export_now(d)
        if made is not None:
            made.append(done["export"])
        if _exported(root, done["export"])["offsets"] == {str(p): o for p, o in end.items()}:
            return done
        assert time.monotonic() < deadline, f"no export at {end}; last {done}"
        time.sleep(0.5)


def _exporter(daemon: Daemon, broker: Broker, topic: Callable[..., str], tmp_path: Path, n: int, keys: int,
              seed: int, export: dict[str, Any] | None = None, storage: Root | None = None,
              **topic_kw: Any) -> tuple[str, Root, DaemonProcess]:
    """A topic with ``n`` records and a daemon exporting it to ``storage`` (by default ``tmp_path/exports``;
    ``[export]`` keys over ``_export_conf``'s from ``export``), RUNNING at its end."""
    t = topic(**topic_kw)
    root = tmp_path / "exports" if storage is None else storage
    broker.admin.produce(t, random_records(n, keys=keys, seed=seed, tombstones=0.1))
    d = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=REFRESH_MS, export=_export_conf(root, **(export or {})),
               state_dir=tmp_path / "state-exporter")
    d.wait_running({"tbl": broker.admin.end_offsets(t)})
    return t, root, d


def _fresh(daemon: Daemon, broker: Broker, t: str, root: Root, tmp_path: Path, name: str,
           **export: Any) -> tuple[DaemonProcess, dict[str, Any]]:
    """A daemon with an empty state_dir, RUNNING at the log end; its table's status."""
    d = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=REFRESH_MS, export=_export_conf(root, **export),
               state_dir=tmp_path / name)
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    return d, doc["tables"]["tbl"]


def _equals_fold(broker: Broker, t: str, d: DaemonProcess, table: dict[str, Any]) -> None:
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, table["offsets"])


@pytest.mark.long  # two daemons' starts and restores (and the broker's JVM tools): over 30 s
def test_a_new_host_bootstraps_from_the_export_tails_and_equals_the_fold(broker: Broker, topic: Callable[..., str],
                                                                        daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 3_000, 600, 341)
    made: list[str] = []
    first = _export_at(exporter, root, broker.admin.end_offsets(t), made=made)
    # One manifest per export, named by its id. Not "only the first's": the first `globald export` exports the
    # newest snapshot a check has vouched for, which may be one from before the log end (checks every REFRESH_MS),
    # and _export_at then exports again; retention (keep = 2) keeps both.
    manifests = {p.name for p in (root / "tbl" / "exports").iterdir()}
    assert f"{first['export']}.json" in manifests <= {f"{i}.json" for i in made} and first["uploaded_bytes"] > 0
    # Incremental: a second export of the same data uploads nothing new.
    again = _export_now(exporter)
    assert again["export"] != first["export"] and again["uploaded_bytes"] == 0

    broker.admin.produce(t, random_records(500, keys=900, seed=342, tombstones=0.1))  # the tail after the export
    d, table = _fresh(daemon, broker, t, root, tmp_path, "state-new", interval_s=1)
    origin = table["origin"]
    assert origin["kind"] == "export" and origin["export"] == again["export"], origin
    assert origin["bytes_downloaded"] > 0 and origin["fallback"] is None
    exported = _exported(root, again["export"])
    assert origin["offsets"] == exported["offsets"]
    # Only the tail was replayed: from the export's offsets to the log end it reached RUNNING at.
    end = broker.admin.end_offsets(t)
    assert origin["tail"] == sum(end.values()) - sum(exported["offsets"].values()) >= 500
    _equals_fold(broker, t, d, table)
    assert "file://" in exporter.status()["tables"]["tbl"]["export"]["uri"]
    # The bootstrapped host exports by itself every interval_s, once a check vouched for its newest snapshot.
    end_json = {str(p): o for p, o in end.items()}
    doc = d.wait_for(lambda s: (s["tables"]["tbl"]["export"]["last"] or {}).get("offsets") == end_json,
                     timeout=60, what="a periodic export at the log end")
    assert doc["tables"]["tbl"]["export"]["last"]["uploaded_bytes"] > 0


@pytest.mark.parametrize("storage", ["file", pytest.param("s3", marks=pytest.mark.long)], indirect=True)
def test_a_damaged_or_torn_export_is_refused_and_an_older_one_used(broker: Broker, topic: Callable[..., str],
                                                                    daemon: Daemon, tmp_path: Path,
                                                                    storage: Root) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 2_000, 400, 343, storage=storage)
    older = _export_at(exporter, root, broker.admin.end_offsets(t))
    broker.admin.produce(t, random_records(300, keys=500, seed=344, tombstones=0.1))
    newer = _export_at(exporter, root, broker.admin.end_offsets(t))
    exporter.stop()
    # A flipped byte in one file only the newer export holds.
    old_doc, new_doc = _exported(root, older["export"]), _exported(root, newer["export"])
    old_blobs = {f"{f['sha256']}-{f['size']}" for f in old_doc["files"]}
    own = [f for f in new_doc["files"] if f"{f['sha256']}-{f['size']}" not in old_blobs and f["size"] > 0]
    assert own, "the newer export shares every file with the older one"
    target, blob = Target(_uri(root)), ("tbl", "files", f"{own[0]['sha256']}-{own[0]['size']}")
    raw = bytearray(target.read(*blob, limit=own[0]["size"]))
    raw[len(raw) // 2] ^= 0x01
    target.put(iter([bytes(raw)]), *blob)
    # A torn upload: files and no manifest (an export without one does not exist).
    target.put(iter([b"torn!"]), "tbl", "files", "0" * 64 + "-5")
    d, table = _fresh(daemon, broker, t, root, tmp_path, "state-new")
    origin = table["origin"]
    assert origin["kind"] == "export" and origin["export"] == older["export"], origin
    assert f"export {newer['export']}" in origin["fallback"] and "checksum mismatch" in origin["fallback"]
    _equals_fold(broker, t, d, table)
    assert not list((d.state_dir / "tables").glob(".bootstrap-*"))


@pytest.mark.long  # two daemons' starts and restores (and the broker's JVM tools): over 30 s
def test_an_export_older_than_the_log_start_falls_back_to_the_topic(broker: Broker, topic: Callable[..., str],
                                                                     daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 1_000, 300, 345, compact=False)
    _export_now(exporter)
    exporter.stop()
    broker.admin.advance_log_start(t)
    broker.admin.produce(t, random_records(200, keys=300, seed=346, tombstones=0.0))
    d, table = _fresh(daemon, broker, t, root, tmp_path, "state-new")
    origin = table["origin"]
    assert origin["kind"] == "topic" and "below the log start" in origin["fallback"], origin
    _equals_fold(broker, t, d, table)


@pytest.mark.long  # two daemons' starts and restores (and the broker's JVM tools): over 30 s
def test_an_export_of_a_deleted_and_recreated_topic_is_refused(broker: Broker, topic: Callable[..., str],
                                                              daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 400, 100, 347, partitions=1)
    _export_at(exporter, root, broker.admin.end_offsets(t))
    exporter.stop()
    broker.admin.delete(t)
    broker.admin.create(t, partitions=1)
    broker.admin.produce(t, random_records(900, keys=100, seed=348, tombstones=0.0))  # past the export's offsets
    d, table = _fresh(daemon, broker, t, root, tmp_path, "state-new")
    origin = table["origin"]
    assert origin["kind"] == "topic" and "is not the one exported" in origin["fallback"], origin
    _equals_fold(broker, t, d, table)


def test_unreachable_storage_falls_back_to_the_topic(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                     tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(500, keys=100, seed=349, tombstones=0.0))
    # An S3 endpoint that takes connections and never answers, with credentials in the URI: the bound holds and
    # nothing secret is shown.
    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # the kernel accepts; nothing ever reads
    uri = f"s3://AKIDSECRET:hunter2@bucket/exports?endpoint_override=127.0.0.1:{silent.getsockname()[1]}" \
          "&scheme=http&region=us-east-1"
    d = daemon({"tbl": t}, snapshots=FAST, export={"uri": uri, "interval_s": 0, "bootstrap_timeout_s": 5},
               state_dir=tmp_path / "state-new")
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    origin = doc["tables"]["tbl"]["origin"]
    assert origin["kind"] == "topic" and "bootstrap_timeout_s = 5" in origin["fallback"], origin
    silent.close()
    text = json.dumps(doc) + d.log.read_text()
    assert "hunter2" not in text and "AKIDSECRET" not in text
    _equals_fold(broker, t, d, doc["tables"]["tbl"])


@pytest.mark.long  # three daemons' starts and restores: over 30 s
@pytest.mark.parametrize("storage", ["file", "s3"], indirect=True)
def test_two_exporters_at_once_leave_two_whole_exports(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                       tmp_path: Path, storage: Root) -> None:
    t, root, one = _exporter(daemon, broker, topic, tmp_path, 1_500, 300, 350, storage=storage)
    two = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=REFRESH_MS, export=_export_conf(root),
                 state_dir=tmp_path / "state-exporter-2")
    two.wait_running({"tbl": broker.admin.end_offsets(t)})
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(_export_now, [one, two]))
    ids = {x["export"] for x in done}
    assert len(ids) == 2
    target = Target(_uri(root))
    found, bad = live_manifests(target, "tbl")
    assert {m.id for m in found} == ids and not bad
    for m in found:  # every file each names is whole: its content hashes to its name
        for f in m.files:
            assert target.size("tbl", "files", f.blob) == f.size
            assert hashlib.sha256(target.read("tbl", "files", f.blob, limit=f.size)).hexdigest() == f.sha256
    d, table = _fresh(daemon, broker, t, root, tmp_path, "state-new")
    assert table["origin"]["kind"] == "export" and table["origin"]["export"] == max(ids)
    _equals_fold(broker, t, d, table)


@pytest.mark.parametrize(("storage", "grace_s"), [("file", 3600), ("file", 0), ("s3", 3600),
                                                  pytest.param("s3", 0, marks=pytest.mark.long)],
                         indirect=["storage"])
def test_retention_during_a_download_keeps_its_files_for_the_grace_period(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path, storage: Root,
        grace_s: int) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 1_500, 300, 351, storage=storage)
    older = _export_at(exporter, root, broker.admin.end_offsets(t))
    older_offsets = {int(p): o for p, o in _exported(root, older["export"])["offsets"].items()}
    broker.admin.produce(t, random_records(600, keys=900, seed=352, tombstones=0.1))
    raced: list[str] = []

    class Racing(Target):
        """The storage as a downloading host sees it while another host exports and applies retention."""

        def chunks(self, *parts: str) -> Iterator[bytes]:
            if not raced:
                raced.append(_export_at(exporter, root, broker.admin.end_offsets(t))["export"])
                retention.apply(Target(_uri(root)), "tbl", keep=1, grace_s=grace_s)
            yield from super().chunks(*parts)

    cfg = load(write_config(tmp_path / "new.toml", tmp_path / "state-new", broker.settings, {"tbl": t},
                            export=_export_conf(root)))
    (tmp_path / "state-new").mkdir(mode=0o700)
    found = Bootstrap(cfg, cfg.tables[0], Racing(_uri(root)), threading.Event(), Install()).run()
    retired = Target(_uri(root)).size("tbl", "exports", f"{older['export']}.json") is None
    assert raced and retired  # retired meanwhile
    if grace_s:
        assert found.kind == "export" and found.export == older["export"], found
        with StoreReader(tmp_path / "state-new" / "tables" / "tbl" / "db") as store:
            assert store.offsets() == older_offsets
    else:  # without a grace period the download is cut off: refused, never installed half
        assert found.kind == "topic" and "missing from the storage" in (found.fallback or ""), found
        assert not (tmp_path / "state-new" / "tables" / "tbl").exists()
    assert not (tmp_path / "state-new" / "tables" / ".bootstrap-tbl").exists()


def test_a_stop_during_a_bootstrap_does_not_wait_for_the_storage(broker: Broker, topic: Callable[..., str],
                                                                  daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # storage that takes connections, never answers
    uri = f"s3://bucket/exports?endpoint_override=127.0.0.1:{silent.getsockname()[1]}&scheme=http&region=us-east-1"
    d = daemon({"tbl": t}, snapshots=FAST, export={"uri": uri, "bootstrap_timeout_s": 600},
               state_dir=tmp_path / "state-new")
    deadline = time.monotonic() + 60
    while "looking for an export" not in d.log.read_text(errors="replace"):
        assert time.monotonic() < deadline and d.alive(), d.tail()
        time.sleep(0.1)
    # Waited for, not timed: a stop that waited for the storage (600 s bound, or ~95 s in the exit) would not exit
    # within STOP_BOUND_S, while a fixed few seconds would also count the process's exit on a loaded machine.
    assert d.stop(timeout=STOP_BOUND_S) == 0
    assert not (tmp_path / "state-new" / "tables" / "tbl").exists()
    # The storage call was still in flight (the storage never answers): the exit did not wait for it.
    assert "exiting without waiting for export storage calls still in flight" in d.log.read_text(errors="replace")
    silent.close()


@pytest.fixture(scope="module")
def s3_emulator() -> Iterator[str]:
    """moto's S3 server, an emulator of S3 (not S3 itself), on a free loopback port; its endpoint. One per module:
    each test has a bucket of its own."""
    moto_server = require_module("moto.server", "test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


# Credentials from the environment only, as in production; the URI names the emulator's endpoint.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "emulator", "AWS_SECRET_ACCESS_KEY": "emulator-secret",
                  "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def storage(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Root:
    """The export storage a test runs on (indirect parameter): "file", a local directory; "s3", a bucket of its own
    on the S3 emulator, whose objects are written in place and whose move is a copy."""
    if request.param == "file":
        return tmp_path / "exports"
    assert request.param == "s3", request.param
    endpoint = request.getfixturevalue("s3_emulator")
    for k, v in S3_CREDENTIALS.items():
        monkeypatch.setenv(k, v)  # the daemons' environment too
    bucket = f"globald-{uuid.uuid4().hex[:12]}"
    uri = f"s3://{bucket}/exports?endpoint_override={endpoint}&scheme=http&allow_bucket_creation=true"
    Target(uri).fs.create_dir(bucket)
    return uri


@pytest.mark.long  # two daemons' starts and restores: over 30 s
def test_s3_emulator_moto_a_new_host_bootstraps_from_the_bucket(broker: Broker, topic: Callable[..., str],
                                                                daemon: Daemon, tmp_path: Path, s3_emulator: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in S3_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    uri = f"s3://globald-test/exports?endpoint_override={s3_emulator}&scheme=http&allow_bucket_creation=true"
    Target(uri).fs.create_dir("globald-test")  # the bucket
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=400, seed=353, tombstones=0.1))
    conf = {"uri": uri, "interval_s": 0, "keep": 2}
    exporter = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=REFRESH_MS, export=conf,
                      state_dir=tmp_path / "state-exporter")
    exporter.wait_running({"tbl": broker.admin.end_offsets(t)})
    done = _export_now(exporter)
    assert done["uploaded_bytes"] > 0
    assert [m.id for m in live_manifests(Target(uri), "tbl")[0]] == [done["export"]]
    broker.admin.produce(t, random_records(300, keys=500, seed=354, tombstones=0.1))
    d = daemon({"tbl": t}, snapshots=FAST, export=conf, state_dir=tmp_path / "state-new")
    table = d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)["tables"]["tbl"]
    assert table["origin"]["kind"] == "export" and table["origin"]["export"] == done["export"], table["origin"]
    _equals_fold(broker, t, d, table)
    assert "emulator-secret" not in d.log.read_text() + exporter.log.read_text()
