"""The local HTTP endpoint: GET /metrics, /healthz, /readyz, /status, on 127.0.0.1 unless configured otherwise.

It is read-only: nothing a request sends can change the daemon (a table reset goes through the state_dir,
whose permissions say who may ask). Handlers read the loop's last ``Sample`` and never block the loop.
It has no authentication, so the config refuses a non-loopback host unless ``[http] allow_non_loopback`` says so.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from globald.common import swallowed
from globald.common.errors import ConfigError
from globald.ops.health import Liveness
from globald.settings.config import HttpConfig, is_loopback
from globald.status.document import DaemonStatus

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often the serve loop looks for a stop: a stop waits this long at most for it


class Endpoints:
    """What the handlers need from the daemon, as callables so this module knows nothing of the engine."""

    def __init__(self, metrics: Callable[[], bytes], status: Callable[[], DaemonStatus | None],
                 liveness: Callable[[], Liveness]) -> None:
        self.metrics = metrics
        self.status = status
        self.liveness = liveness


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "globald"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        ep = self.server.endpoints
        try:
            if path == "/metrics":
                self._send(200, ep.metrics(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                live = ep.liveness()
                self._json(200 if live.healthy else 503, {"healthy": live.healthy, "detail": live.detail,
                                                          "loop_age_seconds": live.loop_age_seconds,
                                                          "progress_age_seconds": live.progress_age_seconds})
            elif path == "/readyz":
                doc = ep.status()
                ready = bool(doc is not None and doc.ready)
                self._json(200 if ready else 503, {"ready": ready,
                                                   "detail": (doc.ready_detail if doc else None) or "starting",
                                                   "state": doc.state.value if doc else "CREATED"})
            elif path == "/status":
                status = ep.status()
                self._json(200 if status is not None else 503,
                           status.to_json() if status is not None else {"state": "CREATED"})
            else:
                self._json(404, {"error": f"no such endpoint {path}; try /metrics /healthz /readyz /status"})
        except Exception as e:
            swallowed.record("http", e, log, "http %s failed", path)
            self._json(500, {"error": "internal error; see the daemon log"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def _refuse(self) -> None:
        self._json(405, {"error": "read-only endpoint: only GET"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _json(self, code: int, doc: dict[str, Any]) -> None:
        self._send(code, json.dumps(doc, sort_keys=True).encode() + b"\n", "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s " + format, self.client_address[0], *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


def _bound(server: _Server) -> tuple[str, int]:
    host, port = server.server_address[:2]
    return str(host), int(port)


class HttpServer:
    def __init__(self, config: HttpConfig, endpoints: Endpoints) -> None:
        self.config = config
        self.endpoints = endpoints
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound (host, port); the port is the real one when the config asked for port 0."""
        return None if self._server is None else _bound(self._server)

    def bind(self) -> None:
        """Take the address (a config check: raises ConfigError naming http.port when it cannot be bound), without
        serving yet: the daemon binds before it writes anything to its state_dir (``ops.runtime.listening``)."""
        if self._server is not None:
            return
        try:
            self._server = _Server((self.config.host, self.config.port), self.endpoints)
        except OSError as e:
            raise ConfigError("http.port", f"cannot listen on {self.config.host}:{self.config.port}: "
                                           f"{e.strerror or e} (choose another port, or set [http] enabled = false)"
                              ) from None

    def start(self) -> None:
        """Serve, binding first unless ``bind`` did (once: a second call is a no-op)."""
        if self._thread is not None:
            return
        self.bind()
        assert self._server is not None
        server = self._server
        # A stop (shutdown()) waits for the serve loop to see it, up to one poll_interval.
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S},
                                        name="globald-http", daemon=True)
        self._thread.start()

    def announce(self) -> None:
        """Say where it serves, once the daemon has started (a start refused sooner says only why: one line)."""
        assert self._server is not None
        log.info("http endpoint on http://%s:%d (/metrics /healthz /readyz /status)", *_bound(self._server))
        if not is_loopback(self.config.host):
            log.warning("http endpoint on %s is reachable from other hosts and unauthenticated: anyone who can "
                        "connect reads /metrics and /status (table and topic names, offsets, errors); "
                        "[http] allow_non_loopback = true", self.config.host)

    def stop(self, wait_s: float = 5.0) -> None:
        """Stop serving: waits one poll for the serve loop, and ``wait_s`` at most for its thread to end."""
        if self._server is None:
            return
        if self._thread is not None:  # shutdown() waits for serve_forever: never called when bound only
            self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(wait_s)
        self._server = self._thread = None
