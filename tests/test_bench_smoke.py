"""``python -m bench`` end to end on 20k records: every benchmark runs and writes consistent results.

Timings on shared machines are noise, so nothing here judges speed; it checks that each benchmark measured what
it claims (every record read, the restored store equal to the oracle, only new records fetched on restart, one
invalid-offset wipe) and that the JSON, Markdown and PNG are written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.kafka


@pytest.mark.long  # over 30 s on an idle 2-core machine: the long lane (make test-long)
def test_bench_runs_end_to_end_on_a_small_topic(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--records", "20000", "--repeats", "1", "--freshness-seconds", "2",
         "--rates", "1000", "--benches", "restore,rss,freshness,resume,oor",
         "--out", str(out), "--scratch", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "bench-20k.json").read_text())

    assert r["meta"]["produced"] == 20_000 and r["meta"]["in_log"] == 20_000
    restore = r["restore"]
    assert restore["verified"]["equal"] and restore["verified"]["keys"] > 0
    for name, s in restore["pipelines"].items():
        assert s["records"] == 20_000, name  # every pipeline read the whole log, no more, no less
    assert set(restore["ratios"]) == {f"globald/{n}" for n in restore["pipelines"] if n != "globald"}

    assert r["resume"]["only_new_fetched"] and r["resume"]["fetched"] == [1_000]
    assert r["oor"]["records_in_log"] >= 20_000 and r["oor"]["ratio_recovery_to_cold"] > 0
    assert r["rss"]["records"] == 20_000 and r["rss"]["peak_rss_mb"] > 0
    fresh = r["freshness"]["rates"]["1000"]
    assert fresh["measured"] > 0 and fresh["unseen"] == 0 and fresh["p99_ms"] >= fresh["p50_ms"] > 0

    targets = {t["target"]: t for t in r["targets"]}
    # 7 restore/ops targets and the 3 Spark lookup targets of issue 12, the 4 disk figures of issue 21, and the
    # churn load's disk peak and write amplification of issue 33
    assert len(targets) == 16 and all(t["met"] is None for t in targets.values() if t["value"] is None)
    assert {"restore vs consume-only limit", "peak RSS while restoring 10M keys",
            "Spark join (mapInArrow) vs dict in mapInArrow"} <= set(targets)
    assert targets["restore vs raw batch pipeline"]["met"] in (True, False)
    assert (out / "bench-20k.png").read_bytes().startswith(b"\x89PNG")
    md = (out / "bench-20k.md").read_text()
    assert "## Targets" in md and "globald (GlobalThread, to RUNNING)" in md
