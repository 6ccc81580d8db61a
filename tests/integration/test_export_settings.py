"""The ``[export]`` settings through a running daemon (issue 40 items 5.8 and 5.9), against the real broker and
RocksDB with a local directory as the storage: ``keep`` leaves exactly the newest ``keep`` exports; ``grace_s``
keeps what retention retired (manifests and the files only they reference) for that long, and with 0 not at all;
``bootstrap = false`` makes a host with an empty state_dir replay its topic though a usable export exists; and a
reload that changes ``[export]`` or ``[registry]``, which need a restart, is refused naming the key while the daemon
carries on with the config in force."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.common import exitcodes
from tests.harness import Broker, DaemonProcess, random_records
from tests.integration.test_export import (
    FAST,
    REFRESH_MS,
    _equals_fold,
    _export_at,
    _export_conf,
    _export_now,
    _exporter,
    _fresh,
)
from tests.integration.test_reload import edit, reload, sha256
from tests.support.registry import RegistryDouble

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def _blobs(manifest: Path) -> set[str]:
    """The storage names (``<sha256>-<size>``) of the files an export's manifest references."""
    return {f"{f['sha256']}-{f['size']}" for f in json.loads(manifest.read_text())["files"]}


def _logged(d: DaemonProcess, text: str, times: int, timeout: float = 120.0) -> int:
    """How often ``text`` is in the daemon's log, once it is there ``times`` times or ``timeout`` passed: the
    caller asserts what it claims, so that a daemon that never logs it fails on that claim, not on this wait."""
    deadline = time.monotonic() + timeout
    while (n := d.log.read_text(errors="replace").count(text)) < times and time.monotonic() < deadline:
        assert d.alive(), d.tail()
        time.sleep(0.1)
    return n


# Out of make test's budget for this file (~10 s; calls measured on a shared 2-core machine: reload 5.2-7.5 s,
# (1, 0) 3.7-3.9 s, (2, 3600) 6.4-7.2 s, bootstrap = false 8.3-8.6 s): the long lane (make test-long) runs the
# other two.
@pytest.mark.parametrize(("keep", "grace_s"), [pytest.param(2, 3600, marks=pytest.mark.long), (1, 0)])
def test_keep_leaves_the_newest_exports_and_grace_s_holds_what_retention_retired(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path, keep: int, grace_s: int) -> None:
    t, root, d = _exporter(daemon, broker, topic, tmp_path, 600, 200, 401, export={"keep": keep, "grace_s": grace_s})
    made: list[str] = []
    first = _export_at(d, root, broker.admin.end_offsets(t), made=made)["export"]
    exports, files = root / "tbl" / "exports", root / "tbl" / "files"
    first_blobs = _blobs(exports / f"{first}.json")
    for seed in range(402, 402 + keep):  # keep more exports, each of other data, after the first
        broker.admin.produce(t, random_records(200, keys=400, seed=seed, tombstones=0.1))
        _export_at(d, root, broker.admin.end_offsets(t), made=made)

    # The CLI returns once the manifest is written; the worker applies retention after that. Each export past
    # the first ``keep`` retires one and logs it: waited for, so that nothing is listed half-way.
    retentions = _logged(d, "export retention: 1 exports retired", len(made) - keep)
    newest = sorted(made)[-keep:]
    assert sorted(p.name for p in exports.iterdir()) == [f"{i}.json" for i in newest], made
    assert retentions == len(made) - keep, d.tail()  # one retired at each export past the first keep
    live_blobs = set().union(*(_blobs(exports / f"{i}.json") for i in newest))
    for blob in live_blobs:  # every file a kept export references is there, whole
        data = (files / blob).read_bytes()
        assert f"{hashlib.sha256(data).hexdigest()}-{len(data)}" == blob
    own = first_blobs - live_blobs  # what only the first (retired) export referenced
    assert own, "the kept exports share every file with the first one: nothing for grace_s to hold"
    retired = {p.name.split("@")[0] for p in (root / "tbl" / "retired").glob("*.json")}
    left = {p.name for p in files.iterdir()}
    if grace_s:  # retired, not deleted: a host still downloading the first export finds all of it
        assert retired == set(made) - set(newest), (retired, made)
        assert own <= left, own - left
    else:  # nothing protects them: the retired manifests and the files only they referenced are gone at once
        assert not retired, retired
        assert not own & left, own & left
        assert left == live_blobs, left ^ live_blobs


@pytest.mark.long  # three daemons, 8.6 s: out of make test's budget for this file (see above)
def test_bootstrap_false_replays_the_topic_though_a_usable_export_exists(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 600, 200, 410)
    done = _export_at(exporter, root, broker.admin.end_offsets(t))
    exporter.stop()
    broker.admin.produce(t, random_records(100, keys=300, seed=411, tombstones=0.1))  # a tail after the export
    # The same storage with bootstrap on is used (the control): the export is usable.
    on, table = _fresh(daemon, broker, t, root, tmp_path, "state-on")
    assert table["origin"]["kind"] == "export" and table["origin"]["export"] == done["export"], table["origin"]
    on.stop()
    d, table = _fresh(daemon, broker, t, root, tmp_path, "state-off", bootstrap=False)
    origin = table["origin"]
    assert origin["kind"] == "topic" and origin["fallback"] == "bootstrap = false", origin
    assert not origin["bytes_downloaded"] and origin["export"] is None, origin
    assert "looking for an export" not in d.log.read_text(errors="replace")
    _equals_fold(broker, t, d, table)


def test_a_reload_that_changes_export_or_registry_is_refused_and_the_daemon_carries_on(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    t = topic(partitions=1)
    broker.admin.produce(t, random_records(200, keys=50, seed=420, tombstones=0.1))
    root = tmp_path / "exports"
    edited = daemon({"tbl": t}, snapshots=FAST, metadata_refresh_ms=REFRESH_MS, export=_export_conf(root),
                    state_dir=tmp_path / "state")
    # Status, dumps and waits read a copy of the config in force: the file the reloads are asked with is edited.
    copy = edited.config.with_name("status.toml")
    first = edited.config.read_bytes()
    copy.write_bytes(first)
    d = DaemonProcess(copy, edited.log, proc=edited.proc)
    before = d.wait_running({"tbl": broker.admin.end_offsets(t)})
    pid, sha = d.pid, sha256(copy)
    assert before["config"]["generation"] == 1 and before["pid"] == pid
    registry = RegistryDouble().start()  # check-config reaches the registry a file names: one that answers
    request.addfinalizer(registry.stop)
    for key, pattern, replacement in [
            ("export.keep", r"^keep = 2$", "keep = 5"),
            ("export.uri", r"^uri = .*$", f"uri = {json.dumps((tmp_path / 'elsewhere').as_uri())}"),
            ("registry", r"^\[kafka\]$", f'[registry]\nurl = "{registry.url}"\n[kafka]')]:
        edited.config.write_bytes(first)
        edit(edited.config, pattern, replacement)
        r = reload(edited)
        assert r.returncode == exitcodes.USAGE, f"{key}: {r.stdout}{r.stderr}\n{d.tail()}"
        assert f"reload refused: {key}: cannot change while the daemon runs" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
        doc = d.status()
        assert doc["config"]["generation"] == 1 and doc["config"]["sha256"] == sha and doc["pid"] == pid, key
        assert doc["config"]["last_reload"]["result"] == "refused" and key in doc["config"]["last_reload"]["error"]
    # The same process keeps mirroring the topic, and exports, on the config in force: to the first uri.
    broker.admin.produce(t, random_records(100, keys=50, seed=421, tombstones=0.1))
    after = d.wait_running({"tbl": broker.admin.end_offsets(t)})
    assert after["pid"] == pid == edited.pid and after["config"]["generation"] == 1
    _equals_fold(broker, t, d, after["tables"]["tbl"])
    done = _export_now(d)
    assert (root / "tbl" / "exports" / f"{done['export']}.json").exists()
    assert not (tmp_path / "elsewhere").exists()
