"""The HTTP endpoint, metrics and the get/reset commands against the real daemon, a real broker and RocksDB."""

from __future__ import annotations

import hashlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from globald.common import exitcodes
from tests.harness import Broker, DaemonProcess, globald, oracle_at, random_records, values_only, write_config

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
HTTP = {"enabled": True, "port": 0}


def fetch(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = fetch(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def port_of(d: DaemonProcess) -> int:
    doc = d.wait_for(lambda s: s.get("http", {}).get("port"), what="the http port in status")
    port = doc["http"]["port"]
    assert doc["http"]["host"] == "127.0.0.1" and port > 0
    return port


def test_metrics_health_status_get_and_reset(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    records = random_records(6_000, keys=800, seed=31, tombstones=0.1)
    records += [(b"caf\xc3\xa9", b"\xff\x00binary"), (b"text-key", "Zoë".encode())]
    broker.admin.produce(t, records)
    ends = broker.admin.end_offsets(t)
    d = daemon({"tbl": t}, http=HTTP)
    port = port_of(d)
    doc = d.wait_running({"tbl": ends})
    assert doc["ready"] is True

    # /status is the document `globald status --json` prints. Both are republished every second with a fresh memory
    # sample, so compare a CLI read with /status read on both sides of it, once those two agree.
    for _ in range(20):
        status, body = fetch(port, "/status")
        assert status == 200
        cli = d.status_cli()
        live, again = json.loads(body), json.loads(fetch(port, "/status")[1])
        for x in (live, cli, again):
            x.pop("updated")
        if live == again:
            break
    assert live == cli

    samples = scrape(port)
    offsets = cli["tables"]["tbl"]["offsets"]
    for p, end in ends.items():
        labels = {"table": "tbl", "topic": t, "partition": str(p)}
        assert metric(samples, "globald_partition_offset", **labels) == offsets[str(p)] == end
        assert metric(samples, "globald_partition_end_offset", **labels) == end
        assert metric(samples, "globald_partition_lag", **labels) == 0
    assert metric(samples, "globald_state", state="RUNNING") == 1
    assert metric(samples, "globald_state", state="RESTORING") == 0
    assert metric(samples, "globald_table_state", table="tbl", state="RUNNING") == 1
    assert metric(samples, "globald_ready") == 1
    assert metric(samples, "globald_restore_records_total", table="tbl") == cli["tables"]["tbl"]["records"]
    assert cli["tables"]["tbl"]["records"] == len(records)  # nothing compacted yet: the active segment is never
    assert metric(samples, "globald_restore_active", table="tbl") == 0
    assert metric(samples, "globald_commits_total") >= 1
    assert metric(samples, "globald_commit_duration_seconds_count") >= 1
    assert metric(samples, "globald_callback_failures_total") == 0
    # A small restore on a healthy disk never waits for RocksDB to make room.
    assert metric(samples, "globald_write_stalls_total") == metric(samples, "globald_writes_remade_total") == 0
    assert metric(samples, "globald_loop_age_seconds") < 5
    assert not [k for k in samples if k[0] == "globald_wipes_total"]

    status, body = fetch(port, "/healthz")
    assert status == 200 and json.loads(body)["healthy"] is True
    status, body = fetch(port, "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    assert fetch(port, "/nope")[0] == 404
    assert fetch(port, "/metrics", method="POST")[0] == 405

    # get: the value and timestamp of one key, as text, hex or base64; exit 1 when absent.
    r = globald("get", "--config", str(d.config), "--table", "tbl", "text-key")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["value:     Zoë", "timestamp: none (the record carried no timestamp)"] \
        or (broker.has_timestamps and r.stdout.startswith("value:     Zoë\ntimestamp: 20"))
    r = globald("get", "--config", str(d.config), "--table", "tbl", "--key-format", "hex", b"caf\xc3\xa9".hex(),
                "--json")
    got = json.loads(r.stdout)
    assert r.returncode == 0 and got["found"] and got["value"] is None
    assert got["value_base64"] == "/wBiaW5hcnk=" and isinstance(got["timestamp"], int)
    r = globald("get", "--config", str(d.config), "--table", "tbl", "café", "--json")
    assert json.loads(r.stdout)["value_base64"] == "/wBiaW5hcnk="
    r = globald("get", "--config", str(d.config), "--table", "tbl", "no-such-key", "--json")
    got = json.loads(r.stdout)
    assert r.returncode == 1 and {k: got[k] for k in ("found", "key_base64", "table", "source")} == {
        "found": False, "key_base64": "bm8tc3VjaC1rZXk=", "table": "tbl", "source": "live"}

    # reset while the daemon runs: refused without confirmation, then done by the daemon itself.
    r = globald("reset", "--config", str(d.config), "--table", "tbl")
    assert r.returncode == 4 and "--yes" in r.stderr  # refused (globald.common.exitcodes.REFUSED)
    assert d.status()["tables"]["tbl"]["wipes"] == 0
    r = globald("reset", "--config", str(d.config), "--table", "tbl", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"by": "daemon", "had_store": True, "pid": d.pid, "table": "tbl"}
    doc = d.wait_for(lambda s: s["tables"]["tbl"]["wipes"] == 1 and s["state"] == "RUNNING"
                     and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
                     what="rebuilt after reset")
    assert doc["pid"] == d.pid
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, doc["tables"]["tbl"]["offsets"])
    samples = scrape(port)
    assert metric(samples, "globald_wipes_total", table="tbl", reason="operator_reset") == 1
    assert metric(samples, "globald_restore_records_total", table="tbl") == 2 * len(records)

    # reset with no daemon: the CLI takes the lock and wipes; the next run restores from the log start.
    assert d.stop() == 0
    r = globald("reset", "--config", str(d.config), "--table", "tbl", "--yes")
    assert r.returncode == 0 and "wiped" in r.stdout, r.stderr
    assert globald("status", "--config", str(d.config), "--json").stdout.count('"offsets": {}') == 1
    d.start()
    doc = d.wait_running({"tbl": ends})
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, doc["tables"]["tbl"]["offsets"])


def test_not_ready_but_healthy_while_a_topic_is_missing(broker: Broker, topic: Callable[..., str],
                                                        daemon: Daemon) -> None:
    ready_topic = topic()
    missing = f"{ready_topic}-later"
    broker.admin.produce(ready_topic, random_records(200, keys=50, seed=32))
    d = daemon({"here": ready_topic, "later": missing}, http=HTTP)
    port = port_of(d)
    d.wait_for(lambda s: s["tables"]["here"]["state"] == "RUNNING" and s.get("degraded"), what="one table running")
    status, body = fetch(port, "/readyz")
    assert status == 503 and "later" in json.loads(body)["detail"]
    status, body = fetch(port, "/healthz")
    assert status == 200 and json.loads(body)["healthy"] is True  # broker trouble is not a dead loop
    samples = scrape(port)
    assert metric(samples, "globald_ready") == 0 and metric(samples, "globald_degraded") == 1
    assert metric(samples, "globald_table_state", table="later", state="RESTORING") == 1

    broker.admin.create(missing, partitions=1)
    broker.admin.produce(missing, random_records(100, keys=10, seed=33))
    d.wait_running({"later": broker.admin.end_offsets(missing)}, timeout=90)
    deadline = time.monotonic() + 10
    while fetch(port, "/readyz")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fetch(port, "/readyz")[0] == 200


def test_http_port_in_use_is_a_config_error(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        d = daemon({"tbl": topic()}, http={"enabled": True, "port": busy.getsockname()[1]})
        assert d.proc is not None and d.proc.wait(30) == 2
    log = d.log.read_text()
    assert "config error: http.port: cannot listen on 127.0.0.1:" in log


def test_status_of_a_config_naming_another_state_dir_says_no_daemon_holds_it(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    """Issue 42: a status that finds no daemon names the state_dir it looked in and exits 5, as reload does, even
    while a daemon runs on another state_dir; it creates nothing there."""
    t = topic()
    broker.admin.produce(t, random_records(200, keys=50, seed=421))
    d = daemon({"tbl": t})
    d.wait_running({"tbl": broker.admin.end_offsets(t)})
    elsewhere = tmp_path / "elsewhere"
    other = write_config(tmp_path / "other.toml", elsewhere, broker.settings, {"tbl": t})
    r = globald("status", "--config", str(other))
    assert r.returncode == exitcodes.FAILED, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.splitlines() == [f"globald: no globald runs on state_dir {elsewhere} ({other}'s state_dir; no "
                                     "process holds its lock)"], r.stderr
    assert r.stdout.startswith("globald: NOT_RUNNING\n"), r.stdout
    assert globald("status", "--config", str(other), "--json").returncode == exitcodes.FAILED
    assert not elsewhere.exists()
    assert globald("status", "--config", str(d.config)).returncode == exitcodes.OK  # the running one's


def test_a_second_daemon_on_a_taken_http_port_exits_2_before_it_writes_its_state_dir(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    """Issue 42: the [http] bind is checked before anything is written to the state_dir, so a second daemon (another
    state_dir, the first one's port) leaves its state_dir as it was instead of bootstrapping it from the export first;
    on a free port it bootstraps, and plain status shows where its store came from and the config in force."""
    from tests.integration.test_export import FAST, REFRESH_MS, _export_at, _export_conf

    t = topic()
    broker.admin.produce(t, random_records(500, keys=100, seed=422))
    ends = broker.admin.end_offsets(t)
    root = tmp_path / "exports"
    one = daemon({"tbl": t}, http=HTTP, snapshots=FAST, metadata_refresh_ms=REFRESH_MS, export=_export_conf(root),
                 state_dir=tmp_path / "one")
    one.wait_running({"tbl": ends})
    port = port_of(one)
    exported = _export_at(one, root, ends)["export"]  # what a second daemon would bootstrap from

    second = tmp_path / "second"
    two = daemon({"tbl": t}, http={"enabled": True, "port": port}, snapshots=FAST, export=_export_conf(root),
                 state_dir=second)
    assert two.proc is not None and two.proc.wait(60) == 2, two.tail()
    said = [line for line in two.log.read_text().splitlines() if "http.port" in line]
    assert said == [f"globald: config error: http.port: cannot listen on 127.0.0.1:{port}: Address already in use "
                    "(choose another port, or set [http] enabled = false)"], two.tail()
    assert not second.exists() or list(second.iterdir()) == [], list(second.rglob("*"))
    assert one.alive()

    three = daemon({"tbl": t}, http=HTTP, snapshots=FAST, export=_export_conf(root), state_dir=second)
    three.wait_running({"tbl": ends}, timeout=120)
    text = globald("status", "--config", str(three.config)).stdout
    assert f"origin: export {exported} (" in text, text
    sha = hashlib.sha256(three.config.read_bytes()).hexdigest()
    line = next((x for x in text.splitlines() if x.startswith("  config: ")), "")
    assert line.startswith(f"  config: generation 1, sha256 {sha} (clients: ") and line.endswith("; no reload yet"), \
        text
