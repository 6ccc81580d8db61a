"""The chaos campaign's power-loss lane: cuts of the real daemon's disk at random moments of every phase.

Per seed: the campaign's two tables (one restored as a bulk load, one small) under a steady produce load, and the
daemon (through ``tests.chaos.entry``, for its phase hooks) with its state_dir on a loop-mounted file system image
(``tests.reliability.powercut``: ext4 ``commit=600,noauto_da_alloc``; XFS too when ``mkfs.xfs`` is installed, every
other seed). Each cut drives the daemon to a phase (restore, bulk-load end, commit, steady state, snapshot publish,
stop), where its hook freezes it; it then runs on for a random few milliseconds (or none), is SIGKILLed, and the
image is copied at once: the copy, mounted in its place, is the disk after a power loss and a reboot. Before any
daemon opens it, every live store must equal the oracle fold at its own offsets, every ``.checkpoint`` be whole and
claim nothing beyond its store, and every listed snapshot and CURRENT open and equal the fold at its manifest's
offsets. Then a daemon started there must reach RUNNING at every log end by itself, and the same checks hold on
what it serves. The next cut is made on that disk. A phase not reached is a failed cut: it proved nothing.

``python -m tests.chaos`` runs this lane after the campaign (``--powerloss-seeds``, ``--powerloss-cuts``); it
writes ``powerloss.md`` and ``powerloss.json`` beside the campaign's report. Needs root (loop devices).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from globald.embedded.broker import free_port
from tests.chaos import entry, plan
from tests.chaos.campaign import BULK_KEYS, BULK_RECORDS, PARTITIONS, SMALL_KEYS, SMALL_RECORDS, produce_pinned
from tests.chaos.daemon import ChaosDaemon, stopped_at_hook
from tests.harness import Broker, globald, random_records, write_config
from tests.reliability.load import Load
from tests.reliability.powercut import CutReport, ImageError, LoopImage, can_mount, check_cut
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka

PHASES = (plan.RESTORE, plan.BULK_END, plan.COMMIT, plan.STEADY, plan.PUBLISH, plan.STOP)
HOOK_TIMEOUT_S = 90.0
RECOVER_TIMEOUT_S = 180.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--powerloss-seeds", type=int, default=5,
                   help="seeds of the power-loss lane, from --seed (default 5; 0 leaves the lane out; needs root)")
    p.add_argument("--powerloss-cuts", type=int, default=12,
                   help="power cuts per seed, cycling through the lane's six phases (default 12)")


@dataclass
class Cut:
    seed: int
    index: int
    phase: str
    fs: str
    table: str
    delay_ms: float = 0.0  # how long the daemon ran on after its hook froze it, before the kill
    reached: bool = False
    recovered: bool = False
    recover_s: float | None = None
    stores: int = 0
    snapshots: int = 0
    currents: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.problems) or not self.reached or not self.recovered

    def describe(self) -> str:
        return f"seed {self.seed} cut {self.index}: {self.phase} on {self.table} ({self.fs}, +{self.delay_ms:.0f} ms)"


def why_not(fs: str = "ext4") -> str | None:
    why = can_mount()
    if why is None and shutil.which(f"mkfs.{fs}") is None:
        why = f"mkfs.{fs} is not installed"
    return why


class PowerSeed:
    """One seed of the lane: its topics, load, disk image and daemon, cut again and again."""

    def __init__(self, broker: Broker, root: Path, seed: int, fs: str) -> None:
        self.broker, self.seed, self.fs = broker, seed, fs
        self.root = root / f"powerloss-{seed}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.topics = {plan.BULK: f"power-{seed}-bulk", plan.SMALL: f"power-{seed}-small"}
        self.loads: dict[str, Load] = {}
        self.image = LoopImage(self.root / "disk", fs)
        self.arm_path = self.root / "arm.json"
        self.arm_ids = 0
        self.port = free_port()
        self.config = write_config(self.root / "globald.toml", self.image.mount / "state", broker.settings,
                                   self.topics, commit_interval_ms=300, log_level="INFO",
                                   http={"enabled": True, "port": self.port},
                                   snapshots={"interval_ms": 500, "retain": 3})
        self.daemon: ChaosDaemon | None = None

    @property
    def admin(self) -> TopicAdmin:
        return self.broker.admin

    def setup(self) -> None:
        self.image.__enter__()
        for i, (table, topic) in enumerate(self.topics.items()):
            self.admin.create(topic, partitions=PARTITIONS)
            n, keys = (BULK_RECORDS, BULK_KEYS) if table == plan.BULK else (SMALL_RECORDS, SMALL_KEYS)
            produce_pinned(self.admin, topic, random_records(n, keys=keys, seed=self.seed * 100 + i))
            self.loads[table] = Load(self.admin, topic, rate=100 if table == plan.BULK else 40, keys=keys,
                                     seed=self.seed * 100 + 10 + i, pin_partitions=PARTITIONS)
        self._arm({})
        self._start()
        self._settle()
        for load in self.loads.values():
            load.start()
            load.resume()  # _settle paused it before it started: commits and publishes need records coming

    def teardown(self) -> None:
        for load in self.loads.values():
            load.stop()
        try:
            if self.daemon is not None and self.daemon.alive():
                self.daemon.thaw()
                self.daemon.stop(signal.SIGKILL)
        finally:
            self.image.__exit__(None, None, None)

    # -- one cut ----------------------------------------------------------------------------------------------

    def cut(self, index: int) -> Cut:
        rnd = random.Random(f"powerloss:{self.seed}:{index}")
        phase = PHASES[(self.seed + index) % len(PHASES)]
        table = plan.BULK if phase == plan.BULK_END or rnd.random() < 0.6 else plan.SMALL
        out = Cut(self.seed, index, phase, self.fs, table)
        d = self.daemon
        assert d is not None
        if phase == plan.STEADY:
            time.sleep(rnd.uniform(0.2, 3.0))
            out.reached = True
        else:
            arm_id = self._next_id()
            arm = {"id": arm_id, "phase": phase, "action": "freeze", "table": table,
                   "fraction": round(rnd.uniform(0.05, 0.9), 2),
                   "nth": rnd.randint(1, 3) if phase == plan.COMMIT else rnd.randint(1, 6) if phase == plan.PUBLISH
                   else 1}
            self._arm(arm)
            if phase in (plan.RESTORE, plan.BULK_END):  # a restore from the log start: the table is reset
                r = globald("reset", "--config", str(self.config), "--table", table, "--yes", timeout=90)
                if r.returncode != 0:
                    out.problems.append(f"globald reset exited {r.returncode}: {r.stderr.strip()[-300:]}")
            elif phase == plan.STOP:
                os.kill(d.pid, signal.SIGTERM)
            out.reached = not out.problems and self._fired(arm_id)
            self._arm({})
            if out.reached and rnd.random() < 0.7:  # else cut right at the hook
                out.delay_ms = rnd.uniform(0.0, 250.0)
                d.thaw()
                time.sleep(out.delay_ms / 1000)
        if not out.reached:
            out.problems.append(f"phase {phase} not reached within {HOOK_TIMEOUT_S:.0f}s")
        os.kill(d.pid, signal.SIGKILL)
        d.exit_code(30)
        self.image.power_cycle()  # at once: nothing writes to the disk any more, nothing may reach it
        for t, topic in self.topics.items():
            restoring = out.phase in (plan.RESTORE, plan.BULK_END) and t == table
            self._absorb(out, check_cut(self.broker, self.state, t, topic, require_store=not restoring,
                                        require_current=True), "after the cut")
        started = time.monotonic()
        self._start()
        try:
            self._settle()
            out.recovered, out.recover_s = True, time.monotonic() - started
        except AssertionError as e:
            out.problems.append(f"the daemon on the disk after the cut did not reach RUNNING at the log end: "
                                f"{str(e)[:1500]}")
            self._restart()
        for t, topic in self.topics.items():  # what the recovered daemon serves, the load paused
            self._absorb(out, check_cut(self.broker, self.state, t, topic, require_store=True, require_current=True),
                         "after recovery")
        for load in self.loads.values():
            load.resume()
        return out

    @staticmethod
    def _absorb(out: Cut, report: CutReport, when: str) -> None:
        out.problems += [f"{when}: {p}" for p in report.problems]
        if when == "after the cut":
            out.stores += report.stores
            out.snapshots += report.snapshots
            out.currents += report.currents

    # -- the daemon ---------------------------------------------------------------------------------------------

    @property
    def state(self) -> Path:
        return self.image.mount / "state"

    def _start(self) -> None:
        self.daemon = ChaosDaemon(self.config, self.root / "daemon.log", env={entry.ARM_ENV: str(self.arm_path)},
                                  http_port=self.port, state=self.state)
        self.daemon.start()

    def _settle(self) -> None:
        """Pause the load; RUNNING and ready at every log end, and each CURRENT a snapshot at those ends, or
        AssertionError. The last part keeps the check after recovery from racing the daemon: a snapshot published
        at the ends between the checker's listing and its read of CURRENT would be named by CURRENT and not listed."""
        for load in self.loads.values():
            load.pause()
        assert self.daemon is not None
        ends = {t: self.admin.end_offsets(topic) for t, topic in self.topics.items()}
        self.daemon.wait_running(ends, timeout=RECOVER_TIMEOUT_S)

        def published_at_ends(doc: dict[str, Any]) -> bool:
            return all(((doc["tables"][t]["snapshot"] or {}).get("offsets") or {}).get(str(p), 0) >= o
                       for t, want in ends.items() for p, o in want.items())

        self.daemon.wait_for(published_at_ends, RECOVER_TIMEOUT_S, f"CURRENT at {ends}")

    def _restart(self) -> None:
        """A daemon that did not recover is replaced, so that the seed can go on (the cut already failed)."""
        if self.daemon is not None and self.daemon.alive():
            self.daemon.thaw()
            self.daemon.stop(signal.SIGKILL)
        self._start()
        self._settle()

    def _next_id(self) -> int:
        self.arm_ids += 1
        return self.arm_ids

    def _arm(self, doc: dict[str, Any]) -> None:
        tmp = self.arm_path.with_name(self.arm_path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.arm_path)

    def _fired(self, arm_id: int) -> bool:
        assert self.daemon is not None
        return stopped_at_hook(self.daemon, self.arm_path.with_name(f"{self.arm_path.name}.fired-{arm_id}"),
                               HOOK_TIMEOUT_S)


# -- the lane: seeds, report -----------------------------------------------------------------------------------


@dataclass
class Lane:
    seeds: list[int]
    cuts_per_seed: int
    cuts: list[Cut] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    minutes: float = 0.0

    def ok(self) -> bool:
        return not self.aborted and len(self.cuts) == len(self.seeds) * self.cuts_per_seed and not any(
            c.failed for c in self.cuts)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for phase in PHASES:
            cuts = [c for c in self.cuts if c.phase == phase]
            times = [c.recover_s for c in cuts if c.recover_s is not None]
            out.append({"phase": phase, "cuts": len(cuts), "reached": sum(c.reached for c in cuts),
                        "recovered": sum(c.recovered for c in cuts), "failed": sum(c.failed for c in cuts),
                        "stores": sum(c.stores for c in cuts), "snapshots": sum(c.snapshots for c in cuts),
                        "currents": sum(c.currents for c in cuts),
                        "median_recover_s": statistics.median(times) if times else None,
                        "max_recover_s": max(times) if times else None})
        return out

    def markdown(self) -> str:
        failed = [c for c in self.cuts if c.failed]
        fss = sorted({c.fs for c in self.cuts})
        verdict = "PASSED" if self.ok() else "FAILED"
        lines = [f"### Power-loss lane: seeds {self.seeds[0]}-{self.seeds[-1]}, {self.cuts_per_seed} cuts each, "
                 f"{', '.join(fss) or 'no file system'}, {self.minutes:.1f} min — {verdict}",
                 "", f"{len(self.cuts)} cuts, {len(failed)} failed. After each cut (SIGKILL, the disk image copied at "
                 "once, mounted in its place) and before any daemon opened it: live stores, `.checkpoint` files, "
                 "snapshots and CURRENT compared with the oracle; then a daemon on that disk must reach RUNNING at "
                 "every log end.", ""]
        lines += [f"- note: {n}" for n in self.notes]
        lines += [f"- ABORTED {a.splitlines()[0][:300]}" for a in self.aborted]
        lines += ["", "| phase | cuts | reached | recovered | stores compared | snapshots compared | CURRENT verified "
                  "| recovery median s | max s | failed |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows():
            med = "-" if r["median_recover_s"] is None else f"{r['median_recover_s']:.1f}"
            top = "-" if r["max_recover_s"] is None else f"{r['max_recover_s']:.1f}"
            lines.append(f"| {r['phase']} | {r['cuts']} | {r['reached']} | {r['recovered']} | {r['stores']} | "
                         f"{r['snapshots']} | {r['currents']} | {med} | {top} | {r['failed']} |")
        lines += ["", f"#### Failed cuts ({len(failed)})", ""]
        for c in failed:
            lines.append(f"- **{c.describe()}**: replay: `python -m tests.chaos --seeds 0 --seed {c.seed} "
                         f"--powerloss-seeds 1 --powerloss-cuts {c.index + 1}`")
            lines += [f"  - {p[:1500]}" for p in c.problems]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        doc = {"generated": time.time(), "ok": self.ok(), "seeds": self.seeds, "cuts_per_seed": self.cuts_per_seed,
               "minutes": self.minutes, "aborted": self.aborted, "notes": self.notes, "rows": self.rows(),
               "cuts": [{**asdict(c), "failed": c.failed} for c in self.cuts]}
        (directory / "powerloss.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
        md = directory / "powerloss.md"
        md.write_text(self.markdown())
        return md


def say(text: str) -> None:
    print(f"powerloss: {text}", flush=True)


def run(first_seed: int, seeds: int, cuts_per_seed: int, report_dir: Path) -> Lane:
    """The lane on its own embedded broker; the caller decides what a failure means."""
    lane = Lane(list(range(first_seed, first_seed + seeds)), cuts_per_seed)
    why = why_not()
    if why is not None:
        lane.aborted.append(f"cannot cut power: {why} (run as root, or pass --powerloss-seeds 0)")
        lane.write(report_dir)
        return lane
    xfs = why_not("xfs") is None
    if not xfs:
        lane.notes.append("mkfs.xfs is not installed (Debian package xfsprogs): every seed on ext4")
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="globald-powerloss-"))
    kafka = EmbeddedKafka(root / "kafka").start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    broker = Broker(kafka.client_settings, admin, kafka)
    try:
        for seed in lane.seeds:
            fs = "xfs" if xfs and seed % 2 else "ext4"
            one = PowerSeed(broker, root, seed, fs)
            say(f"seed {seed}: {cuts_per_seed} cuts on {fs}; working in {one.root}")
            try:
                one.setup()
                for i in range(cuts_per_seed):
                    t0 = time.monotonic()
                    c = one.cut(i)
                    lane.cuts.append(c)
                    verdict = "FAILED: " + "; ".join(c.problems)[:600] if c.failed else "ok"
                    say(f"{c.describe()}: {c.stores} stores, {c.snapshots} snapshots, {c.currents} CURRENT checked, "
                        f"recovered in {c.recover_s or 0:.1f}s ({time.monotonic() - t0:.0f}s): {verdict}")
            except (AssertionError, ImageError, OSError) as e:
                lane.aborted.append(f"seed {seed}: {type(e).__name__}: {str(e)[:3000]}")
                say(f"seed {seed}: ABORTED: {str(e)[:2000]}")
            finally:
                one.teardown()
    finally:
        admin.close()
        kafka.stop()
        shutil.rmtree(root, ignore_errors=True)
        lane.minutes = (time.monotonic() - started) / 60
        md = lane.write(report_dir)
        print(md.read_text(), flush=True)
        say(f"report in {md} and powerloss.json")
    return lane
