"""Time to RUNNING of a small restore, in process: ``GlobalThread.run`` from its start until the daemon is RUNNING
(imports and interpreter start excluded), on an empty table and a 1000-record one (3 partitions, embedded 0.9
broker). What it shows is the loop's own waits around the plan (issue 44: the first plan waited an idle poll).

    python -m bench.time_to_running [--runs 7] [--records 1000] [--trees A,B]

With ``--trees``, each checkout's globald in turn (a child process per run, PYTHONPATH and cwd set to it),
interleaved, the order swapped each run; medians in milliseconds.
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
import threading
import time
from pathlib import Path

from tests.harness import REPO

TOPICS = ("empty", "small")


def measure(settings: dict[str, str], topic: str, state: str, timeout: float = 120) -> float:
    """Seconds from ``GlobalThread.run``'s start until the daemon is RUNNING (this checkout's globald)."""
    from globald.common.states import State
    from globald.engine.thread import GlobalThread
    from globald.settings import config as configmod

    config = configmod.parse({"state_dir": state, "kafka": {**settings, "log_level": 3},
                              "tables": [{"name": "t", "topic": topic}], "http": {"enabled": False}})
    thread = GlobalThread.standalone(config)
    runner = threading.Thread(target=thread.run, daemon=True)
    started = time.monotonic()
    runner.start()
    try:
        while thread.state != State.RUNNING:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"not RUNNING within {timeout} s")
            time.sleep(0.0005)
        return time.monotonic() - started
    finally:
        thread.stop()
        runner.join(30)


def child(tree: Path, settings: dict[str, str], topic: str) -> float:
    state = tempfile.mkdtemp(prefix="globald-ttr-")
    try:
        # This file as a script, so that a checkout without it is measured too: its globald comes from PYTHONPATH.
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(settings), topic, state], cwd=tree,
                             env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                             timeout=300, check=True)
        return float(out.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.time_to_running", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--trees", default=str(REPO), help="comma-separated checkouts of globald (default this one)")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # settings, topic, state_dir: one measure
    a = p.parse_args(argv)
    if a.child:
        print(measure(json.loads(a.child[0]), a.child[1], a.child[2]))
        return 0
    from bench import data
    from bench.env import BenchEnv

    trees = [Path(x).resolve() for x in a.trees.split(",") if x]
    env = BenchEnv.start()
    try:
        env.admin.create("empty", partitions=3, compact=True)
        data.create(env.admin, "small", a.records)
        seconds: dict[str, list[float]] = {f"{tree} {topic}": [] for tree in trees for topic in TOPICS}
        for run in range(a.runs):
            for topic in TOPICS:
                for tree in trees if run % 2 == 0 else trees[::-1]:
                    seconds[f"{tree} {topic}"].append(child(tree, env.settings, topic))
    finally:
        env.kafka.stop()
        shutil.rmtree(env.root, ignore_errors=True)
    for name, s in seconds.items():
        print(json.dumps({"run": name, "median_ms": round(statistics.median(s) * 1000, 1),
                          "runs_ms": [round(x * 1000) for x in s]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
