"""The faults a soak injects (``tests.soak``): the broker stopped, paused, killed; retention past the daemon; the
topic recreated; a partition added; the state_dir's disk full; a live key reloaded, by ``globald reload`` and by a
burst of SIGHUPs; a table exported. Each lasts its nominal time times --fault-scale."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness import Broker, DaemonProcess, globald, random_records
from tests.reliability.disk import fill
from tests.reliability.load import Load
from tests.support.broker import EmbeddedKafka

TABLES = ("customers", "products")
MAX_PARTITIONS = 6
COMMIT_MS = (1000, 700)  # the commit_interval_ms values a reload moves between
BURST = 5  # SIGHUPs in a burst
APPLIED_S = 120.0  # a reload asked for and not applied by then did not happen


class EventMissed(RuntimeError):
    """A reload the daemon did not apply, or an export it did not make: the event proves nothing. The soak counts
    it and fails; the daemon's log says why (``reload of … refused``, ``export … failed``)."""


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
    root: Path
    commit_ms: int
    write_config: Callable[..., Path]

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
        out += [("commit_interval_ms reloaded (globald reload)", self.reload),
                (f"commit_interval_ms reloaded by a burst of {BURST} SIGHUPs", self.sighup_burst),
                ("table exported (globald export)", self.export)]
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

    # -- reloads and exports: the load keeps running ------------------------------------------------------------

    def _generation(self) -> int:
        return int(self.daemon.status()["config"]["generation"])

    def _next_config(self) -> None:
        self.commit_ms = COMMIT_MS[(COMMIT_MS.index(self.commit_ms) + 1) % len(COMMIT_MS)]
        self.write_config(commit_interval_ms=self.commit_ms)

    def _applied(self, since: int, moves: int) -> None:
        deadline = time.monotonic() + APPLIED_S
        while time.monotonic() < deadline and self.daemon.alive():
            doc = self.daemon.status()
            if doc.get("pid") == self.daemon.pid and doc["config"]["generation"] >= since + moves:
                return
            time.sleep(0.5)
        doc = self.daemon.status()
        raise EventMissed(f"config generation {doc.get('config', {}).get('generation')} {APPLIED_S:.0f}s after the "
                          f"reload, {moves} expected beyond {since}; last reload "
                          f"{doc.get('config', {}).get('last_reload')}")

    def reload(self) -> None:
        """A live key changed and ``globald reload``: exit 0 and the generation moved, same PID."""
        since = self._generation()
        self._next_config()
        r = globald("reload", "--config", str(self.daemon.config), timeout=300)
        if r.returncode != 0:
            raise EventMissed(f"globald reload exited {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}")
        self._applied(since, 1)

    def sighup_burst(self) -> None:
        """A live key changed and SIGHUPs in a row: the first applied at least (a signal arriving while the one
        before is still pending merges with it)."""
        since = self._generation()
        self._next_config()
        for _ in range(BURST):
            os.kill(self.daemon.pid, signal.SIGHUP)
            time.sleep(0.05)
        self._applied(since, 1)

    def export(self) -> None:
        """``globald export`` of a table: exit 0 and its manifest in the storage."""
        table = self._table()
        r = globald("export", "--config", str(self.daemon.config), "--table", table, "--json", timeout=330)
        try:
            export_id = json.loads(r.stdout)["export"] if r.returncode == 0 else None
        except (ValueError, KeyError):
            export_id = None
        manifest = self.root / "exports" / table / "exports" / f"{export_id}.json"
        if export_id is None or not manifest.is_file():
            raise EventMissed(f"globald export exited {r.returncode} ({(r.stdout + r.stderr).strip()[-300:]}); "
                              f"manifest {manifest} {'present' if manifest.is_file() else 'absent'}")
