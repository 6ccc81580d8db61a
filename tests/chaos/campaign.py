"""The randomized fault campaign: from a seed, load on two tables, one fault at a time at a random place, checks.

Per seed: two compacted topics on the campaign's own embedded Kafka 0.9 (one over the bulk-load threshold, one
small), a steady produce load on both, and the real daemon (``tests.chaos.daemon``). Before the faults, two
probes prove the tools reach the daemon: a libfiu failure point must surface as a RocksDB I/O error in its
status, and a libfaketime step must move the clock its status is stamped with; a campaign whose probes fail
fails, whatever its faults did.

Each fault of the seed's plan (``tests.chaos.plan``) is driven to its phase (for short phases through the
entry's hooks: the daemon freezes at that point, or arms a failure point itself), injected, held, healed; then
the load pauses and the daemon must be RUNNING at every log end, undegraded, with the same PID (unless the
campaign itself killed or restarted it), within ``--recover-timeout``. Then every store and every snapshot on
disk is compared with the oracle fold at its own offsets (``tests.reliability.checks``), and no ``.checkpoint``
file or manifest may claim offsets beyond those its store or snapshot database holds. After the campaign's own
SIGKILLs and stops the same check runs on what the dead daemon left, before it is restarted.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import json
import os
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from globald.common.errors import ManifestError
from globald.embedded.broker import free_port
from globald.snapshot import exact_requests as snap_requests
from globald.snapshot import leases
from globald.snapshot import manifest as manifests
from globald.snapshot.reader import current_id, manifests_of
from globald.store import checkpoint_file
from globald.store.names import checkpoint_path, snapshots_dir
from globald.store.reader import StoreReader
from tests.chaos import entry, exports, plan, reach, reloads
from tests.chaos.daemon import ChaosDaemon, stopped_at_hook
from tests.chaos.plan import Fault
from tests.chaos.tools import ERRNOS, FIU_SITES, Clock, Fiu
from tests.harness import Broker, globald, random_records
from tests.reliability.checks import check_snapshots, check_store
from tests.reliability.disk import fill
from tests.reliability.load import Load, pinned
from tests.support.admin import Record, TopicAdmin
from tests.support.broker import EmbeddedKafka

if TYPE_CHECKING:
    from tests.chaos.runner import Campaign

PARTITIONS = 3
# Above globald's bulk-load threshold (a restore of at least 100k records), so that every full restore of the bulk
# table is a bulk load. Not imported: the engine moves that constant around, the contract is the number.
BULK_RECORDS = 110_000
BULK_KEYS = 100_000
SMALL_RECORDS, SMALL_KEYS = 5_000, 2_000
HOOK_TIMEOUT_S = 60.0  # a hooked phase not reached by then is reported as not reached, never as injected
STOP_TIMEOUT_S = 60.0
READER, READER_LEASE_S = "chaos-reader", 900.0  # a reader pinning CURRENT through each fault, as Spark jobs do
# Kinds that count only once the daemon showed it met them (``Outcome.hit``): I/O faults, reload and export events.
EVENT_KINDS = (*plan.RELOAD_KINDS, *plan.EXPORT_KINDS)
LANDED_KINDS = (*reach.IO_KINDS, *EVENT_KINDS)


@dataclass
class Outcome:
    """One fault as it went. ``pid_changes`` counts only the daemon's own exits, not the campaign's kills."""

    fault: Fault
    reached: bool = False
    injected: bool = False
    recovered: bool = False
    divergences: int = 0
    pid_changes: int = 0
    recover_s: float | None = None
    hit: bool | None = None  # io-error and disk-full: the daemon reported the error (status or log)
    checks: int = 0  # stores and snapshots compared with the oracle after this fault
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The campaign's own steps that failed (a Java admin call timed out…): the fault was not injected, so it proves
    # nothing about the daemon, and a run that meant to prove it must not pass: failed.
    campaign_errors: list[str] = field(default_factory=list)
    log_tail: str = ""

    @property
    def failed(self) -> bool:
        """A problem, a divergence, a PID change, not recovered, a campaign error, an I/O fault that never reached
        the daemon (not injected, or nothing showed the daemon met it: see ``tests.chaos.reach``), or a reload or
        export event that did not land (``tests.chaos.reloads``, ``tests.chaos.exports``)."""
        io_missed = self.fault.kind in LANDED_KINDS and not (self.injected and self.hit)
        return bool(self.problems or self.campaign_errors) or self.divergences > 0 or self.pid_changes > 0 or (
            self.injected and not self.recovered) or io_missed

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.fault.seed, "index": self.fault.index, "kind": self.fault.kind,
                "phase": self.fault.phase, "params": self.fault.params, "describe": self.fault.describe(),
                "reached": self.reached, "injected": self.injected, "recovered": self.recovered,
                "divergences": self.divergences, "pid_changes": self.pid_changes,
                "recover_s": None if self.recover_s is None else round(self.recover_s, 2), "hit": self.hit,
                "checks": self.checks, "notes": self.notes, "problems": self.problems,
                "campaign_errors": self.campaign_errors, "log_tail": self.log_tail if self.failed else ""}


@dataclass
class Probe:
    name: str
    ok: bool
    detail: str


def produce_pinned(admin: TopicAdmin, topic: str, records: list[Record]) -> int:
    """Each key to the partition its bytes pick, as the Load does: a key in two partitions has no last value."""
    return admin.produce(topic, records, partition_of=pinned(PARTITIONS))


class Unrecoverable(RuntimeError):
    """The seed cannot go on (the daemon does not come back even when restarted); its remaining faults are skipped."""


class SeedRun:
    """One seed: its topics, load and daemon, and the faults of its plan."""

    def __init__(self, campaign: Campaign, seed: int) -> None:
        self.c = campaign
        self.seed = seed
        self.root: Path = campaign.root / f"seed-{seed}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.disk: Path | None = campaign.disk
        state = self.state = (self.disk / f"state-{seed}") if self.disk is not None else self.root / "state"
        self.topics = {plan.BULK: f"chaos-{seed}-bulk", plan.SMALL: f"chaos-{seed}-small"}
        self.loads: dict[str, Load] = {}
        self.clock = Clock(self.root / "clock-offset", campaign.args.clock)
        self.fiu = Fiu(self.root / "fiu")
        self.arm_path = self.root / "arm.json"
        self.arm_ids = 0
        self.armed: dict[str, Any] = {}  # the arm written last, until released or disarmed
        self.filler: Path | None = None
        self.may_die: int | None = None  # the PID the campaign SIGKILLed or stopped on purpose in this fault
        self.exact_request: snap_requests.Request | None = None
        self.mark = 0  # the daemon log's size when the current fault began
        self.leased: dict[str, str] = {}  # table -> snapshot the campaign's reader pinned before the fault
        self.evidence: reach.Evidence | None = None  # what the daemon had said when the current fault began
        self.http_port = free_port()
        self.event: reloads.ReloadEvent | exports.ExportEvent | None = None  # the reload or export under way
        self.extra: str | None = None  # the topic of the table reload events add and drop, once created
        # [export] only for export events: the CI form's daemon stays as it was, pyarrow never loaded under libfiu
        exporting = campaign.args.exports_per_seed > 0
        self.config = reloads.ConfigFile(self.root / "globald.toml", state, campaign.broker.settings, self.topics,
                                         self.http_port, export=exporting)
        cfg = self.config.write()
        env = {entry.ARM_ENV: str(self.arm_path), **self.clock.env(),
               **({entry.IMPORT_PYARROW_ENV: "1"} if exporting else {})}
        self.daemon = ChaosDaemon(cfg, self.root / "daemon.log", env=env, prefix=self.fiu.prefix(self.clock.preload()),
                                  http_port=self.http_port, state=state)

    @property
    def admin(self) -> TopicAdmin:
        return self.c.broker.admin

    @property
    def broker(self) -> Broker:
        return self.c.broker

    @property
    def kafka(self) -> EmbeddedKafka:
        return self.c.kafka

    # -- setup and teardown ---------------------------------------------------------------------------------

    def setup(self) -> None:
        for i, (table, topic) in enumerate(self.topics.items()):
            self.admin.create(topic, partitions=PARTITIONS)
            n, keys = (BULK_RECORDS, BULK_KEYS) if table == plan.BULK else (SMALL_RECORDS, SMALL_KEYS)
            produce_pinned(self.admin, topic, random_records(n, keys=keys, seed=self.seed * 100 + i))
            rate = 60 if table == plan.BULK else 30
            self.loads[table] = Load(self.admin, topic, rate=rate, keys=keys, seed=self.seed * 100 + 10 + i,
                                     pin_partitions=PARTITIONS)
        self.disarm()
        self.daemon.start()
        ok, _, doc = self.settle(timeout=300)
        if not ok:
            raise Unrecoverable(f"seed {self.seed}: the daemon did not reach RUNNING at the start; status {doc}; "
                                f"log:\n{self.daemon.tail()}")
        for load in self.loads.values():
            load.start()
        self.resume_loads()  # settle() paused them before they started

    def teardown(self) -> None:
        for load in self.loads.values():
            load.stop()
        self.daemon.thaw()
        if self.daemon.alive():
            with contextlib.suppress(AssertionError):  # SIGKILLed by stop() when SIGTERM is not enough
                self.daemon.stop(timeout=STOP_TIMEOUT_S)
        self.clock.set(0)
        self._unfill()
        shutil.rmtree(self.state, ignore_errors=True)  # the next seed's disk-full faults start from the same room

    # -- probes: do the tools reach the daemon at all? --------------------------------------------------------

    def probes(self) -> list[Probe]:
        return [self._probe_fiu(), self._probe_clock()]

    def _probe_fiu(self) -> Probe:
        """An fdatasync or fsync failure point must come back as RocksDB's own I/O error in the daemon's status:
        otherwise no io-error fault of the campaign ever reached the store, and a green run would prove nothing."""
        for site in ("fdatasync", "fsync"):
            cmd = Fiu.enable_command(site, errno_mod.EIO, "always")
            problem = self.fiu.control(self.daemon.pid, cmd)
            if problem:
                return Probe("libfiu reaches RocksDB", False, f"fiu-ctrl failed: {problem}")
            mark = self.daemon.log_size()
            seen = self._watch(8.0, stop_when=lambda texts: any("IO error" in t for t in texts))
            self.fiu.control(self.daemon.pid, Fiu.disable_command(site))
            ok, _, doc = self.settle()
            self.resume_loads()
            said = [x for x in self.daemon.log_since(mark, 400).splitlines() if "IO error" in x]
            hits = [t for t in seen if "IO error" in t] + said
            if hits:
                return Probe("libfiu reaches RocksDB", ok,
                             f"{FIU_SITES[site]} with EIO surfaced as: {hits[0][:160]}"
                             + ("" if ok else f"; but the daemon did not recover: {doc}"))
        return Probe("libfiu reaches RocksDB", False, "neither fdatasync nor fsync failures surfaced in the status")

    def _probe_clock(self) -> Probe:
        """A one-day step must show in the time the daemon stamps its status with, and a step back too."""
        day = 86_400
        self.clock.set(day)
        try:
            stepped = self._wait_status(lambda d: d.get("updated", 0) > time.time() + day / 2, 15)
        finally:
            self.clock.set(0)
        back = self._wait_status(lambda d: abs(d.get("updated", 0) - time.time()) < 600, 15)
        ok, _, _ = self.settle()
        self.resume_loads()
        return Probe(f"clock steps ({self.clock.mode}) reach the daemon's wall clock", stepped and back and ok,
                     f"status stamped one day ahead: {stepped}; back to now: {back}; recovered: {ok}")

    def _wait_status(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.daemon.status()):
                return True
            time.sleep(0.3)
        return False

    # -- the daemon -------------------------------------------------------------------------------------------

    def arm(self, phase: str, action: str, fault: Fault, fiu: dict[str, Any] | None = None) -> int:
        self.arm_ids += 1
        # Held: the phase cannot end until the fault's window has passed (release), so the fault lands in it.
        doc: dict[str, Any] = {"id": self.arm_ids, "phase": phase, "action": action, "nth": 1, "hold": True}
        if phase in (plan.RESTORE, plan.BULK_END):
            doc["table"] = fault.table
        if phase == plan.RESTORE:
            doc["fraction"] = fault.params["fraction"]
        if phase in (plan.COMMIT, plan.PUBLISH):
            doc["nth"] = fault.params["nth"]
        if fiu is not None:
            doc["fiu"] = fiu
        self._write_arm(doc)
        self.armed = doc
        return self.arm_ids

    def disarm(self) -> None:
        self._write_arm({})
        self.armed = {}

    def release(self, out: Outcome) -> None:
        """The fault's window has passed: let its phase end (``entry.Arm.ended``). Notes whether the phase had
        reached its end meanwhile (held there) or was still under way, either way inside the phase."""
        if not self.armed:
            return
        held = self.arm_path.with_name(f"{self.arm_path.name}.held-{self.armed['id']}").exists()
        out.notes.append(f"{self.armed['phase']} phase " + ("held at its end through the fault's window" if held
                                                          else "still under way when the fault's window ended"))
        # A directory, not a new arm file: the held daemon only stats (libfiu wraps open and read, not stat).
        self.arm_path.with_name(f"{self.arm_path.name}.release-{self.armed['id']}").mkdir(exist_ok=True)
        self.armed = {}

    def _write_arm(self, doc: dict[str, Any]) -> None:
        tmp = self.arm_path.with_name(self.arm_path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.arm_path)

    def wait_fired(self, arm_id: int, freeze: bool, timeout: float = HOOK_TIMEOUT_S) -> bool:
        fired = self.arm_path.with_name(f"{self.arm_path.name}.fired-{arm_id}")
        if freeze:
            return stopped_at_hook(self.daemon, fired, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.daemon.alive():
            if fired.exists():
                return True
            time.sleep(0.02)
        return False

    def start_daemon(self) -> None:
        self.daemon.start()

    def stop_daemon(self, out: Outcome) -> int | None:
        """SIGTERM and wait; the exit code, or None (and a problem) when it did not stop in time."""
        self.daemon.thaw()
        if not self.daemon.alive():
            return self.daemon.proc.returncode if self.daemon.proc else None
        os.kill(self.daemon.pid, signal.SIGTERM)
        rc = self.daemon.exit_code(STOP_TIMEOUT_S)
        if rc is None:
            out.problems.append(f"did not exit within {STOP_TIMEOUT_S:.0f}s of SIGTERM")
            self.daemon.stop(signal.SIGKILL)
        return rc

    def settle(self, timeout: float | None = None) -> tuple[bool, float, dict[str, Any]]:
        """Pause the load; wait for RUNNING, undegraded, every table RUNNING at exactly its log end.
        Returns (in time, seconds taken, last status)."""
        timeout = self.c.args.recover_timeout if timeout is None else timeout
        self.pause_loads()
        ends = {t: self.admin.end_offsets(topic) for t, topic in self.topics.items()}
        t0 = time.monotonic()
        doc: dict[str, Any] = {}
        while time.monotonic() - t0 < timeout:
            if not self.daemon.alive():
                return False, time.monotonic() - t0, doc
            doc = self.daemon.status()
            if self._settled(doc, ends):
                return True, time.monotonic() - t0, doc
            time.sleep(0.2)
        return False, time.monotonic() - t0, doc

    def _settled(self, doc: dict[str, Any], ends: dict[str, dict[int, int]]) -> bool:
        if doc.get("pid") != self.daemon.pid or doc.get("state") != "RUNNING" or doc.get("degraded"):
            return False
        for table, want in ends.items():
            t = doc.get("tables", {}).get(table)
            if t is None or t.get("state") != "RUNNING":
                return False
            if any(t.get("offsets", {}).get(str(p), 0) != o for p, o in want.items()):
                return False
        return True

    def pause_loads(self) -> None:
        for load in self.loads.values():
            load.pause()

    def resume_loads(self) -> None:
        for load in self.loads.values():
            load.resume()

    def _watch(self, seconds: float, stop_when: Callable[[list[str]], bool] | None = None) -> list[str]:
        """Degraded texts and table errors seen in the status over ``seconds`` (HTTP serves it from memory, so
        it answers on a full disk)."""
        seen: list[str] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.daemon.alive():
            doc = self.daemon.status()
            tables = doc.get("tables", {}).values()
            texts = [doc.get("degraded") or ""] + [t.get("last_error") or "" for t in tables]
            texts += [(t.get("snapshot") or {}).get("last_error") or "" for t in tables]
            seen += [t for t in texts if t and t not in seen]
            if stop_when is not None and stop_when(seen):
                break
            time.sleep(0.3)
        return seen

    # -- preconditions ------------------------------------------------------------------------------------------

    def ensure_bulk(self) -> None:
        """Retention and recreation shrink the bulk topic; a bulk-load phase needs a log of BULK_RECORDS again."""
        topic = self.topics[plan.BULK]
        marks = self.admin.watermarks(topic)
        have = sum(hi - lo for lo, hi in marks.values())
        if have < BULK_RECORDS:
            n = BULK_RECORDS - have + 1_000
            produce_pinned(self.admin, topic, random_records(n, keys=BULK_KEYS, seed=self.seed * 1_000 + have))

    def extra_topic(self) -> str:
        """The topic of the table reload events add and drop: created, small, at the first such event."""
        if self.extra is None:
            topic = f"chaos-{self.seed}-{reloads.EXTRA}"
            reloads.create_extra(self, topic, PARTITIONS)
            self.extra = topic
        return self.extra

    def reset_table(self, table: str) -> str | None:
        r = globald("reset", "--config", str(self.daemon.config), "--table", table, "--yes", timeout=90)
        return None if r.returncode == 0 else f"globald reset exited {r.returncode}: {r.stderr.strip()[-300:]}"

    def exact_target(self, table: str, fraction: float) -> dict[int, int] | None:
        """Offsets below every published snapshot that holds anything, so the build starts from the log start and
        reads a while, and at no snapshot's offsets: an exact match is served without a build. None if no room."""
        marks = self.admin.watermarks(self.topics[table])
        found = manifests_of(self.daemon.state_dir, table)
        snaps = [m for m in found if not m.stale and any(m.offsets.get(p, lo) > lo for p, (lo, _) in marks.items())]
        if not snaps:
            return None
        top = {p: min([m.offsets.get(p, hi) for m in snaps] + [hi]) for p, (_, hi) in marks.items()}
        target = {p: lo + int(fraction * max(0, top[p] - lo)) for p, (lo, _) in marks.items()}
        if any(m.offsets == target for m in found):
            target = {p: max(lo, target[p] - 1) for p, (lo, _) in marks.items()}
        return None if any(m.offsets == target for m in found) else target

    # -- verification -------------------------------------------------------------------------------------------

    def verify(self, out: Outcome, online: bool) -> None:
        """Every store and snapshot against the oracle at its own offsets; claims of .checkpoint and manifests."""
        when = "while RUNNING" if online else "left by the stopped daemon"
        for table, topic in self.topics.items():
            marks = self.admin.watermarks(topic)
            claimed, bad = self._checkpoint_claims(table, topic)  # read before the store: a commit in between
            if bad:  # can only move the store further ahead than the file
                out.divergences += 1
                out.problems.append(f"{table}: .checkpoint does not parse ({when}): {bad}")
            store = check_store(self.broker, self.daemon.state_dir, table, topic, allow_uncompared=True)
            out.checks += 1
            if not store.readable:
                if online:
                    out.divergences += 1
                    out.problems.append(f"{table}: store unreadable {when}: {store.error}")
                else:
                    out.notes.append(f"{table}: store unreadable {when}: {store.error}")
            else:
                if store.divergences:
                    out.divergences += store.divergences
                    out.problems.append(f"{table}: store {when} differs from the oracle at its offsets "
                                        f"{store.offsets}: {store.error}")
                if store.invalid_offsets and online:
                    out.divergences += 1
                    out.problems.append(f"{table}: store {when} holds offsets outside the log: {store.error}")
                for p, o in claimed.items():
                    holds = store.offsets.get(p, marks.get(p, (0, 0))[0])
                    if o > holds:
                        out.divergences += 1
                        out.problems.append(f"{table}: .checkpoint claims partition {p} at {o}, the store holds "
                                            f"{holds} ({when})")
            for snap in check_snapshots(self.broker, self.daemon.state_dir, table, topic):
                if snap.divergences and not snap.path.exists():
                    continue  # retired by retention while it was read
                out.checks += snap.visible and snap.error is None
                if snap.divergences:
                    out.divergences += snap.divergences
                    why = f": {snap.error}" if snap.error else ""
                    out.problems.append(f"{table}: snapshot {snap.path.name} {when}: {snap.divergences} keys differ "
                                        f"from the oracle at its manifest offsets{why}")
                elif snap.visible and snap.error is None:
                    self._manifest_claims(out, table, snap.path, marks, when)

    def lease_current(self) -> None:
        """Pin each table's CURRENT snapshot as a reader would, for longer than any fault lasts."""
        self.leased = {}
        for table in self.topics:
            sid = current_id(self.daemon.state_dir, table)
            if sid is not None:
                leases.take(snapshots_dir(self.daemon.state_dir, table), READER, sid, READER_LEASE_S)
                self.leased[table] = sid

    def check_readers(self, f: Fault, out: Outcome) -> None:
        """What readers rely on: a leased snapshot stays, whatever the fault (a clock step included: the daemon times
        leases on its monotonic clock), and CURRENT names a snapshot with a valid manifest."""
        state = self.daemon.state_dir
        for table, sid in self.leased.items():
            folder = snapshots_dir(state, table)
            if not (folder / sid).is_dir() and out.injected:
                out.divergences += 1
                out.problems.append(f"{table}: snapshot {sid}, leased by a reader for {READER_LEASE_S:.0f}s "
                                    f"before the fault, was deleted")
            with contextlib.suppress(OSError):
                leases.release(folder, READER)
        self.leased = {}
        if not out.injected:
            return
        for table in self.topics:
            cur = current_id(state, table)
            if cur is None:
                continue
            try:
                manifests.read(snapshots_dir(state, table) / cur, table)
            except ManifestError as e:
                out.divergences += 1
                out.problems.append(f"{table}: CURRENT names snapshot {cur}, which readers cannot open: {e}")

    def _checkpoint_claims(self, table: str, topic: str) -> tuple[dict[int, int], str | None]:
        try:
            found = checkpoint_file.read(checkpoint_path(self.daemon.state_dir, table))
        except checkpoint_file.CheckpointFormatError as e:
            return {}, str(e)
        return {p: o for (t, p), o in found.items() if t == topic}, None

    def _manifest_claims(self, out: Outcome, table: str, snap: Path, marks: dict[int, tuple[int, int]],
                         when: str) -> None:
        try:
            m = manifests.read(snap, table)
            db = snap / "db" if (snap / "db" / "CURRENT").exists() else snap
            with StoreReader(db) as r:
                holds = r.offsets()
        except (ManifestError, OSError) as e:
            if snap.exists():
                out.notes.append(f"{table}: snapshot {snap.name}: manifest or offsets unreadable: {e}")
            return
        except Exception as e:  # RocksDB reports a damaged database as a plain Exception
            if snap.exists():
                out.divergences += 1
                out.problems.append(f"{table}: snapshot {snap.name} {when}: offsets unreadable: {e}")
            return
        for p, o in m.offsets.items():
            have = holds.get(p, marks.get(p, (0, 0))[0])
            if o > have:
                out.divergences += 1
                out.problems.append(f"{table}: manifest of snapshot {snap.name} claims partition {p} at {o}, its "
                                    f"database holds {have} ({when})")

    # -- one fault ----------------------------------------------------------------------------------------------

    def run(self, fault: Fault) -> Outcome:
        out = Outcome(fault)
        d = self.daemon
        mark = self.mark = d.log_size()
        self.evidence = reach.Evidence.before(d, list(self.topics))
        self.may_die, self.exact_request = None, None
        self.kafka.start_broker()  # idempotent: a fault that could not heal its broker must not spill over
        self.resume_loads()
        try:
            if fault.phase in (plan.RESTORE, plan.BULK_END, plan.EXACT) and fault.table == plan.BULK:
                self.ensure_bulk()
            self.lease_current()
            if fault.kind in plan.RELOAD_KINDS:
                self.event = reloads.ReloadEvent(self, fault, out)
            elif fault.kind in plan.EXPORT_KINDS:
                self.event = exports.ExportEvent(self, fault, out)
            if self.event is not None:
                self.event.prepare()
            self._drive(fault, out)
        except Unrecoverable:
            raise
        except Exception as e:  # the campaign's own step failed (a Java admin call timed out…): say so, go on
            out.campaign_errors.append(f"{type(e).__name__}: {e}")
        finally:
            self._cleanup()
        if out.campaign_errors:
            self._contain(out)
        elif out.injected:
            self._recover(fault, out)
        else:
            self._back_to_baseline(out)
        if fault.kind in reach.IO_KINDS and not (out.injected and out.hit):  # a fault that never happened
            out.recovered, out.recover_s = False, None
            out.problems.append("the planned I/O fault never reached the daemon: " + (
                f"nothing in its status, log, caught-failure count or RocksDB LOG within {reach.GRACE_S:.0f}s beyond "
                "its planned duration" if out.injected else "not injected"))
        if fault.kind in EVENT_KINDS and not out.injected:  # not landed: the event said why
            out.problems.append("the planned event was never asked for: not injected")
        self.check_readers(fault, out)
        if out.failed:
            out.log_tail = d.log_since(mark)
        return out

    def _cleanup(self) -> None:
        """Whatever the fault left behind that is the campaign's own doing (also when a step of it failed)."""
        self.disarm()
        self.daemon.thaw()
        self._unfill()
        if self.event is not None:
            self.event.close()
            self.event = None
        if self.config.extra:  # an event that failed between adding its table and dropping it: drop it now
            self.config.write()
            if self.daemon.alive():
                os.kill(self.daemon.pid, signal.SIGHUP)
        if self.kafka.broker_pid is not None:
            os.kill(self.kafka.broker_pid, signal.SIGCONT)
        self.kafka.start_broker()

    def _unfill(self) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None

    def _drive(self, f: Fault, out: Outcome) -> None:
        d = self.daemon
        action = "fiu" if f.kind == plan.IO_ERROR else "freeze"
        fiu = self._fiu_spec(f) if f.kind == plan.IO_ERROR else None
        at = "running"
        if f.phase == plan.STEADY:
            time.sleep(f.params["delay"])
        elif f.phase == plan.START:
            self.may_die = d.pid  # the campaign's own restart: a new PID is expected
            rc = self.stop_daemon(out)
            if rc not in (0, None):  # no fault yet: SIGTERM must commit, close and exit 0
                out.problems.append(f"exited with {rc} on SIGTERM, before any fault was injected")
            if f.params.get("when") == "before-start":
                self._inject(f, out, "stopped")
                self.start_daemon()
                out.reached = out.injected = True
                self._hold(f, out)
                return
            arm_id = self.arm(plan.START, action, f, fiu)
            self.start_daemon()
            if not self.wait_fired(arm_id, action == "freeze"):
                return self._not_reached(f, out)
            at = "frozen" if action == "freeze" else "fiu-armed"
        else:
            arm_id = self.arm(f.phase, action, f, fiu)
            if f.phase in (plan.RESTORE, plan.BULK_END):
                problem = self.reset_table(f.table)
                if problem:
                    out.problems.append(problem)
                    return
            elif f.phase == plan.EXACT:
                target = self.exact_target(f.table, f.params["target"])
                if target is None:
                    out.notes.append("no room for an exact build below the published snapshots")
                    return
                self.exact_request = snap_requests.submit(d.state_dir, f.table, target)
            elif f.phase == plan.STOP:
                self.may_die = d.pid  # the campaign stops it: the restart after this fault is expected
                os.kill(d.pid, signal.SIGTERM)
            if not self.wait_fired(arm_id, action == "freeze"):
                return self._not_reached(f, out)
            at = "frozen" if action == "freeze" else "fiu-armed"
        out.reached = True
        self._inject(f, out, at)
        out.injected = True
        self._hold(f, out)

    def _not_reached(self, f: Fault, out: Outcome) -> None:
        self.disarm()
        out.notes.append(f"phase {f.phase} not reached within {HOOK_TIMEOUT_S:.0f}s")
        if self.exact_request is not None:  # answered without a build (an exact match, a refusal): say which
            resp = snap_requests.wait(self.daemon.state_dir, self.exact_request, timeout=10)
            out.notes.append(f"the exact request was answered {resp.code.value}: {resp.message[:200]}")

    def _back_to_baseline(self, out: Outcome) -> None:
        """After a fault that was not injected: the daemon running and settled again, for the next fault."""
        d = self.daemon
        if d.alive() and self.may_die == d.pid:  # stopped by the campaign while the hook did not fire
            d.thaw()
            if d.exit_code(STOP_TIMEOUT_S) is None:
                out.problems.append(f"did not exit within {STOP_TIMEOUT_S:.0f}s of SIGTERM")
                d.stop(signal.SIGKILL)
        if not d.alive():
            self._died(out)
            self._restart_after_death(out)
        ok, _, _ = self.settle()
        if not ok:
            self._force_restart(out)

    def _contain(self, out: Outcome) -> None:
        """A campaign step failed halfway (retention switched on, then the tool failed): what the daemon holds may
        now differ from any fold of the log for reasons of the campaign's making. Rebuild both tables from the log,
        so that the faults after this one are judged on a clean slate; this fault counts as not injected."""
        out.injected = False
        self._back_to_baseline(out)
        for table in self.topics:
            problem = self.reset_table(table)
            if problem:
                out.campaign_errors.append(problem)
        ok, _, doc = self.settle()
        out.notes.append("tables reset after the campaign error" + ("" if ok else f"; not settled: {doc}"))
        if not ok:
            self._force_restart(out)

    def _died(self, out: Outcome) -> None:
        """The daemon is gone: a PID change unless the campaign ended that process itself."""
        rc = self.daemon.proc.returncode if self.daemon.proc else None
        if self.may_die == self.daemon.pid:
            return
        out.pid_changes += 1
        out.problems.append(f"daemon exited by itself (rc {rc})")

    def _fiu_spec(self, f: Fault) -> dict[str, Any]:
        p = f.params
        return {"name": FIU_SITES[p["site"]], "errno": ERRNOS[p["errno"]], "mode": p["mode"],
                "probability": p["probability"]}

    # -- inject, hold, heal ---------------------------------------------------------------------------------------

    def _inject(self, f: Fault, out: Outcome, at: str) -> None:
        """Inject ``f``; ``at`` says how the daemon stands: running, frozen at a hook, stopped, or with the failure
        point already armed by the hook."""
        d, k, p = self.daemon, f.kind, f.params
        frozen = at == "frozen"
        if k == plan.IO_ERROR:
            if at == "running":
                problem = self.fiu.control(d.pid, Fiu.enable_command(p["site"], ERRNOS[p["errno"]], p["mode"],
                                                                     p["probability"]))
                if problem:
                    raise RuntimeError(problem)
        elif k == plan.DISK_FULL:
            if self.disk is None:
                raise RuntimeError("no tmpfs for the state_dir (needs root): disk-full cannot be injected")
            self.filler = fill(self.disk, leave=16 * 1024)
        elif k == plan.KILL:
            self.may_die = d.pid
            os.kill(d.pid, signal.SIGKILL)
            d.exit_code(10)
            return
        elif k == plan.PAUSE:
            if not frozen:
                d.freeze()
            return  # stays frozen for the duration
        elif k == plan.BROKER_PAUSE:
            assert self.kafka.broker_pid is not None
            os.kill(self.kafka.broker_pid, signal.SIGSTOP)
        elif k == plan.BROKER_KILL:
            self.kafka.stop_broker(signal.SIGKILL)
        elif k == plan.BROKER_RESTART:
            self.kafka.stop_broker()
        elif k == plan.RETENTION:
            self._producer_knows(self.topics[f.table])  # before the topic stops compacting, not after
            self._with_daemon_frozen(at, lambda: self.admin.advance_log_start(self.topics[f.table]))
        elif k == plan.RECREATE:
            self.loads[f.table].pause()  # the new topic stays empty until the daemon has seen it: see _recover
            self._with_daemon_frozen(at, lambda: self._recreate(self.topics[f.table]))
        elif k == plan.CLOCK:
            self.clock.set(p["step"])
        elif k in EVENT_KINDS:
            assert self.event is not None
            self.event.inject()
        if frozen:
            d.thaw()

    def _with_daemon_frozen(self, at: str, action: Callable[[], object]) -> None:
        """Retention and recreation while the daemon cannot fetch: it must not apply records that are then
        deleted (those keys would stay in its store, a documented limitation, not a fault)."""
        froze = at == "running" and self.daemon.freeze()
        try:
            action()
        finally:
            if froze:
                self.daemon.thaw()

    def _recreate(self, topic: str) -> None:
        self.admin.delete(topic)
        self.admin.create(topic, partitions=PARTITIONS)
        self._producer_knows(topic)

    def _producer_knows(self, topic: str) -> None:
        """The shared producer keeps a deleted topic as unknown until its next metadata refresh (minutes): ask now,
        or retention's roll records and the load fail on a topic that exists again."""
        self.admin.producer().list_topics(topic, timeout=10)

    def _hold(self, f: Fault, out: Outcome) -> None:
        d, k, p = self.daemon, f.kind, f.params
        duration = float(p.get("duration", 0.0))
        if k in reach.IO_KINDS:
            assert self.evidence is not None
            evidence = self.evidence
            seen = self._watch(duration)
            self.release(out)
            how = evidence.met(d, seen)
            if how is None and d.alive():  # not met yet: the point stays armed, the disk full, until it is (bounded)
                started = time.monotonic()
                seen += self._watch(reach.GRACE_S, stop_when=lambda texts: evidence.met(d, texts) is not None)
                how = evidence.met(d, seen)
                if how is None and k == plan.IO_ERROR and p["mode"] == "once" and d.alive():
                    how = reach.once_fired(d, self.arm_path, FIU_SITES[p["site"]], evidence.log_mark)
                out.notes.append(f"held {time.monotonic() - started:.1f}s beyond its duration for the daemon to meet")
            out.hit = how is not None
            out.notes.append(f"reached the daemon: {how}" if how else "never reached the daemon")
            if k == plan.IO_ERROR and d.alive():  # a onetime point may have fired already: disabling is harmless
                problem = self.fiu.control(d.pid, Fiu.disable_command(p["site"]))
                if problem and d.alive():
                    out.problems.append(f"campaign step failed: could not disarm the failure point: {problem}")
            self._unfill()
        elif k == plan.PAUSE:
            time.sleep(duration)
            d.thaw()
        elif k == plan.BROKER_PAUSE:
            self._watch(duration)
            if self.kafka.broker_pid is not None:
                os.kill(self.kafka.broker_pid, signal.SIGCONT)
        elif k in (plan.BROKER_KILL, plan.BROKER_RESTART):
            self._watch(duration)
            self.kafka.start_broker()
        elif k == plan.CLOCK:
            self._watch(duration)
        elif k in EVENT_KINDS:
            assert self.event is not None
            self.event.hold()
        if d.alive():
            self.release(out)  # healed: the phase may end (a killed daemon has no phase to hold)

    # -- after the fault ----------------------------------------------------------------------------------------------

    def _recover(self, f: Fault, out: Outcome) -> None:
        d = self.daemon
        heal_started = time.monotonic()
        if f.phase == plan.STOP and self.may_die == d.pid:
            d.thaw()
            rc = d.exit_code(STOP_TIMEOUT_S)
            if rc is None:
                out.problems.append(f"did not exit within {STOP_TIMEOUT_S:.0f}s of SIGTERM")
                d.stop(signal.SIGKILL)
            elif rc != 0 and f.kind != plan.KILL:  # even when the final commit fails, a stop exits 0
                out.problems.append(f"exited with {rc} after SIGTERM")
        if not d.alive():
            self._died(out)
            self.verify(out, online=False)
            self._restart_after_death(out)
            heal_started = time.monotonic()
        recovered, took, doc = self.settle()
        if recovered and f.kind == plan.CLOCK:
            self.clock.set(0)  # the step back is a second step: it must be lived through as well
            recovered, back, doc = self.settle()
            took += back
        elif f.kind == plan.CLOCK:
            self.clock.set(0)
        out.recovered = recovered
        out.recover_s = time.monotonic() - heal_started if recovered else None
        if not recovered:
            tables = {t: (v.get("state"), v.get("offsets"), v.get("last_error"))
                      for t, v in doc.get("tables", {}).items()}
            out.problems.append(f"not RUNNING at the log end, undegraded, within {self.c.args.recover_timeout:.0f}s: "
                                f"state {doc.get('state')}, degraded {doc.get('degraded')!r}, tables {tables}")
            if not d.alive():
                out.pid_changes += 1
            self._force_restart(out)
        if f.phase == plan.EXACT and recovered:
            self._exact_after(f, out)
        self.verify(out, online=True)
        if f.kind == plan.RECREATE:
            self.loads[f.table].resume()
        self.resume_loads()

    def _exact_after(self, f: Fault, out: Outcome) -> None:
        """The request made during the fault must have an answer; a fresh one after healing must be served."""
        req = getattr(self, "exact_request", None)
        if req is not None:
            resp = snap_requests.wait(self.daemon.state_dir, req, timeout=60)
            out.notes.append(f"exact request during the fault: {resp.code.value} {resp.message[:120]}")
        target = self.exact_target(f.table, f.params["target"])
        if target is None:
            return
        resp = snap_requests.request(self.daemon.state_dir, f.table, target, timeout=120)
        out.notes.append(f"exact request after healing: {resp.code.value} {resp.message[:120]}")
        if resp.code.value in ("failed", "timeout", "no_daemon", "stopping", "rebuilding"):
            out.problems.append(f"exact build after healing answered {resp.code.value}: {resp.message[:300]}")

    def _restart_after_death(self, out: Outcome) -> None:
        self.disarm()
        self.daemon.start()

    def _force_restart(self, out: Outcome) -> None:
        """A daemon that did not recover is replaced so that the seed can go on (the fault is already failed)."""
        d = self.daemon
        d.thaw()
        if d.alive():
            try:
                d.stop(timeout=STOP_TIMEOUT_S)
            except AssertionError:
                out.problems.append("did not stop on SIGTERM after failing to recover; SIGKILLed")
        self.disarm()
        d.start()
        ok, _, doc = self.settle()
        if not ok:
            raise Unrecoverable(f"a restarted daemon did not reach RUNNING either: {doc}; log:\n{d.tail()}")


def summarize(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """One row per (fault kind, phase), in the plan's kind and phase order."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for o in outcomes:
        key = (o.fault.kind, o.fault.phase)
        r = rows.setdefault(key, {"kind": key[0], "phase": key[1], "planned": 0, "injected": 0, "recovered": 0,
                                  "divergences": 0, "pid_changes": 0, "times": [], "hits": 0, "hit_of": 0,
                                  "failed": 0})
        r["planned"] += 1
        r["injected"] += o.injected
        r["recovered"] += o.injected and o.recovered
        r["divergences"] += o.divergences
        r["pid_changes"] += o.pid_changes
        r["failed"] += o.failed
        if o.recover_s is not None:
            r["times"].append(o.recover_s)
        if o.hit is not None:
            r["hit_of"] += 1
            r["hits"] += o.hit
    out = []
    for key in [(k, p) for k in (*plan.KINDS, *EVENT_KINDS) for p in plan.PHASES if (k, p) in rows]:
        row = rows[key]
        times = row.pop("times")
        row["median_recover_s"] = round(statistics.median(times), 1) if times else None
        row["max_recover_s"] = round(max(times), 1) if times else None
        out.append(row)
    return out
