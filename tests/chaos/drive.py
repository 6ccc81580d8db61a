"""A fault driven to its phase and injected (a part of ``campaign.SeedRun``): the entry's hooks freeze the daemon at
the phase or arm a failure point, the fault goes in, is held for its duration, and the phase is released."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from globald.snapshot import exact_requests as snap_requests
from tests.chaos import plan, reach
from tests.chaos.base import SeedBase
from tests.chaos.outcome import (
    EVENT_KINDS,
    HOOK_TIMEOUT_S,
    PARTITIONS,
    Outcome,
)
from tests.chaos.plan import Fault
from tests.chaos.tools import ERRNOS, FIU_SITES, Fiu
from tests.reliability.disk import fill

ONCE_POLL_S = 2.0  # how often a once-armed point is asked whether it fired, while the campaign waits for a sign


class Drive(SeedBase):
    """Drive a fault to its phase, inject it, hold it."""

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

    def _fiu_spec(self, f: Fault) -> dict[str, Any]:
        p = f.params
        return {"name": FIU_SITES[p["site"]], "errno": ERRNOS[p["errno"]], "mode": p["mode"],
                "probability": p["probability"]}

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

    def _spent_poll(self, f: Fault) -> Callable[[], str | None]:
        """Whether the once-armed point of ``f`` failed a call yet, asked at most every ``ONCE_POLL_S`` without
        spending it (a caller that ignores the error says nothing: the grace would otherwise run out in full)."""
        d, p = self.daemon, f.params
        assert self.evidence is not None
        mark = self.evidence.log_mark
        asked_at = [time.monotonic()]
        found: list[str] = []

        def poll() -> str | None:
            if not found and time.monotonic() - asked_at[0] >= ONCE_POLL_S and d.alive():
                how = reach.once_fired(d, self.arm_path, FIU_SITES[p["site"]], mark, timeout=5.0,
                                       keep=ERRNOS[p["errno"]])
                asked_at[0] = time.monotonic()
                found.extend([how] if how is not None else [])
            return found[0] if found else None

        return poll

    def _hold(self, f: Fault, out: Outcome) -> None:
        d, k, p = self.daemon, f.kind, f.params
        duration = float(p.get("duration", 0.0))
        if k in reach.IO_KINDS:
            assert self.evidence is not None
            evidence = self.evidence
            seen = self._watch(duration)
            how = evidence.met(d, seen)
            once = k == plan.IO_ERROR and p["mode"] == "once"
            asked = False  # the probe spends a point still armed: asked twice, the second answer is "fired"
            if how is None and once and f.phase == plan.STOP and d.alive():
                # Asked while the stop is still held: released, the daemon exits, and no one is left to ask
                # (the stores' files were closed in the held phase, where RocksDB trims them with ftruncate).
                how, asked = reach.once_fired(d, self.arm_path, FIU_SITES[p["site"]], evidence.log_mark), True
            self.release(out)
            how = how or evidence.met(d, seen)
            if how is None and d.alive():  # not met yet: the point stays armed, the disk full, until it is (bounded)
                started = time.monotonic()
                spent = self._spent_poll(f) if once and not asked else (lambda: None)
                seen += self._watch(reach.GRACE_S,
                                    stop_when=lambda texts: evidence.met(d, texts) is not None or spent() is not None)
                how = evidence.met(d, seen) or spent()
                if how is None and once and not asked and d.alive():
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
