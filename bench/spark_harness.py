"""What the Spark benchmarks share (``bench.spark``, ``spark_typed_join``, ``spark_memory``): an embedded broker's
table, the sidecar daemon, a classic session and the interleaved best-of timing. Nothing here is a pass/fail test.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka

TABLE = "bench"
DEFAULT_ARROW_BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch: Spark's default, kept by measurement

T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_ms": round(statistics.median(s) * 1000, 3), "p95_ms": round(s[int(len(s) * 0.95) - 1] * 1000, 3),
            "max_ms": round(s[-1] * 1000, 3), "n": len(s)}


def records(n: int, keys: int, seed: int, value_size: int = 100) -> list[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    return [(b"key-%012d" % rnd.randrange(keys), rnd.randbytes(value_size)) for _ in range(n)]


def wait(pred: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(what)


def status(state: Path) -> dict[str, Any]:
    try:
        return json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def snapshot_at(state: Path, ends: dict[int, int]) -> dict[str, Any] | None:
    snap = status(state).get("tables", {}).get(TABLE, {}).get("snapshot") or {}
    return snap if snap.get("offsets") == {str(p): o for p, o in ends.items()} and not snap.get("stale") else None


def snapshot_at_end(admin: TopicAdmin, topic: str, state: Path) -> dict[str, Any] | None:
    return snapshot_at(state, admin.end_offsets(topic))


def sidecar_config(path: Path, state: Path, kafka: dict[str, str], topic: str) -> Path:
    """A daemon config mirroring ``topic`` as table TABLE into ``state`` (HTTP off)."""
    kafka_lines = "".join(f'"{k}" = "{v}"\n' for k, v in kafka.items())
    path.write_text(f'state_dir = "{state}"\n[http]\nenabled = false\n[kafka]\n{kafka_lines}'
                    f'[[tables]]\nname = "{TABLE}"\ntopic = "{topic}"\n')
    return path


def start_sidecar(config: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """The real daemon (``python -m globald run``), its output appended to ``log_path``."""
    with open(log_path, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "globald", "run", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT)


def stop_all(sidecars: list[subprocess.Popen[bytes]], admin: TopicAdmin, kafka: EmbeddedKafka) -> None:
    for p in sidecars:
        p.terminate()
        p.wait(60)
    admin.close()
    kafka.stop()


def spark_session(master: str = "local[1]", conf: dict[str, str] | None = None,
                  batch: int = DEFAULT_ARROW_BATCH) -> Any:
    """A classic session; local[1] (one core: every figure per core) unless ``master`` says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName("globald-bench").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch))
         .config("spark.driver.memory", "2g"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def fastest(modes: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best wall-clock seconds of each mode over ``rounds`` rounds, the modes interleaved within each round (so a
    burst of load from other jobs on the machine hits every mode alike); one warm-up run each first."""
    for fn in modes.values():
        fn()  # workers started, handles opened, broadcasts fetched
    best = dict.fromkeys(modes, float("inf"))
    names = list(modes)
    for r in range(rounds):
        # Rotated each round: a round's first query may find its Python worker cold (a job of another kind ran
        # last), and that must not fall on the same mode every round.
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = modes[name]
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best
