"""Soak: ``python -m tests.soak [--minutes 30]`` (``make soak``) runs the real daemon for a long time under steady
produce load, injecting a fault from the reliability suite's list at a fixed interval, and reports memory over
time, wipes, divergences and restarts.

Faults come --fault-every seconds apart, from one injection to the next. After each (or each --check-every-th)
the load pauses until the daemon is RUNNING, undegraded and at the log end of every table, each store (and every
verifiable snapshot) is compared with the oracle at its stored offsets, and the load resumes; after the others
the daemon need only catch up, the load running. ``--accelerated`` packs three hours of the default load into 45
minutes (see tests.soak_report.reached_vs_default); memory.md accounts for RSS part by part.
Nothing ever restarts the daemon: a PID change is a failure, counted, and the run goes on with a new daemon so
the rest of the report stays meaningful. Reloads (a live key by ``globald reload``, a burst of SIGHUPs) and
exports (``globald export`` to a directory under the run's) are in the default fault mix; one that did not happen
(the config generation did not move, no manifest) fails the run. Exit status 0 only with zero divergences, zero
restarts and no such event missed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from globald.ops.memory import process_memory
from globald.store.names import STATUS_FILE, db_dir
from tests.chaos.exports import section as export_section
from tests.harness import Broker, DaemonProcess, random_records, write_config
from tests.reliability.checks import check_snapshots, check_store
from tests.reliability.disk import mount_tmpfs, unmount
from tests.reliability.ledger import FaultRow, Ledger, report_dir
from tests.reliability.load import Load
from tests.soak_faults import TABLES, EventMissed, SoakFaults
from tests.soak_report import (
    MALLOC_KINDS,
    OTHER_VIEWS,
    ROCKSDB_KINDS,
    component_slopes,
    memory_table,
    other_views,
    per_default_hour,
    per_default_hour_md,
    quarters,
    reached_md,
    reached_vs_default,
    rocksdb_bound,
    rss_mb,
    slope_after_warmup,
    slope_mb_per_hour,
    tracemalloc_growth,
    verdict,
)
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka

MISSED = "did not happen: "  # a ledger note: a reload or export event that proves nothing
PARTIAL_EVERY_S = 300.0  # how often a run writes its memory figures so far
SAMPLE_EVERY_S = 1.0  # RSS: many samples a minute, so a minute's median is not one fault's swing
STATUS_EVERY_S = 5.0  # the daemon's status memory and publications
SMAPS_EVERY_S = 30.0  # how often the daemon's smaps is read (a walk of every mapping)
KAFKA_STATS_MS = 10_000  # librdkafka's statistics interval in the daemon (its buffers in the status's memory)
# Three hours at the default load (--rate 2000, a publication a second per table, a fault every 45 s), and what
# the accelerated form runs to reach as much in 45 minutes: 4x the rate, the publications and the faults.
DEFAULT_HOURS = 3.0
# The load is paused while a fault lasts and while the stores are compared, a third of the time or more: it catches
# up after each pause (Load's catch_up), and publications come oftener than 4 a second while it runs. No
# tracemalloc: it slows the daemon and its own memory grows with what it traces (``--tracemalloc`` to profile).
ACCELERATED = {"minutes": 44.0, "rate": 8000, "fault_every": 6.0, "snapshot_interval_ms": 40,
               "fault_scale": 0.3, "check_every": 12, "block_cache_mb": 16, "tracemalloc": False, "batches_per_s": 25}
DEFAULTS = {"minutes": 30.0, "rate": 2000, "fault_every": 45.0, "snapshot_interval_ms": 1000, "fault_scale": 1.0,
            "check_every": 1, "block_cache_mb": None, "tracemalloc": False, "batches_per_s": 5}


@dataclass
class Soak(SoakFaults):
    args: argparse.Namespace
    root: Path
    kafka: EmbeddedKafka = field(init=False)
    broker: Broker = field(init=False)
    daemon: DaemonProcess = field(init=False)
    status_path: Path = field(init=False)
    topics: dict[str, str] = field(default_factory=dict)
    loads: dict[str, Load] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    rows: dict[str, FaultRow] = field(default_factory=dict)
    memory: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, RSS MB)
    # RSS just before each injection: the daemon had recovered from the fault before and run on at the log end
    settled: list[tuple[float, float]] = field(default_factory=list)
    # (seconds, {component: MB}): rocksdb_/malloc_/python_/kafka_ from the daemon's status, proc_ from its smaps
    rocksdb: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    injections: list[float] = field(default_factory=list)  # seconds since start at which each fault began
    published: dict[str, int] = field(default_factory=dict)  # snapshot publications per table, from the status
    _last_published: dict[str, int] = field(default_factory=dict)
    next_smaps: float = 0.0
    next_status: float = 0.0
    _stopping: threading.Event = field(default_factory=threading.Event)
    recoveries: list[float] = field(default_factory=list)
    restarts: int = 0
    unrecovered: int = 0
    missed: int = 0  # reload and export events that did not happen (soak_faults.EventMissed)
    commit_ms: int = 1000  # commit_interval_ms in force; the reload faults move it
    write_config: Callable[..., Path] = field(init=False)
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
            # A producer per load: a flush waits for every record its producer holds, the other load's too.
            admin = TopicAdmin.for_broker({**settings, "logger": _quiet()}, self.kafka.zookeeper)
            self.loads[table] = Load(admin, topic, rate=rate, keys=20_000, seed=self.args.seed + 10 + i,
                                     pin_partitions=3, batches_per_s=self.args.batches_per_s,
                                     catch_up=self.args.accelerated)
        store = {} if self.args.block_cache_mb is None else {"store": {"block_cache_mb": self.args.block_cache_mb}}
        # The daemon's own consumer reports librdkafka's buffers (status memory.kafka); the harness's clients don't.
        stats = {**settings, "statistics.interval.ms": KAFKA_STATS_MS,
                 **dict(kv.split("=", 1) for kv in self.args.kafka)}
        # Rewritten whole by the reload faults (soak_faults), each time with another commit_interval_ms.
        self.write_config = partial(write_config, self.root / "globald-soak.toml", state, stats, self.topics,
                                    metadata_refresh_ms=2000, http={"enabled": False},
                                    snapshots={"interval_ms": self.args.snapshot_interval_ms},
                                    export=export_section(self.root, bootstrap=False), **store)
        cfg = self.write_config(commit_interval_ms=self.commit_ms)
        env = dict(kv.split("=", 1) for kv in self.args.daemon_env) or None
        if self.args.tracemalloc:
            shutil.rmtree(self.tracemalloc_dir, ignore_errors=True)  # an earlier run's dumps would be compared
            # A dump every sixteenth of the run: the quarters' and the warm-up's ends fall near one.
            env = {**(env or {}), "GLOBALD_TRACEMALLOC_DIR": str(self.tracemalloc_dir),
                   "GLOBALD_TRACEMALLOC_FRAMES": "6",
                   "GLOBALD_TRACEMALLOC_INTERVAL_S": str(max(30, round(self.args.minutes * 60 / 16)))}
        self.daemon = DaemonProcess(cfg, self.root / "daemon.log", env=env).start()
        self.status_path = state / STATUS_FILE
        self.pid = self.daemon.pid
        self.settle("initial restore")
        for load in self.loads.values():
            load.start()
        self.started = time.monotonic()  # the run's minutes and quarters begin with the load, after the restore
        # Sampled from a thread of its own: a recovery the run waits out (up to 300 s) must not leave a hole.
        threading.Thread(target=self._sample_until_stopped, name="soak-memory", daemon=True).start()

    def _sample_until_stopped(self) -> None:
        while not self._stopping.wait(SAMPLE_EVERY_S):
            self.sample_memory()

    @staticmethod
    def _mount_tmpfs(path: Path, size_mb: int) -> Path | None:
        why = mount_tmpfs(path, size_mb)
        if why is not None:
            print(f"soak: no tmpfs ({why}); the disk-full fault is left out", flush=True)
            return None
        return path

    def stop(self) -> None:
        self._stopping.set()
        for load in self.loads.values():
            load.stop()
        if self.daemon.alive():
            self.daemon.stop()
        self.broker.admin.close()
        for load in self.loads.values():
            load.admin.close()
        self.kafka.stop()
        if self.disk is not None:
            unmount(self.disk)

    # -- verification ---------------------------------------------------------------------------------------------

    @property
    def tracemalloc_dir(self) -> Path:
        return Path(self.args.report_dir) / "tracemalloc"

    def sample_memory(self) -> None:
        t = time.monotonic() - self.started
        mb = rss_mb(self.daemon.pid, running=True)
        if mb is not None:
            self.memory.append((t, mb))
        if time.monotonic() < self.next_status:
            return
        self.next_status = time.monotonic() + STATUS_EVERY_S
        try:  # the daemon's own file, read directly: `globald status` would cost a Python start per sample
            doc = json.loads(self.status_path.read_bytes())
        except (OSError, ValueError):
            return
        memory = doc.get("memory") or {}
        tables, heap = memory.get("tables") or {}, memory.get("malloc") or {}
        if doc.get("pid") != self.daemon.pid or not tables:
            return
        sample = {f"rocksdb_{k}": sum(m.get(k, 0.0) for m in tables.values()) for k in ROCKSDB_KINDS}
        sample.update({f"malloc_{k}": heap[k] for k in MALLOC_KINDS if k in heap})
        for part in ("python", "kafka"):
            sample.update({f"{part}_{k}": float(v) for k, v in (memory.get(part) or {}).items()})
        if time.monotonic() >= self.next_smaps:
            self.next_smaps = time.monotonic() + SMAPS_EVERY_S
            sample.update({f"proc_{k}": v for k, v in (process_memory(self.daemon.pid) or {}).items()})
        self.rocksdb.append((t, sample))
        for table, s in doc.get("tables", {}).items():
            # The daemon's count restarts with the table's publisher (a wipe, a reopen): add what is new since.
            now, last = (s.get("snapshot") or {}).get("published", 0), self._last_published.get(table, 0)
            self.published[table] = self.published.get(table, 0) + (now - last if now >= last else now)
            self._last_published[table] = now

    def settle(self, what: str, timeout: float = 300.0, compare: bool = True) -> dict[str, int]:
        """Pause the load, wait for an undegraded RUNNING daemon at every log end, compare every table with the
        oracle; returns divergences per table. A daemon that died is counted and replaced.

        Without ``compare`` the load runs on (a fault's pause ends here) and recovery means reaching the log ends
        as they were when it began: an accelerated soak's updates and publications happen while the load runs."""
        for load in self.loads.values():
            if compare:
                load.pause()
            else:
                load.resume()
        try:
            ends = {t: self.broker.admin.end_offsets(topic) for t, topic in self.topics.items()}

            # Compared: at the log end, not past it; a store ahead of a topic recreated empty looks "caught up" to
            # >= until the daemon has found the topic is another one (it may take a few metadata refreshes).
            def at(offset: int, end: int) -> bool:
                return offset == end if compare else offset >= end

            def ok(s: dict) -> bool:
                return s.get("pid") == self.daemon.pid and s["state"] == "RUNNING" and not s.get("degraded") and all(
                    all(at(s["tables"].get(t, {}).get("offsets", {}).get(str(p), -1), o) for p, o in e.items())
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
            out: dict[str, int] = {}
            for table, topic in self.topics.items() if compare else ():
                check = check_store(self.broker, self.daemon.state_dir, table, topic, allow_uncompared=True)
                snaps = check_snapshots(self.broker, self.daemon.state_dir, table, topic)
                out[table] = check.divergences + sum(s.divergences for s in snaps) + (0 if check.compared else 1)
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

    # -- the run ----------------------------------------------------------------------------------------------

    def run(self) -> None:
        """Faults at --fault-every seconds from one injection to the next; a fault whose recovery outlasts the gap
        is followed by the next one at once (the rate reached is reported)."""
        self.rnd = random.Random(self.args.seed)
        deadline = self.started + self.args.minutes * 60
        faults = self.faults()
        self.rnd.shuffle(faults)
        i = 0
        next_fault = time.monotonic() + self.args.fault_every
        next_partial = time.monotonic() + PARTIAL_EVERY_S
        while time.monotonic() < deadline:
            if time.monotonic() >= next_partial:
                next_partial = time.monotonic() + PARTIAL_EVERY_S
                self.write_partial()
            if time.monotonic() < next_fault:
                time.sleep(min(5.0, max(0.0, next_fault - time.monotonic())))
                continue
            name, inject = faults[i % len(faults)]
            i += 1
            row = self.rows.get(name) or self.rows.setdefault(name, self.ledger.row(name, "soak", ""))
            injected_at = time.monotonic()
            self.injections.append(injected_at - self.started)
            if (mb := rss_mb(self.daemon.pid)) is not None:
                self.settled.append((injected_at - self.started, mb))
            print(f"soak: {injected_at - self.started:7.0f}s  {name}", flush=True)
            restarts = self.restarts
            try:
                inject()
            except EventMissed as e:  # a reload not applied, an export not made: it proves nothing, and fails the run
                self.missed += 1
                row.notes.append(f"{MISSED}{e}")
                print(f"soak: EVENT MISSED: {name}: {e}", flush=True)
            row.injected += 1
            # Every fault is waited out; the stores are compared with the oracle after every check_every-th.
            diverged = self.settle(name, compare=i % self.args.check_every == 0)
            row.diverged(sum(diverged.values()))
            row.pid_changes += self.restarts - restarts
            next_fault = injected_at + self.args.fault_every
        final = self.settle("the end of the run")
        self.ledger.row("none (final check)", "soak", "").diverged(sum(final.values()))

    def reached(self, elapsed: float) -> dict[str, float]:
        """Faults, updates and publications reached, beside three hours at the default load."""
        gaps = [b - a for a, b in zip(self.injections, self.injections[1:], strict=False)]
        return reached_vs_default(elapsed, len(self.injections), statistics.fmean(gaps) if gaps else math.nan,
                                  sum(load.sent for load in self.loads.values()), sum(dict(self.published).values()),
                                  len(TABLES), sum(load.failed_batches for load in self.loads.values()))

    def write_partial(self) -> None:
        """The memory figures so far (``partial.json``), so a run cut short still tells its trend."""
        if len(self.memory) < 4:
            return
        elapsed = time.monotonic() - self.started
        partial = {"minutes": round(elapsed / 60, 1), "faults": sum(r.injected for r in self.ledger.rows),
                   "divergences": sum(r.divergences for r in self.ledger.rows), "restarts": self.restarts,
                   "reached": self.reached(elapsed), "after_warmup": slope_after_warmup(self.memory, elapsed),
                   "component_slopes": component_slopes(self.rocksdb, elapsed),
                   "quarters": quarters(self.memory, self.rocksdb, elapsed),
                   "slope_mb_per_hour": round(slope_mb_per_hour(self.memory), 1)}
        out = Path(self.args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "partial.json").write_text(json.dumps(partial, indent=2))

    def report(self) -> bool:
        self._stopping.set()  # the figures below are of the run; the final check's wait was sampled too
        for row in self.ledger.rows:
            row.outcome = "recovered in-process" if row.divergences == 0 and row.pid_changes == 0 else "FAILED"
            if any(n.startswith(MISSED) for n in row.notes):
                row.outcome = "FAILED"
            if not row.injected:
                row.outcome = "checked" if row.divergences == 0 else "FAILED"
        wipes = sum(t.get("wipes", 0) for t in self.daemon.status().get("tables", {}).values())
        elapsed = time.monotonic() - self.started
        mem = [mb for _, mb in self.memory]
        qs = quarters(self.memory, self.rocksdb, elapsed)
        first, last = qs[0]["rss_median_mb"], qs[-1]["rss_median_mb"]
        slope = slope_mb_per_hour(self.memory)
        half = self.memory[-1][0] / 2 if self.memory else 0.0
        slope_last_half = slope_mb_per_hour([s for s in self.memory if s[0] >= half])
        after = slope_after_warmup(self.memory, elapsed)
        others = other_views(self.memory, self.rocksdb, self.settled, elapsed)
        components = component_slopes(self.rocksdb, elapsed)
        reached = self.reached(elapsed)
        divergences = sum(r.divergences for r in self.ledger.rows)
        summary = {
            "minutes": round(elapsed / 60, 1), "seed": self.args.seed, "args": vars(self.args),
            "faults": sum(r.injected for r in self.ledger.rows), "divergences": divergences,
            "restarts": self.restarts, "unrecovered": self.unrecovered, "wipes": wipes, "reached": reached,
            "events_missed": self.missed,
            "rss_mb": {"first_quarter": round(first, 1), "last_quarter": round(last, 1), "max": round(max(mem), 1),
                       "slope_mb_per_hour": round(slope, 1), "slope_last_half_mb_per_hour": round(slope_last_half, 1),
                       "after_warmup": after, "after_warmup_per_default_hour": per_default_hour(after, reached),
                       **{f"after_warmup_{k}": v for k, v in others.items()}},
            "component_slopes_mb_per_hour": components, "quarters": qs,
            "recovery_s": {"median": round(statistics.median(self.recoveries), 1),
                           "max": round(max(self.recoveries), 1)},
            "memory": [(round(t), round(mb, 1)) for t, mb in self.memory],
            "settled": [(round(t, 1), round(mb, 1)) for t, mb in self.settled],
            "components_mb": [(round(t), {k: round(v, 2) for k, v in m.items()}) for t, m in self.rocksdb],
        }
        out = Path(self.args.report_dir)
        self.ledger.write(out, f"Soak, {summary['minutes']} min")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        memory_md = (reached_md(reached) + memory_table(qs, slope, slope_last_half)
                     + verdict(after, components, {OTHER_VIEWS[k]: v for k, v in others.items()})
                     + "\n" + per_default_hour_md(per_default_hour(after, reached)) + "\n"
                     + rocksdb_bound(self.daemon.config, len(TABLES)))
        if self.args.tracemalloc:
            memory_md += tracemalloc_growth(self.tracemalloc_dir)
        (out / "memory.md").write_text(memory_md)
        lines = [f"soak: {summary['minutes']} min, {summary['faults']} faults, {divergences} divergences, "
                 f"{self.restarts} restarts, {self.unrecovered} not recovered within 300 s, {wipes} wipes, "
                 f"{self.missed} reloads or exports that did not happen",
                 f"soak: daemon RSS MB first quarter {first:.0f}, last quarter {last:.0f}, max {max(mem):.0f}, "
                 f"trend {slope:+.1f} MB/h ({slope_last_half:+.1f} MB/h over the last half; after warm-up "
                 f"{after['slope_mb_per_hour']:+.2f}, 95 % [{after['ci95_low']:+.2f}, {after['ci95_high']:+.2f}]); "
                 f"recovery median {summary['recovery_s']['median']} s, max {summary['recovery_s']['max']} s",
                 f"soak: report in {out}"]
        print("\n".join(lines), flush=True)
        print(memory_md, flush=True)
        print((out / "report.md").read_text(), flush=True)
        return divergences == 0 and self.restarts == 0 and self.unrecovered == 0 and self.missed == 0


def _quiet() -> object:
    import logging

    log = logging.getLogger("soak.librdkafka")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    return log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--accelerated", action="store_true",
                   help="three hours of the default load's updates, publications and faults in 45 minutes: "
                        f"{ACCELERATED} unless given")
    p.add_argument("--minutes", type=float, help="how long to run (default 30)")
    p.add_argument("--rate", type=int, help="records per second over all tables (default 2000)")
    p.add_argument("--fault-every", type=float,
                   help="seconds from one fault's injection to the next's (default 45; sooner is impossible "
                        "while a recovery lasts: the rate reached is reported)")
    p.add_argument("--snapshot-interval-ms", type=int, help="[snapshots] interval_ms (default 1000)")
    p.add_argument("--fault-scale", type=float, help="multiplies how long each fault lasts (default 1)")
    p.add_argument("--check-every", type=int,
                   help="compare the stores with the oracle after every Nth fault (default 1; and at the end)")
    p.add_argument("--batches-per-s", type=int, help="produce batches a second per table (default 5)")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    p.add_argument("--report-dir", default=str(report_dir() / "soak"))
    p.add_argument("--block-cache-mb", type=int,
                   help="[store] block_cache_mb per table; a small one shows RSS levelling off within a short run")
    p.add_argument("--kafka", action="append", default=[], metavar="KEY=VALUE",
                   help="a [kafka] client property for the daemon (repeatable): to try a setting's effect on memory")
    p.add_argument("--daemon-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the daemon (repeatable): MALLOC_ARENA_MAX=1, LD_PRELOAD=...")
    p.add_argument("--tracemalloc", action=argparse.BooleanOptionalAction, default=None,
                   help="profile the daemon's Python allocations (slower daemon); top growth in memory.md")
    args = p.parse_args(argv)
    for key, default in (ACCELERATED if args.accelerated else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    args.tracemalloc = bool(args.tracemalloc)
    root = Path(tempfile.mkdtemp(prefix="globald-soak-"))
    print(f"soak: {args.minutes} min, seed {args.seed}, {vars(args)}, working in {root}", flush=True)
    soak = Soak(args, root)
    try:
        soak.start()
        soak.run()
        return 0 if soak.report() else 1
    finally:
        soak.stop()


if __name__ == "__main__":
    sys.exit(main())
