"""The reference restore pipelines globald is compared with, and what every pipeline is given and reports.

Each pipeline starts cold (empty directory, new consumer), reads every partition from its log start to the end
captured when it started, and reports the seconds from its first action to "restored", the records it applied
and the CPU seconds the process spent meanwhile. The baselines have no daemon logic; they use globald's consumer
settings and RocksDB options, so a ratio against them measures globald's design, not a tuning difference.

This module imports only what the baselines use (confluent-kafka, rocksdict and globald's store options and
codec), so that ``python -m bench.baselines`` runs the raw batch pipeline as a whole process (interpreter start,
imports, restore) with no more start-up than such a program of its own would have: the other side of
``bench.whole_process``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition
from rocksdict import Rdict, WriteBatch

from globald.settings.kafka_properties import CONSUMER_DEFAULTS
from globald.store.codec import NO_TIMESTAMP, encode_offset, pack_i64, partition_key
from globald.store.names import OFFSETS_CF, VALUES_CF
from globald.store.options import StoreOptions

if TYPE_CHECKING:
    from bench.data import Record
    from globald.settings.config import Config

_EOF = KafkaError._PARTITION_EOF


@dataclass(frozen=True)
class Job:
    """What every pipeline gets: the same topic, consumer settings, batch size and store options."""

    topic: str
    settings: dict[str, Any]
    workdir: Path
    config: Callable[[Path], Config]  # globald's config for a state_dir
    batch: int = 10_000
    options: StoreOptions = field(default_factory=StoreOptions)
    records: Callable[[], Iterable[Record]] | None = None  # the topic's records, made again in memory


@dataclass(frozen=True)
class Run:
    seconds: float
    records: int
    cpu_seconds: float = 0.0
    # globald only: from RUNNING until the files its bulk load left in L0 are merged (in the background, served)
    settle_seconds: float | None = None
    settle_cpu_seconds: float | None = None
    l0_files: int | None = None  # globald only: files the bulk load left in L0 at RUNNING, for the merge after it
    broker_cpu_seconds: float | None = None  # the embedded broker's CPU meanwhile (it shares the machine's cores)

    # CPU seconds per kind of thread of this process (see ``thread_cpu``), up to "restored"
    threads: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def proc_cpu(stat: Path) -> float:
    """CPU seconds (user + system) of the process or thread whose /proc ``stat`` file this is; 0 once it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's live threads, per kind: the thread's name without its number
    (rdk:broker, rocksdb:high for flushes, rocksdb:low for compactions; Python threads are all "python")."""
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            kind = (task / "comm").read_text().strip().rstrip("0123456789-") or "?"
        except OSError:
            continue
        out[kind] = out.get(kind, 0.0) + proc_cpu(task / "stat")
    return out


@dataclass
class _Clock:
    """Wall time, process CPU and CPU per kind of thread, from a pipeline's first action."""

    wall: float = field(default_factory=time.monotonic)
    cpu: float = field(default_factory=time.process_time)
    threads: dict[str, float] = field(default_factory=thread_cpu)

    def run(self, records: int) -> Run:
        # A thread that ended meanwhile takes its CPU with it: such a kind's figure is clipped at 0.
        now = thread_cpu()
        return Run(time.monotonic() - self.wall, records, time.process_time() - self.cpu,
                   threads={k: round(max(0.0, v - self.threads.get(k, 0.0)), 3) for k, v in sorted(now.items())})


class _Ends:
    """Which partitions still have records below the end captured at the start."""

    def __init__(self, consumer: Consumer, topic: str) -> None:
        md = consumer.list_topics(topic, timeout=10)
        self.todo: dict[int, int] = {}
        self.starts: dict[int, int] = {}
        for p in sorted(md.topics[topic].partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            self.starts[p] = low
            if low < high:
                self.todo[p] = high

    def reached(self, partition: int, next_offset: int) -> None:
        end = self.todo.get(partition)
        if end is not None and next_offset >= end:
            del self.todo[partition]


@contextmanager
def _reading(job: Job, with_store: bool) -> Iterator[tuple[Consumer, _Ends, Rdict | None]]:
    """A consumer assigned to every partition from its log start, and (optionally) a store like globald's."""
    db = None
    if with_store:
        db_options, families = job.options.column_families()
        db = Rdict(str(job.workdir / "db"), db_options, column_families=families)
    c = Consumer(job.settings)
    try:
        ends = _Ends(c, job.topic)
        c.assign([TopicPartition(job.topic, p, o) for p, o in ends.starts.items()])
        yield c, ends, db
    finally:
        c.close()
        if db is not None:
            db.close()


def _batch(c: Consumer, n: int) -> list[Any]:
    """Up to ``n`` messages, as globald takes them: wait for the first, then only what is already queued
    (``consume(n, timeout)`` alone would hold the last, partial batch of a restore for the whole timeout)."""
    first = c.poll(0.2)
    return [] if first is None else [first, *c.consume(n - 1, 0)]


def _stored(m: Any) -> bytes:
    ts_type, ts = m.timestamp()
    return pack_i64(ts if ts_type != TIMESTAMP_NOT_AVAILABLE else NO_TIMESTAMP) + m.value()


def consume_only(job: Job) -> Run:
    """The single-consumer limit: ``consume(n)``, records discarded unread."""
    clock = _Clock()
    n = 0
    with _reading(job, with_store=False) as (c, ends, _):
        while ends.todo:
            messages = _batch(c, job.batch)
            n += len(messages)
            for m in messages:
                if m.error() is not None:
                    n -= 1
            # Records are not even looked at: the end is found from the last message of each partition.
            _reach_ends(messages, ends)
        return clock.run(n)


def _reach_ends(messages: list[Any], ends: _Ends) -> None:
    """Mark the partitions whose end ``messages`` reach, from the last message of each."""
    unseen = set(ends.todo)
    for m in reversed(messages):
        p = m.partition()
        if p not in unseen:
            continue
        unseen.discard(p)
        err = m.error()
        if err is None:
            ends.reached(p, m.offset() + 1)
        elif err.code() == _EOF:
            ends.reached(p, m.offset())
        if not unseen:
            break


def read_fields(job: Job) -> Run:
    """consume-only plus reading each record's key, value and timestamp, nothing written: the floor of any restore
    that takes records through confluent-kafka's Message objects (globald's per-record work minus the store)."""
    clock = _Clock()
    n = 0
    with _reading(job, with_store=False) as (c, ends, _):
        while ends.todo:
            messages = _batch(c, job.batch)
            for m in messages:  # what globald's update loop reads of each record
                if m.error() is not None:
                    continue
                n += 1
                m.partition()
                m.key()
                m.value()
                m.timestamp()
            _reach_ends(messages, ends)
        return clock.run(n)


def raw_batch(job: Job) -> Run:
    """``consume(n)`` plus one WriteBatch per poll holding the records and the offsets; no daemon logic."""
    clock = _Clock()
    n = 0
    with _reading(job, with_store=True) as (c, ends, db):
        assert db is not None
        values = db.get_column_family_handle(VALUES_CF)
        offsets = db.get_column_family_handle(OFFSETS_CF)
        while ends.todo:
            wb = WriteBatch(raw_mode=True)
            wb.set_default_column_family(values)
            last: dict[int, int] = {}
            for m in _batch(c, job.batch):
                err = m.error()
                if err is not None:
                    if err.code() == _EOF:
                        ends.reached(m.partition(), m.offset())
                    continue
                n += 1
                last[m.partition()] = m.offset() + 1
                if m.value() is None:
                    wb.delete(m.key())
                else:
                    wb.put(m.key(), _stored(m))
            for p, o in last.items():
                wb.put(partition_key(p), encode_offset(o), offsets)
                ends.reached(p, o)
            if last:
                db.write(wb)
        return clock.run(n)


def raw_batch_librdkafka_fetch(job: Job) -> Run:
    """The raw pipeline with librdkafka's own fetch defaults: what globald's fetch defaults are worth."""
    return raw_batch(replace(job, settings={k: v for k, v in job.settings.items() if k not in CONSUMER_DEFAULTS}))


def per_record(job: Job) -> Run:
    """The recovery loop of quix-streams and faust: ``poll()`` one message, one put and one offset put each."""
    clock = _Clock()
    n = 0
    with _reading(job, with_store=True) as (c, ends, db):
        assert db is not None
        values = db.get_column_family(VALUES_CF)
        offsets = db.get_column_family(OFFSETS_CF)
        while ends.todo:
            m = c.poll(0.2)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == _EOF:
                    ends.reached(m.partition(), m.offset())
                continue
            n += 1
            if m.value() is None:
                del values[m.key()]
            else:
                values[m.key()] = _stored(m)
            offsets[partition_key(m.partition())] = encode_offset(m.offset() + 1)
            ends.reached(m.partition(), m.offset() + 1)
        return clock.run(n)


BASELINES: dict[str, Callable[[Job], Run]] = {
    "raw_batch": raw_batch,
    "consume_only": consume_only,
    "read_fields": read_fields,
    "per_record": per_record,
    "raw_batch_librdkafka_fetch": raw_batch_librdkafka_fetch,
}


def main(argv: list[str] | None = None) -> int:
    """One baseline in this process, on a topic and consumer settings given as JSON; prints its Run as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.baselines", description=main.__doc__)
    p.add_argument("pipeline", choices=sorted(BASELINES))
    p.add_argument("--topic", required=True)
    p.add_argument("--settings", required=True, help="the consumer settings, a JSON object")
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--batch", type=int, default=10_000)
    a = p.parse_args(argv)

    def no_config(state: Path) -> Config:
        raise AssertionError("a baseline has no globald config")

    run = BASELINES[a.pipeline](Job(a.topic, json.loads(a.settings), a.workdir, no_config, a.batch))
    print(json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
