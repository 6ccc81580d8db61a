"""After a fault (a part of ``campaign.SeedRun``): the daemon must be RUNNING at every log end, undegraded, with the
same PID, within ``--recover-timeout``; a daemon that is not is replaced so that the seed can go on."""

from __future__ import annotations

import signal
import time

from globald.snapshot import exact_requests as snap_requests
from tests.chaos import plan
from tests.chaos.checks import Checks
from tests.chaos.outcome import (
    STOP_TIMEOUT_S,
    Outcome,
    Unrecoverable,
)
from tests.chaos.plan import Fault


class Heal(Checks):
    """Recover from a fault, or get back to the baseline after one that was not injected."""

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
