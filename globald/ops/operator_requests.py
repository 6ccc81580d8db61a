"""Operator requests to a running daemon, as JSON files in ``<state_dir>/requests/`` (mode 0700).

Only a user who may write the state_dir can ask, which is exactly who may wipe it offline. A request is
``<action>-<token>.json`` (a reset, an export or a reload: ``common.requests``); the daemon claims it by renaming it
(so a request is either cancelled or taken, never both), hands an ``OperatorRequest`` to the part that acts on it
(a wipe to its loop), and answers in ``<token>.done`` with the request's ``reply()`` once that part settled it:
``ok``, else why not. Files are JSON and size-capped; nothing read here is ever executed or unpickled.

The mechanism (claim by rename, size-capped JSON, answer file, cancellation) is ``status.file_requests``, shared with
the exact snapshot requests of Spark readers (``snapshot.exact_requests``); what is this protocol's own is its
folder (one per state_dir: a request names its table), the action in the file's name, the ``<token>.done`` answer
and that an answer may wait for the loop (a wipe runs at the start of the loop's next turn).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from globald.common.errors import GlobaldError
from globald.common.requests import ACTIONS, EXPORT, RELOAD, RESET, OperatorRequest
from globald.common.waits import pause
from globald.engine.view import EngineView
from globald.status import file_requests
from globald.store.names import REQUESTS_DIR

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4096
MAX_ANSWER_BYTES = 1 << 20  # an answer carries a wipe's error or an export's figures: still small
CHECK_INTERVAL = 0.25


def requests_dir(state_dir: Path) -> Path:
    return state_dir / REQUESTS_DIR


class RequestInbox:
    """The daemon's side. ``poll`` runs on the loop thread (an after_poll hook) and is cheap when idle."""

    def __init__(self, state_dir: Path, engine: EngineView, reset: Callable[[str, str], OperatorRequest]) -> None:
        """``engine``: the tables a request may name are those it has now (a reload adds and drops them)."""
        self.dir = requests_dir(state_dir)
        self.engine = engine
        self.reset = reset
        self._next = 0.0
        # (token, request) of requests handed on, not yet answered
        self._waiting: list[tuple[str, OperatorRequest]] = []
        self.export: Callable[[str, str], OperatorRequest] | None = None  # set by the daemon when [export] is set
        self.reload: Callable[[dict[str, Any]], OperatorRequest] | None = None  # set by the daemon (service.reload)

    def open(self) -> None:
        self.dir.mkdir(mode=0o700, exist_ok=True)

    def poll(self) -> None:
        self._answer_settled()  # at every turn: the loop runs a wipe at the start of the turn after its request
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + CHECK_INTERVAL
        for name in file_requests.pending(self.dir, tuple(f"{k}-" for k in ACTIONS)):
            self._handle(name)

    def _handle(self, name: str) -> None:
        action = next(k for k in ACTIONS if name.startswith(f"{k}-"))
        token = name[len(action) + 1:-len(".json")]
        taken = file_requests.claim(self.dir, name)  # from here the client can no longer cancel
        if taken is None:
            return
        try:
            answer = self._act(taken, action)
        except Exception as e:  # a request that cannot be read or handed on is answered; the loop carries on
            log.exception("%s request %s failed", action, token)
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        finally:
            taken.unlink(missing_ok=True)
        if isinstance(answer, dict):
            self._reply(token, answer)
        else:
            self._waiting.append((token, answer))

    def _answer_settled(self) -> None:
        """Answer each request the part it was handed to has settled."""
        settled = [(token, r) for token, r in self._waiting if r.settled]
        self._waiting = [item for item in self._waiting if item not in settled]
        for token, r in settled:
            self._reply(token, {**r.reply(), "pid": os.getpid()})

    def close(self) -> None:
        """After the loop has ended: answer resets it never ran, so no asker waits out its timeout."""
        with contextlib.suppress(OSError):  # a failing disk: the asker times out, saying to check the log
            self._answer_settled()
        for token, r in self._waiting:
            with contextlib.suppress(OSError):
                self._reply(token, {"ok": False, "table": r.table, "pid": os.getpid(), "error": r.stopped})
        self._waiting = []

    def _reply(self, token: str, answer: dict[str, Any]) -> None:
        if token.isalnum():
            # Not durable: the asker waits on this machine and does not outlive a power loss; the wipe itself is.
            file_requests.post(self.dir / f"{token}.done", answer)

    def _act(self, path: Path, action: str) -> dict[str, Any] | OperatorRequest:
        try:
            doc = file_requests.read(path, MAX_REQUEST_BYTES)
        except ValueError as e:
            return {"ok": False, "error": str(e)}
        if action == RELOAD:
            if self.reload is None:
                return {"ok": False, "error": "this daemon does not take reload requests"}
            return self.reload(doc)
        table = doc.get("table")
        if not isinstance(table, str) or self.engine.table_view(table) is None:
            return {"ok": False, "error": f"no table named {table!r} in the daemon's config"}
        if action == EXPORT:
            if self.export is None:
                return {"ok": False, "error": "the daemon has no [export] section in its config"}
            return self.export(table, "requested by globald export")
        who = doc.get("requested_by")
        detail = f"requested by globald reset (uid {who.get('uid')}, pid {who.get('pid')})" \
            if isinstance(who, dict) else "requested by globald reset"
        log.warning("table %s: reset %s", table, detail)
        return self.reset(table, detail)


def ask_daemon(state_dir: Path, action: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
    """The client's side: queue an ``action`` (``common.requests``) for the daemon owning ``state_dir``, with
    ``fields`` in its request (a reset's or an export's ``table``, a reload's ``config``); wait for its answer."""
    d = requests_dir(state_dir)
    if not d.is_dir():
        raise GlobaldError(f"the daemon owning {state_dir} does not accept requests (no {REQUESTS_DIR}/ directory); "
                           "is it an older globald?")
    token = secrets.token_hex(8)
    request = d / f"{action}-{token}.json"
    done = d / f"{token}.done"
    doc = {"action": action, "requested": time.time(), "requested_by": {"uid": os.getuid(), "pid": os.getpid()},
           **fields}
    # Not durable: a request lost in a power loss was never answered, and its asker is gone with the machine.
    file_requests.post(request, doc)
    deadline = time.monotonic() + timeout
    taken = False
    while True:
        try:
            answer = file_requests.collect(done, MAX_ANSWER_BYTES)
        except ValueError:
            return {"ok": False, "error": "malformed answer"}
        if answer is not None:
            return answer
        if time.monotonic() > deadline:
            if taken:
                raise GlobaldError(f"the daemon took the {action} request but did not answer; check its log")
            if not file_requests.withdraw(request):  # taken meanwhile: the answer is on its way
                taken, deadline = True, time.monotonic() + timeout
                continue
            raise GlobaldError(f"the daemon did not take the {action} request within {timeout:.0f}s; request "
                               f"cancelled, nothing was {'wiped' if action == RESET else 'done'}")
        pause(0.05)


def sweep(state_dir: Path, older_than: float = 3600.0) -> None:
    """At daemon start: drop claims of a daemon that died while acting, and answers nobody collected."""
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(requests_dir(state_dir)):
            stale = e.name.endswith((file_requests.CLAIM_SUFFIX, ".tmp")) or (
                e.name.endswith(".done") and time.time() - e.stat().st_mtime > older_than)
            if stale:
                Path(e.path).unlink(missing_ok=True)
