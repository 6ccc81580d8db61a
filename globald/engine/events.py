"""Typed events out of the engine, and the bus that delivers them to subscribers fixed when the daemon is built.

What a subscriber can rely on: events arrive on the loop thread, in the order they happened, each exactly once, to
every subscriber in the order they were connected. A table's events lie between its ``TableAdded`` (a reload's; the
tables of the config at start have none) and its ``TableDropped``. ``Committed`` offsets are durable in the store
and claimed by its ``.checkpoint`` file; ``Wiped`` is emitted once the store is empty. A subscriber that raises is
logged and counted; it never stops the loop nor hides the event from the subscribers after it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from globald.common.requests import RESET, OperatorRequest
from globald.common.states import Listeners, State
from globald.settings.config import TableConfig
from globald.store.fingerprint import Fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateChanged:
    """The daemon (``table`` None) or a table moved from ``old`` to ``new``."""

    table: str | None
    new: State
    old: State
    reason: str


@dataclass(frozen=True)
class Committed:
    """A commit made ``offsets`` durable in ``table``'s store; its .checkpoint file now claims them."""

    table: str
    offsets: Mapping[int, int]
    seconds: float  # how long the commit took


@dataclass(frozen=True)
class Wiped:
    """``table``'s store was emptied (``kind``: invalid_offset, corrupt_store, operator_reset, topic_recreated); it
    rebuilds.

    ``verified`` is set when the store may hold records of another topic of the same name (``topic_recreated``):
    per partition, the offset below which its records were shown to be the mirrored topic's (``Verified``). What
    was applied past it, and every snapshot taken past it, may mix two topics. An empty mapping: nothing was shown
    in this run (the recreation was found by the first check after the daemon started). None: no such doubt."""

    table: str
    kind: str
    reason: str
    verified: Mapping[int, int] | None = None


@dataclass(frozen=True)
class Verified:
    """A check read ``table``'s topic back at the fingerprints of the records applied (``kafka.identity``) and found
    them: below ``offsets`` (per partition) the store holds records of the topic it mirrors, and of no other.
    ``fingerprints`` (newest first) are those the next check reads back first: a record past ``offsets`` is shown
    to be of the same topic only by a check that finds them again."""

    table: str
    offsets: Mapping[int, int]
    fingerprints: Mapping[int, tuple[Fingerprint, ...]]


@dataclass(frozen=True)
class RestoreStarted:
    table: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class BatchRestored:
    table: str
    partition: int
    batch_end: int  # the next offset after the batch
    count: int


@dataclass(frozen=True)
class RestoreEnded:
    table: str
    partition: int
    total: int


@dataclass(frozen=True)
class TableAdded:
    """A reload added ``config.name`` (or replaced it: another topic, typed or raw, right after its
    ``TableDropped``). Emitted before its store opens and before its first ``StateChanged``: a part that keeps
    something per table makes its entry here, and every later event of the table finds it."""

    config: TableConfig

    @property
    def table(self) -> str:
        return self.config.name


@dataclass(frozen=True)
class TableDropped:
    """A reload dropped ``table`` (or is replacing it: its ``TableAdded`` follows at once). Emitted after its last
    ``StateChanged`` (NOT_RUNNING), once the engine no longer has it: a part forgets the table here, and no event
    of it comes after (until a ``TableAdded`` of the name)."""

    table: str
    replaced: bool = False  # its ``TableAdded``, under the same name with its new declaration, follows at once


@dataclass(frozen=True)
class TableRedeclared:
    """A reload changed a table's declaration in place (a typed table's, same topic, typed still; or a versioned
    table's history window, which its store took already): nothing is replayed; what decodes or publishes the
    table takes ``config`` from its next snapshot version on."""

    config: TableConfig

    @property
    def table(self) -> str:
        return self.config.name


TableEvent = TableAdded | TableDropped | TableRedeclared
Event = StateChanged | Committed | Wiped | Verified | RestoreStarted | BatchRestored | RestoreEnded | TableEvent
Subscriber = Callable[[Event], None]
Emit = Callable[[Event], None]


class EventBus:
    """Delivers events to the subscribers connected once, before the loop starts."""

    def __init__(self) -> None:
        self._subscribers: tuple[Subscriber, ...] | None = None
        self.failures = 0

    def connect(self, *subscribers: Subscriber) -> None:
        if self._subscribers is not None:
            raise RuntimeError("the event bus is already connected")  # a bug: wiring happens in one place
        self._subscribers = subscribers

    def emit(self, event: Event) -> None:
        for fn in self._subscribers or ():
            try:
                fn(event)
            except Exception:
                self.failures += 1
                log.exception("subscriber %r raised on %s; ignored", getattr(fn, "__qualname__", fn),
                              type(event).__name__)


def deliver(listeners: Listeners) -> Subscriber:
    """A subscriber that hands events to a user's callbacks (state, table state, restore listeners)."""

    def on_event(event: Event) -> None:
        match event:
            case StateChanged(table=None):
                for fn in list(listeners.state):
                    listeners.call(fn, event.new, event.old, event.reason)
            case StateChanged(table=str(table)):
                for tfn in list(listeners.table_state):
                    listeners.call(tfn, table, event.new, event.old, event.reason)
            case RestoreStarted():
                listeners.restore_event("on_restore_start", event.table, event.partition, event.start, event.end)
            case BatchRestored():
                listeners.restore_event("on_batch_restored", event.table, event.partition, event.batch_end,
                                        event.count)
            case RestoreEnded():
                listeners.restore_event("on_restore_end", event.table, event.partition, event.total)

    return on_event


OPERATOR_RESET = "operator_reset"  # the wipe kind of a rebuild an operator asked for
# Not a wipe: a store holding no offsets when the daemon opens it (a wipe emptied it before a restart, or its first
# restore never got under way); ``engine.refill``'s source decides whether the start already looked for an export.
EMPTY_STORE = "empty_store"


class RebuildRequest(OperatorRequest):
    """One table an operator asked to rebuild (``globald reset``). The loop settles it once it has run the wipe:
    ``error`` is None when the store was wiped, else why the wipe failed."""

    action = RESET
    stopped = "the daemon stopped before it wiped the table; nothing was wiped"

    def failure(self) -> str:
        log.error("table %s: reset failed: %s", self.table, self.error)  # the loop returns it unlogged
        return f"the wipe of table {self.table} failed: {self.error}"


class RebuildRequests:
    """Tables an operator asked to rebuild (``globald reset``), from any thread; the loop takes them between polls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[RebuildRequest] = deque()

    def put(self, table: str, detail: str) -> RebuildRequest:
        request = RebuildRequest(table, detail)
        with self._lock:
            self._queue.append(request)
        return request

    def take(self) -> list[RebuildRequest]:
        with self._lock:
            items = list(self._queue)
            self._queue.clear()
        return items
