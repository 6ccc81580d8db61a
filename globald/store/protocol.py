"""``Store``: what the engine needs of a table's live store, named as quix-streams names its ``StorePartition``.

``TableStore`` is the one implementation; the engine holds its tables' stores by this Protocol (``TableRuntime``), so
what it may ask of one is this list: its writes (batches with offsets and origins, written whole), its lifecycle
once opened (the state manager that builds one opens it: ``TableStore.open_or_wipe``): wipe, replace, reopen, bulk
loads, close; what it holds (offsets, fingerprints, topic ID) and what makes it durable (sync, the .checkpoint file,
checkpoints for snapshots).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rocksdict import WriteBatch

from globald.store.plain import UpgradingBatch

if TYPE_CHECKING:
    from globald.common.errors import GlobaldError
    from globald.store.fingerprint import Ladder
    from globald.store.history import HistoryWriter
    from globald.store.layout import OriginWriter

Batch = WriteBatch | UpgradingBatch  # what ``Store.new_batch`` gives: put/delete address the values


class Store(Protocol):
    """One table's live store, owned by the daemon thread (``get`` excepted). Its errors are ``store.failures``'."""

    # -- lifecycle

    @property
    def is_open(self) -> bool: ...

    def reopen(self) -> None: ...

    def wipe(self) -> None: ...

    def replace_with(self, stage: Path) -> None:
        """Put a complete store directory its maker checked in place of this emptied one, and open it."""
        ...

    def close(self, clean: bool = True, stopping: bool = False) -> None: ...

    @property
    def bulk(self) -> bool: ...

    def begin_bulk_load(self) -> None: ...

    def end_bulk_load(self) -> None: ...

    # -- writes

    def new_batch(self) -> Batch: ...

    def origin_writer(self, batch: Batch) -> OriginWriter | None: ...

    def history_writer(self, batch: Batch) -> HistoryWriter | None: ...

    def history_status(self) -> dict[str, Any] | None: ...

    # The topic's min.compaction.lag.ms as the last plan read it (None: unknown), and a versioned store that held
    # data before it was versioned (store.history): both for the state manager's plan.
    compaction_lag_ms: int | None

    @property
    def history_unproven(self) -> bool: ...

    def put_offsets(self, batch: Batch, offsets: Mapping[int, int],
                    ladders: Mapping[int, Ladder] | None = None) -> None: ...

    # A versioned table's reading marks (store.gaps.since_after_gap): when the loop last knew it reading, why a
    # resume last moved its since.
    history_read_at: int | None
    history_moved: str | None

    def put_read_mark(self, batch: Batch) -> None: ...

    def history_read_mark(self) -> int | None: ...

    def history_resumed(self, now: int, last_read: int | None, tolerance_ms: int) -> str | None: ...

    # A reload's new window of a versioned table, in place (store.history.windowed_since): (since before, now).
    def history_window(self, window_ms: int) -> tuple[int | None, int | None]: ...

    # A reload's removal of a versioned table's history, in place (store.history.forget): a plain table from then on.
    def history_removed(self) -> None: ...

    def write(self, batch: Batch, rebuild: Callable[[], Batch]) -> None: ...

    def write_offsets(self, offsets: dict[int, int]) -> None: ...

    def write_error(self) -> GlobaldError | None:
        """None when the store takes writes; else why not."""
        ...

    def record_topic_id(self, topic_id: str) -> None: ...

    def mark_complete(self) -> None: ...

    @property
    def upgrading(self) -> bool: ...

    def upgrade_step(self, budget_s: float) -> bool: ...

    # -- what it holds, and making it durable

    def offsets(self) -> dict[int, int]: ...

    def fingerprints(self) -> dict[int, Ladder]: ...

    @property
    def topic_id(self) -> str | None: ...

    def estimate_keys(self) -> int: ...

    def memory_usage(self) -> dict[str, int] | None: ...

    def sync(self) -> dict[int, int]: ...

    def write_checkpoint_file(self, offsets: dict[int, int]) -> None: ...

    def checkpoint(self, dest: Path) -> None: ...
