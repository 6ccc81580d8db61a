"""The Prometheus alerts shipped in config/prometheus: valid, behaving as their tests say, on real metric names.

``promtool test rules`` feeds each alert series that must fire and series on the safe side that must not
(config/prometheus/globald-alerts.test.yml). Every metric the rules read must be one the daemon exports: the names
are taken from a real render of the daemon's registry, so renaming a metric breaks this test, not an alert in
production. promtool comes from Debian's ``prometheus`` package (`make sysdeps`); missing, the test skips, and
fails in CI.
"""

from __future__ import annotations

import re
import subprocess

from globald.common.states import State
from globald.ops.metrics import Metrics, Sample
from globald.status.document import DaemonStatus, DecodeStatus, DiskStatus, TableStatus
from tests.ci import require_tool
from tests.harness import REPO

RULES_DIR = REPO / "config" / "prometheus"
RULES = RULES_DIR / "globald-alerts.yml"
RULE_TESTS = RULES_DIR / "globald-alerts.test.yml"
ALERTS = ("GlobaldNotReady", "GlobaldDegraded", "GlobaldLagHigh", "GlobaldDiskHeadroomLow", "GlobaldDiskBelowNextStep",
          "GlobaldDiskFillsSoon", "GlobaldFailuresRepeating", "GlobaldBug", "GlobaldLoopStuck",
          "GlobaldDecodeErrorsRising")


def exported_names() -> set[str]:
    """Metric names in the text a daemon's /metrics serves (one typed table, every family present)."""
    disk = DiskStatus(free_bytes=1 << 30, tables={"t": {"live_bytes": 10, "snapshot_bytes": 5, "leftover_bytes": 0,
                                                        "need_bytes": 20}})
    doc = DaemonStatus(state=State.RUNNING, pid=1, degraded=None, disk=disk, tables={
        "t": TableStatus(state="RUNNING", topic="tt", offsets={0: 5}, end_offsets={0: 9},
                         decode=DecodeStatus(snapshot="1", offsets={0: 5}, created=1.0, values=4, errors=1,
                                             decode_seconds=0.5, runs=1, failures=0, running_pid=7))})
    sample = Sample(doc=doc, swallowed={"snapshot_publish": 1}, bugs={"user_callback": 1},
                    disk_free_bytes=(1 << 30, 1 << 34))
    text = Metrics(lambda: sample, lambda: (0.1, 0.2)).render().decode()
    return {m.group(1) for m in re.finditer(r"^([a-z_]+)(?:\{| )", text, re.M)}


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = require_tool("promtool", "prometheus")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout, check.stdout
    run = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULES_DIR, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_every_alert_is_tested_firing() -> None:
    """Each alert has at least one promtool case where it fires (a rule never seen firing proves nothing)."""
    tests = RULE_TESTS.read_text()
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", tests))
    assert fired == set(ALERTS)
    assert set(re.findall(r"- alert: (\w+)", RULES.read_text())) == set(ALERTS)


def test_the_rules_read_only_metrics_the_daemon_exports() -> None:
    used = set(re.findall(r"\b(globald_[a-z_]+)", RULES.read_text()))
    assert used, "no globald metric in the rules"
    missing = used - exported_names()
    assert not missing, f"the rules read metrics the daemon does not export: {sorted(missing)}"
