"""Secrets in the config never reach a terminal or a log, and the unauthenticated HTTP endpoint is never exposed
beyond this host by accident. Each test runs the real CLI (``python -m globald``) as a subprocess; none needs a
broker: the daemon is pointed at a port nobody listens on, where it keeps retrying until it is stopped.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, DaemonProcess, globald, write_config
from tests.reliability.ledger import FaultRow

MARK = "Qv8z"  # in every secret value below, and nowhere else: if it shows up anywhere, something leaked

# Only properties librdkafka accepts without a real SSL setup or a Kerberos build: with SASL_PLAINTEXT and
# OAUTHBEARER a consumer is constructed although ssl.key.pem is no PEM and nothing provides a token.
SECRETS: dict[str, str] = {
    "ssl.key.pem": f"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC{MARK}\n-----END PRIVATE KEY-----",
    "sasl.oauthbearer.config": f"principal=globald extension_traceId=cfg{MARK}",
    "sasl.password": f"sasl-pw-{MARK}",
    "ssl.keystore.password": f"keystore-pw-{MARK}",
    "ssl.key.password": f"key-pw-{MARK}",
    "sasl.oauthbearer.client.secret": f"client-secret-{MARK}",
    # Named like nothing secret, yet free-form: masked because it is not on the allowlist.
    "sasl.oauthbearer.extensions": f"tenant=t1,token=ext{MARK}",
}
SETTINGS: dict[str, Any] = {
    "api.version.request": False,
    "broker.version.fallback": "0.9.0.1",
    "security.protocol": "sasl_plaintext",
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.username": "globald-user",
}
CONFIG_ROW = ("credential properties in the config (ssl.key.pem, sasl.oauthbearer.config, passwords, unlisted)",
              "shown as *** or absent; never in stdout, stderr, logs, status.json or /status")
BIND_ROW = ("HTTP host beyond loopback",
            "without [http] allow_non_loopback: one line naming it, exit 2, nothing created; with it: a warning")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, kafka: dict[str, Any], **top: Any) -> Path:
    bootstrap = {"bootstrap.servers": f"127.0.0.1:{_free_port()}"}
    return write_config(tmp_path / "g.toml", tmp_path / "state", {**bootstrap, **SETTINGS, **kafka}, {"tbl": "t1"},
                        **top)


def _assert_no_secret(where: str, text: str) -> None:
    assert MARK not in text, f"a secret leaked into {where}:\n{text}"
    for name, value in SECRETS.items():
        for line in value.splitlines():
            assert line.strip() not in text or line.startswith("-----"), f"{name} leaked into {where}"


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_check_config_never_prints_a_secret(tmp_path: Path, fault: Callable[[str, str], FaultRow],
                                            log_format: str) -> None:
    row = fault(*CONFIG_ROW)
    cfg = _config(tmp_path, SECRETS, log_format=log_format)
    for args in (["--json"], []):
        r = globald("check-config", "--config", str(cfg), *args)
        row.injected += 1
        assert r.returncode == 0, r.stderr
        _assert_no_secret(f"check-config {args}", r.stdout + r.stderr)
    shown = json.loads(globald("check-config", "--config", str(cfg), "--json").stdout)["kafka"]
    assert shown == {**dict.fromkeys(SECRETS, "***"), **SETTINGS,
                     "bootstrap.servers": shown["bootstrap.servers"]}
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(("prop", "value", "key"), [
    ("no.such.property", f"unknown-{MARK}", "kafka.no.such.property"),
    # librdkafka quotes this value in its refusal ("dlopen() failed: <value>.so ... (plugin <value>)").
    ("plugin.library.paths", f"/opt/plugin-{MARK}", "kafka"),
])
def test_a_refused_property_names_its_key_but_not_its_value(tmp_path: Path, fault: Callable[[str, str], FaultRow],
                                                            prop: str, value: str, key: str) -> None:
    row = fault(*CONFIG_ROW)
    cfg = _config(tmp_path, {**SECRETS, prop: value})
    for command in ("check-config", "run"):
        r = globald(command, "--config", str(cfg))
        row.injected += 1
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (command, r.stderr)
        assert lines[0].startswith(f"globald: config error: {key}: "), lines
        _assert_no_secret(command, r.stdout + r.stderr)
    assert not (tmp_path / "state").exists()


def _wait_for(predicate: Callable[[], bool], d: DaemonProcess, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert d.alive(), f"daemon exited before {what}:\n{d.tail()}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{d.tail()}")


def _status_file(state_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((state_dir / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_running_daemon_never_logs_or_serves_a_secret(tmp_path: Path, fault: Callable[[str, str], FaultRow],
                                                      log_format: str) -> None:
    row = fault(*CONFIG_ROW)
    cfg = _config(tmp_path, SECRETS, log_format=log_format, log_level="DEBUG", http={"port": 0})
    d = DaemonProcess(cfg, tmp_path / "daemon.log").start()
    state_dir = tmp_path / "state"
    try:
        # Both config echoes are written once the consumer exists; the status then names the HTTP port.
        _wait_for(lambda: "consumer settings" in d.log.read_text() and "http" in _status_file(state_dir), d,
                  "the consumer settings and the HTTP port")
        time.sleep(2)  # librdkafka's own complaints (no broker, no token) get their chance to be logged
        port = _status_file(state_dir)["http"]["port"]
        served = "".join(urllib.request.urlopen(f"http://127.0.0.1:{port}{p}", timeout=10).read().decode()
                         for p in ("/status", "/metrics"))
        status_file = (state_dir / "status.json").read_text()
    finally:
        assert d.stop() == 0, d.tail()
    row.injected += 1
    log = d.log.read_text()
    if log_format == "json":
        assert all(json.loads(line)["level"] for line in log.splitlines())
    for where, text in (("the log", log), ("status.json", status_file), ("/status and /metrics", served)):
        _assert_no_secret(where, text)
    echoes = [line for line in log.splitlines() if "consumer settings" in line or "kafka {" in line]
    assert len(echoes) == 2, log
    for line in echoes:  # each names every property, shows the harmless values and masks the rest
        assert all(name in line for name in SECRETS) and "***" in line and "globald-user" in line, line


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_non_loopback_http_host_without_opt_in_is_refused(tmp_path: Path, fault: Callable[[str, str], FaultRow],
                                                          host: str) -> None:
    row = fault(*BIND_ROW)
    cfg = _config(tmp_path, {}, http={"host": host, "port": _free_port()})
    for command in ("check-config", "run"):
        r = globald(command, "--config", str(cfg))
        row.injected += 1
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (command, r.stderr)
        assert lines[0].startswith("globald: config error: http.host: ") and "allow_non_loopback" in lines[0], lines
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_non_loopback_http_host_with_opt_in_is_served_with_a_warning(
        tmp_path: Path, fault: Callable[[str, str], FaultRow], log_format: str) -> None:
    row = fault(*BIND_ROW)
    cfg = _config(tmp_path, {}, log_format=log_format,
                  http={"host": "0.0.0.0", "port": _free_port(), "allow_non_loopback": True})
    assert globald("check-config", "--config", str(cfg)).returncode == 0
    # The daemon's stderr alone, so that the warning is seen where a service manager would collect it.
    proc = subprocess.Popen([sys.executable, "-m", "globald", "run", "--config", str(cfg)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    row.injected += 1
    try:
        deadline = time.monotonic() + 30
        while not _status_file(tmp_path / "state").get("http") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.1)
        port = _status_file(tmp_path / "state")["http"]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    warnings = [line for line in err.splitlines() if "WARNING" in line and "allow_non_loopback" in line]
    assert len(warnings) == 1 and "unauthenticated" in warnings[0], err
