"""The engine's record of one table: its store, its state, where its topic stands and the restore in progress.

Owned by the state manager, which alone changes the partitions, log ends and restore of a table, and its state while
it runs (RESTORING, and RUNNING once a restore is durable); positions are the update task's (see ``update_task``),
the assignment the loop's, the states of a shutdown the global thread's. Everything else reads it on the loop thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from globald.common.states import StateMachine
from globald.engine.view import TableView
from globald.settings.config import TableConfig
from globald.store.protocol import Store


@dataclass
class Restore:
    """One restore of a table, from its plan until every partition reached its target."""

    targets: dict[int, int]  # partition -> log end captured by the plan, for partitions still restoring
    restored: dict[int, int] = field(default_factory=dict)  # records applied per partition so far
    started: float = field(default_factory=time.monotonic)

    def applied(self, counts: dict[int, int]) -> None:
        for p, n in counts.items():
            if p in self.targets or p in self.restored:
                self.restored[p] = self.restored.get(p, 0) + n


@dataclass
class TableRuntime:
    config: TableConfig
    store: Store
    machine: StateMachine
    partitions: list[int] = field(default_factory=list)
    end_offsets: dict[int, int] = field(default_factory=dict)  # last known log end per partition
    restore: Restore | None = None  # set by a plan with something to restore; None once it is durable
    assigned: bool = False
    last_error: str | None = None
    emptied: str | None = None  # the kind of the wipe that emptied the store, until it is refilled or planned

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def topic(self) -> str:
        return self.config.topic

    def view(self) -> TableView:
        """What code outside the engine may know of the table (see ``engine.view``)."""
        return TableView(self.name, self.topic, self.machine.state, self.machine.reason, tuple(self.partitions),
                         self.last_error, self.store.compaction_lag_ms if self.config.versioned else None)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in self.partitions]
