"""Peak RSS of the real daemon (``python -m globald run``) during a cold restore, sampled with psutil.

Memory is measured in its own process so that nothing of the benchmark (data, oracle, other pipelines) counts.
The daemon's status file saying RUNNING gives its own time to RUNNING, interpreter start included; sampling goes on
for as long again (at least 5 s), while the daemon serves and merges the files its bulk load left in L0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil

from bench.data import Dataset
from bench.env import BenchEnv
from bench.restore import TABLE
from globald.common.states import State
from globald.status import statusfile
from globald.status.document import DaemonStatus

MB = 1 << 20


def peak_rss(env: BenchEnv, ds: Dataset, progress: Callable[[str], None], interval: float = 0.05,
             timeout: float = 3600.0) -> dict[str, Any]:
    daemon = env.daemon({TABLE: ds.topic}, "rss")
    state = daemon.state_dir
    started = time.monotonic()
    daemon.start()
    proc = psutil.Process(daemon.pid)
    peak = samples = 0
    doc: DaemonStatus | None = None
    try:
        while time.monotonic() - started < timeout:
            if not daemon.alive():
                raise RuntimeError(f"daemon exited during the restore; log:\n{daemon.tail()}")
            peak = max(peak, proc.memory_info().rss)
            samples += 1
            doc = statusfile.read_live(state)
            if doc is not None and doc.pid == daemon.pid and doc.state == State.RUNNING:
                break
            time.sleep(interval)
        else:
            raise TimeoutError(f"daemon not RUNNING after {timeout}s; log:\n{daemon.tail()}")
        running = time.monotonic() - started
        after = proc.memory_info().rss
        merge_peak = after
        until = time.monotonic() + max(5.0, running)
        while time.monotonic() < until and daemon.alive():
            merge_peak = max(merge_peak, proc.memory_info().rss)
            time.sleep(interval)
    finally:
        if daemon.alive():
            daemon.stop()
    records = (doc.tables[TABLE].records or 0) if doc else 0
    progress(f"rss: daemon peak {peak / MB:.0f} MB while restoring {records:,} records "
             f"(RUNNING {running:.2f}s after spawn, {samples} samples), {merge_peak / MB:.0f} MB in the "
             f"{max(5.0, running):.0f}s after RUNNING")
    return {
        "peak_rss_mb": round(peak / MB, 1),
        "rss_at_running_mb": round(after / MB, 1),
        "peak_rss_after_running_mb": round(merge_peak / MB, 1),
        "after_running_window_s": round(max(5.0, running), 1),
        "records": records,
        "seconds_spawn_to_running": round(running, 3),
        "samples": samples,
        "sample_interval_s": interval,
    }
