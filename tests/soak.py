"""Soak: ``python -m tests.soak [--minutes 30]`` (``make soak``) runs the real daemon for a long time under steady
produce load, injecting a fault from the reliability suite's list at a fixed interval, and reports memory over
time, wipes, divergences and restarts.

After each fault the load pauses until the daemon is RUNNING, undegraded and at the log end of every table, each
store (and every verifiable snapshot) is compared with the oracle at its stored offsets, and the load resumes.
Nothing ever restarts the daemon: a PID change is a failure, counted, and the run goes on with a new daemon so
the rest of the report stays meaningful. Exit status 0 only with zero divergences and zero restarts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from globald.embedded.admin import TopicAdmin
from globald.embedded.broker import EmbeddedKafka
from globald.store.names import db_dir
from tests.harness import Broker, DaemonProcess, random_records, write_config
from tests.reliability.checks import check_snapshots, check_store
from tests.reliability.disk import fill, mount_tmpfs, unmount
from tests.reliability.ledger import FaultRow, Ledger, report_dir
from tests.reliability.load import Load

TABLES = ("customers", "products")
MAX_PARTITIONS = 6


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Soak:
    args: argparse.Namespace
    root: Path
    kafka: EmbeddedKafka = field(init=False)
    broker: Broker = field(init=False)
    daemon: DaemonProcess = field(init=False)
    topics: dict[str, str] = field(default_factory=dict)
    loads: dict[str, Load] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    rows: dict[str, FaultRow] = field(default_factory=dict)
    memory: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, RSS MB)
    recoveries: list[float] = field(default_factory=list)
    restarts: int = 0
    unrecovered: int = 0
    pid: int = 0
    disk: Path | None = None
    rnd: random.Random = field(default_factory=random.Random)
    started: float = field(default_factory=time.monotonic)

    # -- setup --------------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.kafka = EmbeddedKafka(self.root / "kafka").start()
        settings = self.kafka.client_settings
        self.broker = Broker(settings, TopicAdmin.for_broker({**settings, "logger": _quiet()}, self.kafka.zookeeper),
                             self.kafka)
        self.disk = self._mount_tmpfs(self.root / "disk", 512)
        state = (self.disk or self.root) / "state"
        for i, table in enumerate(TABLES):
            topic = self.topics[table] = f"soak-{table}"
            self.broker.admin.create(topic, partitions=3)
            self.broker.admin.produce(topic, random_records(50_000, keys=20_000, seed=self.args.seed + i))
            rate = self.args.rate // len(TABLES)
            self.loads[table] = Load(self.broker.admin, topic, rate=rate, keys=20_000, seed=self.args.seed + 10 + i,
                                     pin_partitions=3)
        cfg = write_config(self.root / "globald-soak.toml", state, settings, self.topics, commit_interval_ms=1000,
                           metadata_refresh_ms=2000, http={"enabled": False}, snapshots={"interval_ms": 1000})
        self.daemon = DaemonProcess(cfg, self.root / "daemon.log").start()
        self.pid = self.daemon.pid
        self.settle("initial restore")
        for load in self.loads.values():
            load.start()

    @staticmethod
    def _mount_tmpfs(path: Path, size_mb: int) -> Path | None:
        why = mount_tmpfs(path, size_mb)
        if why is not None:
            print(f"soak: no tmpfs ({why}); the disk-full fault is left out", flush=True)
            return None
        return path

    def stop(self) -> None:
        for load in self.loads.values():
            load.stop()
        if self.daemon.alive():
            self.daemon.stop()
        self.broker.admin.close()
        self.kafka.stop()
        if self.disk is not None:
            unmount(self.disk)

    # -- verification ---------------------------------------------------------------------------------------------

    def sample_memory(self) -> None:
        mb = rss_mb(self.daemon.pid)
        if mb is not None:
            self.memory.append((time.monotonic() - self.started, mb))

    def settle(self, what: str, timeout: float = 300.0) -> dict[str, int]:
        """Pause the load, wait for an undegraded RUNNING daemon at every log end, compare every table with the
        oracle; returns divergences per table. A daemon that died is counted and replaced."""
        for load in self.loads.values():
            load.pause()
        try:
            ends = {t: self.broker.admin.end_offsets(topic) for t, topic in self.topics.items()}

            def ok(s: dict) -> bool:
                return s.get("pid") == self.daemon.pid and s["state"] == "RUNNING" and not s.get("degraded") and all(
                    all(s["tables"].get(t, {}).get("offsets", {}).get(str(p), -1) >= o for p, o in e.items())
                    for t, e in ends.items())

            t0 = time.monotonic()
            try:
                self.daemon.wait_for(ok, timeout=timeout, what=f"recovery from {what}")
            except AssertionError as e:
                print(f"soak: NOT RECOVERED from {what}: {str(e)[:2000]}", flush=True)
                self.unrecovered += 1
                if not self.daemon.alive():
                    self.restarts += 1
                    self.daemon.start()
                    self.pid = self.daemon.pid
                    self.daemon.wait_for(ok, timeout=timeout, what="a replacement daemon")
            self.recoveries.append(time.monotonic() - t0)
            out = {}
            for table, topic in self.topics.items():
                check = check_store(self.broker, self.daemon.state_dir, table, topic)
                snaps = check_snapshots(self.broker, self.daemon.state_dir, table, topic)
                out[table] = check.divergences + sum(s.divergences for s in snaps) + (0 if check.readable else 1)
                if out[table]:
                    print(f"soak: DIVERGED after {what}: table {table}: {check}; snapshots "
                          f"{[s for s in snaps if s.divergences]}; watermarks {self.broker.admin.watermarks(topic)}",
                          flush=True)
                    keep = self.root / f"diverged-{len(self.recoveries)}-{table}"
                    shutil.copytree(db_dir(self.daemon.state_dir, table), keep, dirs_exist_ok=True)
            return out
        finally:
            for load in self.loads.values():
                load.resume()

    # -- faults -----------------------------------------------------------------------------------------------

    def faults(self) -> list[tuple[str, Callable[[], None]]]:
        out = [("broker stopped 10 s", self.broker_outage), ("broker paused (SIGSTOP) 8 s", self.broker_pause),
               ("broker SIGKILLed and restarted", self.broker_kill),
               ("log start advanced (retention)", self.retention), ("topic deleted and recreated", self.recreate),
               ("partition added", self.add_partition)]
        if self.disk is not None:
            out.append(("state_dir disk full 10 s", self.disk_full))
        return out

    def _quiet_loads(self) -> None:
        for load in self.loads.values():
            load.pause()

    def broker_outage(self) -> None:
        self._quiet_loads()
        self.kafka.stop_broker()
        time.sleep(10)
        self.kafka.start_broker()

    def broker_pause(self) -> None:
        self._quiet_loads()
        pid = self.kafka.broker_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(8)
        finally:
            os.kill(pid, signal.SIGCONT)

    def broker_kill(self) -> None:
        self._quiet_loads()
        self.kafka.stop_broker(signal.SIGKILL)
        time.sleep(3)
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
        time.sleep(5)
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
            time.sleep(10)
        finally:
            filler.unlink()

    # -- the run ----------------------------------------------------------------------------------------------

    def run(self) -> None:
        self.rnd = random.Random(self.args.seed)
        deadline = self.started + self.args.minutes * 60
        faults = self.faults()
        self.rnd.shuffle(faults)
        i = 0
        next_fault = time.monotonic() + self.args.fault_every
        while time.monotonic() < deadline:
            self.sample_memory()
            if time.monotonic() < next_fault:
                time.sleep(min(5.0, max(0.0, next_fault - time.monotonic())))
                continue
            name, inject = faults[i % len(faults)]
            i += 1
            row = self.rows.get(name) or self.rows.setdefault(name, self.ledger.row(name, "soak", ""))
            print(f"soak: {time.monotonic() - self.started:7.0f}s  {name}", flush=True)
            restarts = self.restarts
            inject()
            row.injected += 1
            diverged = self.settle(name)
            row.diverged(sum(diverged.values()))
            row.pid_changes += self.restarts - restarts
            self.sample_memory()
            next_fault = time.monotonic() + self.args.fault_every
        final = self.settle("the end of the run")
        self.ledger.row("none (final check)", "soak", "").diverged(sum(final.values()))

    def report(self) -> bool:
        for row in self.ledger.rows:
            row.outcome = "recovered in-process" if row.divergences == 0 and row.pid_changes == 0 else "FAILED"
            if not row.injected:
                row.outcome = "checked" if row.divergences == 0 else "FAILED"
        wipes = sum(t.get("wipes", 0) for t in self.daemon.status().get("tables", {}).values())
        mem = [mb for _, mb in self.memory]
        quarter = max(1, len(mem) // 4)
        first, last = statistics.median(mem[:quarter]), statistics.median(mem[-quarter:])
        slope = _slope_mb_per_hour(self.memory)
        divergences = sum(r.divergences for r in self.ledger.rows)
        summary = {
            "minutes": round((time.monotonic() - self.started) / 60, 1), "seed": self.args.seed,
            "rate": self.args.rate, "faults": sum(r.injected for r in self.ledger.rows), "divergences": divergences,
            "restarts": self.restarts, "unrecovered": self.unrecovered, "wipes": wipes,
            "rss_mb": {"first_quarter": round(first, 1), "last_quarter": round(last, 1), "max": round(max(mem), 1),
                       "slope_mb_per_hour": round(slope, 1)},
            "recovery_s": {"median": round(statistics.median(self.recoveries), 1),
                           "max": round(max(self.recoveries), 1)},
            "memory": [(round(t), round(mb, 1)) for t, mb in self.memory],
        }
        out = Path(self.args.report_dir)
        self.ledger.write(out, f"Soak, {summary['minutes']} min")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        lines = [f"soak: {summary['minutes']} min, {summary['faults']} faults, {divergences} divergences, "
                 f"{self.restarts} restarts, {self.unrecovered} not recovered within 300 s, {wipes} wipes",
                 f"soak: daemon RSS MB first quarter {first:.0f}, last quarter {last:.0f}, max {max(mem):.0f}, "
                 f"trend {slope:+.0f} MB/h; recovery median {summary['recovery_s']['median']} s, "
                 f"max {summary['recovery_s']['max']} s",
                 f"soak: report in {out}"]
        print("\n".join(lines), flush=True)
        print((out / "report.md").read_text(), flush=True)
        return divergences == 0 and self.restarts == 0 and self.unrecovered == 0


def _slope_mb_per_hour(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 2:
        return 0.0
    ts, ms = [t for t, _ in samples], [m for _, m in samples]
    mt, mm = statistics.fmean(ts), statistics.fmean(ms)
    var = sum((t - mt) ** 2 for t in ts)
    return 0.0 if var == 0 else sum((t - mt) * (m - mm) for t, m in samples) / var * 3600


def _quiet() -> object:
    import logging

    log = logging.getLogger("soak.librdkafka")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    return log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    p.add_argument("--rate", type=int, default=2000, help="records per second over all tables (default 2000)")
    p.add_argument("--fault-every", type=float, default=45.0, help="seconds between faults (default 45)")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    p.add_argument("--report-dir", default=str(report_dir() / "soak"))
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="globald-soak-"))
    print(f"soak: {args.minutes} min, seed {args.seed}, working in {root}", flush=True)
    soak = Soak(args, root)
    try:
        soak.start()
        soak.run()
        return 0 if soak.report() else 1
    finally:
        soak.stop()


if __name__ == "__main__":
    sys.exit(main())
