"""What one fault of the campaign came to (``Outcome``), the probes' results, the campaign's sizes and bounds, and
the summary by (kind, phase)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tests.chaos import plan, reach
from tests.chaos.plan import Fault

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
EVENT_KINDS = (*plan.RELOAD_KINDS, *plan.EXPORT_KINDS, *plan.REGISTRY_KINDS)
LANDED_KINDS = (*reach.IO_KINDS, *EVENT_KINDS)


class Unrecoverable(RuntimeError):
    """The seed cannot go on (the daemon does not come back even when restarted); its remaining faults are skipped."""


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
    phases = (*plan.PHASES, *plan.EXTRA_PHASES)
    for key in [(k, p) for k in (*plan.KINDS, *EVENT_KINDS) for p in phases if (k, p) in rows]:
        row = rows[key]
        times = row.pop("times")
        row["median_recover_s"] = round(statistics.median(times), 1) if times else None
        row["max_recover_s"] = round(max(times), 1) if times else None
        out.append(row)
    return out
