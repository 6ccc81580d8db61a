"""The restore as a user sees it: a whole process, from its spawn to RUNNING, against the raw batch pipeline also
run as a whole process (issue 44, item 2).

globald: ``python -m globald run --config FILE`` on an empty state_dir, from ``Popen`` until its status.json
(read every 10 ms) says the table is RUNNING at the log end: interpreter start (twice where ``allocator = "auto"``
re-executes it with jemalloc preloaded), imports, config checks, the state_dir's lock and store open, the restore
with its durable end, RUNNING. The raw batch pipeline: ``python -m bench.baselines raw_batch`` from ``Popen``
until the process has exited (interpreter start, its few imports, the restore, the store closed). Both are run
``repeats`` times, interleaved, the order swapped each repetition; the ratio is of the medians, and the same ratio
within each repetition shows how much the machine's noise moves it. The first globald store is checked against
the oracle fold.

``python -m bench.whole_process --runs 9 [--trees A,B]``: the start alone, no broker needed: seconds from spawning
``globald run`` (on a table whose broker is not there) until its status.json names it, the daemon started
(RESTORING); with ``--trees``, each checkout's globald in turn, interleaved (PYTHONPATH and cwd set to it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.data import Dataset
from bench.env import BenchEnv
from bench.export_bootstrap import status_doc
from bench.restore import TABLE, verify_store
from tests.harness import REPO, DaemonProcess, write_config

POLL_S = 0.01


def globald_process(env: BenchEnv, ds: Dataset, batch: int, timeout: float = 3600) -> tuple[float, Path, str]:
    """Seconds from spawning ``globald run`` until its status says RUNNING at the log end; its state_dir and the
    log of its start (for the breakdown). The daemon is stopped before returning."""
    workdir = env.fresh_dir("globald-process")
    state = workdir / "state"
    config = write_config(workdir / "globald.toml", state, {**env.settings, "log_level": 3}, {TABLE: ds.topic},
                          http={"enabled": False}, consume_batch_size=batch)
    d = DaemonProcess(config, workdir / "daemon.log")
    want = {str(p): o for p, o in ds.ends.items()}
    started = time.monotonic()
    d.start()
    try:
        while time.monotonic() - started < timeout:
            doc = status_doc(state)
            table = (doc.get("tables") or {}).get(TABLE) or {}
            if doc.get("pid") == d.pid and table.get("state") == "RUNNING" and table.get("offsets") == want:
                return time.monotonic() - started, state, d.tail()
            if not d.alive():
                raise RuntimeError(f"globald exited before RUNNING:\n{d.tail()}")
            time.sleep(POLL_S)
        raise TimeoutError(d.tail())
    finally:
        d.stop()


def raw_process(env: BenchEnv, ds: Dataset, batch: int, timeout: float = 3600) -> tuple[float, dict[str, Any]]:
    """Seconds from spawning the raw batch pipeline as a process of its own until it exited; its own Run."""
    workdir = env.fresh_dir("raw-process")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench.baselines", "raw_batch", "--topic", ds.topic,
                           "--settings", json.dumps(env.consumer_settings()), "--workdir", str(workdir),
                           "--batch", str(batch)], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the raw batch process failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(workdir, ignore_errors=True)
    run: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return took, run


def compare(env: BenchEnv, ds: Dataset, repeats: int, batch: int,
            progress: Callable[[str], None]) -> dict[str, Any]:
    g: list[float] = []
    raw: list[float] = []
    raw_inside: list[float] = []
    verified: dict[str, Any] | None = None
    raw_process(env, ds, batch)  # a warm-up, not counted: the page cache, the broker's JIT
    for rep in range(repeats):
        for name in ("globald", "raw_batch") if rep % 2 == 0 else ("raw_batch", "globald"):
            if name == "globald":
                seconds, state, _ = globald_process(env, ds, batch)
                g.append(seconds)
                if verified is None:
                    verified = verify_store(env, state, ds.topic)
                    progress(f"whole process: globald's store against the oracle: {verified}")
                shutil.rmtree(state.parent, ignore_errors=True)
            else:
                seconds, run = raw_process(env, ds, batch)
                if run["records"] != ds.in_log:
                    raise RuntimeError(f"the raw batch process read {run['records']} records of {ds.in_log}")
                raw.append(seconds)
                raw_inside.append(run["seconds"])
            end = "RUNNING" if name == "globald" else "exit"
            progress(f"whole process {rep + 1}/{repeats} {name:<10} spawn to {end:<8} {seconds:7.2f}s")
    med_g, med_raw = statistics.median(g), statistics.median(raw)
    return {
        "repeats": repeats,
        "records": ds.in_log,
        "globald_spawn_to_running_seconds": [round(s, 3) for s in g],
        "raw_batch_spawn_to_exit_seconds": [round(s, 3) for s in raw],
        "raw_batch_inside_seconds": [round(s, 3) for s in raw_inside],  # its own clock: restore only
        "globald_median_seconds": round(med_g, 3),
        "raw_batch_median_seconds": round(med_raw, 3),
        "ratio": round(med_raw / med_g, 3),
        "paired_ratios": [round(r / x, 3) for x, r in zip(g, raw, strict=True)],
        "verified": verified,
    }


def start_seconds(tree: Path, workdir: Path, timeout: float = 60) -> float:
    """Seconds from spawning ``globald run`` from ``tree`` until its status.json names it (the daemon started)."""
    state = workdir / "state"
    shutil.rmtree(state, ignore_errors=True)
    config = write_config(workdir / "globald.toml", state, {"bootstrap.servers": "127.0.0.1:9", "log_level": 3},
                          {TABLE: TABLE}, http={"enabled": False})
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "globald", "run", "--config", str(config)], cwd=tree,
                            env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - started < timeout:
            if status_doc(state).get("pid") == proc.pid:
                return time.monotonic() - started
            if proc.poll() is not None:
                raise RuntimeError(f"globald exited with {proc.returncode} before it started")
            time.sleep(POLL_S / 2)
        raise TimeoutError(f"globald did not start in {timeout} s")
    finally:
        proc.kill()  # a clean stop would wait for the broker that is not there
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.whole_process", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--trees", default=str(REPO), help="comma-separated checkouts of globald (default this one)")
    a = p.parse_args(argv)
    trees = [Path(x).resolve() for x in a.trees.split(",") if x]
    seconds: dict[Path, list[float]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory(prefix="globald-start-") as work:
        for _ in range(a.runs):
            for tree in trees:
                seconds[tree].append(start_seconds(tree, Path(work)))
    print(json.dumps({str(tree): {"median_seconds": round(statistics.median(s), 3), "runs": [round(x, 3) for x in s]}
                      for tree, s in seconds.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
