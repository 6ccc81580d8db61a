"""The campaign's versioned lane (issue 45): ``python -m tests.chaos.versioned`` (part of ``make chaos``).

The campaign's broker, Kafka 0.9, gives its records no timestamps, and a versioned table refuses as-of lookups there
by design (docs/as-of.md). This lane runs the same campaign (plan, drive, heal, checks, report: ``runner.Campaign``
and ``campaign.SeedRun``, not a copy) on an embedded Tansu, whose records keep the timestamps a producer sets and
whose topics have configs. Per seed the ``bulk`` table (110k records, a bulk load) is versioned (``history``), the
``small`` one plain until a reload gives it history. Every record produced in the lane (the preload, the steady
load, the tables reload events add) is stamped here (``TimedAdmin``): near the wall clock, out of order by up to
±5 s, one in twenty 1 to 30 minutes back (before ``since``), some a tie (the same key and time twice: the later offset
answers), with the load's tombstones. Every topic has ``min.compaction.lag.ms`` = ``LAG_MS``, from which the daemon
derives ``since``.

Faults: the campaign's own cycle of (kind, phase) cells, less the kinds Tansu cannot take (``SKIPPED``: each says
why in the report), and its reload events, each of which also changes ``history`` (``HISTORY_STEPS``): adds it to
the plain table or removes it, shrinks or grows the versioned one's window. After every event, besides the
campaign's checks, ``asof_checks`` compares what the tables answer as of a time with the as-of fold and checks
``since``.
"""

from __future__ import annotations

import contextlib
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from globald.embedded.admin import TimedRecord
from globald.embedded.tansu import EmbeddedTansu
from globald.snapshot import leases
from globald.store.names import SNAPSHOT_DROPPED_PREFIX, snapshots_dir
from tests.chaos import asof_checks, plan, runner, tools
from tests.chaos.campaign import SeedRun
from tests.chaos.outcome import PARTITIONS, READER, Outcome, Unrecoverable
from tests.chaos.plan import Fault
from tests.chaos.reloads import ConfigFile
from tests.harness import Broker
from tests.reliability.disk import mount_tmpfs, unmount
from tests.support.admin import Record, TansuAdmin
from tests.support.broker import EmbeddedKafka

LAG_MS = 600_000  # every lane topic's min.compaction.lag.ms: since = a replay's start less this
BULK_HISTORY = "1h"  # the versioned table's window at the start of each seed
KINDS = (plan.IO_ERROR, plan.DISK_FULL, plan.KILL, plan.PAUSE, plan.BROKER_PAUSE, plan.CLOCK)
SKIPPED = {
    plan.BROKER_KILL: "Tansu keeps its data in memory only: a killed broker comes back empty, a new topic, not a "
                      "fault the daemon lives through (the 0.9 campaign has it)",
    plan.BROKER_RESTART: "Tansu keeps its data in memory only: a restarted broker comes back empty (the 0.9 "
                         "campaign has it)",
    plan.RETENTION: "Tansu has no retention, and DeleteRecords crashes it (the 0.9 campaign has it)",
}
RECREATED = ("with librdkafka 2.16 a consumer assigned a Tansu topic that is deleted dies (SIGSEGV in librdkafka's "
             "main thread, globald or not): the lane recreates one topic per seed only while the daemon is stopped "
             "(lane_plan), which must find it by its new topic ID at its start (KIP-516) and wipe it (KIP-406)")
# What each reload event does to ``history`` besides its own change, in turn from the seed's number: the plain
# table gains history (a replay: since = its start less the lag) or loses it; the versioned one's window shrinks
# (since moves forward at once) or grows back (since stays).
HISTORY_STEPS = ("toggle small", "toggle bulk window")
SHORT_WINDOW = "2m"
WINDOWS_MS = {BULK_HISTORY: 3_600_000, SHORT_WINDOW: 120_000}
TICK = b"tick-"  # a record alone in its batch at the end of each produce: Tansu's watermark is then the end


def lane_plan(seed: int, faults: int, reloads: int) -> list[Fault]:
    """The campaign's (kind, phase) cycle less the skipped kinds (``plan``'s parameters), then one topic recreated
    while the daemon is stopped (a KIP-406 wipe: on the bulk table for odd seeds, the small one for even), then
    the campaign's reload events."""
    cells = [c for c in plan.cycle() if c[0] in KINDS]
    wipe = Fault(seed, faults, plan.RECREATE, plan.START,
                 {**plan.params(seed, faults, plan.RECREATE, plan.START), "when": "before-start",
                  "table": plan.BULK if seed % 2 else plan.SMALL})
    return [*plan._take(cells, seed, faults, 0), wipe, *plan.reloads(seed, reloads, faults + 1)]


class TimedAdmin(TansuAdmin):
    """The lane's admin: stamps the records produced (see the module's doc), ends each produce with a tick alone
    in its batch in every partition, and creates topics with ``min.compaction.lag.ms``."""

    def __init__(self, client_settings: dict[str, Any], seed: int = 45) -> None:
        super().__init__(client_settings)
        self._rnd = random.Random(seed)
        self._lock = threading.Lock()  # the loads' threads and the campaign's produce at once

    def create(self, topic: str, partitions: int = 3, compact: bool = True,
               config: dict[str, str] | None = None) -> None:
        super().create(topic, partitions, compact, {"min.compaction.lag.ms": str(LAG_MS), **(config or {})})

    def produce(self, topic: str, records: Iterable[Record | TimedRecord], partition: int | None = None,
                timestamp: int | None = None, partition_of: Callable[[bytes | None], int] | None = None) -> int:
        timed = self._stamp(records)
        n = super().produce(topic, timed, partition=partition, partition_of=partition_of)
        now = int(time.time() * 1000)
        ticks: list[TimedRecord] = [(TICK + b"%d" % p, b"tick", now, None) for p in range(PARTITIONS)]
        super().produce(topic, ticks, partition_of=lambda key: int((key or b"0")[len(TICK):]))
        return n

    def _stamp(self, records: Iterable[Record | TimedRecord]) -> list[TimedRecord]:
        out: list[TimedRecord] = []
        now = int(time.time() * 1000)
        with self._lock:
            rnd = self._rnd
            for r in records:
                if len(r) == 4:
                    out.append(r)
                    continue
                key, value = r[0], r[1]
                ts = now - rnd.randrange(60_000, 1_800_000) if rnd.random() < 0.05 else now + rnd.randrange(-5_000,
                                                                                                             5_000)
                out.append((key, value, ts, None))
                if key is not None and value is not None and rnd.random() < 0.03:
                    out.append((key, b"tie-" + value, ts, None))  # a tie: the later offset answers
        return out


class TansuKafka:
    """What the campaign asks of its broker (``EmbeddedKafka``'s ``start_broker``, ``broker_pid``), on Tansu. A
    Tansu that is gone cannot be started again with its data: the seed cannot go on."""

    def __init__(self, run_dir: Path) -> None:
        self.tansu = EmbeddedTansu(run_dir)

    @property
    def client_settings(self) -> dict[str, str]:
        return self.tansu.client_settings

    @property
    def broker_pid(self) -> int | None:
        return self.tansu.pid

    def start_broker(self) -> None:
        if self.tansu.pid is None:
            raise Unrecoverable("the Tansu broker is gone, and its data with it: the seed cannot go on")

    def stop_broker(self, sig: int = 0) -> None:
        raise NotImplementedError(SKIPPED[plan.BROKER_RESTART])

    def stop(self) -> None:
        self.tansu.stop()


@dataclass
class VersionedConfig(ConfigFile):
    """The campaign's config file with ``history`` on the tables that have it (table -> window)."""

    history: dict[str, str] = field(default_factory=lambda: {plan.BULK: BULK_HISTORY})

    def amend(self, path: Path) -> None:
        text = path.read_text()
        for table, window in self.history.items():
            topic = self.topics.get(table) or self.extra.get(table)
            text = re.sub(rf'^(topic = "{re.escape(str(topic))}"\n)', rf'\1history = "{window}"\n', text, flags=re.M)
        path.write_text(text)


class VersionedSeed(SeedRun):
    """One seed of the lane: the campaign's seed run, with history in its config, its records stamped, and the
    as-of checks after every event."""

    config_file = VersionedConfig
    config: VersionedConfig

    def __init__(self, campaign: runner.Campaign, seed: int) -> None:
        super().__init__(campaign, seed)
        self.floor: dict[str, int] = {}  # table -> the earliest since the lane can prove (see asof_checks)
        self.replayed_at: dict[str, int] = {}  # table -> the wall time (ms) before its last replay began
        self.last_since: dict[str, int] = {}  # table -> the served version's since at the last check
        self.steps = seed  # the next of HISTORY_STEPS
        self.replaced: str | None = None  # the table the current event's reload replaces (history added)
        # A since up to this (epoch ms) is explained: a restart under a clock stepped forward measures its downtime
        # on the wall clock, the only one that spans it, and moves since by the step (docs/limitations.md)
        self.ahead_ok = 0

    def window_ms(self, table: str) -> int | None:
        window = self.config.history.get(table)
        return None if window is None else WINDOWS_MS[window]

    def setup(self) -> None:
        self._replay_begins(plan.BULK)
        super().setup()

    def _replay_begins(self, table: str) -> None:
        """The table replays from its log start from now on (a start, a reset, history added): since may move back
        to the wall time now less the lag, and never earlier."""
        self.replayed_at[table] = int(time.time() * 1000)
        self.floor[table] = self.replayed_at[table] - LAG_MS
        self.last_since.pop(table, None)

    def run(self, fault: Fault) -> Outcome:
        if fault.phase in (plan.RESTORE, plan.BULK_END) or fault.kind == plan.RECREATE:
            self._replay_begins(fault.table)  # the drive resets the table, or the topic is new: a replay
        self.replaced = None
        if fault.kind == plan.CLOCK and fault.phase in (plan.START, plan.STOP) and fault.params["step"] > 0:
            self.ahead_ok = max(self.ahead_ok, int(time.time() * 1000) + fault.params["step"] * 1000)
        if fault.kind in plan.RELOAD_KINDS:
            self._history_step()
        out = super().run(fault)
        if fault.kind in plan.RELOAD_KINDS:
            out.notes.append(f"history now {self.config.history}")
        return out

    def _history_step(self) -> None:
        """The next change of ``history``, written with the event's own change (``ConfigFile.write``)."""
        step = HISTORY_STEPS[self.steps % len(HISTORY_STEPS)]
        self.steps += 1
        history = self.config.history
        if step == "toggle small" and plan.SMALL in history:
            del history[plan.SMALL]  # in place: the table keeps RUNNING, its snapshots where they are
            self.floor.pop(plan.SMALL, None)
        elif step == "toggle small":
            history[plan.SMALL] = BULK_HISTORY
            self._replay_begins(plan.SMALL)  # adding history replaces the table: a replay (docs/as-of.md)
            self.replaced = plan.SMALL
        else:
            history[plan.BULK] = SHORT_WINDOW if history.get(plan.BULK) == BULK_HISTORY else BULK_HISTORY

    def check_readers(self, f: Fault, out: Outcome) -> None:
        """The campaign's, but a table replaced by a reload (history added) moves the snapshots its
        readers lease aside (``snapshots/.dropped-<table>-<n>``, docs/operations/reload.md): the leased one must be
        there, not gone."""
        sid = self.leased.pop(self.replaced, None) if self.replaced is not None else None
        if self.replaced is not None and sid is not None:
            base = snapshots_dir(self.daemon.state_dir, self.replaced)
            aside = sorted(base.parent.glob(f"{SNAPSHOT_DROPPED_PREFIX}{self.replaced}-*/{sid}"))
            here = base / sid
            if not aside and not here.is_dir() and out.injected:
                out.divergences += 1
                out.problems.append(f"{self.replaced}: snapshot {sid}, leased by a reader before the reload that "
                                    "replaced the table, was deleted, not moved aside")
            for folder in [base, *(a.parent for a in aside)]:
                with contextlib.suppress(OSError):
                    leases.release(folder, READER)
            out.notes.append(f"{self.replaced}: replaced by the reload; its leased snapshot {sid} "
                             + (f"moved aside to {aside[0].parent.name}" if aside else "in place"))
        super().check_readers(f, out)

    def verify(self, out: Outcome, online: bool) -> None:
        super().verify(out, online)
        when = "while RUNNING" if online else "left by the stopped daemon"
        for table, topic in self.topics.items():
            if table in self.config.history:
                asof_checks.check_versions(self, out, table, topic, when)


class VersionedCampaign(runner.Campaign):
    """The campaign on Tansu, its seeds ``VersionedSeed``s, its events ``lane_plan``'s."""

    seed_run = VersionedSeed
    module = "tests.chaos.versioned"

    def start(self) -> None:
        tansu = TansuKafka(self.root / "tansu")
        tansu.tansu.start()
        self.kafka = cast("EmbeddedKafka", tansu)  # duck-typed: start_broker, broker_pid, stop
        settings = tansu.client_settings
        self.broker = Broker(settings, TimedAdmin(settings), tansu=tansu.tansu)
        why = mount_tmpfs(self.root / "disk", runner.TMPFS_MB)
        if why is None:
            self.disk = self.root / "disk"
        else:
            self.notes.append(f"no tmpfs for the state_dir ({why}): disk-full faults fail as not injectable")
        self.notes += [f"{kind} skipped in this lane: {why}" for kind, why in SKIPPED.items()]
        self.notes.append(f"{plan.RECREATE} only at start, before it: {RECREATED}")

    def stop(self) -> None:
        self.broker.admin.close()
        self.kafka.stop()
        if self.disk is not None:
            unmount(self.disk)

    def events(self, seed: int) -> list[Fault]:
        return lane_plan(seed, self.args.faults_per_seed, self.args.reloads_per_seed)

    def command(self) -> str:
        a = self.args
        return (f"python -m tests.chaos.versioned --seed {a.seed} --seeds {a.seeds} --faults-per-seed "
                f"{a.faults_per_seed} --reloads-per-seed {a.reloads_per_seed}"
                + (f" --only-fault {a.only_fault}" if a.only_fault is not None else ""))


def main(argv: list[str] | None = None) -> int:
    args = runner.parse(argv)
    args.exports_per_seed = args.registry_per_seed = args.powerloss_seeds = 0  # the 0.9 campaign's events
    args.report_dir = args.report_dir or str(runner.report_dir() / "versioned")
    if args.seeds <= 0:
        runner.say("versioned lane: --seeds 0, nothing to run")
        return 0
    why = tools.missing(args.clock)
    if why is not None:
        runner.say(f"cannot run: {why}")
        return 2
    return 0 if runner.run(args, VersionedCampaign).ok() else 1


if __name__ == "__main__":
    sys.exit(main())
