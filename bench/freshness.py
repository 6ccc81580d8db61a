"""Freshness under steady produce load: how long from ``produce()`` until a reader can see the record.

A separate process (``bench.loadgen``) produces at a fixed rate; globald runs in this process. "Visible" means
visible in the current snapshot when ``globald.snapshot`` is installed (CURRENT's manifest offsets, as a reader
sees them), else visible in the live store (the next-offsets written with the data, sampled after each poll).
Records produced in the first second are left out (warm-up). Latencies are in milliseconds.
"""

from __future__ import annotations

import bisect
import json
import statistics
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable
from typing import Any

from bench import data
from bench.env import BenchEnv
from bench.pipelines import RunningGlobald
from bench.restore import TABLE
from globald.snapshot.manifest import read as manifest_read
from globald.snapshot.reader import current_id
from globald.store.names import snapshots_dir

Sample = tuple[int, dict[int, int]]  # (CLOCK_MONOTONIC ns, next-offset per partition)


class LiveStoreVisibility:
    """Next-offsets written to the live store, sampled right after every poll's write."""

    name = "live store"

    def __init__(self, g: RunningGlobald) -> None:
        self.samples: list[Sample] = []
        self._g = g
        g.probes.append(self._sample)

    def _sample(self) -> None:
        self.samples.append((time.monotonic_ns(), self._g.thread.positions(TABLE)))

    def close(self) -> None:
        pass


class SnapshotVisibility:
    """SWITCH POINT for "visible in the current snapshot": the snapshot publisher runs in the daemon's loop as it
    does in ``globald run``, and a reader thread records CURRENT's manifest offsets each time CURRENT moves."""

    name = "current snapshot"

    def __init__(self, g: RunningGlobald, publisher: Any, current_id: Callable[..., Any],
                 read_manifest: Callable[..., Any], snapshots_dir: Callable[..., Any]) -> None:
        self.samples: list[Sample] = []
        self.publish_ms: list[float] = []
        self.publisher = publisher
        self._config = g.config
        self._current_id, self._read, self._dir = current_id, read_manifest, snapshots_dir
        self._stop = threading.Event()
        self._published = 0
        g.probes.append(self._publish_times)  # after the publisher's own tick
        publisher.start()
        self._watcher = threading.Thread(target=self._watch, name="snapshot-watcher", daemon=True)
        self._watcher.start()

    def _publish_times(self) -> None:
        snap = self.publisher.status(TABLE)
        if snap.published > self._published:
            self._published = snap.published
            self.publish_ms.append(snap.last_publish_ms)

    def _watch(self) -> None:
        seen = None
        while not self._stop.wait(0.005):
            sid = self._current_id(self._config.state_dir, TABLE)
            if sid is None or sid == seen:
                continue
            seen = sid
            m = self._read(self._dir(self._config.state_dir, TABLE) / sid, TABLE)
            self.samples.append((time.monotonic_ns(), {int(p): o for p, o in m.offsets.items()}))

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(5)
        self.publisher.close()


def snapshot_visibility(g: RunningGlobald) -> SnapshotVisibility | None:
    """Snapshot visibility when ``g`` publishes snapshots; None (fall back to the live store) if not."""
    if g.publisher is None:
        return None
    g.config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # as `globald run` does before publishing
    return SnapshotVisibility(g, g.publisher, current_id, manifest_read, snapshots_dir)


def latencies_ms(sent: array, samples: list[Sample], skip_before_ns: int) -> tuple[list[float], int]:
    """Per record: first sample time whose next-offset is past it, minus its produce time. Also: records never
    seen."""
    by_partition: dict[int, tuple[list[int], list[int]]] = {}
    for t, positions in samples:
        for p, o in positions.items():
            times, offs = by_partition.setdefault(p, ([], []))
            if offs and o < offs[-1]:
                continue  # a sample older than one already seen (never expected; keeps bisect valid)
            times.append(t)
            offs.append(o)
    out: list[float] = []
    unseen = 0
    for i in range(0, len(sent), 3):
        p, offset, produced = sent[i], sent[i + 1], sent[i + 2]
        if produced < skip_before_ns:
            continue
        times, offs = by_partition.get(p, ([], []))
        j = bisect.bisect_right(offs, offset)
        if j == len(offs):
            unseen += 1
        else:
            out.append((times[j] - produced) / 1e6)
    return out, unseen


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def freshness(env: BenchEnv, rates: list[int], seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    topic = "bench-fresh"
    env.admin.create(topic, partitions=3, compact=True)
    env.admin.produce(topic, data.records(10_000, seed=3))
    results: dict[str, Any] = {"rates": {}}
    for rate in rates:
        g = RunningGlobald(env.config(env.fresh_dir(f"fresh-{rate}") / "state", {TABLE: topic}), snapshots=True)
        vis = snapshot_visibility(g) or LiveStoreVisibility(g)
        g.start()
        g.wait()
        out = env.fresh_dir(f"loadgen-{rate}") / "sent.bin"
        began = time.monotonic_ns()
        subprocess.run([sys.executable, "-m", "bench.loadgen", "--settings", json.dumps(env.settings),
                        "--topic", topic, "--rate", str(rate), "--seconds", str(seconds), "--out", str(out)],
                       check=True, timeout=seconds + 120)
        ends = env.admin.end_offsets(topic)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                vis.samples and vis.samples[-1][1].get(p, -1) >= o for p, o in ends.items()):
            time.sleep(0.05)
        vis.close()
        g.stop()
        sent = array("q")
        sent.frombytes(out.read_bytes())
        lat, unseen = latencies_ms(sent, vis.samples, skip_before_ns=began + 1_000_000_000)
        row: dict[str, Any] = {
            "visible_in": vis.name,
            "records": len(sent) // 3,
            "measured": len(lat),
            "unseen": unseen,
            "p50_ms": round(_percentile(lat, 0.50), 1),
            "p99_ms": round(_percentile(lat, 0.99), 1),
            "max_ms": round(max(lat), 1) if lat else None,
            "achieved_rate": round(len(sent) / 3 / seconds),
        }
        if isinstance(vis, SnapshotVisibility) and vis.publish_ms:
            row["snapshot_publish_ms_p50"] = round(statistics.median(vis.publish_ms), 2)
            row["snapshot_publish_ms_max"] = round(max(vis.publish_ms), 2)
        results["rates"][str(rate)] = row
        progress(f"freshness {rate:>6}/s: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms "
                 f"({row['measured']:,} records, visible in the {vis.name})")
    results["snapshot_interval_ms"] = env.config(env.root, {TABLE: topic}).snapshots.interval_ms
    return results
