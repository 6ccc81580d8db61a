"""The real daemon's operator surfaces: sd_notify on a socket the test binds, state hooks (command and webhook),
secrets never logged, and the restore progress bar on a terminal."""

from __future__ import annotations

import ctypes.util
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from globald.ops.allocator import REEXEC_ENV
from tests.harness import REPO, Broker, DaemonProcess, globald, random_records

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


class Datagrams:
    """Collects what arrives on a bound AF_UNIX datagram socket, as systemd's notify socket would."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append((time.monotonic(), self.sock.recv(65536).decode()))
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def texts(self) -> list[str]:
        return [m for _, m in self.messages]

    def wait_for(self, predicate: Callable[[list[str]], bool], what: str, timeout: float = 60.0) -> list[str]:
        """The messages received, once ``predicate`` holds of them; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate(texts := self.texts()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {texts}"
            time.sleep(0.1)
        return texts


def test_sd_notify_ready_status_watchdog_stopping(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                  tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(20_000, keys=2_000, seed=41))
    sock = Datagrams(tmp_path / "notify.sock")
    try:
        d = daemon({"tbl": t}, start=False)
        d.env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"}
        d.start()
        d.wait_running({"tbl": broker.admin.end_offsets(t)})

        def pinged(texts: list[str]) -> bool:  # pinged at half of WATCHDOG_USEC from the loop: three times since READY
            ready = [i for i, m in enumerate(texts) if m.startswith("READY=1")]
            return bool(ready) and texts[ready[0]:].count("WATCHDOG=1") >= 3

        sock.wait_for(pinged, "three watchdog pings after READY=1")
        assert d.stop() == 0
        sock.wait_for(lambda texts: any(m.startswith("STOPPING=1") for m in texts), "STOPPING=1 after SIGTERM")
    finally:
        sock.close()
    texts = sock.texts()
    ready = [i for i, m in enumerate(texts) if m.startswith("READY=1")]
    assert len(ready) == 1, texts
    assert f"MAINPID={d.pid}" in texts[ready[0]]
    statuses = [m for m in texts if m.startswith("STATUS=")]
    assert any(m.startswith("STATUS=RESTORING") for m in texts[:ready[0]])  # state changes before READY
    assert any("tbl RESTORING" in m for m in statuses)
    # READY=1 comes with the change that made every table servable.
    assert "tbl RUNNING" in texts[ready[0]]
    assert texts[ready[0]:].count("WATCHDOG=1") >= 3
    assert any(m.startswith("STOPPING=1") for m in texts[ready[0]:])


class Collector(BaseHTTPRequestHandler):
    events: list[dict] = []

    def do_POST(self) -> None:
        type(self).events.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_state_hooks_command_and_webhook(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                         tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(1_000, keys=100, seed=42))
    out = tmp_path / "hook-events.jsonl"
    script = tmp_path / "hook.py"
    script.write_text(f"""import json, os
env = {{k: v for k, v in os.environ.items() if k.startswith("GLOBALD_") or k in ("NOTIFY_SOCKET", "LD_PRELOAD")}}
with open({str(out)!r}, "a") as f:
    f.write(json.dumps(env) + "\\n")
""")
    server = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        d = daemon({"tbl": t}, start=False, hooks={
            # -I -S: a hook starts in 10 ms rather than 30: the stop's own events are delivered within STOP_HOOKS_S
            # of the signal (0.5 s), after which a stop does not wait for its hooks (issue 40)
            "on_state_change": [sys.executable, "-I", "-S", str(script)],
            "webhook_url": f"http://127.0.0.1:{server.server_address[1]}/globald", "timeout_ms": 5000})
        d.env = {"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")}
        d.start()
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        assert d.stop() == 0
    finally:
        server.shutdown()
        server.server_close()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    seen = [(e["GLOBALD_TABLE"], e["GLOBALD_PREVIOUS_STATE"], e["GLOBALD_STATE"]) for e in events]
    daemon_changes = [(old, new) for table, old, new in seen if table == ""]
    table_changes = [(old, new) for table, old, new in seen if table == "tbl"]
    assert daemon_changes == [("CREATED", "RESTORING"), ("RESTORING", "RUNNING"), ("RUNNING", "PENDING_SHUTDOWN"),
                              ("PENDING_SHUTDOWN", "NOT_RUNNING")]
    assert table_changes == daemon_changes
    assert all(e["GLOBALD_REASON"] and e["GLOBALD_PID"] == str(d.pid) for e in events)
    assert not any("NOTIFY_SOCKET" in e for e in events)  # hooks never get the daemon's systemd channel
    assert not any("LD_PRELOAD" in e or REEXEC_ENV in e for e in events)  # nor the allocator the daemon preloaded
    posted = [(e["table"] or "", e["previous_state"], e["state"]) for e in Collector.events]
    assert posted == seen


@pytest.mark.parametrize("wanted", ["auto", "glibc"])
def test_run_switches_to_jemalloc_in_place_when_installed(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                          wanted: str) -> None:
    """``allocator = "auto"`` re-executes ``globald run`` with jemalloc preloaded, in the same process (systemd and
    the PID file see one PID); "glibc" keeps glibc's malloc. On a machine without libjemalloc, auto is glibc."""
    t = topic()
    broker.admin.produce(t, random_records(500, keys=50, seed=43))
    d = daemon({"tbl": t}, allocator=wanted)
    d.wait_running({"tbl": broker.admin.end_offsets(t)})
    expected = "jemalloc" if wanted == "auto" and ctypes.util.find_library("jemalloc") else "glibc"
    doc = d.status()
    assert doc["pid"] == d.pid and d.alive()
    assert doc["memory"]["allocator"] == expected
    mapped = "libjemalloc" in Path(f"/proc/{d.pid}/maps").read_text()
    assert mapped == (expected == "jemalloc")
    heap = doc["memory"]["malloc"]
    assert heap is not None and heap["in_use_mb"] > 1  # the allocator in use reports its heap, not the other's
    assert f"starting on {expected}'s malloc" in d.log.read_text()
    assert d.stop() == 0


SECRETS = {
    "sasl.password": "s3cr3t-sasl-Xy7",
    "ssl.key.password": "s3cr3t-key-Xy7",
    "ssl.keystore.password": "s3cr3t-keystore-Xy7",
    "sasl.oauthbearer.client.secret": "s3cr3t-oauth-Xy7",
}


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_secrets_never_reach_logs_status_or_http(broker: Broker, topic: Callable[..., str], tmp_path: Path,
                                                 log_format: str) -> None:
    from tests.harness import write_config

    t = topic()
    broker.admin.produce(t, random_records(500, keys=50, seed=43))
    cfg = write_config(tmp_path / "g.toml", tmp_path / "state", {**broker.settings, **SECRETS}, {"tbl": t},
                       log_level="DEBUG", log_format=log_format, commit_interval_ms=200,
                       http={"enabled": True, "port": 0})
    d = DaemonProcess(cfg, tmp_path / "daemon.log").start()
    try:
        doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})
        port = doc["http"]["port"]
        import urllib.request

        served = b"".join(urllib.request.urlopen(f"http://127.0.0.1:{port}{p}", timeout=10).read()
                          for p in ("/status", "/metrics", "/healthz", "/readyz"))
        status_file = (d.state_dir / "status.json").read_text()
    finally:
        assert d.stop() == 0
    log = d.log.read_text()
    if log_format == "json":
        assert all(json.loads(line)["level"] for line in log.splitlines())  # JSON lines, every one
    assert "sasl.password" in log and "***" in log  # the config echo names the property, masked
    checked = globald("check-config", "--config", str(cfg), "--json").stdout
    checked += globald("check-config", "--config", str(cfg)).stdout
    for name, secret in SECRETS.items():
        for where, text in (("log", log), ("status.json", status_file), ("http", served.decode()),
                            ("check-config", checked)):
            assert secret not in text, f"{name} leaked into {where}"
            assert "Xy7" not in text, f"part of {name} leaked into {where}"


def test_restore_progress_bar_on_a_terminal(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(60_000, keys=20_000, seed=44))
    d = daemon({"tbl": t}, start=False, consume_batch_size=2000)
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "globald", "run", "--config", str(d.config)],
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, cwd=REPO)
    os.close(terminal)
    d.proc = proc
    output = b""
    try:
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(30) == 0
    finally:
        os.close(controller)
    text = output.decode(errors="replace")
    assert "\r\x1b[Krestoring tbl [" in text and "rec/s ETA" in text
    assert "tbl: restored 60,000 records in" in text
    # A log line never lands after the bar on the same terminal line: the bar is cleared ("\r\x1b[K") first.
    assert "INFO" in text
    assert not re.search(r"restoring tbl \[[^\r\n]*\d{4}-\d\d-\d\d \d\d:", text)
