"""Operations logic without a broker: readiness, restore progress, sd_notify on real sockets, hooks with real
processes and a real HTTP server, log redaction, and the request inbox's claim protocol."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from globald.common.logs import JsonFormatter, PlainFormatter, Redactor
from globald.common.requests import EXPORT, RELOAD, RESET, OperatorRequest
from globald.common.states import State
from globald.engine.events import RebuildRequests
from globald.export.service import ExportRequest
from globald.ops import operator_requests
from globald.ops.health import liveness, readiness
from globald.ops.hooks import HookRunner
from globald.ops.metrics import Metrics, Sample
from globald.ops.progress import ProgressDisplay, ProgressOptions, RestoreTracker
from globald.ops.sdnotify import Notifier
from globald.service.reload import ReloadRequest
from globald.settings.config import HooksConfig
from globald.status.document import DaemonStatus
from globald.store.stalls import Stalls


class Servable:
    def __init__(self, tables: set[str]) -> None:
        self.tables = tables

    def servable(self, table: str) -> bool:
        return table in self.tables

    def age_seconds(self, table: str) -> float | None:
        return None

    def publish_seconds(self, table: str) -> float | None:
        return None

    def build_workers_replaced(self) -> int:
        return 0


def test_readiness_needs_every_table_running_or_with_a_servable_snapshot() -> None:
    assert readiness("RUNNING", {"a": "RUNNING", "b": "RUNNING"}).ready
    r = readiness("RESTORING", {"a": "RUNNING", "b": "RESTORING"})
    assert not r.ready and "b" in r.detail and r.tables == {"a": True, "b": False}
    # A rebuilding table whose (stale) snapshot can be served keeps the daemon ready.
    assert readiness("RESTORING", {"a": "RUNNING", "b": "RESTORING"}, Servable({"a", "b"})).ready
    # With snapshots, RUNNING alone is not enough: executors read snapshots, so one must be published.
    r = readiness("RUNNING", {"a": "RUNNING", "b": "RUNNING"}, Servable({"b"}))
    assert not r.ready and r.tables == {"a": False, "b": True}
    assert not readiness("PENDING_SHUTDOWN", {"a": "RUNNING"}).ready
    assert not readiness("CREATED", {"a": "RUNNING"}).ready
    assert not readiness("RUNNING", {}).ready


def test_liveness_is_about_the_loop_iterating() -> None:
    assert liveness("RESTORING", loop_age=1.0, progress_age=500.0).healthy
    assert not liveness("RUNNING", loop_age=120.0, progress_age=1.0).healthy
    assert not liveness("ERROR", loop_age=0.0, progress_age=0.0).healthy


def test_restore_tracker_counts_rate_and_restarts_after_a_wipe() -> None:
    t = RestoreTracker()
    t.on_restore_start("c", 0, 0, 1000)
    t.on_restore_start("c", 1, 100, 600)
    t.on_batch_restored("c", 0, 400, 300)  # compaction gaps: 400 offsets, 300 records
    time.sleep(0.05)
    t.on_batch_restored("c", 1, 350, 250)
    s = t.stats()["c"]
    assert s.active and s.records == 550 and s.done_offsets == 400 + 250 and s.total_offsets == 1500
    assert s.records_per_second > 0 and s.eta_seconds is not None and s.eta_seconds > 0
    assert round(s.percent) == round(100 * 650 / 1500)
    t.on_restore_end("c", 0, 300)
    assert t.stats()["c"].active
    t.on_restore_end("c", 1, 250)
    s = t.stats()["c"]
    assert not s.active and s.done_offsets == s.total_offsets and s.eta_seconds == 0.0
    # After a wipe, a new restore of the same table starts from zero; the lifetime total keeps counting.
    t.on_restore_start("c", 0, 0, 50)
    t.on_batch_restored("c", 0, 50, 40)
    s = t.stats()["c"]
    assert s.active and s.records == 40 and s.total_offsets == 50 and s.records_total == 590


def test_progress_draws_a_bar_on_a_terminal_and_lines_otherwise() -> None:
    tracker = RestoreTracker()
    bar = io.StringIO()
    lines: list[str] = []
    tty = ProgressDisplay(tracker, ProgressOptions(stream=bar, tty=True, emit=lines.append))
    plain = ProgressDisplay(tracker, ProgressOptions(stream=io.StringIO(), tty=False, interval=0.0,
                                                     emit=lines.append))
    for listener in (tracker, tty, plain):
        listener.on_restore_start("c", 0, 0, 100)
    for listener in (tracker, tty, plain):
        listener.on_batch_restored("c", 0, 50, 50)
    assert "\r\x1b[K" in bar.getvalue() and "[############------------]  50%" in bar.getvalue()
    assert "rec/s" in bar.getvalue() and "ETA" in bar.getvalue()
    assert any(line.startswith("restoring c:  50%") for line in lines)
    logging.getLogger("x").addFilter(tty.log_filter)
    tty.log_filter.filter(logging.LogRecord("x", logging.INFO, "", 0, "m", None, None))
    assert bar.getvalue().endswith("\r\x1b[K")  # a log line clears the bar first
    for listener in (tracker, tty, plain):
        listener.on_restore_end("c", 0, 50)
    assert lines[-1].startswith("c: restored 50 records in")


@pytest.mark.parametrize("abstract", [False, True])
def test_sd_notify_reaches_a_real_datagram_socket(tmp_path: Path, abstract: bool) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"globald-test-{os.getpid()}-{time.monotonic_ns()}"
        server.bind("\0" + name)
        env = {"NOTIFY_SOCKET": "@" + name}
    else:
        path = tmp_path / "notify.sock"
        server.bind(str(path))
        env = {"NOTIFY_SOCKET": str(path)}
    server.settimeout(5)
    n = Notifier.from_env({**env, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())})
    assert n.enabled and n.watchdog_interval == pytest.approx(0.1)
    n.status("RESTORING (starting)")
    n.ready("RUNNING")
    n.ready("RUNNING again")  # READY=1 only once
    n.watchdog()
    n.watchdog()  # within the interval: no second ping
    got = [server.recv(4096).decode() for _ in range(4)]
    assert got == ["STATUS=RESTORING (starting)", f"READY=1\nSTATUS=RUNNING\nMAINPID={os.getpid()}",
                   "STATUS=RUNNING again", "WATCHDOG=1"]
    server.settimeout(0.3)
    with pytest.raises(TimeoutError):
        server.recv(4096)
    server.close()
    n.close()


def test_sd_notify_is_off_without_socket_and_watchdog_ignores_other_pids() -> None:
    assert not Notifier.from_env({}).enabled
    assert not Notifier.from_env({}).send("READY=1")
    n = Notifier.from_env({"NOTIFY_SOCKET": "/nonexistent/sock", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None
    assert not n.send("STATUS=x") and n.failures == 1  # a dead socket is counted, never raised


def _hook_script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / f"hook-{len(list(tmp_path.glob('hook-*')))}.py"
    script.write_text("import json, os, sys, time\n" + body)
    return [sys.executable, str(script)]


def test_hook_command_gets_the_event_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    argv = _hook_script(tmp_path, f"""
env = {{k: v for k, v in os.environ.items() if k.startswith(("GLOBALD_", "NOTIFY_", "WATCHDOG_"))}}
open({str(out)!r}, "a").write(json.dumps(env) + "\\n")
""")
    os.environ["NOTIFY_SOCKET"] = "/should/not/leak"
    try:
        runner = HookRunner(HooksConfig(on_state_change=tuple(argv), timeout_ms=10_000))
        runner.start()
        runner.on_state(State.RESTORING, State.CREATED, "starting")
        runner.on_table_state("customers", State.RUNNING, State.RESTORING, "restored to the log end")
        runner.close(timeout=30)
    finally:
        del os.environ["NOTIFY_SOCKET"]
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert events == [
        {"GLOBALD_STATE": "RESTORING", "GLOBALD_PREVIOUS_STATE": "CREATED", "GLOBALD_TABLE": "",
         "GLOBALD_REASON": "starting", "GLOBALD_PID": str(os.getpid())},
        {"GLOBALD_STATE": "RUNNING", "GLOBALD_PREVIOUS_STATE": "RESTORING", "GLOBALD_TABLE": "customers",
         "GLOBALD_REASON": "restored to the log end", "GLOBALD_PID": str(os.getpid())},
    ]
    assert not runner.failures


def test_hook_failures_and_timeouts_are_counted_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    slow = HookRunner(HooksConfig(on_state_change=tuple(_hook_script(tmp_path, "time.sleep(30)")), timeout_ms=300))
    failing = HookRunner(HooksConfig(on_state_change=tuple(_hook_script(tmp_path, "print('boom'); sys.exit(3)"))))
    missing = HookRunner(HooksConfig(on_state_change=(str(tmp_path / "no-such-program"),)))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        for runner in (slow, failing, missing):
            runner.start()
            runner.on_state(State.RESTORING, State.CREATED, "starting")
            runner.close(timeout=20)
    assert time.monotonic() - started < 15  # the 30 s hook was killed at its timeout
    assert slow.failures["command"] == failing.failures["command"] == missing.failures["command"] == 1
    assert "timed out" in caplog.text and "exited with 3: boom" in caplog.text and "could not start" in caplog.text


class _Collector(BaseHTTPRequestHandler):
    bodies: list[dict] = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append({"json": json.loads(body), "type": self.headers["Content-Type"]})
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_webhook_posts_json_and_counts_http_errors() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        runner = HookRunner(HooksConfig(webhook_url=url, timeout_ms=5000))
        runner.start()
        runner.on_table_state("customers", State.RESTORING, State.RUNNING, "invalid offset, rebuilding")
        runner.close(timeout=10)
        assert not runner.failures
        (got,) = _Collector.bodies
        assert got["type"] == "application/json"
        assert {k: got["json"][k] for k in ("state", "previous_state", "table", "reason", "pid")} == {
            "state": "RESTORING", "previous_state": "RUNNING", "table": "customers",
            "reason": "invalid offset, rebuilding", "pid": os.getpid()}
        _Collector.status = 302  # a redirect is refused: the event goes to the configured URL only
        runner = HookRunner(HooksConfig(webhook_url=url, timeout_ms=5000))
        runner.start()
        runner.on_state(State.RUNNING, State.RESTORING, "every table restored")
        runner.close(timeout=10)
        assert runner.failures["webhook"] == 1
    finally:
        server.shutdown()
        server.server_close()


SECRET = 'pa"ss\\word-Zq9'


@pytest.mark.parametrize("formatter", [PlainFormatter(Redactor([SECRET])), JsonFormatter(Redactor([SECRET]))])
def test_log_lines_mask_secrets_in_messages_and_tracebacks(formatter: logging.Formatter) -> None:
    try:
        raise RuntimeError(f"connect failed with password {SECRET}")
    except RuntimeError:
        record = logging.LogRecord("t", logging.ERROR, "", 0, "props %s", ({"sasl.password": SECRET},),
                                   sys.exc_info())
    line = formatter.format(record)
    assert "***" in line and SECRET not in line and json.dumps(SECRET)[1:-1] not in line
    assert "Zq9" not in line


class Tables:
    """What the inbox asks of the engine: which tables it has now."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def table_view(self, table: str) -> object | None:
        return object() if table in self.names else None


def test_request_inbox_claims_each_request_once(tmp_path: Path) -> None:
    queue = RebuildRequests()
    resets: list[tuple[str, str]] = []
    inbox = operator_requests.RequestInbox(tmp_path, Tables("customers"), queue.put)
    inbox.open()
    assert (tmp_path / "requests").stat().st_mode & 0o777 == 0o700
    answers: list[dict] = []
    asker = threading.Thread(
        target=lambda: answers.append(operator_requests.ask_daemon(tmp_path, RESET, 10, table="customers")))
    asker.start()
    deadline = time.monotonic() + 10
    while not answers and time.monotonic() < deadline:
        inbox.poll()
        for request in queue.take():  # the loop's part: wipe, then settle
            resets.append((request.table, request.detail))
            request.settle(None)
        time.sleep(0.05)
    asker.join(10)
    assert resets and resets[0][0] == "customers" and f"pid {os.getpid()}" in resets[0][1]
    assert answers == [{"ok": True, "table": "customers", "pid": os.getpid()}]
    assert list((tmp_path / "requests").iterdir()) == []
    # A table the daemon does not know is refused; a request nobody takes is cancelled, not left behind.
    t = threading.Thread(target=lambda: answers.append(operator_requests.ask_daemon(tmp_path, RESET, 10, table="nope")))
    t.start()
    deadline = time.monotonic() + 10
    while len(answers) < 2 and time.monotonic() < deadline:
        inbox.poll()
        time.sleep(0.05)
    t.join(10)
    assert answers[1]["ok"] is False and "nope" in answers[1]["error"]
    with pytest.raises(Exception, match="request cancelled, nothing was wiped"):
        operator_requests.ask_daemon(tmp_path, RESET, timeout=0.3, table="customers")
    assert list((tmp_path / "requests").iterdir()) == [] and len(resets) == 1


def ask(tmp_path: Path, inbox: operator_requests.RequestInbox, action: str = RESET, token: str = "abc123",
        **fields: object) -> Path:
    """Queue a request as the CLI does (a reset of customers unless told) and let the inbox take it; returns where
    its answer will appear."""
    doc = {"action": action, **(fields or {"table": "customers"})}
    (tmp_path / "requests" / f"{action}-{token}.json").write_text(json.dumps(doc))
    inbox._next = 0.0  # the request directory is read at most every CHECK_INTERVAL
    inbox.poll()
    return tmp_path / "requests" / f"{token}.done"


def inbox_on(tmp_path: Path) -> tuple[RebuildRequests, operator_requests.RequestInbox]:
    queue = RebuildRequests()
    inbox = operator_requests.RequestInbox(tmp_path, Tables("customers"), queue.put)
    inbox.open()
    return queue, inbox


def test_a_reset_is_answered_once_the_wipe_ran_or_with_its_error(tmp_path: Path) -> None:
    """Issue 21, item 5: the answer waits for the loop's wipe; it used to be ok as soon as the request was queued."""
    queue, inbox = inbox_on(tmp_path)
    done = ask(tmp_path, inbox)
    (request,) = queue.take()
    for _ in range(3):  # queued, not yet wiped: no answer, however often the inbox looks
        inbox.poll()
    assert not done.exists()
    request.settle("StoreIOError: IO error: No space left on device")
    inbox.poll()
    answer = json.loads(done.read_text())
    assert answer["ok"] is False and "No space left on device" in answer["error"] and answer["table"] == "customers"
    done.unlink()
    done = ask(tmp_path, inbox)
    (request,) = queue.take()
    request.settle(None)
    inbox.poll()
    assert json.loads(done.read_text()) == {"ok": True, "table": "customers", "pid": os.getpid()}


def test_a_reset_the_loop_never_ran_is_answered_when_the_daemon_stops(tmp_path: Path) -> None:
    _, inbox = inbox_on(tmp_path)
    done = ask(tmp_path, inbox)
    inbox.close()
    answer = json.loads(done.read_text())
    assert answer["ok"] is False and "nothing was wiped" in answer["error"]


def test_exports_and_reloads_are_answered_through_the_one_request_base(tmp_path: Path) -> None:
    """Issue 43, item 7: the inbox answers every action from its request's ``reply()`` and ``stopped``."""
    _, inbox = inbox_on(tmp_path)
    handed: list[OperatorRequest] = []
    inbox.export = lambda table, detail: handed.append(ExportRequest(table, detail)) or handed[-1]
    inbox.reload = lambda doc: handed.append(ReloadRequest(Path(doc["config"]), "test")) or handed[-1]
    exported = ask(tmp_path, inbox, EXPORT, "ex1")
    reloaded = ask(tmp_path, inbox, RELOAD, "re1", config="/etc/globald.toml")
    never = ask(tmp_path, inbox, RELOAD, "re2", config="/etc/globald.toml")
    assert [r.action for r in handed] == [EXPORT, RELOAD, RELOAD] and handed[0].table == "customers"
    handed[0].settle(None, export="0001", uploaded_bytes=3)
    handed[1].settle("a bad key", generation=1, sha256="ab")
    inbox.poll()
    assert json.loads(exported.read_text()) == {"export": "0001", "uploaded_bytes": 3, "ok": True,
                                                "table": "customers", "pid": os.getpid()}
    assert json.loads(reloaded.read_text()) == {"generation": 1, "sha256": "ab", "ok": False, "table": "",
                                                "error": "a bad key", "pid": os.getpid()}
    inbox.close()
    assert json.loads(never.read_text())["error"] == ReloadRequest.stopped


def test_write_stall_counters_reach_metrics() -> None:
    sample = Sample(doc=DaemonStatus(state=State.RUNNING, pid=1, tables={}),
                    write_stalls=Stalls(waited=3, remade=2, seconds=1.5))
    text = Metrics(lambda: sample, lambda: (0.0, 0.0)).render().decode()
    assert "globald_write_stalls_total 3.0" in text
    assert "globald_write_stall_seconds_total 1.5" in text
    assert "globald_writes_remade_total 2.0" in text


def test_replaced_consumers_and_build_workers_reach_metrics() -> None:
    sample = Sample(doc=DaemonStatus(state=State.RUNNING, pid=1, tables={}), consumer_renewals=2,
                    build_workers_replaced=3)
    text = Metrics(lambda: sample, lambda: (0.0, 0.0)).render().decode()
    assert "globald_consumer_renewals_total 2.0" in text
    assert "globald_exact_build_workers_replaced_total 3.0" in text
