"""``python -m bench.profile``: where a cold globald restore spends its time, as a pyinstrument call tree.

globald's loop runs on the main thread here (pyinstrument samples the thread it starts on) until the table is
RUNNING. Time inside C (librdkafka's consume, rocksdict's write) shows against the Python line that called it.
The report goes to bench/results/profile-<size>.txt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import data
from bench.__main__ import RESULTS, size_name
from bench.env import BenchEnv
from bench.restore import TABLE
from globald.common.states import Listeners, State
from globald.engine.thread import GlobalThread


def profile_restore(env: BenchEnv, topic: str, state: Path) -> tuple[str, float]:
    from pyinstrument import Profiler

    listeners = Listeners()
    thread = GlobalThread.standalone(env.config(state, {TABLE: topic}), listeners)
    listeners.state.append(lambda new, old, reason: thread.stop() if new == State.RUNNING else None)
    profiler = Profiler(interval=0.0005)
    started = time.monotonic()
    profiler.start()
    thread.run()  # returns once RUNNING, after the clean shutdown that stop() asks for
    profiler.stop()
    return profiler.output_text(unicode=True, color=False, show_all=False), time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    env = BenchEnv.start()
    try:
        ds = data.create(env.admin, "bench", a.records)
        text, seconds = profile_restore(env, ds.topic, env.fresh_dir("profile") / "state")
    finally:
        env.stop()
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"profile-{size_name(a.records)}.txt"
    path.write_text(f"cold restore of {ds.in_log:,} records, start to RUNNING and shutdown: {seconds:.2f}s\n\n{text}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
