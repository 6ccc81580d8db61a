"""The fault ledger: what the reliability suite injected, how each fault ended, divergences and PID changes.

Tests add to a row as they inject faults and compare stores with the oracle; the row's outcome is decided by the
test's own result (a failed test marks its rows FAILED). At the end of the session the rows are folded per fault
and written as JSON and as a Markdown table, the table quoted in the closing note of the reliability issue.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.harness import REPO

REPORT_ENV = "GLOBALD_RELIABILITY_REPORT"


def report_dir() -> Path:
    return Path(os.environ.get(REPORT_ENV, REPO / "build" / "reliability"))


@dataclass
class FaultRow:
    """One fault as injected by one test. ``pid_changes`` counts only restarts the test did not cause itself."""

    fault: str
    test: str
    expected: str  # the outcome the test proves when it passes, e.g. "degraded, resumed, no wipe"
    injected: int = 0
    divergences: int = 0
    pid_changes: int = 0
    outcome: str = "not finished"
    notes: list[str] = field(default_factory=list)

    def diverged(self, n: int) -> int:
        """Record a store/snapshot comparison that found ``n`` differing keys; returns ``n`` for the assert."""
        self.divergences += n
        return n


@dataclass
class FaultSummary:
    fault: str
    injected: int = 0
    divergences: int = 0
    pid_changes: int = 0
    outcomes: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)


@dataclass
class Ledger:
    rows: list[FaultRow] = field(default_factory=list)

    def row(self, fault: str, test: str, expected: str) -> FaultRow:
        r = FaultRow(fault=fault, test=test, expected=expected)
        self.rows.append(r)
        return r

    def summary(self) -> list[FaultSummary]:
        """One line per fault: counts summed over the tests that injected it."""
        by_fault: dict[str, FaultSummary] = {}
        for r in self.rows:
            s = by_fault.setdefault(r.fault, FaultSummary(r.fault))
            s.injected += r.injected
            s.divergences += r.divergences
            s.pid_changes += r.pid_changes
            if r.outcome not in s.outcomes:
                s.outcomes.append(r.outcome)
            s.tests.append(r.test)
        return list(by_fault.values())

    def write(self, directory: Path, title: str = "Reliability suite") -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        js = directory / "report.json"
        js.write_text(json.dumps({"generated": time.time(), "summary": [asdict(s) for s in summary],
                                  "rows": [asdict(r) for r in self.rows]}, indent=2, sort_keys=True))
        md = directory / "report.md"
        md.write_text(markdown(summary, title))
        return js, md


def markdown(summary: list[FaultSummary], title: str) -> str:
    lines = [f"### {title}", "",
             "PID changes count restarts the test did not cause itself (SIGKILL rows restart by design).", "",
             "| fault | times injected | outcome | divergences | PID changes |", "|---|---:|---|---:|---:|"]
    for s in summary:
        lines.append(f"| {s.fault} | {s.injected} | {'; '.join(s.outcomes)} | {s.divergences} | {s.pid_changes} |")
    return "\n".join(lines) + "\n"
