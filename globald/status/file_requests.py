"""The one mechanism of the file-based requests a local process makes to its daemon: an exact snapshot
(``snapshot.exact_requests``, from a Spark reader) and an operator request (``ops.operator_requests``: ``globald
reset``, ``globald export``).

Contract, for both sides:

- **ask** (client): the request is one JSON file, written under a temporary name and renamed into the request
  folder (``post``), so the daemon never reads half a request;
- **claim** (daemon): the daemon takes a request by renaming it to ``.<name>.taken`` (``claim``); from then on the
  client can no longer withdraw it, and a request is either withdrawn or taken, never both. Dot-names are never
  requests (being written, or claimed), so a claim is never taken twice;
- **read** (daemon): a request is size-capped JSON, one object (``read``); nothing read is executed or unpickled;
- **answer** (daemon): one JSON file per request, written like a request (``post``), and collected, then
  deleted, by the client (``collect``);
- **cancel** (client): a client that gives up deletes its request (``withdraw``); when the file is gone, the
  daemon took it and its answer is on its way (or swept once nobody collects it).

Requests and answers are not durable, on purpose: the client waiting for them runs on this machine and does not
outlive a power loss. Each protocol keeps its own folder, file names, fields and size cap, which readers and
command lines of other globald versions on the same host rely on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from globald.store import durable

REQUEST_SUFFIX = ".json"
CLAIM_SUFFIX = ".taken"


def post(path: Path, doc: dict[str, Any]) -> None:
    """Write a request or an answer: atomically, not durably (the module docstring says why)."""
    durable.replace_file(path, json.dumps(doc, sort_keys=True), durable=False)


def pending(folder: Path, prefixes: tuple[str, ...] = ("",)) -> list[str]:
    """The requests waiting in ``folder`` whose name starts with one of ``prefixes``, in name order."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    return sorted(e.name for e in entries if not e.name.startswith(".") and e.name.endswith(REQUEST_SUFFIX)
                  and e.name.startswith(prefixes))


def claim(folder: Path, name: str) -> Path | None:
    """Take request ``name`` for this daemon; where it now is, or None when it was withdrawn (or claimed)."""
    taken = folder / f".{name}{CLAIM_SUFFIX}"
    try:
        durable.claim(folder / name, taken)
    except FileNotFoundError:
        return None
    return taken


def read(path: Path, max_bytes: int) -> dict[str, Any]:
    """The JSON object in ``path``, at most ``max_bytes``; ValueError (or OSError) saying what is wrong."""
    with open(path, "rb") as f:
        return _parse(f.read(max_bytes + 1), max_bytes)


def _parse(raw: bytes, max_bytes: int) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise ValueError(f"request too large (over {max_bytes} bytes)")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise ValueError("request is not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("request is not a JSON object")
    return doc


def collect(path: Path, max_bytes: int) -> dict[str, Any] | None:
    """The client's side: the answer in ``path``, deleted once read; None while there is none. An unreadable
    answer is deleted too, and raises ValueError (or OSError)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError:
        path.unlink(missing_ok=True)
        raise
    path.unlink(missing_ok=True)  # only once read: an answer written after a miss is collected next time
    return _parse(raw, max_bytes)


def withdraw(path: Path) -> bool:
    """The client's cancel: True when the request was withdrawn, False when the daemon had taken it."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
