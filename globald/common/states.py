"""Lifecycle states of the daemon and of each table, with the one transition table both obey.

Listeners learn every transition exactly once, in order, as (new, old, reason). A listener that raises is
logged and counted; it never stops the daemon or hides the transition from the listeners after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

from globald.common import swallowed

log = logging.getLogger(__name__)


class State(StrEnum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.CREATED: frozenset({State.RESTORING, State.PENDING_SHUTDOWN, State.ERROR}),
    State.RESTORING: frozenset({State.RUNNING, State.PENDING_SHUTDOWN, State.ERROR}),
    State.RUNNING: frozenset({State.RESTORING, State.PENDING_SHUTDOWN, State.ERROR}),
    State.PENDING_SHUTDOWN: frozenset({State.NOT_RUNNING, State.ERROR}),
    State.NOT_RUNNING: frozenset(),
    State.ERROR: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug: code asked for a state change the transition table forbids. Report it with the log."""


class StateListener(Protocol):
    def __call__(self, new: State, old: State, reason: str) -> None: ...


class TableStateListener(Protocol):
    def __call__(self, table: str, new: State, old: State, reason: str) -> None: ...


class RestoreListener(Protocol):
    """Kafka Streams' StateRestoreListener, keyed by table. Offsets are next-offsets (exclusive ends)."""

    def on_restore_start(self, table: str, partition: int, start: int, end: int) -> None: ...

    def on_batch_restored(self, table: str, partition: int, batch_end: int, count: int) -> None: ...

    def on_restore_end(self, table: str, partition: int, total: int) -> None: ...


class Listeners:
    """The callbacks a user registers before the daemon starts (``globald.engine.events.deliver`` calls them from
    the engine's events), each invoked safely."""

    def __init__(self) -> None:
        self.state: list[StateListener] = []
        self.table_state: list[TableStateListener] = []
        self.restore: list[RestoreListener] = []
        self.failures = 0

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:
            self.failures += 1
            swallowed.record("user_callback", e, log, "callback %r raised; ignored", getattr(fn, "__qualname__", fn))

    def restore_event(self, method: str, *args: Any) -> None:
        for listener in list(self.restore):
            fn = getattr(listener, method, None)
            if fn is not None:
                self.call(fn, *args)


class Transition(Protocol):
    def __call__(self, table: str | None, new: State, old: State, reason: str) -> None: ...


class StateMachine:
    """A validated state that reports each transition to ``notify``. ``table`` is None for the daemon as a whole."""

    def __init__(self, notify: Transition, table: str | None = None) -> None:
        self._state = State.CREATED
        self._lock = threading.Lock()
        self._notify = notify
        self.table = table
        self.reason = "created"

    @property
    def state(self) -> State:
        return self._state

    def to(self, new: State, reason: str) -> bool:
        """Move to ``new``; a no-op (returning False) when already there."""
        with self._lock:
            old = self._state
            if new == old:
                return False
            if new not in TRANSITIONS[old]:
                raise IllegalTransition(f"{self.table or 'daemon'}: {old} -> {new} ({reason})")
            self._state = new
            self.reason = reason
        log.info("%s state %s -> %s (%s)", f"table {self.table}" if self.table else "daemon", old, new, reason)
        self._notify(self.table, new, old, reason)
        return True
