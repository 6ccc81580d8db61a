"""Steady produce load from a background thread, for faults that must happen while records keep arriving.

Records are random keys with overwrites and tombstones (``harness.random_records``), sent in small batches at
about ``rate`` records per second. A batch that cannot be delivered (the broker is down) is counted and dropped:
the oracle reads the topic itself, so a record that never arrived is simply not part of the truth.
With ``pin_partitions`` each key goes to a partition fixed by its bytes, not by the topic's current partition
count: Kafka orders records only within a partition, so a key that moved when partitions were added would have
no defined last value, for the daemon or for the oracle.
With ``catch_up`` the load keeps to ``rate`` over wall time, pauses included: after a pause its batches grow (up
to MAX_BURST times the usual) until the records sent are what the rate asked for since the start. An accelerated
soak pauses its load at every fault and still has to deliver its updates.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable

from tests.harness import random_records
from tests.support.admin import TopicAdmin

MAX_BURST = 4  # a catching-up batch is at most this many usual batches


def pinned(partitions: int) -> Callable[[bytes | None], int]:
    """The partition a key is pinned to among the first ``partitions``, whatever the topic's count."""
    return lambda key: zlib.crc32(key or b"") % partitions


class Load:
    def __init__(self, admin: TopicAdmin, topic: str, rate: int = 1000, keys: int = 5000, seed: int = 0,
                 tombstones: float = 0.1, batches_per_s: int = 5, pin_partitions: int | None = None,
                 catch_up: bool = False) -> None:
        self.admin, self.topic = admin, topic
        self.rate, self.catch_up = rate, catch_up
        self.batch = max(1, rate // batches_per_s)
        self.interval = 1.0 / batches_per_s
        self.keys, self.seed, self.tombstones = keys, seed, tombstones
        self.partition_of = pinned(pin_partitions) if pin_partitions else None
        self.sent = 0
        self.failed_batches = 0
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{topic}", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def _size(self, began: float, now: float) -> int:
        if not self.catch_up:
            return self.batch
        due = int(self.rate * (now - began)) - self.sent
        return min(max(self.batch, due), self.batch * MAX_BURST)

    def _run(self) -> None:
        n = 0
        began = time.monotonic()
        while not self._stop.is_set():
            if not self._running.is_set():
                self._idle.set()
                self._running.wait(0.1)
                continue
            self._idle.clear()
            started = time.monotonic()
            records = random_records(self._size(began, started), keys=self.keys, seed=self.seed * 1_000_003 + n,
                                     tombstones=self.tombstones)
            try:
                self.sent += self.admin.produce(self.topic, records, partition_of=self.partition_of)
            except Exception:
                self.failed_batches += 1
            n += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
        self._idle.set()

    def pause(self) -> None:
        """Stop sending; returns once the batch in flight has been delivered."""
        self._running.clear()
        if self._thread.is_alive():
            self._idle.wait(90)

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        if self._thread.ident is not None:  # a teardown after a start that failed stops a load never started
            self._thread.join(90)
