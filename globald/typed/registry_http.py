"""The Schema Registry's HTTP side, for ``globald.typed.registry``: one ``SchemaRegistryClient`` per process and
settings, what its failures mean in one line, and the wait every process on the host keeps after a failure that
asks for one (a ``Retry-After``, a timeout: see ``globald.typed.registry``'s contract).

Why here: confluent-kafka's ``SchemaRegistryError`` keeps neither the answer's headers nor whether the request
timed out, so the client's HTTP session gets a response hook (``_note_answer``) that keeps the ``Retry-After`` of
the last 429 or 503 this thread got.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from globald.settings.typed_spec import SchemaError

log = logging.getLogger(__name__)

MAX_WAIT_S = 900.0  # the longest Retry-After obeyed: a registry's mistake must not hold decoding for days
# Bounds of one request unless [registry] says otherwise: a decode waits for a registry that is down at most this.
CLIENT_DEFAULTS: dict[str, Any] = {"timeout": 10, "max.retries": 1, "retries.wait.ms": 200}
NOT_FOUND_SCHEMA, NOT_FOUND_SUBJECT, NOT_FOUND_VERSION = 40403, 40401, 40402

_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()
_LAST = threading.local()  # the Retry-After of the last answer this thread got, seconds (None: none given)


def describe(e: BaseException) -> str:
    """One line on what failed: unreachable, unauthorized, not found..."""
    code = getattr(e, "error_code", None)
    status = getattr(e, "http_status_code", None)
    message = getattr(e, "error_message", None) or str(e)
    if status in (401, 403):
        return f"unauthorized (HTTP {status}, error {code}): {message}"
    if code == NOT_FOUND_SUBJECT:
        return f"subject not found (error {code}): {message}"
    if code in (NOT_FOUND_SCHEMA, NOT_FOUND_VERSION):
        return f"not found (error {code}): {message}"
    if status is not None:
        return f"HTTP {status}, error {code}: {message}"
    return f"unreachable ({type(e).__name__}: {message})"


def retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (a number of seconds or an HTTP date), within MAX_WAIT_S."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return min(max(seconds, 0.0), MAX_WAIT_S)


def forget_retry_after() -> None:
    """Before a request: a Retry-After kept from an earlier answer is not this request's."""
    _LAST.retry_after = None


def _note_answer(response: Any) -> None:
    """httpx response hook: what the client's SchemaRegistryError does not keep, the Retry-After of a 429 or 503."""
    status = getattr(response, "status_code", None)
    _LAST.retry_after = retry_after(response.headers.get("Retry-After")) if status in (429, 503) else None


def _hook(found: Any) -> None:
    """Attach ``_note_answer`` to the client's HTTP session (confluent-kafka keeps it in ``_rest_client.session``;
    a client without one keeps working, without Retry-After)."""
    session = getattr(getattr(found, "_rest_client", None), "session", None)
    hooks = getattr(session, "event_hooks", None)
    if isinstance(hooks, dict):
        hooks.setdefault("response", []).append(_note_answer)


def client(settings: dict[str, Any]) -> Any:
    """The ``SchemaRegistryClient`` of [registry] settings, one per process and settings."""
    key = json.dumps(settings, sort_keys=True, default=str)
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as e:
                raise SchemaError("registry", "needs confluent-kafka's schemaregistry extra (pip install "
                                  f"'globald[typed]'): {e}") from None
            try:
                found = _CLIENTS[key] = SchemaRegistryClient({**CLIENT_DEFAULTS, **settings})
            except (ValueError, TypeError, OSError) as e:  # unknown keys, bad TLS files: the client's own words
                raise SchemaError("registry", str(e)) from None
            _hook(found)
        return found


def forget_clients() -> None:
    """Drop the clients kept per settings, and with them the schemas each cached by id. A registry's ids never
    change meaning, so a daemon keeps its client; but a registry replaced by another at the same address (the
    tests' registries, whose ports the OS hands out again) would otherwise be answered from the first one's cache."""
    with _CLIENTS_LOCK:
        _CLIENTS.clear()


def timed_out(e: BaseException) -> bool:
    """A request the registry did not answer in time: httpx's (or httpx2's, whichever the client uses) timeouts are
    ``TimeoutException``s, Python's own ``TimeoutError``."""
    return any(c.__name__ in ("TimeoutException", "TimeoutError") for c in type(e).__mro__)


def is_not_found(e: BaseException) -> bool:
    return getattr(e, "error_code", None) in (NOT_FOUND_SCHEMA, NOT_FOUND_SUBJECT, NOT_FOUND_VERSION)


class HostWait:
    """The wait every process of the host keeps after a failure that asks for one, in one file of the registry's
    cache directory (``state_dir/registry/wait.json``): until when, and why."""

    def __init__(self, path: Path, table: str, store: Callable[[Path, str], None]) -> None:
        self.path, self.table, self._store = path, table, store

    def waiting(self) -> str | None:
        """Why no id may be asked now (a Retry-After, a timeout, in force), or None."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            until, why = float(doc["until"]), str(doc["why"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        left = until - time.time()
        # Past, or further than any wait ever written (the wall clock stepped back): not in force.
        if left <= 0 or left > MAX_WAIT_S:
            return None
        return f"{why}; not asked again for {left:.0f}s"

    def hold_all(self, e: BaseException, timeout_wait_s: float) -> str:
        """After a failure that asks every process to wait (a Retry-After; a timeout: ``timeout_wait_s``), write
        that wait down. Returns what failed, in one line."""
        wait = getattr(_LAST, "retry_after", None)
        if wait is not None:
            why = f"{describe(e)}, Retry-After {wait:.0f}s"
        elif timed_out(e):
            wait, why = timeout_wait_s, describe(e)
        else:
            return describe(e)
        try:
            self._store(self.path, json.dumps({"until": time.time() + wait, "why": why}))
        except OSError as err:  # this process still waits per id
            log.warning("table %s: cannot keep the registry's wait in %s: %s", self.table, self.path.parent, err)
        return why

    def answered(self) -> None:
        """The registry answered: whatever wait was kept is over."""
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
