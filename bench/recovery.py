"""Restarts: resuming after a clean stop, and recovering from offsets the broker no longer has (KIP-406).

Resume: globald restores the topic, stops, new records arrive, globald starts again; it must fetch only those.
Out of range: the stopped store's offsets are made invalid by moving the log start past them (retention), and the
same data is produced again; the time from the invalid-offset wipe to RUNNING is compared with a cold restore
of the topic as it now is, interleaved. Both run in-process on globald's real GlobalThread.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import data
from bench.data import Dataset
from bench.env import BenchEnv
from bench.pipelines import RunningGlobald
from bench.restore import TABLE


def _run(env: BenchEnv, state: Path, topic: str) -> RunningGlobald:
    g = RunningGlobald(env.config(state, {TABLE: topic})).start()
    g.wait()
    g.stop()
    return g


def resume(env: BenchEnv, ds: Dataset, repeats: int, progress: Callable[[str], None]) -> tuple[dict[str, Any], Path]:
    """Returns the results and the state_dir left stopped at the topic's end (for ``out_of_range``)."""
    state = env.fresh_dir("resume") / "state"
    cold = _run(env, state, ds.topic)
    new = max(1_000, ds.produced // 100)
    runs = []
    for rep in range(repeats):
        env.admin.produce(ds.topic, data.records(new, seed=1_000 + rep))
        g = _run(env, state, ds.topic)
        assert g.running_at is not None
        runs.append({"seconds": round(g.running_at - g.started, 4), "fetched": g.records(), "new_records": new})
        progress(f"resume {rep + 1}/{repeats}: fetched {g.records():,} of {new:,} new records, "
                 f"RUNNING after {runs[-1]['seconds']:.3f}s")
    return {
        "cold_restore_seconds": round((cold.running_at or 0) - cold.started, 4),
        "new_records_per_restart": new,
        "fetched": [r["fetched"] for r in runs],
        "only_new_fetched": all(r["fetched"] == r["new_records"] for r in runs),
        "median_seconds": round(statistics.median(r["seconds"] for r in runs), 4),
        "runs": runs,
    }, state


def out_of_range(env: BenchEnv, ds: Dataset, stopped_state: Path, repeats: int,
                 progress: Callable[[str], None]) -> dict[str, Any]:
    saved = env.fresh_dir("oor-saved") / "state"
    shutil.copytree(stopped_state, saved)
    progress("oor: moving the log start past every stored offset (retention), then producing the data again")
    lows = env.admin.advance_log_start(ds.topic)
    env.admin.produce(ds.topic, data.records(ds.produced, seed=42))
    marks = env.admin.watermarks(ds.topic)
    in_log = sum(hi - lo for lo, hi in marks.values())
    recovery: list[float] = []
    total: list[float] = []
    cold: list[float] = []
    for rep in range(repeats):
        for kind in (("oor", "cold") if rep % 2 == 0 else ("cold", "oor")):
            state = env.fresh_dir(f"oor-{kind}") / "state"
            if kind == "oor":
                shutil.copytree(saved, state)
            g = _run(env, state, ds.topic)
            took = (g.running_at or 0) - g.started
            if kind == "oor":
                wipes = sum(g.thread.manager.wipes.values())
                if wipes != 1 or not g.thread.stats.recoveries:
                    raise RuntimeError(f"expected one invalid-offset wipe, saw {dict(g.thread.manager.wipes)}")
                recovery.append(g.thread.stats.recoveries[0])
                total.append(took)
                progress(f"oor {rep + 1}/{repeats}: wipe to RUNNING {recovery[-1]:.2f}s (start to RUNNING "
                         f"{took:.2f}s, {g.records():,} records)")
            else:
                cold.append(took)
                progress(f"oor {rep + 1}/{repeats}: cold restore of the same topic {took:.2f}s")
            shutil.rmtree(state.parent, ignore_errors=True)
    med_recovery, med_cold = statistics.median(recovery), statistics.median(cold)
    return {
        "how": "store stopped at the end; log start advanced past its offsets by retention; same data produced "
               "again; globald finds the stored offsets invalid when planning, wipes and rebuilds in-process",
        "log_start_after_advance": {str(p): o for p, o in lows.items()},
        "records_in_log": in_log,
        "recovery_seconds_median": round(med_recovery, 4),
        "start_to_running_seconds_median": round(statistics.median(total), 4),
        "cold_restore_seconds_median": round(med_cold, 4),
        "ratio_recovery_to_cold": round(med_recovery / med_cold, 3) if med_cold else None,
        "recovery_seconds": [round(x, 4) for x in recovery],
        "cold_seconds": [round(x, 4) for x in cold],
    }
