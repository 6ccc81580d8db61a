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
from globald.store.names import STATUS_FILE, db_dir
from tests.harness import Broker, DaemonProcess, random_records, write_config
from tests.reliability.checks import check_snapshots, check_store
from tests.reliability.disk import fill, mount_tmpfs, unmount
from tests.reliability.ledger import FaultRow, Ledger, report_dir
from tests.reliability.load import Load

TABLES = ("customers", "products")
MAX_PARTITIONS = 6
PARTIAL_EVERY_S = 300.0  # how often a run writes its memory figures so far


# What the daemon's status reports of RocksDB's memory (globald.ops.memory), summed over the tables, in MB.
ROCKSDB_KINDS = ("block_cache_mb", "memtables_mb", "table_readers_mb")
# glibc's heap (globald.ops.memory.malloc_bytes): handed out, and free but kept (fragmentation).
MALLOC_KINDS = ("in_use_mb", "free_mb")


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
    status_path: Path = field(init=False)
    topics: dict[str, str] = field(default_factory=dict)
    loads: dict[str, Load] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    rows: dict[str, FaultRow] = field(default_factory=dict)
    memory: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, RSS MB)
    # (seconds, {ROCKSDB_KINDS and malloc_ + MALLOC_KINDS: MB}), from the daemon's status
    rocksdb: list[tuple[float, dict[str, float]]] = field(default_factory=list)
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
        store = {} if self.args.block_cache_mb is None else {"store": {"block_cache_mb": self.args.block_cache_mb}}
        cfg = write_config(self.root / "globald-soak.toml", state, settings, self.topics, commit_interval_ms=1000,
                           metadata_refresh_ms=2000, http={"enabled": False}, snapshots={"interval_ms": 1000}, **store)
        env = None
        if self.args.tracemalloc:
            shutil.rmtree(self.tracemalloc_dir, ignore_errors=True)  # an earlier run's dumps would be compared
            # A dump every eighth of the run: the quarters' boundaries all fall near one.
            env = {"GLOBALD_TRACEMALLOC_DIR": str(self.tracemalloc_dir),
                   "GLOBALD_TRACEMALLOC_INTERVAL_S": str(max(30, round(self.args.minutes * 60 / 8)))}
        self.daemon = DaemonProcess(cfg, self.root / "daemon.log", env=env).start()
        self.status_path = state / STATUS_FILE
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

    @property
    def tracemalloc_dir(self) -> Path:
        return Path(self.args.report_dir) / "tracemalloc"

    def sample_memory(self) -> None:
        t = time.monotonic() - self.started
        mb = rss_mb(self.daemon.pid)
        if mb is not None:
            self.memory.append((t, mb))
        try:  # the daemon's own file, read directly: `globald status` would cost a Python start per sample
            doc = json.loads(self.status_path.read_bytes())
        except (OSError, ValueError):
            return
        memory = doc.get("memory") or {}
        tables, heap = memory.get("tables") or {}, memory.get("malloc") or {}
        if doc.get("pid") == self.daemon.pid and tables:
            sample = {k: sum(m.get(k, 0.0) for m in tables.values()) for k in ROCKSDB_KINDS}
            sample.update({f"malloc_{k}": heap[k] for k in MALLOC_KINDS if k in heap})
            self.rocksdb.append((t, sample))

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
        next_partial = time.monotonic() + PARTIAL_EVERY_S
        while time.monotonic() < deadline:
            self.sample_memory()
            if time.monotonic() >= next_partial:
                next_partial = time.monotonic() + PARTIAL_EVERY_S
                self.write_partial()
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

    def write_partial(self) -> None:
        """The memory figures so far (``partial.json``), so a run cut short still tells its trend."""
        if len(self.memory) < 4:
            return
        elapsed = time.monotonic() - self.started
        partial = {"minutes": round(elapsed / 60, 1), "faults": sum(r.injected for r in self.ledger.rows),
                   "divergences": sum(r.divergences for r in self.ledger.rows), "restarts": self.restarts,
                   "quarters": _quarters(self.memory, self.rocksdb, elapsed),
                   "slope_mb_per_hour": round(_slope_mb_per_hour(self.memory), 1)}
        out = Path(self.args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "partial.json").write_text(json.dumps(partial, indent=2))

    def report(self) -> bool:
        for row in self.ledger.rows:
            row.outcome = "recovered in-process" if row.divergences == 0 and row.pid_changes == 0 else "FAILED"
            if not row.injected:
                row.outcome = "checked" if row.divergences == 0 else "FAILED"
        wipes = sum(t.get("wipes", 0) for t in self.daemon.status().get("tables", {}).values())
        mem = [mb for _, mb in self.memory]
        quarters = _quarters(self.memory, self.rocksdb, time.monotonic() - self.started)
        first, last = quarters[0]["rss_median_mb"], quarters[-1]["rss_median_mb"]
        slope = _slope_mb_per_hour(self.memory)
        half = self.memory[-1][0] / 2 if self.memory else 0.0
        slope_last_half = _slope_mb_per_hour([s for s in self.memory if s[0] >= half])
        divergences = sum(r.divergences for r in self.ledger.rows)
        summary = {
            "minutes": round((time.monotonic() - self.started) / 60, 1), "seed": self.args.seed,
            "rate": self.args.rate, "faults": sum(r.injected for r in self.ledger.rows), "divergences": divergences,
            "restarts": self.restarts, "unrecovered": self.unrecovered, "wipes": wipes,
            "rss_mb": {"first_quarter": round(first, 1), "last_quarter": round(last, 1), "max": round(max(mem), 1),
                       "slope_mb_per_hour": round(slope, 1), "slope_last_half_mb_per_hour": round(slope_last_half, 1)},
            "quarters": quarters,
            "recovery_s": {"median": round(statistics.median(self.recoveries), 1),
                           "max": round(max(self.recoveries), 1)},
            "memory": [(round(t), round(mb, 1)) for t, mb in self.memory],
            "rocksdb_mb": [(round(t), {k: round(v, 2) for k, v in m.items()}) for t, m in self.rocksdb],
        }
        out = Path(self.args.report_dir)
        self.ledger.write(out, f"Soak, {summary['minutes']} min")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        memory_md = _memory_table(quarters, slope, slope_last_half) + _rocksdb_bound(self.daemon.config)
        if self.args.tracemalloc:
            memory_md += _tracemalloc_growth(self.tracemalloc_dir)
        (out / "memory.md").write_text(memory_md)
        lines = [f"soak: {summary['minutes']} min, {summary['faults']} faults, {divergences} divergences, "
                 f"{self.restarts} restarts, {self.unrecovered} not recovered within 300 s, {wipes} wipes",
                 f"soak: daemon RSS MB first quarter {first:.0f}, last quarter {last:.0f}, max {max(mem):.0f}, "
                 f"trend {slope:+.0f} MB/h ({slope_last_half:+.0f} MB/h over the last half); recovery median "
                 f"{summary['recovery_s']['median']} s, max {summary['recovery_s']['max']} s",
                 f"soak: report in {out}"]
        print("\n".join(lines), flush=True)
        print(memory_md, flush=True)
        print((out / "report.md").read_text(), flush=True)
        return divergences == 0 and self.restarts == 0 and self.unrecovered == 0


def _slope_mb_per_hour(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 2:
        return 0.0
    ts, ms = [t for t, _ in samples], [m for _, m in samples]
    mt, mm = statistics.fmean(ts), statistics.fmean(ms)
    var = sum((t - mt) ** 2 for t in ts)
    return 0.0 if var == 0 else sum((t - mt) * (m - mm) for t, m in samples) / var * 3600


def _quarters(rss: list[tuple[float, float]], rocksdb: list[tuple[float, dict[str, float]]],
              duration: float) -> list[dict[str, float]]:
    """RSS median and maximum, and the median of each RocksDB kind, in each quarter of the run's time (faults make
    sampling uneven, so quarters of the samples would not be quarters of the run)."""
    out = []
    for q in range(4):
        lo, hi = duration * q / 4, duration * (q + 1) / 4
        mem = [mb for t, mb in rss if lo <= t < hi]
        row = {"quarter": q + 1, "from_min": round(lo / 60, 1), "to_min": round(hi / 60, 1), "samples": len(mem),
               "rss_median_mb": round(statistics.median(mem), 1) if mem else float("nan"),
               "rss_max_mb": round(max(mem), 1) if mem else float("nan")}
        db = [m for t, m in rocksdb if lo <= t < hi]
        for kind in (*ROCKSDB_KINDS, *(f"malloc_{k}" for k in MALLOC_KINDS)):
            values = [m[kind] for m in db if kind in m]
            row[f"rocksdb_{kind}"] = round(statistics.median(values), 1) if values else float("nan")
        out.append(row)
    return out


def _memory_table(quarters: list[dict[str, float]], slope: float, slope_last_half: float) -> str:
    lines = ["## Daemon memory by quarter (MB; RocksDB: medians summed over the tables; malloc: glibc heap medians)",
             "", "| quarter | minutes | samples | RSS median | RSS max | block cache | memtables | table readers | "
             "malloc in use | malloc free |", "|---|---|---|---|---|---|---|---|---|---|"]
    for q in quarters:
        lines.append(f"| {q['quarter']} | {q['from_min']}-{q['to_min']} | {q['samples']} | {q['rss_median_mb']} | "
                     f"{q['rss_max_mb']} | {q['rocksdb_block_cache_mb']} | {q['rocksdb_memtables_mb']} | "
                     f"{q['rocksdb_table_readers_mb']} | {q['rocksdb_malloc_in_use_mb']} | "
                     f"{q['rocksdb_malloc_free_mb']} |")
    lines += ["", f"RSS trend: {slope:+.1f} MB/hour over the whole run, {slope_last_half:+.1f} MB/hour over the last "
              "half.", ""]
    return "\n".join(lines) + "\n"


def _rocksdb_bound(config: Path) -> str:
    """What the [store] settings allow RocksDB per table (see globald.store.options): the block cache, and the
    memtables of the values family plus those of the two small families."""
    from globald.config import load
    from globald.store.options import _SMALL_FAMILY_BUFFER_MB

    s = load(config).store
    memtables = (s.write_buffer_mb + 2 * _SMALL_FAMILY_BUFFER_MB) * s.max_write_buffers
    per_table = s.block_cache_mb + memtables
    return (f"RocksDB bound per table from [store]: block cache {s.block_cache_mb} MB + memtables "
            f"({s.write_buffer_mb} + 2 x {_SMALL_FAMILY_BUFFER_MB}) MB x {s.max_write_buffers} = {per_table} MB; "
            f"{len(TABLES)} tables: {per_table * len(TABLES)} MB (the block cache alone: "
            f"{s.block_cache_mb * len(TABLES)} MB).\n")


def _tracemalloc_growth(directory: Path, top: int = 25) -> str:
    """The lines whose Python allocations grew most from the dump nearest the end of the first quarter to the last
    dump (dumps come every eighth of the run: the third is the first quarter's end)."""
    import tracemalloc

    dumps = sorted(directory.glob("tracemalloc-*.bin"))
    if len(dumps) < 3:
        return f"\nFewer than 3 tracemalloc dumps in {directory}: no comparison.\n"
    early, late = tracemalloc.Snapshot.load(str(dumps[2])), tracemalloc.Snapshot.load(str(dumps[-1]))
    keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
    early, late = early.filter_traces(keep), late.filter_traces(keep)
    total = sum(s.size for s in late.statistics("filename")) - sum(s.size for s in early.statistics("filename"))
    lines = [f"## Python allocations (tracemalloc), {dumps[2].name} -> {dumps[-1].name}: {total / 2**20:+.2f} MB",
             "", "```"]
    lines += [str(d) for d in late.compare_to(early, "lineno")[:top]]
    return "\n".join(["", *lines, "```", ""])


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
    p.add_argument("--block-cache-mb", type=int, default=None,
                   help="[store] block_cache_mb per table; a small one shows RSS levelling off within a short run")
    p.add_argument("--tracemalloc", action="store_true",
                   help="profile the daemon's Python allocations (slower daemon); top growth in memory.md")
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
