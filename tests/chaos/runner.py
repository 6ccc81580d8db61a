"""Runs the campaign over seeds and writes its table: ``build/chaos/report.md`` and ``report.json``.

The table has one row per (fault kind, phase): how many were injected, recovered, the divergences found, the PID
changes the campaign did not cause, the median and maximum time from healing to RUNNING at the log end, and for
I/O errors and full disks how many the daemon visibly noticed (a failure point nobody hit proves nothing).
Every failed fault is listed below the table with its seed, the command that replays it, what went wrong and the
daemon's log from that fault.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests.chaos import plan, powerloss, tools
from tests.chaos.campaign import Outcome, Probe, SeedRun, Unrecoverable, summarize
from tests.chaos.s3_faults import S3Front
from tests.harness import REPO, Broker
from tests.reliability.disk import mount_tmpfs, unmount
from tests.soak import _quiet
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka

REPORT_ENV = "GLOBALD_CHAOS_REPORT"
TMPFS_MB = 512


def report_dir() -> Path:
    return Path(os.environ.get(REPORT_ENV, REPO / "build" / "chaos"))


@dataclass
class Campaign:
    args: argparse.Namespace
    root: Path
    kafka: EmbeddedKafka = field(init=False)
    broker: Broker = field(init=False)
    disk: Path | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    probes: list[tuple[int, Probe]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    s3: S3Front | None = None  # the S3 emulator and its front, from the first export event on S3
    seed_run: ClassVar[type[SeedRun]] = SeedRun  # one seed's world and faults (tests/chaos/versioned.py's too)
    module: ClassVar[str] = "tests.chaos"  # what replays a fault (python -m …)

    def seeds(self) -> list[int]:
        n = 1 if self.args.only_fault is not None else self.args.seeds
        return list(range(self.args.seed, self.args.seed + n))

    def start(self) -> None:
        self.kafka = EmbeddedKafka(self.root / "kafka").start()
        settings = self.kafka.client_settings
        self.broker = Broker(settings, TopicAdmin.for_broker({**settings, "logger": _quiet()}, self.kafka.zookeeper),
                             self.kafka)
        why = mount_tmpfs(self.root / "disk", TMPFS_MB)
        if why is None:
            self.disk = self.root / "disk"
        else:
            self.notes.append(f"no tmpfs for the state_dir ({why}): disk-full faults fail as not injectable")

    def stop(self) -> None:
        if self.s3 is not None:
            self.s3.stop()
        self.broker.admin.close()
        self.kafka.stop()
        if self.disk is not None:
            unmount(self.disk)

    def run(self) -> None:
        for seed in self.seeds():
            run = self.seed_run(self, seed)
            a = self.args
            faults = self.events(seed)
            say(f"seed {seed}: {a.faults_per_seed} faults, {a.reloads_per_seed} reload, {a.exports_per_seed} "
                f"export and {a.registry_per_seed} registry events planned; working in {run.root}")
            try:
                run.setup()
                for probe in run.probes():
                    self.probes.append((seed, probe))
                    say(f"seed {seed}: probe {probe.name}: {'ok' if probe.ok else 'FAILED'}: {probe.detail}")
                for fault in faults:
                    if not self._selected(fault):
                        continue
                    t0 = time.monotonic()
                    out = run.run(fault)
                    self.outcomes.append(out)
                    say(line(out, time.monotonic() - t0))
            except Unrecoverable as e:
                self.aborted.append(f"seed {seed}: {e}")
                say(f"seed {seed}: ABORTED: {str(e)[:2000]}")
            except Exception as e:  # the campaign itself broke: report it with the seed, go on with the next one
                self.aborted.append(f"seed {seed}: {type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
                say(f"seed {seed}: ABORTED by a campaign error: {e!r}")
            finally:
                run.teardown()

    def events(self, seed: int) -> list[plan.Fault]:
        a = self.args
        return plan.events(seed, a.faults_per_seed, a.reloads_per_seed, a.exports_per_seed, a.registry_per_seed)

    def _selected(self, fault: plan.Fault) -> bool:
        a = self.args
        return ((a.only_fault is None or fault.index == a.only_fault)
                and (not a.only_kind or fault.kind in a.only_kind)
                and (not a.only_phase or fault.phase in a.only_phase))

    # -- the report ---------------------------------------------------------------------------------------------

    def ok(self) -> bool:
        return (not self.aborted and all(p.ok for _, p in self.probes) and bool(self.probes)
                and not any(o.failed for o in self.outcomes))

    def command(self) -> str:
        a = self.args
        cmd = (f"python -m tests.chaos --seed {a.seed} --seeds {a.seeds} --faults-per-seed {a.faults_per_seed} "
               f"--reloads-per-seed {a.reloads_per_seed} --exports-per-seed {a.exports_per_seed} "
               f"--registry-per-seed {a.registry_per_seed}")
        if a.only_fault is not None:
            cmd += f" --only-fault {a.only_fault}"
        return cmd

    def write(self, directory: Path) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        rows = summarize(self.outcomes)
        doc = {"generated": time.time(), "command": self.command(), "minutes": self.minutes(),
               "ok": self.ok(), "seeds": self.seeds(), "faults_per_seed": self.args.faults_per_seed,
               "totals": self.totals(), "probes": [{"seed": s, **p.__dict__} for s, p in self.probes],
               "aborted": self.aborted, "notes": self.notes, "rows": rows,
               "faults": [o.to_json() for o in self.outcomes]}
        js = directory / "report.json"
        js.write_text(json.dumps(doc, indent=2, sort_keys=True))
        md = directory / "report.md"
        md.write_text(self.markdown(rows))
        return js, md

    def minutes(self) -> float:
        return round((time.monotonic() - self.started) / 60, 1)

    def totals(self) -> dict[str, Any]:
        o = self.outcomes
        return {"planned": len(o), "injected": sum(x.injected for x in o),
                "recovered": sum(x.injected and x.recovered for x in o),
                "divergences": sum(x.divergences for x in o), "pid_changes": sum(x.pid_changes for x in o),
                "failed": sum(x.failed for x in o), "not_reached": sum(not x.reached for x in o),
                "campaign_errors": sum(bool(x.campaign_errors) for x in o), "checks": sum(x.checks for x in o)}

    def markdown(self, rows: list[dict[str, Any]]) -> str:
        t = self.totals()
        seeds = self.seeds()
        lines = [f"### Chaos campaign: seeds {seeds[0]}-{seeds[-1]}, {self.args.faults_per_seed} faults each, "
                 f"{self.minutes()} min — {'PASSED' if self.ok() else 'FAILED'}", "",
                 f"`{self.command()}`: {t['injected']} faults injected of {t['planned']} planned "
                 f"({t['not_reached']} phases not reached, {t['campaign_errors']} campaign errors), {t['recovered']} "
                 f"recovered, {t['divergences']} divergences, {t['pid_changes']} PID changes, {t['failed']} failed; "
                 f"{t['checks']} stores and snapshots compared with the oracle.", ""]
        lines += [f"- probe, seed {s}: {p.name}: {'ok' if p.ok else 'FAILED'} ({p.detail})" for s, p in self.probes]
        lines += [f"- note: {n}" for n in self.notes]
        lines += [f"- ABORTED {a.splitlines()[0][:300]}" for a in self.aborted]
        lines += ["", "PID changes count only exits the campaign did not cause (its own SIGKILLs and restarts are "
                  "expected). Recovery time: from the fault healed to RUNNING at every log end, undegraded. "
                  "\"Error seen\": I/O errors and full disks the daemon reported (status or log); for reload events, "
                  "those the daemon applied (its config generation moved); for export events, those exported and "
                  "bootstrapped into a second store equal to the fold.", "",
                  "| fault kind | phase | injected | recovered | divergences | PID changes | recovery median s "
                  "| recovery max s | error seen | failed |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            seen = f"{r['hits']}/{r['hit_of']}" if r["hit_of"] else "-"
            not_reached = r["planned"] - r["injected"]
            injected = f"{r['injected']}" + (f" ({not_reached} not reached)" if not_reached else "")
            lines.append(f"| {r['kind']} | {r['phase']} | {injected} | {r['recovered']} | {r['divergences']} | "
                         f"{r['pid_changes']} | {_num(r['median_recover_s'])} | {_num(r['max_recover_s'])} | "
                         f"{seen} | {r['failed']} |")
        lines.append(f"| **total** | | {t['injected']} | {t['recovered']} | {t['divergences']} | "
                     f"{t['pid_changes']} | | | | {t['failed']} |")
        errors = [o for o in self.outcomes if o.campaign_errors]
        if errors:
            lines += ["", f"#### Campaign errors ({len(errors)}): faults the campaign failed to inject (tables reset "
                      "after each, so that later faults start clean). Each counts as failed: it proves nothing about "
                      "the daemon, and a run meant to prove it does not pass without it", ""]
            lines += [f"- seed {o.fault.seed}, fault {o.fault.index}: {o.fault.describe()}: "
                      f"{'; '.join(o.campaign_errors)[:400]}" for o in errors]
        failed = [o for o in self.outcomes if o.failed]
        lines += ["", f"#### Defects found ({len(failed)})", ""]
        for o in failed:
            f = o.fault
            a = self.args
            lines += [f"- **seed {f.seed}, fault {f.index}**: {f.describe()} — replay: `python -m {self.module} "
                      f"--seed {f.seed} --faults-per-seed {a.faults_per_seed} --reloads-per-seed "
                      f"{a.reloads_per_seed} --exports-per-seed {a.exports_per_seed} --registry-per-seed "
                      f"{a.registry_per_seed} --only-fault {f.index}`"]
            lines += [f"  - {p}" for p in o.problems]
            if o.divergences and not o.problems:
                lines.append(f"  - {o.divergences} divergences")
            lines += [f"  - note: {n}" for n in o.notes]
            if o.log_tail:
                lines += ["  <details><summary>daemon log</summary>", "", "  ```",
                          *["  " + x for x in o.log_tail.splitlines()], "  ```", "  </details>"]
        return "\n".join(lines) + "\n"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def line(o: Outcome, seconds: float) -> str:
    f = o.fault
    head = f"seed {f.seed} #{f.index:<2} {f.describe()}: "
    if not o.injected:
        why = "not injected (" + "; ".join(o.notes + o.problems + o.campaign_errors)[:300] + ")"
        return head + why + (" — FAILED" if o.failed else "")
    rec = f"recovered in {o.recover_s:.1f}s" if o.recover_s is not None else "NOT RECOVERED"
    tail = f"{rec}, {o.divergences} divergences, {o.pid_changes} PID changes, {o.checks} checks ({seconds:.0f}s)"
    if o.failed:
        tail += " — FAILED: " + "; ".join(o.problems)[:600]
    return head + tail


def say(text: str) -> None:
    print(f"chaos: {text}", flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10, help="how many seeds, starting at --seed (default 10)")
    p.add_argument("--faults-per-seed", type=int, default=22, help="faults injected per seed (default 22)")
    p.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--only-fault", type=int, default=None, metavar="K",
                   help="run only fault K of --seed (same --faults-per-seed as the run being replayed)")
    p.add_argument("--reloads-per-seed", type=int, default=3,
                   help="reload events per seed, after its faults (default 3; see tests/chaos/reloads.py)")
    p.add_argument("--exports-per-seed", type=int, default=3,  # 10 seeds: each storage fault with and without a reload
                   help="export events per seed, after its reload events (default 3; see tests/chaos/exports.py)")
    p.add_argument("--registry-per-seed", type=int, default=3,
                   help="Schema Registry fault events per seed, after its export events (default 3; see "
                        "tests/chaos/registry_faults.py)")
    p.add_argument("--only-kind", action="append",
                   choices=(*plan.KINDS, *plan.RELOAD_KINDS, *plan.EXPORT_KINDS, *plan.REGISTRY_KINDS),
                   help="run only faults (or events) of this kind")
    p.add_argument("--only-phase", action="append", choices=(*plan.PHASES, *plan.EXTRA_PHASES),
                   help="run only faults in this phase")
    p.add_argument("--recover-timeout", type=float, default=180.0,
                   help="seconds a healed fault may take to RUNNING at the log end (default 180)")
    p.add_argument("--clock", choices=("python", "libfaketime"), default="python",
                   help="how clock steps reach the daemon: its Python wall clock (default), or libfaketime, which "
                        "makes librdkafka time out at any offset (see tests/chaos/tools.py)")
    p.add_argument("--report-dir", default=None, help=f"where report.md/json go (default build/chaos, ${REPORT_ENV})")
    powerloss.add_arguments(p)
    return p.parse_args(argv)


def run(args: argparse.Namespace, kind: type[Campaign] = Campaign) -> Campaign:
    """The whole campaign (``kind``: the versioned lane's, tests/chaos/versioned.py); the caller decides what a
    failure means (exit status, assert)."""
    root = Path(tempfile.mkdtemp(prefix="globald-chaos-"))
    campaign = kind(args, root)
    say(f"{campaign.command()}; working in {root}")
    try:
        campaign.start()
        campaign.run()
    finally:
        campaign.stop()
        out = Path(args.report_dir) if args.report_dir else report_dir()
        campaign.write(out)
        print((out / "report.md").read_text(), flush=True)
        say(f"report in {out}/report.md and report.json")
    return campaign


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    ok = True
    if args.seeds > 0:  # --seeds 0: the power-loss lane alone
        why = tools.missing(args.clock)
        if why is not None:
            say(f"cannot run: {why}")
            return 2
        ok = run(args).ok()
    if args.powerloss_seeds > 0:
        out = Path(args.report_dir) if args.report_dir else report_dir()
        ok = powerloss.run(args.seed, args.powerloss_seeds, args.powerloss_cuts, out).ok() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
