"""State-change hooks: the ``[hooks] on_state_change`` command and the optional JSON webhook, off the loop thread.

The loop only enqueues events; one worker thread delivers them in order, each command and each POST bounded by
``timeout_ms``. A failure (exit status, timeout, missing program, HTTP error, full queue) is logged and counted
and never reaches the daemon. The webhook goes to the configured URL only: no proxies, no redirects.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from globald import __version__
from globald.common.states import State
from globald.ops.sdnotify import ENV_VARS
from globald.settings.config import HooksConfig

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000
OUTPUT_LIMIT = 2000


@dataclass(frozen=True)
class StateEvent:
    state: str
    previous_state: str
    table: str | None  # None for the daemon as a whole
    reason: str
    time: float
    pid: int

    def environment(self) -> dict[str, str]:
        return {
            "GLOBALD_STATE": self.state,
            "GLOBALD_PREVIOUS_STATE": self.previous_state,
            "GLOBALD_TABLE": self.table or "",
            "GLOBALD_REASON": self.reason,
            "GLOBALD_PID": str(self.pid),
        }

    def json(self) -> bytes:
        return json.dumps({**asdict(self), "host": socket.gethostname()}, sort_keys=True).encode()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the 3xx then surfaces as an HTTPError: the event goes nowhere but the configured URL


class HookRunner:
    def __init__(self, config: HooksConfig) -> None:
        self.config = config
        self.timeout = config.timeout_ms / 1000
        self.failures: Counter[str] = Counter()
        self.delivered = 0
        self._queue: queue.Queue[StateEvent | None] = queue.Queue(QUEUE_SIZE)
        self._worker: threading.Thread | None = None
        self._running: subprocess.Popen[bytes] | None = None  # the hook command in progress (the worker's)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())

    @property
    def enabled(self) -> bool:
        return bool(self.config.on_state_change or self.config.webhook_url)

    def describe(self) -> str:
        parts = []
        if self.config.on_state_change:
            parts.append(f"command {os.path.basename(self.config.on_state_change[0])}")
        if self.config.webhook_url:
            # The host only, never the URL: it may carry a token.
            parts.append(f"webhook to {urlsplit(self.config.webhook_url).hostname}")
        return ", ".join(parts) or "none"

    # -- listeners (loop thread) ----------------------------------------------------------------------------

    def on_state(self, new: State, old: State, reason: str) -> None:
        self._enqueue(StateEvent(new.value, old.value, None, reason, time.time(), os.getpid()))

    def on_table_state(self, table: str, new: State, old: State, reason: str) -> None:
        self._enqueue(StateEvent(new.value, old.value, table, reason, time.time(), os.getpid()))

    def _enqueue(self, event: StateEvent) -> None:
        if not self.enabled:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.failures["queue_full"] += 1
            log.warning("hook queue full (%d events pending); dropped %s -> %s", QUEUE_SIZE, event.previous_state,
                        event.state)

    # -- worker ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.enabled and self._worker is None:
            self._worker = threading.Thread(target=self._run, name="globald-hooks", daemon=True)
            self._worker.start()

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued, then stop the worker. ``timeout``: what the caller waits for that, at most (a
        daemon's stop: what is left of its shared bound; a reload's old runner: two hooks' timeouts). A command or
        POST still running then is left to the worker, a daemon thread the process's end does not wait for, and a
        command's process group is killed: a hook is the user's code, and a stop is over within a second whatever
        it does (issue 40)."""
        if self._worker is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=1 if timeout is None else 0)
        self._worker.join(timeout if timeout is not None else self.timeout * 2 + 1)
        if self._worker.is_alive():
            running = self._running
            if running is not None:  # killed as at its timeout: no hook command outlives the daemon
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(running.pid, signal.SIGKILL)
            log.warning("state hooks: a hook still running at the stop's bound is not waited for (a command is "
                        "killed), nor are the events queued after it delivered")
        self._worker = None

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            if self.config.on_state_change:
                self._command(event)
            if self.config.webhook_url:
                self._post(event)
            self.delivered += 1

    def _command(self, event: StateEvent) -> None:
        argv = list(self.config.on_state_change)
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}  # hooks must not talk to systemd as us
        env.update(event.environment())
        try:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        except OSError as e:
            self.failures["command"] += 1
            log.warning("state hook %s could not start: %s", argv[0], e.strerror or e)
            return
        self._running = proc
        try:
            out, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: a shell script's children too
            out, _ = proc.communicate()
            self.failures["command"] += 1
            log.warning("state hook %s timed out after %.1fs and was killed", argv[0], self.timeout)
            return
        finally:
            self._running = None
        if proc.returncode != 0:
            self.failures["command"] += 1
            tail = out[-OUTPUT_LIMIT:].decode("utf-8", "replace").strip()
            log.warning("state hook %s exited with %d%s", argv[0], proc.returncode, f": {tail}" if tail else "")

    def _post(self, event: StateEvent) -> None:
        url = self.config.webhook_url
        assert url is not None
        req = urllib.request.Request(url, data=event.json(), method="POST", headers={
            "Content-Type": "application/json", "User-Agent": f"globald/{__version__}"})
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                resp.read(OUTPUT_LIMIT)
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.failures["webhook"] += 1
            detail = f"HTTP {e.code}" if isinstance(e, urllib.error.HTTPError) else str(getattr(e, "reason", e))
            log.warning("state webhook to %s failed: %s", urlsplit(url).hostname, detail)
