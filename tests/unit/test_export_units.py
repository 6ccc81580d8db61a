"""The export package's pure parts on a real RocksDB store and a local directory as the storage: manifests as
untrusted input, masked URIs, incremental uploads, and retention's grace period."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from globald.export import retention
from globald.export.exporter import export_snapshot, live_manifests
from globald.export.manifest import ExportManifest, ExportManifestError
from globald.export.target import EXPORTS_DIR, FILES_DIR, RETIRED_DIR, Target, TargetError, masked
from globald.settings.config import Config, load
from globald.snapshot.manifest import Manifest
from globald.store.fingerprint import Fingerprint, Ladder
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore


def test_masked_hides_user_info_and_query() -> None:
    assert masked("s3://AKID:secret@bucket/p?access_key=x&secret_key=y") == "s3://***@bucket/p?***"
    assert masked("file:///mnt/shared/globald") == "file:///mnt/shared/globald"
    assert masked("gs://bucket/x") == "gs://bucket/x"


def _snapshot(tmp_path: Path, n: int, name: str) -> tuple[Path, Manifest]:
    """A real table store holding ``n`` records with offsets and fingerprints, checkpointed as a snapshot."""
    state = tmp_path / "state"
    store = TableStore.open(state, "tbl", "topic", StoreOptions()).store
    try:
        batch = store.new_batch()
        for i in range(n):
            batch.put(b"k%d" % i, b"\0" * 8 + b"v%d" % i)
        ladder = Ladder(()).climb(Fingerprint(n - 1, b"12345678"))
        store.put_offsets(batch, {0: n}, {0: ladder})
        store.write(batch, rebuild=lambda: batch)
        store.db.flush()
        snap = tmp_path / "snapshots" / name
        snap.mkdir(parents=True)
        store.checkpoint(snap / "db")
    finally:
        store.close()
    m = Manifest(table="tbl", topic="topic", id=name, offsets={0: n}, created=time.time(), daemon_state="RUNNING",
                 table_state="RUNNING", records=n)
    return snap, m


def _new_host(tmp_path: Path, target_uri: str) -> Config:
    """The config of a new host bootstrapping table ``tbl`` from ``target_uri`` (no broker: nothing asks one)."""
    state = tmp_path / "new"
    state.mkdir(mode=0o700)
    cfg_path = tmp_path / "new.toml"
    cfg_path.write_text(f'state_dir = "{state}"\n[export]\nuri = "{target_uri}"\n[kafka]\n'
                        '"bootstrap.servers" = "127.0.0.1:9"\n[[tables]]\nname = "tbl"\ntopic = "topic"\n')
    return load(cfg_path)


def test_exports_are_incremental_and_their_manifests_name_every_file(tmp_path: Path) -> None:
    target = Target((tmp_path / "bucket").as_uri())
    snap, m = _snapshot(tmp_path, 100, "0000000000000001")
    first = export_snapshot(target, snap, m, threading.Event())
    assert first.uploaded_bytes == first.manifest.total_bytes > 0 and first.shared_bytes == 0
    second = export_snapshot(target, snap, m, threading.Event())
    assert second.uploaded_bytes == 0 and second.shared_bytes == first.manifest.total_bytes
    found, bad = live_manifests(target, "tbl")
    assert [x.id for x in found] == sorted([first.manifest.id, second.manifest.id], reverse=True) and not bad
    got = found[0]
    assert got.offsets == {0: 100} and got.ladders == {0: (Fingerprint(99, b"12345678"),)} and got.topic == "topic"
    assert {f.name for f in got.files} >= {"CURRENT"} and any(f.name.endswith(".sst") for f in got.files)
    for f in got.files:  # every blob is there, with the manifest's size
        assert (tmp_path / "bucket" / "tbl" / FILES_DIR / f.blob).stat().st_size == f.size


def _doc(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "format": 1, "id": "0000000000000001-0a0b0c0d", "table": "tbl", "topic": "topic", "topic_id": None,
        "offsets": {"0": 10}, "ladders": {"0": [[9, "00" * 8]]}, "store_format": 1, "created": 1.0,
        "snapshot": "0000000000000001", "host": "h", "records": 1, "typed": False,
        "files": [{"name": "CURRENT", "size": 16, "sha256": "a" * 64}]}
    doc.update(over)
    return doc


@pytest.mark.parametrize(("over", "why"), [
    ({"format": 2}, "format"),
    ({"files": [{"name": "../CURRENT", "size": 1, "sha256": "a" * 64}]}, "base name"),
    ({"files": [{"name": "/etc/passwd", "size": 1, "sha256": "a" * 64}]}, "base name"),
    ({"files": [{"name": "CURRENT", "size": -1, "sha256": "a" * 64}]}, "size"),
    ({"files": [{"name": "CURRENT", "size": 1 << 62, "sha256": "a" * 64}]}, "size"),
    ({"files": [{"name": "CURRENT", "size": 1, "sha256": "xyz"}]}, "sha256"),
    ({"files": [{"name": "000001.sst", "size": 1, "sha256": "a" * 64}]}, "CURRENT"),
    ({"ladders": {"0": [[10, "00" * 8]]}}, "not below"),
    ({"ladders": {"1": [[1, "00" * 8]]}}, "offsets do not name"),
    ({"id": "../../x"}, "id"),
    ({"offsets": {"0": -1}}, "offset"),
])
def test_a_manifest_is_untrusted_input(over: dict[str, object], why: str) -> None:
    raw = json.dumps(_doc(**over)).encode()
    with pytest.raises(ExportManifestError, match=why):
        ExportManifest.decode(raw, "0000000000000001-0a0b0c0d")
    assert ExportManifest.decode(json.dumps(_doc()).encode(), "0000000000000001-0a0b0c0d").files[0].name == "CURRENT"
    with pytest.raises(ExportManifestError):
        ExportManifest.decode(b"\x80\x04pickle", None)  # never unpickled: just not JSON


def test_retention_keeps_the_newest_and_deletes_files_only_after_the_grace_period(tmp_path: Path) -> None:
    target = Target((tmp_path / "bucket").as_uri())
    snap, m = _snapshot(tmp_path, 50, "0000000000000001")
    old = export_snapshot(target, snap, m, threading.Event()).manifest
    snap2, m2 = _snapshot(tmp_path, 80, "0000000000000002")  # the same store, more records: some files differ
    new = export_snapshot(target, snap2, m2, threading.Event()).manifest
    only_old = {f.blob for f in old.files} - {f.blob for f in new.files}
    assert only_old
    files = tmp_path / "bucket" / "tbl" / FILES_DIR
    unreferenced = files / ("f" * 64 + "-3")  # an upload whose manifest is not written yet
    unreferenced.write_bytes(b"abc")
    now = time.time()
    swept = retention.apply(target, "tbl", keep=1, grace_s=100, now=now)
    assert swept.retired == 1 and swept.deleted_files == 0
    assert [x.id for x in live_manifests(target, "tbl")[0]] == [new.id]
    assert len(os.listdir(tmp_path / "bucket" / "tbl" / RETIRED_DIR)) == 1
    # Within the grace period the retired export's files stay (a host may be downloading it).
    assert retention.apply(target, "tbl", keep=1, grace_s=100, now=now + 50).deleted_files == 0
    assert all((files / b).exists() for b in only_old) and unreferenced.exists()
    later = retention.apply(target, "tbl", keep=1, grace_s=100, now=now + 200)
    assert later.forgotten == 1 and not any((files / b).exists() for b in only_old) and not unreferenced.exists()
    assert all((files / f.blob).exists() for f in new.files)  # the kept export is whole
    assert not os.listdir(tmp_path / "bucket" / "tbl" / RETIRED_DIR)
    assert os.listdir(tmp_path / "bucket" / "tbl" / EXPORTS_DIR) == [f"{new.id}.json"]


def test_metrics_say_where_a_store_came_from_and_what_exports_uploaded() -> None:
    from globald.common.states import State
    from globald.ops.metrics import Metrics, Sample
    from globald.status.document import DaemonStatus, TableStatus

    origin = {"kind": "export", "export": "0000000000000001-0a0b0c0d", "bytes_downloaded": 1234, "seconds": 1.5,
              "tail": 42, "age_s": 30.0, "fallback": "export x: checksum mismatch"}
    export = {"exports": 2, "failures": 1, "uploaded_bytes_total": 5000, "last": {"uploaded_bytes": 100}}
    doc = DaemonStatus(state=State.RUNNING, pid=1, tables={
        "tbl": TableStatus(state="RUNNING", topic="t", origin=origin, export=export),
        "plain": TableStatus(state="RUNNING", topic="u")})
    text = Metrics(lambda: Sample(doc=doc), lambda: (0.0, 0.0)).render().decode()
    for line in ('globald_table_origin{kind="export",table="tbl"} 1.0',
                 'globald_table_bootstrap_fallback{table="tbl"} 1.0',
                 'globald_table_bootstrap_bytes_downloaded{table="tbl"} 1234.0',
                 'globald_table_bootstrap_tail{table="tbl"} 42.0',
                 'globald_table_export_uploaded_bytes_total{table="tbl"} 5000.0',
                 'globald_table_exports_total{table="tbl"} 2.0',
                 'globald_table_export_failures_total{table="tbl"} 1.0',
                 'globald_table_export_last_uploaded_bytes{table="tbl"} 100.0'):
        assert line in text, line
    assert 'table="plain"' not in "\n".join(x for x in text.splitlines() if "export" in x or "origin" in x)
    # Round trip through status.json keeps both sections.
    back = DaemonStatus.from_json(doc.to_json()).tables["tbl"]
    assert back.origin == origin and back.export == export


def test_globald_export_needs_an_export_section_and_a_running_daemon(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from globald.cli import main as cli
    from globald.common import exitcodes

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    base = (f'state_dir = "{state}"\n[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n'
            '[[tables]]\nname = "tbl"\ntopic = "t"\n')
    plain = tmp_path / "plain.toml"
    plain.write_text(base)
    assert cli.main(["export", "--config", str(plain), "--table", "tbl"]) == 2
    assert "config error: export: is not configured" in capsys.readouterr().err
    exporting = tmp_path / "export.toml"
    exporting.write_text(base.replace("[kafka]", f'[export]\nuri = "{(tmp_path / "bucket").as_uri()}"\n[kafka]'))
    assert cli.main(["export", "--config", str(exporting), "--table", "tbl"]) == exitcodes.FAILED
    assert "no globald runs on state_dir" in capsys.readouterr().err
    assert cli.main(["export", "--config", str(exporting), "--table", "nope"]) != 0
    assert not (tmp_path / "bucket").exists()  # nothing written anywhere


def test_a_download_fetches_files_at_once_and_a_damaged_one_refuses_the_export(tmp_path: Path) -> None:
    from collections.abc import Iterator

    from globald.export.bootstrap import Bootstrap, Install, Refused, staging_dir
    from globald.store.names import DB_DIR

    target_uri = (tmp_path / "bucket").as_uri()
    snap, m = _snapshot(tmp_path, 3_000, "0000000000000001")
    exported = export_snapshot(Target(target_uri), snap, m, threading.Event()).manifest
    assert len(exported.files) >= 2
    together = threading.Barrier(2, timeout=30)  # two files' downloads under way at the same moment
    first_two: set[str] = set()
    lock = threading.Lock()

    class Meeting(Target):
        def chunks(self, *parts: str) -> Iterator[bytes]:
            me = threading.current_thread().name
            with lock:
                wait = len(first_two) < 2 and me not in first_two  # the first two threads to open a file
                first_two.add(me)
            if wait:
                together.wait()  # BrokenBarrierError when one thread fetches the files one after the other
            yield from super().chunks(*parts)

    cfg = _new_host(tmp_path, target_uri)
    state = cfg.state_dir
    stage = staging_dir(state, "tbl")
    b = Bootstrap(cfg, cfg.tables[0], Meeting(target_uri), threading.Event(), Install())
    b._download(exported, stage)
    assert b.downloaded == exported.total_bytes  # each downloader's bytes counted once
    for f in exported.files:
        assert (stage / DB_DIR / f.name).read_bytes() == (snap / "db" / f.name).read_bytes(), f.name

    # One flipped byte in the largest file: the export is refused, naming that file.
    largest = max(exported.files, key=lambda f: f.size)
    blob = tmp_path / "bucket" / "tbl" / FILES_DIR / largest.blob
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    again = tmp_path / "again"
    with pytest.raises(Refused, match=f"file {largest.name}: checksum mismatch"):
        Bootstrap(cfg, cfg.tables[0], Target(target_uri), threading.Event(), Install())._download(exported, again)


# What pyarrow's S3 filesystem raises when an object it opened (lazily: no GET yet) is gone at its first read.
S3_GONE = "AWS Error NO_SUCH_KEY during GetObject operation: The specified key does not exist. (Request ID: x)"


class _GoneAtRead:
    """A stream opened while the object was there, read after another host's retention removed it (S3)."""

    def __enter__(self) -> _GoneAtRead:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, n: int) -> bytes:
        raise OSError(S3_GONE)


def test_an_object_gone_between_open_and_read_is_a_missing_file_and_retention_goes_on(tmp_path: Path) -> None:
    """CI, on the S3 emulator: a manifest listed, opened, then retired by another host's retention before its first
    read raised a raw OSError out of ``retention.apply`` (the read was outside the storage-error mapping). A read or
    a download of such an object now says FileNotFoundError, which every caller takes as "gone"; other failures
    stay TargetError."""
    target = Target(tmp_path.as_uri())
    target.put(iter([b"{}"]), "tbl", "exports", "x.json")

    class Gone(Target):
        def _call(self, what: str, fn: object, *args: object, **kwargs: object) -> object:
            if what == "open":
                return _GoneAtRead()
            return super()._call(what, fn, *args, **kwargs)

    gone = Gone(tmp_path.as_uri())
    with pytest.raises(FileNotFoundError, match="NO_SUCH_KEY"):
        gone.read("tbl", "exports", "x.json", limit=1_000)
    with pytest.raises(FileNotFoundError):
        list(gone.chunks("tbl", "exports", "x.json"))

    def fails() -> None:
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: timed out")

    with pytest.raises(TargetError, match="NETWORK_CONNECTION"):
        target._call("read", fails)


def test_the_brokers_refusal_during_a_download_halts_it_and_nothing_is_opened_or_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's checks run beside the download (issue 44): a refusal from them stops every file's download at
    its next chunk, the store is never opened (the checks are waited for first) and the export is not used, for
    the broker's reason."""
    from collections.abc import Iterator

    from globald.export import bootstrap
    from globald.export.checks import BrokerChecks, Refused

    target_uri = (tmp_path / "bucket").as_uri()
    snap, m = _snapshot(tmp_path, 3_000, "0000000000000001")
    exported = export_snapshot(Target(target_uri), snap, m, threading.Event()).manifest
    halts: list[threading.Event] = []
    asked = threading.Event()

    def refuses(self: BrokerChecks) -> None:
        halts.append(self.halt)
        asked.set()
        raise Refused("the broker refused it (test)")

    class Slow(Target):
        def chunks(self, *parts: str) -> Iterator[bytes]:
            for chunk in super().chunks(*parts):
                for i in range(0, len(chunk), 100):
                    yield chunk[i:i + 100]
                    # the download is under way when the broker's answer comes: the next piece is read after it
                    assert asked.wait(60) and halts[0].wait(60)

    opened: list[Path] = []
    monkeypatch.setattr(BrokerChecks, "check", refuses)
    monkeypatch.setattr(bootstrap.Bootstrap, "_check", lambda self, m, db: opened.append(db))
    cfg = _new_host(tmp_path, target_uri)
    state = cfg.state_dir
    b = bootstrap.Bootstrap(cfg, cfg.tables[0], Slow(target_uri), threading.Event(), bootstrap.Install())
    origin = b.run()
    assert origin.kind == "topic" and "the broker refused it (test)" in (origin.fallback or ""), origin
    assert b.downloaded <= 100 * min(bootstrap.DOWNLOADERS, len(exported.files)) < exported.total_bytes
    assert not opened and not bootstrap.staging_dir(state, "tbl").exists()
    assert bootstrap.needs_bootstrap(state, "tbl")


@pytest.mark.parametrize("said", [S3_GONE, "AWS Error RESOURCE_NOT_FOUND during GetObject operation: "])
def test_each_way_s3_says_an_object_is_gone_is_a_missing_file(tmp_path: Path, said: str) -> None:
    """A ranged GET of an object deleted after its stream opened may be answered 404 without an error body: the AWS
    SDK then says RESOURCE_NOT_FOUND, not NO_SUCH_KEY (a CI download raced retention so). Both are FileNotFoundError,
    which the bootstrap reports as a file missing from the storage; another failure stays a TargetError."""

    def fails(text: str) -> None:
        raise OSError(text)

    target = Target(tmp_path.as_uri())
    with pytest.raises(FileNotFoundError):
        target._call("read", fails, said)
    with pytest.raises(TargetError, match="read failed"):
        target._call("read", fails, "AWS Error NETWORK_CONNECTION during GetObject operation")
