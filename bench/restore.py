"""Restore throughput: every pipeline on the same topic, interleaved, repeated, compared as ratios of medians.

Each repetition runs every pipeline once, in an order rotated by one per repetition, so that a noisy neighbour
or the page cache favours no pipeline. The first globald restore is checked against the oracle fold: a fast
restore that restores the wrong thing would be worth nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.data import Dataset, records
from bench.env import BenchEnv
from bench.pipelines import PIPELINES, Job, Run, proc_cpu
from globald.embedded.oracle import fold
from globald.store.names import db_dir
from globald.store.reader import StoreReader

log = logging.getLogger(__name__)

TABLE = "bench"


def summary(runs: list[Run]) -> dict[str, Any]:
    seconds = [r.seconds for r in runs]
    med = statistics.median(seconds)
    records = runs[0].records
    out: dict[str, Any] = {
        "median_seconds": round(med, 4),
        "min_seconds": round(min(seconds), 4),
        "max_seconds": round(max(seconds), 4),
        "records": records,
        "records_per_second": round(records / med) if med else 0,
        "cpu_seconds_median": round(statistics.median(r.cpu_seconds for r in runs), 3),
        "broker_cpu_seconds_median": round(statistics.median(r.broker_cpu_seconds or 0.0 for r in runs), 3),
        "thread_cpu_seconds_median": {k: round(statistics.median(r.threads.get(k, 0.0) for r in runs), 3)
                                      for k in sorted({k for r in runs for k in r.threads})},
        "runs": [{"seconds": round(r.seconds, 4), "records": r.records, "cpu_seconds": round(r.cpu_seconds, 3)}
                 for r in runs],
    }
    settles = [(r.settle_seconds, r.settle_cpu_seconds or 0.0) for r in runs if r.settle_seconds is not None]
    if settles:  # globald: the merge of the bulk load's L0 files, after RUNNING
        out["l0_files_at_running_median"] = statistics.median(r.l0_files or 0 for r in runs)
        out["settle_seconds_median"] = round(statistics.median(s for s, _ in settles), 3)
        out["settle_cpu_seconds_median"] = round(statistics.median(c for _, c in settles), 3)
    return out


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Throughput of ``a`` over throughput of ``b`` (same records, so the inverse ratio of median times)."""
    return round(b["median_seconds"] / a["median_seconds"], 3) if a["median_seconds"] else 0.0


def _broker_cpu(env: BenchEnv) -> float:
    return proc_cpu(Path(f"/proc/{env.kafka.broker_pid}/stat"))


def ceiling(stats: dict[str, Any]) -> dict[str, Any] | None:
    """The best restore-to-consume-only ratio this machine allows: the CPU no restore avoids (consume-only's, the
    broker's while serving it, and the store's) spread perfectly over the cores; None unless both were measured."""
    c, s = stats.get("consume_only"), stats.get("store_only")
    if c is None or s is None:
        return None
    cores = os.cpu_count() or 1
    cpu = c["cpu_seconds_median"] + c["broker_cpu_seconds_median"] + s["cpu_seconds_median"]
    floor = max(c["median_seconds"], cpu / cores)
    return {"cores": cores, "cpu_seconds": round(cpu, 3), "floor_seconds": round(floor, 3),
            "ratio_to_consume_only": round(c["median_seconds"] / floor, 3)}


def verify_store(env: BenchEnv, state_dir: Path, topic: str) -> dict[str, Any]:
    """The restored store against the oracle fold at the store's own offsets."""
    with StoreReader(db_dir(state_dir, TABLE)) as r:
        offsets = r.offsets()
        # The oracle reads in Python at some 100k records/s: a fixed timeout fails at 10M.
        expected = fold(env.settings, topic, offsets, timeout=120 + sum(offsets.values()) / 20_000)
        keys = len(expected)
        mismatches = 0
        for key, value, _ in r.items():
            if expected.pop(key, None) != value:
                mismatches += 1
    mismatches += len(expected)
    return {"keys": keys, "mismatches": mismatches, "equal": mismatches == 0}


def compare(env: BenchEnv, ds: Dataset, names: list[str], repeats: int, batch: int,
            progress: Callable[[str], None]) -> dict[str, Any]:
    config = lambda state: env.config(state, {TABLE: ds.topic}, consume_batch_size=batch)  # noqa: E731
    settings = env.consumer_settings()
    runs: dict[str, list[Run]] = {n: [] for n in names}
    verified: dict[str, Any] | None = None
    # A warm-up read, not counted: the first pass over the log pays for the page cache and JIT of the broker.
    warm = PIPELINES["consume_only"](Job(ds.topic, settings, env.fresh_dir("warmup"), config, batch))
    for rep in range(repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            workdir = env.fresh_dir(name)
            broker = _broker_cpu(env)
            run = PIPELINES[name](Job(ds.topic, settings, workdir, config, batch,
                                      records=lambda: records(ds.produced, ds.seed)))
            run = replace(run, broker_cpu_seconds=round(_broker_cpu(env) - broker, 3))
            runs[name].append(run)
            settle = "" if run.settle_seconds is None else (
                f"  {run.l0_files} L0 files merged {run.settle_seconds:.2f}s after RUNNING "
                f"(cpu {run.settle_cpu_seconds or 0:.2f}s)")
            threads = " ".join(f"{k} {v:.2f}" for k, v in run.threads.items() if v >= 0.01)
            progress(f"restore {rep + 1}/{repeats} {name:<28} {run.records:>10,} records {run.seconds:7.2f}s "
                     f"{run.rate:>12,.0f}/s  cpu {run.cpu_seconds:6.2f}s{settle}  [{threads}; broker "
                     f"{run.broker_cpu_seconds:.2f}]")
            if name == "globald" and verified is None:
                verified = verify_store(env, workdir / "state", ds.topic)
                progress(f"restore: globald's store against the oracle: {verified}")
            shutil.rmtree(workdir, ignore_errors=True)
    stats = {n: summary(r) for n, r in runs.items()}
    ratios: dict[str, float] = {}
    paired: dict[str, list[float]] = {}  # the same ratio within each repetition: how much noise moves it
    if "globald" in stats:
        for other in names:
            if other != "globald":
                ratios[f"globald/{other}"] = ratio(stats["globald"], stats[other])
                paired[f"globald/{other}"] = [round(o.seconds / g.seconds, 3)
                                              for g, o in zip(runs["globald"], runs[other], strict=True)]
    return {
        "ceiling": ceiling(stats),
        "repeats": repeats,
        "consume_batch_size": batch,
        "records_read_by_warmup": warm.records,
        "pipelines": stats,
        "ratios": ratios,
        "paired_ratios": paired,
        "verified": verified,
    }
