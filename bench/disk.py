"""Disk space of the real daemon in each phase, as a multiple of the table's live size, and write amplification.

The state_dir is measured every ``interval`` seconds, each inode once however many hard links name it (a
snapshot's files are links to the live store's until a compaction rewrites them), so the figure is what the disk
holds. Phases, one daemon (``python -m globald run``, default settings: snapshots every second, ``retain`` 3):

- cold restore: from start to RUNNING (the bulk load's L0 pile), then the merge after it, until the store settles;
- steady state: records produced at ``rate``/s for ``seconds`` (bench.loadgen), snapshots published every second;
- KIP-406 rebuild: ``globald reset`` wipes the table while the stale snapshot stays served, until RUNNING again
  and settled.

Live size is the live store at the end of each phase. Write amplification is RocksDB's own record of the steady
phase (its LOG's event log): bytes written by flushes plus compactions against the bytes flushed (RocksDB's W-Amp,
which compression does not distort), and against the user bytes produced (key + value, before compression).

``churn`` is the harder steady state of issue 33 (a small, hot table such as exchange rates): 400k records of up to
600 B over 200k keys (~60 MB live), then 40 s of 3,000 updates/s over the same keys with values of the same size,
a snapshot a second, ``retain`` 3. Its figure is the state_dir's maximum over the updates (and the settling
after them) against the live store once the restore's merge settled, as the issue measured it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.data import Dataset
from bench.env import BenchEnv
from bench.restore import TABLE
from globald.common.states import State
from globald.status import statusfile
from globald.store import space
from globald.store.names import db_dir
from tests.harness import DaemonProcess, globald

MB = 1 << 20
LOADGEN_BYTES = 8 + 92 + 16  # bench.loadgen: 8-byte timestamp + 92 filler, "fresh-%010d" keys
# The churn load (issue 33, item 3).
CHURN_RECORDS, CHURN_KEYS, CHURN_VALUE_MAX = 400_000, 200_000, 600
CHURN_RATE, CHURN_SECONDS = 3000, 40.0


def state_bytes(state_dir: Path) -> int:
    """Bytes under ``state_dir``, each inode once."""
    return sum({(st.st_dev, st.st_ino): st.st_blocks * 512 for st in space.files(state_dir)}.values())


class Sampler:
    def __init__(self, d: DaemonProcess, interval: float) -> None:
        self.d, self.interval, self.peak = d, interval, 0

    def until(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"disk bench: phase did not end in {timeout}s; log:\n{self.d.tail()}")
            if not self.d.alive():
                raise RuntimeError(f"daemon exited; log:\n{self.d.tail()}")
            self.sample()
            time.sleep(self.interval)

    def sample(self) -> None:
        self.peak = max(self.peak, state_bytes(self.d.state_dir))

    def settle(self, quiet_s: float, timeout: float) -> None:
        """Sample until the store's files stay the same for ``quiet_s`` (the merge after a load is over)."""
        last, since = None, time.monotonic()

        def done() -> bool:
            nonlocal last, since
            names = sorted(p.name for p in db_dir(self.d.state_dir, TABLE).glob("*.sst"))
            if names != last:
                last, since = names, time.monotonic()
            return time.monotonic() - since >= quiet_s

        self.until(done, timeout)


def running(d: DaemonProcess) -> bool:
    doc = statusfile.read_live(d.state_dir)
    return doc is not None and doc.pid == d.pid and doc.state == State.RUNNING


def wipes(d: DaemonProcess) -> int:
    doc = statusfile.read_live(d.state_dir)
    return (doc.tables[TABLE].wipes or 0) if doc is not None and TABLE in doc.tables else 0


def phase(sampler: Sampler, d: DaemonProcess, name: str) -> dict[str, Any]:
    live = space.measure(d.state_dir, TABLE)
    out = {"peak_mb": round(sampler.peak / MB, 1), "live_mb": round(live.live / MB, 1),
           "snapshots_mb_at_end": round(live.snapshots / MB, 1),
           "peak_x_live": round(sampler.peak / max(1, live.live), 2)}
    sampler.peak = 0
    return {name: out}


def events(log: Path, since_micros: int) -> Iterator[dict[str, Any]]:
    """RocksDB's event log (the ``EVENT_LOG_v1`` lines of its LOG) after ``since_micros``."""
    for line in log.read_text(errors="replace").splitlines():
        at = line.find("EVENT_LOG_v1 ")
        if at < 0:
            continue
        try:
            ev = json.loads(line[at + len("EVENT_LOG_v1 "):])
        except ValueError:
            continue
        if ev.get("time_micros", 0) >= since_micros:
            yield ev


def write_amp(log: Path, since_micros: int) -> tuple[int, int]:
    """(bytes written by flushes, by compactions) after ``since_micros``, from RocksDB's event log."""
    flush_jobs: set[Any] = set()
    flushed = compacted = 0
    for ev in events(log, since_micros):
        kind = ev.get("event")
        if kind == "flush_started":
            flush_jobs.add(ev.get("job"))
        elif kind == "table_file_creation" and ev.get("job") in flush_jobs:
            flushed += int(ev.get("file_size", 0))
        elif kind == "compaction_finished":
            compacted += int(ev.get("total_output_size", 0))
    return flushed, compacted


def churn_records(n: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    for _ in range(n):
        yield b"key-%08d" % rnd.randrange(CHURN_KEYS), rnd.randbytes(rnd.randrange(8, CHURN_VALUE_MAX + 1))


def amplification(log: Path, since: int, user: int) -> dict[str, Any]:
    flushed, compacted = write_amp(log, since)
    return {"user_mb": round(user / MB, 1), "flushed_mb": round(flushed / MB, 1),
            "compacted_mb": round(compacted / MB, 1), "compaction_x_user": round(compacted / max(1, user), 2),
            "written_x_user": round((flushed + compacted) / max(1, user), 2),
            "written_x_flushed": round((flushed + compacted) / max(1, flushed), 2)}


def paced(source: Iterator[tuple[bytes, bytes]], rate: int, seconds: float,
          send: Callable[[list[tuple[bytes, bytes]]], object]) -> int:
    """``send`` ``rate`` records a second of ``source`` for ``seconds``, a tenth of a second's at a time; returns
    their user bytes (key + value)."""
    user = 0
    start = time.monotonic()
    for i in range(int(seconds * 10)):
        batch = [next(source) for _ in range(rate // 10)]
        user += sum(len(k) + len(v) for k, v in batch)
        send(batch)
        time.sleep(max(0.0, start + (i + 1) / 10 - time.monotonic()))
    return user


def churn(env: BenchEnv, progress: Callable[[str], None], interval: float = 0.2) -> dict[str, Any]:
    """The churn load: the state_dir's maximum under updates over the same keys, against the settled live store."""
    topic = "disk-churn"
    env.admin.create(topic, partitions=3, compact=True)
    env.admin.produce(topic, churn_records(CHURN_RECORDS, seed=33))
    d = env.daemon({TABLE: topic}, "disk-churn")
    s = Sampler(d, interval)
    r: dict[str, Any] = {"records": CHURN_RECORDS, "keys": CHURN_KEYS, "value_max": CHURN_VALUE_MAX,
                         "rate": CHURN_RATE, "seconds": CHURN_SECONDS, "retain": 3, "interval_ms": 1000}
    d.start()
    try:
        s.until(lambda: running(d), 600)
        s.settle(quiet_s=5.0, timeout=600)
        live = space.measure(d.state_dir, TABLE).live
        s.peak = 0
        since = int(time.time() * 1e6)
        user = 0
        done = threading.Event()

        def produce() -> None:
            nonlocal user
            user = paced(churn_records(int(CHURN_RATE * CHURN_SECONDS), seed=34), CHURN_RATE, CHURN_SECONDS,
                         lambda batch: env.admin.produce(topic, batch))
            done.set()

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        s.until(done.is_set, CHURN_SECONDS + 120)
        s.settle(quiet_s=3.0, timeout=120)
        r["live_mb"] = round(live / MB, 1)
        r["peak_mb"] = round(s.peak / MB, 1)
        r["peak_x_live"] = round(s.peak / max(1, live), 2)
        r["live_mb_at_end"] = round(space.measure(d.state_dir, TABLE).live / MB, 1)
        r["write_amp"] = amplification(db_dir(d.state_dir, TABLE) / "LOG", since, user)
        progress(f"disk: churn peak {r['peak_x_live']}x live ({r['live_mb']} MB); write amp "
                 f"{r['write_amp']['written_x_user']}x the user bytes")
    finally:
        if d.alive():
            d.stop()
    return r


def disk_use(env: BenchEnv, ds: Dataset, progress: Callable[[str], None], rate: int = 3000, seconds: float = 20.0,
             interval: float = 0.2) -> dict[str, Any]:
    d = env.daemon({TABLE: ds.topic}, "disk")
    s = Sampler(d, interval)
    r: dict[str, Any] = {"rate": rate, "seconds": seconds, "retain": 3, "interval_ms": 1000}
    d.start()
    try:
        s.until(lambda: running(d), 600)
        s.settle(quiet_s=5.0, timeout=600)
        r.update(phase(s, d, "restore"))
        progress(f"disk: cold restore peak {r['restore']['peak_mb']} MB = {r['restore']['peak_x_live']}x live")

        since = int(time.time() * 1e6)
        out = env.root / "disk-loadgen.bin"
        gen = subprocess.Popen([sys.executable, "-m", loadgen.__name__, "--settings", json.dumps(env.settings),
                                "--topic", ds.topic, "--rate", str(rate), "--seconds", str(seconds),
                                "--out", str(out)])
        s.until(lambda: gen.poll() is not None, seconds + 120)
        s.settle(quiet_s=3.0, timeout=120)
        r.update(phase(s, d, "steady"))
        r["write_amp"] = amplification(db_dir(d.state_dir, TABLE) / "LOG", since, int(rate * seconds) * LOADGEN_BYTES)
        progress(f"disk: steady peak {r['steady']['peak_x_live']}x live; write amp "
                 f"{r['write_amp']['written_x_user']}x the user bytes")

        pid = d.pid
        res = globald("reset", "--config", str(d.config), "--table", TABLE, "--yes", timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"reset failed: {res.stdout} {res.stderr}")
        s.until(lambda: running(d) and d.pid == pid and wipes(d) >= 1, 600)
        s.settle(quiet_s=5.0, timeout=600)
        r.update(phase(s, d, "rebuild"))
        progress(f"disk: KIP-406 rebuild peak {r['rebuild']['peak_x_live']}x live")
    finally:
        if d.alive():
            d.stop()
    r["churn"] = churn(env, progress, interval)
    return r


def targets(r: dict[str, Any], target: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """The disk goals (issues 21 and 33), judged from ``r["disk"]`` (``target`` is bench.report's ``_target``)."""
    x = r.get("disk") or {}
    out = []
    for phase_name, name, bound in (("restore", "disk peak during a cold restore", 2.5),
                                    ("steady", "disk peak in steady state, gentle load (snapshots every 1 s)", 1.5),
                                    ("churn", "disk peak in steady state, churn load (snapshots every 1 s)", 1.5),
                                    ("rebuild", "disk peak in a KIP-406 rebuild (stale snapshot served)", None)):
        v = (x.get(phase_name) or {}).get("peak_x_live")
        met = None if bound is None or v is None else v <= bound
        out.append(target(name, f"<= {bound}x live" if bound else "measured", v, met, f"{v}x live"))
    for load, w in (("gentle", x.get("write_amp") or {}), ("churn", (x.get("churn") or {}).get("write_amp") or {})):
        v = w.get("written_x_user")
        out.append(target(f"write amplification, {load} load", "<= 5x", v, None if v is None else v <= 5, f"{v}x",
                          "bytes RocksDB flushed and compacted over the user bytes (key + value) produced"))
    return out


def markdown(r: dict[str, Any]) -> list[str]:
    x = r.get("disk")
    if not x:
        return []
    rows = [f"| {p} | {x[p]['peak_mb']} | {x[p]['live_mb']} | **{x[p]['peak_x_live']}x** | "
            f"{x[p]['snapshots_mb_at_end']} |" for p in ("restore", "steady", "rebuild") if p in x]
    w = x["write_amp"]
    return ["## Disk",
            f"The state_dir every 0.2 s, each inode once; default settings (snapshots every {x['interval_ms']} ms, "
            f"retain {x['retain']}); steady state: {x['rate']} records/s for {x['seconds']} s.",
            "\n".join(["| phase | peak MB | live store MB at its end | peak / live | snapshots' own MB at its end |",
                       "|---|---|---|---|---|", *rows]),
            f"Write amplification in steady state (RocksDB's event log): {w['user_mb']} MB of user bytes; "
            f"flushes wrote {w['flushed_mb']} MB (LZ4) and compactions {w['compacted_mb']} MB: "
            f"{w['written_x_flushed']}x the bytes flushed (RocksDB's W-Amp), **{w['written_x_user']}x** the user "
            "bytes.", *churn_markdown(x.get("churn"))]


def churn_markdown(c: dict[str, Any] | None) -> list[str]:
    if not c:
        return []
    w = c["write_amp"]
    return [f"Churn load: {c['records']:,} records of up to {c['value_max']} B over {c['keys']:,} keys "
            f"({c['live_mb']} MB live once settled), then {c['rate']} updates/s over the same keys for {c['seconds']} "
            f"s, a snapshot a second, retain {c['retain']}: state_dir maximum {c['peak_mb']} MB = "
            f"**{c['peak_x_live']}x live** (live store {c['live_mb_at_end']} MB at the end); write amplification "
            f"**{w['written_x_user']}x** the {w['user_mb']} MB of user bytes (flushes {w['flushed_mb']} MB, "
            f"compactions {w['compacted_mb']} MB)."]
