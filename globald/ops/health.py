"""Liveness and readiness, decided in one place for /healthz, /readyz, sd_notify READY=1 and the status document.

Ready means a consistent view of every table can be served: the snapshot source says it has a servable
snapshot (a stale one while rebuilding, if the config allows), or, without snapshots, the table is RUNNING.
Healthy means the loop is iterating: a loop stuck longer than ``STALL_SECONDS`` is unhealthy whatever its state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from globald.common.states import State

# Longer than any single blocking call the loop makes (metadata queries time out after 5 s, consume after
# poll_timeout_ms), so a slow broker never makes a live loop look stuck.
STALL_SECONDS = 30.0

_FINISHED = {State.PENDING_SHUTDOWN.value, State.NOT_RUNNING.value, State.ERROR.value}


class SnapshotSource(Protocol):
    """What the snapshot publisher tells operations about one table. Called on the loop thread only."""

    def servable(self, table: str) -> bool:
        """A consistent snapshot of ``table`` can be served now (possibly stale, if the config allows)."""
        ...

    def age_seconds(self, table: str) -> float | None:
        """Seconds since the current snapshot was created, or None when there is none."""
        ...

    def publish_seconds(self, table: str) -> float | None:
        """How long the last snapshot publish of ``table`` took, or None when none was published yet."""
        ...

    def build_workers_replaced(self) -> int:
        """Exact-build workers replaced so far, each left stuck inside a Kafka client past its bound."""
        ...


@dataclass(frozen=True)
class Readiness:
    ready: bool
    detail: str
    tables: dict[str, bool] = field(default_factory=dict)


def readiness(daemon_state: str, table_states: Mapping[str, str], snapshots: SnapshotSource | None = None
              ) -> Readiness:
    """Whether every table can be served consistently; ``detail`` says why not, for people."""
    # With a snapshot source, only a published snapshot counts: executors read snapshots, never the live store.
    tables = {name: snapshots.servable(name) if snapshots is not None else state == State.RUNNING.value
              for name, state in table_states.items()}
    if daemon_state in _FINISHED or daemon_state == State.CREATED.value:
        return Readiness(False, f"daemon is {daemon_state}", tables)
    waiting = sorted(name for name, ok in tables.items() if not ok)
    if not tables or waiting:
        return Readiness(False, f"waiting for {', '.join(waiting) or 'tables'}", tables)
    return Readiness(True, "every table can be served", tables)


@dataclass(frozen=True)
class Liveness:
    healthy: bool
    detail: str
    loop_age_seconds: float
    progress_age_seconds: float


def liveness(daemon_state: str, loop_age: float, progress_age: float) -> Liveness:
    if daemon_state == State.ERROR.value:
        healthy, detail = False, "the loop ended in ERROR"
    elif daemon_state == State.NOT_RUNNING.value:
        healthy, detail = False, "the daemon has stopped"
    elif loop_age > STALL_SECONDS:
        healthy, detail = False, f"the loop has not iterated for {loop_age:.0f}s"
    else:
        healthy, detail = True, "the loop is iterating"
    return Liveness(healthy, detail, round(loop_age, 3), round(progress_age, 3))
