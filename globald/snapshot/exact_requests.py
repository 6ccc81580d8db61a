"""Exact-offset snapshot requests between a reader process and its local daemon, as JSON files.

A reader drops ``requests/<id>.json`` (written under a dot-name, then renamed) and polls for
``responses/<id>.json``. The daemon answers every request it takes exactly once: a snapshot id, or a refusal with a
code saying why. A reader never waits past its own timeout, and learns at once when no daemon owns the state_dir.

The mechanism (claim by rename, size-capped JSON, answer file, cancellation) is ``status.file_requests``, shared with
the operator's requests (``ops.operator_requests``); what is this protocol's own is its folders (per table, under
the table's snapshot directory, where the readers already look), its fields and codes, and that uncollected
answers are swept after ``RESPONSE_TTL_S``.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from globald.common.waits import pause
from globald.snapshot.manifest import MAX_JSON_BYTES, Offsets, offsets_from_json, offsets_to_json, valid_id
from globald.status import file_requests, statusfile
from globald.store.names import SNAPSHOT_REQUESTS_DIR, SNAPSHOT_RESPONSES_DIR, snapshots_dir

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_LEASE_S = 60.0  # the daemon pins what it answers this long: until the reader holds its own lease
RESPONSE_TTL_S = 600.0  # unclaimed responses are swept after this


class Code(StrEnum):
    READY = "ready"
    BEYOND_END = "beyond_end"  # an offset is past the partition's end
    BELOW_LOG_START = "below_log_start"  # records needed were deleted by retention
    COMPACTED = "compacted"  # records needed were removed by compaction
    REBUILDING = "rebuilding"  # the table is not RUNNING (wiped and rebuilding, or restoring)
    INVALID = "invalid"  # the request itself is malformed or names other partitions
    TIMEOUT = "timeout"  # no answer in time (client side), or the build took too long (daemon side)
    STOPPING = "stopping"  # the daemon is shutting down
    NO_DAEMON = "no_daemon"  # no live daemon owns the state_dir
    NO_ROOM = "no_room"  # the state_dir lacks room for the build, after globald freed what it may (message: bytes)
    FAILED = "failed"  # an unexpected error; the daemon log has the details


@dataclass(frozen=True)
class Request:
    id: str
    table: str
    offsets: Offsets
    lease_s: float = DEFAULT_LEASE_S

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "table": self.table, "offsets": offsets_to_json(self.offsets),
                "lease_s": self.lease_s, "created": time.time()}

    @classmethod
    def from_json(cls, doc: dict[str, Any], request_id: str, table: str) -> Request:
        """Raises ValueError naming what is wrong."""
        if doc.get("id") != request_id or doc.get("table") != table:
            raise ValueError("id/table do not match the request's file and directory")
        lease = doc.get("lease_s", DEFAULT_LEASE_S)
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not 0 <= lease <= 86_400:
            raise ValueError("lease_s must be a number of seconds in [0, 86400]")
        offsets = offsets_from_json(doc.get("offsets"))
        if not offsets:
            raise ValueError("offsets must name at least one partition")
        return cls(request_id, table, offsets, float(lease))


@dataclass(frozen=True)
class Response:
    request: str
    code: Code
    message: str = ""
    snapshot: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == Code.READY

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request, "code": self.code.value, "message": self.message, "snapshot": self.snapshot}

    @classmethod
    def from_json(cls, doc: dict[str, Any], request_id: str) -> Response:
        raw_code = doc.get("code")
        if not isinstance(raw_code, str):
            raise ValueError(f"response code {raw_code!r} is not a string")
        code = Code(raw_code)  # ValueError for a code this version does not know
        snapshot = doc.get("snapshot")
        if doc.get("request") != request_id or (code == Code.READY and not valid_id(snapshot)):
            raise ValueError("response does not answer this request with a snapshot id")
        return cls(request_id, code, str(doc.get("message", ""))[:2000], snapshot if valid_id(snapshot) else None)


def _dirs(state_dir: Path, table: str) -> tuple[Path, Path]:
    base = snapshots_dir(state_dir, table)
    return base / SNAPSHOT_REQUESTS_DIR, base / SNAPSHOT_RESPONSES_DIR


# -- reader side ---------------------------------------------------------------------------------------------


def submit(state_dir: Path, table: str, offsets: Offsets, lease_s: float = DEFAULT_LEASE_S) -> Request:
    req = Request(f"r{uuid.uuid4().hex}", table, dict(offsets), lease_s)
    requests_dir, _ = _dirs(state_dir, table)
    requests_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Not durable: the reader waiting for the answer does not outlive a power loss of this machine.
    file_requests.post(requests_dir / f"{req.id}.json", req.to_json())
    return req


def wait(state_dir: Path, req: Request, timeout: float, poll_s: float = 0.01) -> Response:
    """The daemon's answer to ``req``, or a TIMEOUT/NO_DAEMON response; never waits past ``timeout``."""
    requests_dir, responses_dir = _dirs(state_dir, req.table)
    path = responses_dir / f"{req.id}.json"
    deadline = time.monotonic() + timeout
    next_alive_check = 0.0
    while True:
        try:
            doc = file_requests.collect(path, MAX_JSON_BYTES)
            if doc is not None:
                return Response.from_json(doc, req.id)
        except (OSError, ValueError) as e:
            return Response(req.id, Code.FAILED, f"unreadable response: {e}")
        now = time.monotonic()
        if now >= next_alive_check:
            next_alive_check = now + 0.5
            if statusfile.read_live(state_dir) is None:
                _withdraw(requests_dir, req)
                return Response(req.id, Code.NO_DAEMON, f"no running globald owns {state_dir}")
        if now >= deadline:
            _withdraw(requests_dir, req)
            return Response(req.id, Code.TIMEOUT, f"no answer from the daemon within {timeout:.1f}s")
        pause(min(poll_s, max(0.0, deadline - now)))


def _withdraw(requests_dir: Path, req: Request) -> None:
    file_requests.withdraw(requests_dir / f"{req.id}.json")  # taken already: answered, then swept uncollected


def request(state_dir: Path, table: str, offsets: Offsets, timeout: float,
            lease_s: float = DEFAULT_LEASE_S) -> Response:
    """Ask the local daemon for a snapshot of ``table`` at exactly ``offsets`` and wait for its answer."""
    if statusfile.read_live(state_dir) is None:
        return Response("-", Code.NO_DAEMON, f"no running globald owns {state_dir}")
    return wait(state_dir, submit(state_dir, table, offsets, lease_s), timeout)


# -- daemon side ---------------------------------------------------------------------------------------------


def take_pending(state_dir: Path, table: str) -> list[Request | Response]:
    """Every request waiting for ``table``, removed from the queue: parsed, or an INVALID response to send."""
    requests_dir, _ = _dirs(state_dir, table)
    out: list[Request | Response] = []
    for name in file_requests.pending(requests_dir):
        request_id = name[: -len(file_requests.REQUEST_SUFFIX)]
        if not REQUEST_ID_RE.match(request_id):  # no answer file can be named after it
            (requests_dir / name).unlink(missing_ok=True)
            continue
        taken = file_requests.claim(requests_dir, name)
        if taken is None:  # withdrawn by its reader meanwhile
            continue
        try:
            out.append(Request.from_json(file_requests.read(taken, MAX_JSON_BYTES), request_id, table))
        except (OSError, ValueError) as err:
            out.append(Response(request_id, Code.INVALID, f"unreadable request: {err}"))
        taken.unlink(missing_ok=True)
    return out


def respond(state_dir: Path, table: str, resp: Response) -> None:
    _, responses_dir = _dirs(state_dir, table)
    responses_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Not durable: the reader waiting for it does not outlive a power loss; the snapshot it names is durable.
    file_requests.post(responses_dir / f"{resp.request}.json", resp.to_json())


def sweep_responses(state_dir: Path, table: str, now: float) -> None:
    """Delete responses nobody collected (their reader timed out or died)."""
    for folder in _dirs(state_dir, table):
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for e in entries:
            try:
                if now - e.stat().st_mtime > RESPONSE_TTL_S:
                    os.unlink(e.path)
            except OSError:
                continue
