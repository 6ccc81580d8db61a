"""Prometheus metrics of one daemon, in a registry of their own (never the process-global default one).

Every value comes from a ``Sample`` the loop thread takes when it publishes status, so a scrape sees the same
numbers as ``status.json`` at that moment and never touches the consumer or a store from the HTTP thread. Only
the loop's age and the commit-latency histogram are read live (and decoded snapshots' ages, from the sample's
creation times and the clock at the scrape).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from globald import __version__
from globald.common.states import State
from globald.ops.progress import RestoreStats
from globald.status.document import DaemonStatus
from globald.store.stalls import Stalls

PREFIX = "globald"


@dataclass(frozen=True)
class SnapshotStats:
    age_seconds: float | None
    publish_seconds: float | None


@dataclass(frozen=True)
class Sample:
    """Everything /metrics, /status and /readyz report, taken on the loop thread at one moment."""

    doc: DaemonStatus  # the status document, as in status.json
    wipes: dict[tuple[str, str], int] = field(default_factory=dict)  # (table, reason) -> count
    commits: int = 0
    callback_failures: int = 0
    hook_failures: dict[str, int] = field(default_factory=dict)  # kind -> count
    consumer_errors: int = 0
    consumer_renewals: int = 0
    build_workers_replaced: int = 0
    restores: dict[str, RestoreStats] = field(default_factory=dict)
    snapshots: dict[str, SnapshotStats] = field(default_factory=dict)
    write_stalls: Stalls = field(default_factory=Stalls)
    swallowed: dict[str, int] = field(default_factory=dict)  # where -> exceptions caught there (common.swallowed)
    bugs: dict[str, int] = field(default_factory=dict)  # where -> those of them that were not I/O or Kafka errors
    disk_free_bytes: tuple[int, int] | None = None  # (free to globald, size) of the state_dir's filesystem


# The places whose swallowed exceptions are callbacks that raised (globald_callback_failures_total).
CALLBACK_PLACES = ("user_callback", "event_subscriber", "loop_service:")


def callback_failures(swallowed: dict[str, int]) -> int:
    return sum(n for where, n in swallowed.items() if where.startswith(CALLBACK_PLACES))


def disk_free_bytes(path: Path) -> tuple[int, int] | None:
    """(bytes an unprivileged writer may still use, size) of the filesystem holding ``path``; None if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


class DaemonCollector(Collector):
    def __init__(self, sample: Callable[[], Sample | None], loop_age: Callable[[], tuple[float, float]]) -> None:
        self._sample = sample
        self._loop_age = loop_age

    def collect(self) -> Iterator[Metric]:
        s = self._sample()
        info = InfoMetricFamily(f"{PREFIX}_build", "globald version")
        info.add_metric([], {"version": __version__})
        yield info
        if s is None:
            return
        yield from _states(s)
        yield from _partitions(s)
        yield from _restores(s)
        yield from _counters(s)
        yield from _snapshots(s)
        yield from _decodes(s)
        yield from _history(s)
        yield from _exports(s)
        yield from _config(s)
        loop_age, progress_age = self._loop_age()
        yield GaugeMetricFamily(f"{PREFIX}_loop_age_seconds", "Seconds since the loop last iterated", value=loop_age)
        yield GaugeMetricFamily(f"{PREFIX}_progress_age_seconds", "Seconds since a poll last moved an offset",
                                value=progress_age)


def _states(s: Sample) -> Iterator[Metric]:
    daemon = GaugeMetricFamily(f"{PREFIX}_state", "1 for the daemon's current state", labels=["state"])
    for st in State:
        daemon.add_metric([st.value], 1.0 if s.doc.state == st else 0.0)
    yield daemon
    tables = GaugeMetricFamily(f"{PREFIX}_table_state", "1 for each table's current state", labels=["table", "state"])
    for name, t in s.doc.tables.items():
        for st in State:
            tables.add_metric([name, st.value], 1.0 if t.state == st.value else 0.0)
    yield tables
    yield GaugeMetricFamily(f"{PREFIX}_ready", "1 when every table can be served consistently (/readyz)",
                            value=1.0 if s.doc.ready else 0.0)
    yield GaugeMetricFamily(f"{PREFIX}_degraded", "1 while a fault is being retried (see status 'degraded')",
                            value=1.0 if s.doc.degraded else 0.0)


def _partitions(s: Sample) -> Iterator[Metric]:
    labels = ["table", "topic", "partition"]
    offset = GaugeMetricFamily(f"{PREFIX}_partition_offset", "Next offset stored for the partition", labels=labels)
    end = GaugeMetricFamily(f"{PREFIX}_partition_end_offset", "Latest known log end of the partition", labels=labels)
    lag = GaugeMetricFamily(f"{PREFIX}_partition_lag", "Log end minus stored next offset", labels=labels)
    records = CounterMetricFamily(f"{PREFIX}_records", "Records applied to the table since start", labels=["table"])
    null_keys = CounterMetricFamily(f"{PREFIX}_null_keys", "Records skipped for a null key", labels=["table"])
    for name, t in s.doc.tables.items():
        offsets, ends = t.offsets, t.end_offsets or {}
        for p in sorted(set(offsets) | set(ends)):
            key = [name, t.topic, str(p)]
            if p in offsets:
                offset.add_metric(key, offsets[p])
            if p in ends:
                end.add_metric(key, ends[p])
                lag.add_metric(key, max(0, ends[p] - offsets.get(p, 0)))
        records.add_metric([name], t.records or 0)
        null_keys.add_metric([name], t.null_keys or 0)
    yield from (offset, end, lag, records, null_keys)


def _restores(s: Sample) -> Iterator[Metric]:
    total = CounterMetricFamily(f"{PREFIX}_restore_records", "Records restored since start, over every restore",
                                labels=["table"])
    rate = GaugeMetricFamily(f"{PREFIX}_restore_records_per_second",
                             "Restore rate over the last seconds (0 when not restoring)", labels=["table"])
    remaining = GaugeMetricFamily(f"{PREFIX}_restore_remaining_offsets", "Offsets left before the restore target",
                                  labels=["table"])
    restoring = GaugeMetricFamily(f"{PREFIX}_restore_active", "1 while the table is restoring", labels=["table"])
    for name in s.doc.tables:
        r = s.restores.get(name)
        total.add_metric([name], r.records_total if r else 0)
        rate.add_metric([name], r.records_per_second if r and r.active else 0.0)
        remaining.add_metric([name], r.total_offsets - r.done_offsets if r and r.active else 0)
        restoring.add_metric([name], 1.0 if r and r.active else 0.0)
    yield from (total, rate, remaining, restoring)


def _counters(s: Sample) -> Iterator[Metric]:
    wipes = CounterMetricFamily(f"{PREFIX}_wipes", "Tables wiped and rebuilt, by reason", labels=["table", "reason"])
    for (table, reason), n in sorted(s.wipes.items()):
        wipes.add_metric([table, reason], n)
    yield wipes
    yield CounterMetricFamily(f"{PREFIX}_commits", "Commits (fsync + .checkpoint file)", value=s.commits)
    yield CounterMetricFamily(f"{PREFIX}_callback_failures", "State/restore callbacks and loop hooks that raised",
                              value=s.callback_failures)
    hooks = CounterMetricFamily(f"{PREFIX}_hook_failures", "State-change hooks that failed, by kind", labels=["kind"])
    for kind, n in sorted(s.hook_failures.items()):
        hooks.add_metric([kind], n)
    yield hooks
    yield CounterMetricFamily(f"{PREFIX}_consumer_errors", "Transient consumer errors", value=s.consumer_errors)
    yield CounterMetricFamily(f"{PREFIX}_consumer_renewals",
                              "Consumers replaced: after the cluster stayed silent, or for new [kafka] properties",
                              value=s.consumer_renewals)
    yield CounterMetricFamily(f"{PREFIX}_exact_build_workers_replaced",
                              "Exact-build workers replaced, left stuck inside a Kafka client past their bound",
                              value=s.build_workers_replaced)
    stalls = s.write_stalls
    yield CounterMetricFamily(f"{PREFIX}_write_stalls", "Store writes that waited for RocksDB to make room",
                              value=stalls.waited)
    yield CounterMetricFamily(f"{PREFIX}_write_stall_seconds", "Time store writes waited for RocksDB to make room",
                              value=stalls.seconds)
    yield CounterMetricFamily(f"{PREFIX}_writes_remade", "Write batches RocksDB refused and that were made again",
                              value=stalls.remade)
    caught = CounterMetricFamily(f"{PREFIX}_swallowed_failures", "Exceptions caught and ridden out, by place",
                                 labels=["where"])
    for where, n in sorted(s.swallowed.items()):
        caught.add_metric([where], n)
    yield caught
    bugs = CounterMetricFamily(f"{PREFIX}_bugs", "Caught exceptions that were not I/O, store or Kafka errors: "
                               "defects (status 'bugs' names them)", labels=["where"])
    for where, n in sorted(s.bugs.items()):
        bugs.add_metric([where], n)
    yield bugs
    if s.disk_free_bytes is not None:
        free, size = s.disk_free_bytes
        yield GaugeMetricFamily(f"{PREFIX}_state_dir_free_bytes", "Bytes globald may still write on the state_dir's "
                                "filesystem", value=free)
        yield GaugeMetricFamily(f"{PREFIX}_state_dir_size_bytes", "Size of the state_dir's filesystem", value=size)
    yield from _disk(s)


def _disk(s: Sample) -> Iterator[Metric]:
    """Per table, each inode once (globald.snapshot.space): the live store, its snapshots' own bytes, and what the
    table's next step (a compaction rewriting the whole live store) needs free."""
    tables = s.doc.disk.tables if s.doc.disk is not None else {}
    table_bytes = GaugeMetricFamily(f"{PREFIX}_table_disk_bytes", "Bytes a table takes on the state_dir, by part "
                                    "(live store; snapshots beyond it, hard links counted once; leftovers)",
                                    labels=["table", "part"])
    need = GaugeMetricFamily(f"{PREFIX}_table_disk_need_bytes", "Free bytes the table's next step needs (a compaction "
                             "rewriting its whole live store)", labels=["table"])
    for name, t in sorted(tables.items()):
        for part in ("live", "snapshot", "leftover"):
            table_bytes.add_metric([name, part], t.get(f"{part}_bytes", 0))
        need.add_metric([name], t.get("need_bytes", 0))
    yield from (table_bytes, need)


def _snapshots(s: Sample) -> Iterator[Metric]:
    age = GaugeMetricFamily(f"{PREFIX}_snapshot_age_seconds", "Age of the table's current snapshot",
                            labels=["table"])
    publish = GaugeMetricFamily(f"{PREFIX}_snapshot_publish_seconds", "Duration of the table's last snapshot publish",
                                labels=["table"])
    for name, snap in sorted(s.snapshots.items()):
        if snap.age_seconds is not None:
            age.add_metric([name], snap.age_seconds)
        if snap.publish_seconds is not None:
            publish.add_metric([name], snap.publish_seconds)
    yield from (age, publish)


def _history(s: Sample) -> Iterator[Metric]:
    """Versioned tables only (``store.history``): the record time from which as-of answers are exact, as epoch
    seconds; absent while it is unproven or pending (status says why), so an alert on its age never reads a 0."""
    since = GaugeMetricFamily(f"{PREFIX}_table_history_since_seconds", "Versioned tables: the record time (epoch "
                              "seconds) from which as-of lookups are exact", labels=["table"])
    for name, t in sorted(s.doc.tables.items()):
        if t.history is not None and isinstance(t.history.get("since"), int):
            since.add_metric([name], t.history["since"] / 1000)
    yield since


def _decodes(s: Sample) -> Iterator[Metric]:
    """Typed tables only (globald.ops.decoding): the newest snapshot the daemon decoded, as its columnar file says,
    and the decode processes it ran. The age is taken at the scrape, from the snapshot's creation time."""
    labels = ["table"]
    errors = GaugeMetricFamily(f"{PREFIX}_table_decode_errors", "Values of the newest decoded snapshot that did not "
                               "decode (null in every reader)", labels=labels)
    pending = GaugeMetricFamily(f"{PREFIX}_table_decode_pending", "Of the decode errors, values whose writer schema "
                                "is not fetched from the Schema Registry yet: decoded once it answers", labels=labels)
    key_errors = GaugeMetricFamily(f"{PREFIX}_table_key_decode_errors", "Typed keys: stored keys of the newest "
                                   "decoded snapshot that did not decode (left out of its file)", labels=labels)
    values = GaugeMetricFamily(f"{PREFIX}_table_decoded_values", "Values (keys) of the newest decoded snapshot",
                               labels=labels)
    age = GaugeMetricFamily(f"{PREFIX}_table_decoded_snapshot_age_seconds", "Age of the newest snapshot decoded into "
                            "its columnar file", labels=labels)
    seconds = GaugeMetricFamily(f"{PREFIX}_table_decode_seconds", "How long decoding the newest decoded snapshot took",
                                labels=labels)
    active = GaugeMetricFamily(f"{PREFIX}_table_decode_active", "1 while a decode process runs for the table",
                               labels=labels)
    runs = CounterMetricFamily(f"{PREFIX}_table_decodes", "Decode processes that ended well (file written or found)",
                               labels=labels)
    failures = CounterMetricFamily(f"{PREFIX}_table_decode_failures", "Decode processes that failed or timed out",
                                   labels=labels)
    now = time.time()
    for name, t in sorted(s.doc.tables.items()):
        d = t.decode
        if d is None:
            continue
        if d.snapshot is not None and not d.too_large:
            errors.add_metric([name], d.errors)
            pending.add_metric([name], d.pending)
            key_errors.add_metric([name], d.key_errors)
            values.add_metric([name], d.values)
        if d.created is not None:
            age.add_metric([name], max(0.0, now - d.created))
        if d.decode_seconds is not None:
            seconds.add_metric([name], d.decode_seconds)
        active.add_metric([name], 1.0 if d.running_pid is not None else 0.0)
        runs.add_metric([name], d.runs)
        failures.add_metric([name], d.failures)
    yield from (errors, pending, key_errors, values, age, seconds, active, runs, failures)


def _number(doc: dict[str, object] | None, key: str) -> float | None:
    """A figure of a status section read leniently (``origin``/``export`` are plain dicts): a number, or None."""
    value = None if doc is None else doc.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _exports(s: Sample) -> Iterator[Metric]:
    """[export] only (globald.export): where each store came from at this start, and this host's exports."""
    labels = ["table"]
    origin = GaugeMetricFamily(f"{PREFIX}_table_origin", "1 for where the table's store came from: export, topic "
                               "or store (it had one)", labels=["table", "kind"])
    fallback = GaugeMetricFamily(f"{PREFIX}_table_bootstrap_fallback", "1 when an export was looked for and not "
                                 "used (status says why)", labels=labels)
    figures = {key: GaugeMetricFamily(f"{PREFIX}_table_bootstrap_{key}", text, labels=labels) for key, text in (
        ("bytes_downloaded", "Bytes the bootstrap downloaded"), ("seconds", "How long the bootstrap took"),
        ("tail", "Offsets replayed from the export's to where the table first went RUNNING"),
        ("age_s", "Age of the exported snapshot when the status was taken"))}
    uploaded = CounterMetricFamily(f"{PREFIX}_table_export_uploaded_bytes", "Bytes this host uploaded to the "
                                   "export storage", labels=labels)
    exports = CounterMetricFamily(f"{PREFIX}_table_exports", "Exports this host wrote", labels=labels)
    failures = CounterMetricFamily(f"{PREFIX}_table_export_failures", "Exports that failed", labels=labels)
    last = GaugeMetricFamily(f"{PREFIX}_table_export_last_uploaded_bytes", "Bytes the last export uploaded (the "
                             "rest it shared with earlier exports)", labels=labels)
    for name, t in sorted(s.doc.tables.items()):
        if t.origin is not None:
            origin.add_metric([name, str(t.origin.get("kind"))], 1.0)
            fallback.add_metric([name], 1.0 if t.origin.get("fallback") else 0.0)
            for key, family in figures.items():
                value = _number(t.origin, key)
                if value is not None:
                    family.add_metric([name], value)
        if t.export is not None:
            uploaded.add_metric([name], _number(t.export, "uploaded_bytes_total") or 0.0)
            exports.add_metric([name], _number(t.export, "exports") or 0.0)
            failures.add_metric([name], _number(t.export, "failures") or 0.0)
            recent = t.export.get("last")
            if isinstance(recent, dict):
                last.add_metric([name], _number(recent, "uploaded_bytes") or 0.0)
    yield from (origin, fallback, *figures.values(), uploaded, exports, failures, last)


def _config(s: Sample) -> Iterator[Metric]:
    """The config in force and the last reload (``service.reload``), from the status document's ``config``."""
    c = s.doc.config
    if c is None:
        return
    yield GaugeMetricFamily(f"{PREFIX}_config_generation", "The config in force: 1 at start, +1 per applied reload",
                            value=c.generation)
    last = c.last_reload
    if last is None:
        return
    when = last.get("time")
    if isinstance(when, int | float):
        yield GaugeMetricFamily(f"{PREFIX}_config_last_reload_timestamp_seconds",
                                "When the last reload was asked for (Unix time)", value=float(when))
    result = GaugeMetricFamily(f"{PREFIX}_config_last_reload_result",
                               "1 for the last reload's result: applied or refused", labels=["result"])
    for name in ("applied", "refused"):
        result.add_metric([name], 1.0 if last.get("result") == name else 0.0)
    yield result


class Metrics:
    """The daemon's registry. ``observe_commit`` is called on the loop thread after each commit."""

    def __init__(self, sample: Callable[[], Sample | None], loop_age: Callable[[], tuple[float, float]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DaemonCollector(sample, loop_age))
        self.commit_seconds = Histogram(
            f"{PREFIX}_commit_duration_seconds", "Duration of a commit (fsync every written table + .checkpoint)",
            registry=self.registry, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))

    def observe_commit(self, seconds: float) -> None:
        self.commit_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
