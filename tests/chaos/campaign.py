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

import os
import signal
import time

from tests.chaos import exports, plan, reach, registry_faults, reloads
from tests.chaos.base import BULK_KEYS, BULK_RECORDS, PARTITIONS, SMALL_KEYS, SMALL_RECORDS, SeedBase, produce_pinned  # noqa: F401  # re-exported: the power-loss campaign and the runner use them
from tests.chaos.drive import Drive
from tests.chaos.heal import Heal
from tests.chaos.outcome import EVENT_KINDS, Outcome, Probe, Unrecoverable, summarize  # noqa: F401  # re-exported
from tests.chaos.plan import Fault
from tests.chaos.probes import Probes


class SeedRun(Probes, Drive, Heal, SeedBase):
    """One seed: its topics, load and daemon (``tests.chaos.base``), and the faults of its plan, each driven to its
    phase and injected (``drive``), healed (``heal``) and checked (``checks``), after the probes (``probes``)."""

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
            elif fault.kind in plan.REGISTRY_KINDS:
                self.event = registry_faults.RegistryEvent(self, fault, out)
            if self.event is not None:
                self.event.prepare()
            if isinstance(self.event, registry_faults.RegistryEvent):
                self.event.drive()  # its own daemon's phases; the campaign's daemon is checked after it as ever
            else:
                self._drive(fault, out)
        except Unrecoverable:
            raise
        except Exception as e:  # the campaign's own step failed (a Java admin call timed out…): say so, go on
            out.campaign_errors.append(f"{type(e).__name__}: {e}")
        finally:
            self._cleanup()
        if out.campaign_errors:
            self._contain(out)
        elif fault.kind in plan.REGISTRY_KINDS:  # met by a daemon of the event's own, checked there; this one settles
            t0 = time.monotonic()
            self._back_to_baseline(out)
            out.recovered = out.injected
            out.recover_s = time.monotonic() - t0 if out.injected else None
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
