"""The faults a soak injects (``tests.soak``): the broker stopped, paused, killed; retention past the daemon; the
topic recreated; a partition added; the state_dir's disk full. Each lasts its nominal time times --fault-scale."""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness import Broker, DaemonProcess, random_records
from tests.reliability.disk import fill
from tests.reliability.load import Load
from tests.support.broker import EmbeddedKafka

TABLES = ("customers", "products")
MAX_PARTITIONS = 6


class SoakFaults:
    """Mixed into ``tests.soak.Soak``, which owns these attributes."""

    args: argparse.Namespace
    kafka: EmbeddedKafka
    broker: Broker
    daemon: DaemonProcess
    topics: dict[str, str]
    loads: dict[str, Load]
    disk: Path | None
    rnd: random.Random

    # -- faults -----------------------------------------------------------------------------------------------

    def faults(self) -> list[tuple[str, Callable[[], None]]]:
        k = self.args.fault_scale
        out = [(f"broker stopped {10 * k:g} s", self.broker_outage),
               (f"broker paused (SIGSTOP) {8 * k:g} s", self.broker_pause),
               ("broker SIGKILLed and restarted", self.broker_kill),
               ("log start advanced (retention)", self.retention), ("topic deleted and recreated", self.recreate),
               ("partition added", self.add_partition)]
        if self.disk is not None:
            out.append((f"state_dir disk full {10 * k:g} s", self.disk_full))
        return out

    def _sleep(self, seconds: float) -> None:
        """How long a fault lasts, scaled by --fault-scale (the accelerated form's faults are shorter)."""
        time.sleep(seconds * self.args.fault_scale)

    def _quiet_loads(self) -> None:
        for load in self.loads.values():
            load.pause()

    def broker_outage(self) -> None:
        self._quiet_loads()
        self.kafka.stop_broker()
        self._sleep(10)
        self.kafka.start_broker()

    def broker_pause(self) -> None:
        self._quiet_loads()
        pid = self.kafka.broker_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            self._sleep(8)
        finally:
            os.kill(pid, signal.SIGCONT)

    def broker_kill(self) -> None:
        self._quiet_loads()
        self.kafka.stop_broker(signal.SIGKILL)
        self._sleep(3)
        self.kafka.start_broker()

    def _table(self) -> str:
        return self.rnd.choice(TABLES)

    def retention(self) -> None:
        """Retention deleting what the daemon has not read yet (frozen meanwhile, same PID). Deleting records it
        has read would leave keys in the store that no fold of the log can show any more."""
        self._quiet_loads()
        os.kill(self.daemon.pid, signal.SIGSTOP)
        try:
            self.broker.admin.advance_log_start(self.topics[self._table()])
        finally:
            os.kill(self.daemon.pid, signal.SIGCONT)

    def recreate(self) -> None:
        self._quiet_loads()
        topic = self.topics[self._table()]
        self.broker.admin.delete(topic)
        self._sleep(5)
        self.broker.admin.create(topic, partitions=3)

    def add_partition(self) -> None:
        """One more partition, filled with keys of its own (the load keeps its keys where they were)."""
        topic = self.topics[self._table()]
        n = len(self.broker.admin.watermarks(topic))
        if n < MAX_PARTITIONS:
            self.broker.admin.add_partitions(topic, n + 1)
            records = random_records(2_000, keys=1_000, seed=self.rnd.randrange(1 << 30))
            self.broker.admin.produce(topic, [(b"p%d-" % n + (k or b""), v) for k, v in records], partition=n)

    def disk_full(self) -> None:
        assert self.disk is not None
        filler = fill(self.disk, leave=16 * 1024)  # the load keeps running: the daemon's next writes hit ENOSPC
        try:
            self._sleep(10)
        finally:
            filler.unlink()
