"""Restore rate of a versioned table against a plain one (issue 45: "a versioned table restores at >= 0.8x a plain
one's rate"), through the real restore path without a broker: a bulk load (``begin_bulk_load``), the update task's
polls (``UpdateTask.update``: the fold, the versions, the offsets, ``TableStore.write``) and ``end_bulk_load``'s
flush. The broker's share (fetching the records) is the same for both, so leaving it out makes the ratio stricter.
Runs alternate plain/versioned so that a noisy neighbour favours neither.

    PYTHONPATH=. python -m bench.history_restore [--records 300000] [--keys 50000] [--runs 3] [--broker]

``--broker`` measures the whole restore instead, broker included: globald's GlobalThread in this process (as
``make bench``'s restore does) from start to RUNNING, on an embedded Tansu (the only broker here whose records
carry timestamps; records without one keep no version). Tansu reports a partition's end as the start of its last
batch + 1, so each partition ends with a record produced alone: the end is then right, and the restore reads all.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globald.common.states import StateMachine
from globald.engine.table import TableRuntime
from globald.engine.update_task import UpdateTask
from globald.settings.config import TableConfig
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore

POLL = 10_000  # records per poll, as consume_batch_size's default order


@dataclass(frozen=True)
class _Record:
    """Stands in for confluent_kafka.Message, which Python cannot construct: the same methods the fold calls."""

    _partition: int
    _offset: int
    _key: bytes
    _value: bytes | None
    _ts: int

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)  # TIMESTAMP_CREATE_TIME


def make_records(n: int, keys: int, seed: int = 45) -> list[_Record]:
    """16-byte keys, 100-byte values, 2% tombstones, 3 partitions, timestamps rising 1 ms a record with 10% a
    little out of order; in each poll, grouped by partition."""
    rng = random.Random(seed)
    offsets = [0, 0, 0]
    out = []
    base = 1_790_000_000_000
    for i in range(n):
        k = rng.randrange(keys)
        p = k % 3
        ts = base + i - (rng.randrange(5000) if rng.random() < 0.1 else 0)
        value = None if rng.random() < 0.02 else rng.randbytes(100)
        out.append(_Record(p, offsets[p], b"key-%012d" % k, value, ts))
        offsets[p] += 1
    # As a consumer delivers them: each poll's records in runs of one partition (a fetch answers per partition).
    return [r for i in range(0, n, POLL) for r in sorted(out[i:i + POLL], key=_Record.partition)]


def restore(state_dir: Path, records: list[_Record], history_ms: int | None) -> float:
    """Seconds to restore ``records`` into an empty store, bulk load included."""
    store = TableStore.open(state_dir, "bench", "t", StoreOptions(), history_ms=history_ms).store
    rt = TableRuntime(config=TableConfig("bench", "t", history=history_ms), store=store,
                      machine=StateMachine(lambda *a: None, "bench"))
    task = UpdateTask({"bench": rt})
    task.start("bench", {})
    started = time.perf_counter()
    store.begin_bulk_load()
    for i in range(0, len(records), POLL):
        task.update(records[i:i + POLL])  # type: ignore[arg-type]  # _Record stands in for Message
    store.end_bulk_load()
    seconds = time.perf_counter() - started
    store.close()
    return seconds


def restore_from_broker(state_dir: Path, settings: dict[str, str], topic: str, history_ms: int | None) -> tuple[
        float, int]:
    """(seconds from start to RUNNING, records applied) of a cold restore of ``topic`` by globald's GlobalThread."""
    from bench.pipelines import RunningGlobald
    from globald.settings.config import parse

    table: dict[str, object] = {"name": "bench", "topic": topic}
    if history_ms is not None:
        table["history"] = history_ms
    config = parse({"state_dir": str(state_dir), "kafka": dict(settings), "tables": [table]})
    g = RunningGlobald(config).start()
    try:
        return g.wait(), g.records()
    finally:
        g.stop()


def _fill_tansu(run_dir: Path, records: list[_Record]) -> tuple[Any, str]:
    from confluent_kafka import Producer

    from globald.embedded.tansu import EmbeddedTansu
    from tests.support.admin import TansuAdmin

    tansu = EmbeddedTansu(run_dir).start()
    topic = "bench-history"
    TansuAdmin(tansu.client_settings).create(topic, partitions=3)
    producer = Producer({**tansu.client_settings, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 1_000_000, "log_level": 3})
    for r in records:
        producer.produce(topic, r.value(), r.key(), partition=r.partition(), timestamp=r.timestamp()[1])
        producer.poll(0)
    producer.flush(120)
    for p in range(3):  # alone in its batch: the partition's end is then right (module docstring)
        producer.produce(topic, b"end", b"end-%d" % p, partition=p, timestamp=records[-1].timestamp()[1])
        producer.flush(60)
    return tansu, topic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--broker", action="store_true", help="the whole restore, from an embedded Tansu")
    args = ap.parse_args()
    records = make_records(args.records, args.keys)
    rates: dict[str, list[float]] = {"plain": [], "versioned": []}
    cpu: dict[str, list[float]] = {"plain": [], "versioned": []}  # process CPU (every thread) per record
    top = Path(tempfile.mkdtemp(prefix="globald-bench-history-"))
    tansu, topic = _fill_tansu(top / "tansu", records) if args.broker else (None, "")
    try:
        for run in range(args.runs):
            for kind in (("plain", "versioned") if run % 2 == 0 else ("versioned", "plain")):
                work = top / f"{kind}-{run}"
                window = None if kind == "plain" else 7 * 86_400_000
                cpu_started = time.process_time()
                if tansu is not None:
                    seconds, applied = restore_from_broker(work, tansu.client_settings, topic, window)
                    assert applied == len(records) + 3, f"restored {applied} of {len(records) + 3} records"
                else:
                    seconds = restore(work, records, window)
                used = time.process_time() - cpu_started
                shutil.rmtree(work, ignore_errors=True)
                rates[kind].append(len(records) / seconds)
                cpu[kind].append(used)
                print(f"run {run + 1} {kind:9s} {len(records) / seconds:10,.0f} records/s ({seconds:.2f} s, "
                      f"{used:.2f} CPU s)", flush=True)
    finally:
        if tansu is not None:
            tansu.stop()
        shutil.rmtree(top, ignore_errors=True)
    plain, versioned = (statistics.median(rates[k]) for k in ("plain", "versioned"))
    plain_cpu, versioned_cpu = (statistics.median(cpu[k]) for k in ("plain", "versioned"))
    print(f"median: plain {plain:,.0f} records/s, versioned {versioned:,.0f} records/s, "
          f"ratio {versioned / plain:.2f} (goal >= 0.8); CPU s plain {plain_cpu:.2f}, versioned {versioned_cpu:.2f} "
          f"(ratio {plain_cpu / versioned_cpu:.2f})")


if __name__ == "__main__":
    main()
