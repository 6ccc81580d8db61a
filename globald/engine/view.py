"""The engine's read interface: all that code outside the engine may know of the tables, and ask of them.

Snapshots, operations and status see the engine only through ``EngineView`` (which the state manager provides)
and ``LoopStats``; the engine's records (``TableRuntime``, its store, its state machine) stay inside it. Each
``TableView`` is a copy taken when asked: holding one keeps nothing of the engine alive or in step. Loop thread
only, like the stores behind it (``LoopStats`` excepted).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from globald.common.states import State


@dataclass(frozen=True)
class TableView:
    """One table as the engine sees it now: its state (and why), and the partitions its topic has."""

    name: str
    topic: str
    state: State
    reason: str | None
    partitions: tuple[int, ...]
    last_error: str | None
    # A versioned table's topic's min.compaction.lag.ms as its last plan read it (None: unknown, or not versioned):
    # what an exact build from the log start sets its since from (``snapshot.exact_builds``), with no broker call.
    compaction_lag_ms: int | None = None


@dataclass(frozen=True)
class Checkpointed:
    """A checkpoint of a live store: the offsets read back from the copy itself, and its estimated records."""

    offsets: dict[int, int]
    records: int


class EngineView(Protocol):
    """What snapshots and operations may ask of the engine; the state manager provides it. Typed against this, a
    reach-into the engine's records fails mypy, and import-linter keeps its modules out of reach."""

    @property
    def store_fault(self) -> bool:
        """A write, commit or open failed and the stores are not recovered yet: publish nothing from them."""
        ...

    def table_views(self) -> list[TableView]:
        """Every table, in the configuration's order."""
        ...

    def table_view(self, table: str) -> TableView | None:
        """``table`` now; None before the engine opened it."""
        ...

    def history_status(self, table: str) -> dict[str, Any] | None:
        """A versioned table's ``tables.<t>.history`` status (``store.history.status``); None for another table, or
        one whose store is closed."""
        ...

    def live_offsets(self, table: str) -> dict[int, int]:
        """The offsets the live store holds now, which a checkpoint taken now holds too (between two polls)."""
        ...

    def checkpoint(self, table: str, dest: Path) -> Checkpointed:
        """Checkpoint ``table``'s live store into ``dest`` (which must not exist) and say what the copy holds.
        Raises the store's errors as ``store.failures`` maps them (a closed store, a disk refusing, a bad copy)."""
        ...

    def wipe_counts(self) -> dict[tuple[str, str], int]:
        """Wipes so far, by (table, kind)."""
        ...

    def memory_usage(self) -> Mapping[str, Mapping[str, int] | None]:
        """Bytes RocksDB accounts to each table's store, by kind; None for a closed store."""
        ...


@dataclass
class LoopStats:
    """The loop's vital signs, written by the loop and read by operations from any thread."""

    last_loop: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    consumer_errors: int = 0
    consumer_renewals: int = 0  # consumers replaced: silent ones, or for new [kafka] properties (Loop.replace_consumer)
    recoveries: deque[float] = field(default_factory=lambda: deque(maxlen=100))  # seconds from a wipe to RUNNING
