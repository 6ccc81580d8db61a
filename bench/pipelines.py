"""The restore pipelines under comparison: globald itself (in this process) and the reference designs
(``bench.baselines``), with ``store_only``, the store's share of a restore without Kafka.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from bench.baselines import BASELINES, Job, Run, _Clock, proc_cpu, thread_cpu
from globald.common.states import Listeners, State
from globald.engine.events import EventBus, deliver
from globald.engine.loop import LoopService
from globald.engine.state_manager import StateManager
from globald.engine.thread import GlobalThread
from globald.settings.config import Config
from globald.settings.ref import ConfigRef
from globald.snapshot.publisher import SnapshotPublisher
from globald.store.codec import NO_TIMESTAMP, pack_i64
from globald.store.options import STEADY_L0_TRIGGER
from globald.store.table_store import Batch, TableStore

__all__ = ["PIPELINES", "Job", "Run", "RunningGlobald", "proc_cpu", "thread_cpu"]


def store_only(job: Job) -> Run:
    """The store's share of a restore, without Kafka: the topic's records, made in memory beforehand, written as
    globald's bulk load writes them (a WriteBatch of ``batch`` timestamped values and the offsets per write) and
    flushed durable. Its CPU plus consume-only's is the CPU that no restore into RocksDB avoids."""
    assert job.records is not None, "store_only needs the records"
    stamp = pack_i64(NO_TIMESTAMP)
    made = [(k, None if v is None else stamp + v) for k, v in job.records() if k is not None]
    store = TableStore.open(job.workdir, "bench", job.topic, job.options).store
    try:
        store.begin_bulk_load()
        clock = _Clock()
        for start in range(0, len(made), job.batch):
            def batch(start: int = start) -> Batch:
                b = store.new_batch()
                for k, v in made[start:start + job.batch]:
                    if v is None:
                        b.delete(k)
                    else:
                        b.put(k, v)
                store.put_offsets(b, {0: start + job.batch})
                return b
            store.write(batch(), rebuild=batch)
        store.end_bulk_load()
        return clock.run(len(made))
    finally:
        store.close()


class _Probes:
    def __init__(self, probes: list[Callable[[], None]]) -> None:
        self._probes = probes

    def tick(self) -> None:
        for probe in self._probes:
            probe()


class RunningGlobald:
    """globald's real GlobalThread in this process; ``wait`` returns the seconds from ``start`` to RUNNING."""

    def __init__(self, config: Config, listeners: Listeners | None = None, snapshots: bool = False) -> None:
        """``snapshots`` runs the snapshot publisher in the loop, as ``globald run`` does."""
        self.config = config
        self.listeners = listeners or Listeners()
        self.running_at: float | None = None
        self._running = threading.Event()
        self.listeners.state.append(self._on_state)
        self.probes: list[Callable[[], None]] = []  # called on the loop thread after every turn
        bus = EventBus()
        ref = ConfigRef(config)
        manager = StateManager(ref, bus.emit)
        self.publisher = SnapshotPublisher(ref, manager) if snapshots else None
        services: list[LoopService] = [self.publisher] if self.publisher is not None else []
        self.thread = GlobalThread(ref, manager, bus.emit, services=[*services, _Probes(self.probes)])
        bus.connect(deliver(self.listeners), *([self.publisher.on_event] if self.publisher is not None else []))
        self._runner = threading.Thread(target=self._run, name="globald", daemon=True)
        self.error: BaseException | None = None
        self.clock = _Clock()  # from ``start``
        self.at_running: Run | None = None  # seconds and CPU from start to RUNNING

    def _on_state(self, new: State, old: State, reason: str) -> None:
        if new == State.RUNNING and self.running_at is None:
            self.running_at = time.monotonic()
            self.at_running = self.clock.run(0)
            self._running.set()
        elif new == State.ERROR:
            self._running.set()

    def _run(self) -> None:
        try:
            self.thread.run()
        except BaseException as e:
            self.error = e
            self._running.set()

    def start(self) -> RunningGlobald:
        self.clock = _Clock()
        self._runner.start()
        return self

    @property
    def started(self) -> float:
        """``time.monotonic()`` at ``start``."""
        return self.clock.wall

    def wait(self, timeout: float = 3600.0) -> float:
        if not self._running.wait(timeout) or self.running_at is None:
            raise RuntimeError(f"globald did not reach RUNNING: {self.error or self.thread.machine.reason}")
        return self.running_at - self.started

    def records(self) -> int:
        return sum(self.thread.applied(name)[0] for name in self.thread.tables)

    def settled(self, timeout: float = 600.0) -> tuple[float, float]:
        """(seconds, CPU seconds) from RUNNING until every store's L0 is under the compaction trigger again: the
        merge of the files a bulk load leaves behind, which runs after RUNNING while the table is served."""
        assert self.running_at is not None
        stores = [rt.store for rt in self.thread.manager.tables.values()]
        cpu = time.process_time()
        while any(s.files_per_level()[0] >= STEADY_L0_TRIGGER for s in stores):
            if time.monotonic() - self.running_at > timeout:
                break
            time.sleep(0.05)
        return time.monotonic() - self.running_at, time.process_time() - cpu

    def stop(self) -> None:
        self.thread.stop()
        self._runner.join(300)
        if self.error is not None:
            raise RuntimeError(f"globald failed: {self.error}") from self.error


def globald_restore(job: Job) -> Run:
    """A cold restore by globald's GlobalThread, from start to RUNNING."""
    g = RunningGlobald(job.config(job.workdir / "state")).start()
    try:
        g.wait()
        assert g.at_running is not None
        l0 = sum(rt.store.files_per_level()[0] for rt in g.thread.manager.tables.values())
        run = replace(g.at_running, records=g.records(), l0_files=l0)
        settle, settle_cpu = g.settled()
        return replace(run, settle_seconds=settle, settle_cpu_seconds=settle_cpu)
    finally:
        g.stop()


PIPELINES: dict[str, Callable[[Job], Run]] = {
    "globald": globald_restore,
    "raw_batch": BASELINES["raw_batch"],
    "consume_only": BASELINES["consume_only"],
    "read_fields": BASELINES["read_fields"],
    "store_only": store_only,
    "per_record": BASELINES["per_record"],
    "raw_batch_librdkafka_fetch": BASELINES["raw_batch_librdkafka_fetch"],
}
