"""Builds a snapshot at exact offsets, off the loop thread: a base snapshot plus the records in between.

The base is a published snapshot at or below the target in every partition (or nothing, meaning each log start).
Its files are hard-linked into a private work directory, the records in [base, target) are read with a dedicated
consumer and written with the target offsets, and the result is flushed. A gap in the offsets read means records
the fold needs were compacted away: the build is refused rather than published wrong.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from globald.common.errors import GlobaldError
from globald.engine.fold import fold
from globald.kafka.clients import TransientKafkaError, make_consumer, partitions, watermarks
from globald.kafka.identity import VERIFY_TIMEOUT_S, RecordReader, verify
from globald.settings.config import TableConfig
from globald.settings.ref import ConfigRef
from globald.snapshot.exact_requests import Code
from globald.snapshot.manifest import Offsets
from globald.store import history, layout
from globald.store.durable import sync_tree
from globald.store.failures import store_io
from globald.store.fingerprint import Fingerprint, Ladder
from globald.store.names import (
    COLUMN_FAMILIES,
    FORMAT_VERSION,
    HISTORY_CF,
    META_HISTORY_SINCE,
    ORIGINS_CF,
    SNAPSHOT_DB_DIR,
)
from globald.store.offline import Batch, OfflineStore, open_offline
from globald.store.options import StoreOptions


class BuildRefused(GlobaldError):
    """An exact snapshot cannot be built at the offsets asked; ``code`` says why (an exact_requests.Code). The asker
    gets the code and the message: ask again at offsets the log still holds, or at the table's current ones."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Built:
    offsets: Offsets
    records: int  # estimated keys
    consumed: int  # records read from Kafka for this build


def check_target(target: Offsets, marks: dict[int, tuple[int, int]], base: Offsets | None) -> Offsets:
    """Where each partition's read starts; raises BuildRefused when ``target`` cannot be reached exactly."""
    if set(target) != set(marks):
        raise BuildRefused(Code.INVALID, f"target names partitions {sorted(target)}, topic has {sorted(marks)}")
    beyond = [f"{p}: {o} > end {marks[p][1]}" for p, o in sorted(target.items()) if o > marks[p][1]]
    if beyond:
        raise BuildRefused(Code.BEYOND_END, "offsets beyond the end: " + ", ".join(beyond))
    start: Offsets = {}
    for p, o in sorted(target.items()):
        low = marks[p][0]
        s = base[p] if base is not None else min(low, o)
        if s > o:
            raise BuildRefused(Code.INVALID, f"base {s} is past target {o} in partition {p}")
        if s < o and s < low:
            raise BuildRefused(Code.BELOW_LOG_START,
                               f"partition {p}: records from {s} are needed but the log starts at {low}")
        if base is None and 0 < o < low:
            raise BuildRefused(Code.BELOW_LOG_START, f"partition {p}: target {o} is below the log start {low}")
        start[p] = s
    return start


def link_base(base_db: Path, work_db: Path) -> None:
    """A writable copy of ``base_db``: immutable SST files hard-linked, everything RocksDB rewrites copied."""
    work_db.mkdir(mode=0o700, parents=True)
    for e in os.scandir(base_db):
        if e.name == "LOCK" or not e.is_file():
            continue
        src, dst = Path(e.path), work_db / e.name
        if e.name.endswith(".sst"):
            os.link(src, dst)
        else:
            shutil.copy2(src, dst)


class Builder:
    """Exact builds for one daemon; used by one worker thread, which owns its consumer. Its clients are kept from
    one build to the next, and made again when a reload moved the config's generation (new [kafka] properties)."""

    def __init__(self, config: ConfigRef, stop: threading.Event) -> None:
        self._ref = config
        self.config, self._generation = config.get()  # the config of the build under way, and of the clients
        self.options = StoreOptions.from_config(self.config.store)  # [store] changes need a restart
        self._stop = stop
        self._consumer: Consumer | None = None
        self._reader: RecordReader | None = None  # the identity check's, long-lived as the consumer is
        # When the build under way last came out of a call into a client (monotonic): every call it makes is bounded
        # (5 s at most), so a beat older than that is a call stuck inside librdkafka (``exact_builds.STUCK_S``).
        self.beat = time.monotonic()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @property
    def generation(self) -> int | None:
        """The generation of the config the clients it holds were made under; None while it holds none (a build
        makes them from the config in force). Read from other threads (status): a build may be changing it."""
        return self._generation if self._consumer is not None or self._reader is not None else None

    def _in_force(self) -> None:
        """Take the config in force for the next build; clients made under an earlier one are closed, so that the
        build makes new ones with the settings in force."""
        config, generation = self._ref.get()
        if generation != self._generation:
            self.close()
        self.config, self._generation = config, generation

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = make_consumer(self.config)
        return self._consumer

    def _marks(self, topic: str, until: float) -> dict[int, tuple[int, int]]:
        """Each partition's (log start, end), asking again while the cluster does not answer (a broker that just
        came back takes a moment to be reconnected to) until ``until``."""
        delay = 0.2
        while True:
            self.beat = time.monotonic()
            c = self._client()
            try:
                marks = {}
                for p in partitions(c, topic):
                    self.beat = time.monotonic()
                    marks[p] = watermarks(c, topic, p)
                return marks
            except TransientKafkaError as e:
                # A consumer that was fetching when its broker died can stay disconnected after the broker is back
                # (seen: 20 s and more, while the loop's consumer had long reconnected): ask with a new one.
                self.close()
                if time.monotonic() + delay > until or self._stop.is_set():
                    raise BuildRefused(Code.FAILED, f"cannot ask the broker: {e}") from None
            self._stop.wait(delay)
            delay = min(delay * 2, 2.0)

    def build(self, table: TableConfig, target: Offsets, base: Offsets | None, base_dir: Path | None,
              work: Path, deadline: float, verified: Mapping[int, Sequence[Fingerprint]] | None = None,
              lag_ms: int | None = None) -> Built:
        """Write the snapshot database into ``work/db``, durably; raises BuildRefused. ``verified``: the fingerprints
        the engine's last identity check found (``engine.events.Verified``), read back before the base's own.
        ``lag_ms``: the topic's min.compaction.lag.ms (None: unknown, taken as 0); a versioned build from the log
        start proves ``since`` = the time its first versions are written less it, as a live replay does
        (``store.history.replay_since``). A build on a base keeps the base's ``since``: it reads every offset in
        [base, target) or is refused (``_one``), so no version of the tail is missing."""
        self._in_force()
        marks = self._marks(table.topic, deadline)
        start = check_target(target, marks, base)
        db_path = work / SNAPSHOT_DB_DIR
        if base_dir is not None:
            link_base(base_dir / SNAPSHOT_DB_DIR, db_path)
        with store_io(f"exact snapshot build: open {db_path}"):  # RocksDB's errors mapped as the live store's
            # A typed table's build records origins as the live store does; a base may have them even when the
            # table is no longer typed (RocksDB opens a database only with all of its families).
            held = layout.families(db_path) if base_dir is not None else []
            origins = table.typed or ORIGINS_CF in held
            versioned = table.versioned or HISTORY_CF in held  # likewise a versioned table's history
            store = open_offline(db_path, self.options, [*COLUMN_FAMILIES, *([ORIGINS_CF] if origins else []),
                                                         *([HISTORY_CF] if versioned else [])])
        with store:
            if base_dir is None:  # a new store, stamped as the live store stamps one
                stamp = layout.stamp(FORMAT_VERSION, table.topic)
                if table.versioned:  # a replay from the log start, as an emptied live store's (store.history)
                    stamp[META_HISTORY_SINCE] = history.SINCE_PENDING
                store.put_meta(stamp, "exact snapshot build: metadata", rebuild=False)
            else:
                self._check_same_topic(table.topic, store.ladders()[0], deadline, verified or {})
                if versioned and not table.versioned:  # a base from before a reload or restart removed history
                    history.forget(lambda marks: store.put_meta(marks, "exact snapshot build: metadata", False),
                                   lambda: store.drop_family(HISTORY_CF), table.name,
                                   "an exact build of a table no longer versioned, on a base that had history")
            consumed = self._apply(store, table.topic, start, target, deadline, table.typed, table.history, lag_ms)
            store.put_offsets(target, "exact snapshot build: offsets")
            with store_io("exact snapshot build: flush"):
                store.flush()
            records = store.estimate_keys()
        # The files copied from the base and those RocksDB wrote without a sync (OPTIONS, the info log), and every
        # directory entry, are on disk before the publisher's manifest and rename name them.
        sync_tree(db_path, synced_suffixes=(".sst",))  # the base's, linked, were durable; RocksDB syncs its own
        return Built(dict(target), records, consumed)

    def _check_same_topic(self, topic: str, ladders: dict[int, Ladder], deadline: float,
                          verified: Mapping[int, Sequence[Fingerprint]]) -> None:
        """Refuse to add records to a base snapshot of another topic of the same name (see kafka.identity).

        The base's newest records may have been applied after the topic was replaced and before the daemon's next
        check found out (a base past the offsets that check showed): they would vouch for themselves. So the
        fingerprints the daemon verified last are read back first, as its next check will: found again, the topic
        is the one they were found in, and so is every record applied since."""
        self.beat = time.monotonic()
        timeout = max(0.5, min(VERIFY_TIMEOUT_S, deadline - time.monotonic()))
        rungs = {p: _first(verified.get(p, ()), f.rungs) for p, f in ladders.items()}
        if self._reader is None:
            self._reader = RecordReader(self.config.consumer_settings(), self._stop.wait)
        verdict = verify(self._reader, topic, rungs, timeout)
        if verdict.recreated:
            raise BuildRefused(Code.REBUILDING, f"topic {topic} was recreated since the base snapshot "
                                                f"({verdict.describe()}): the table rebuilds")
        if verdict.unreachable:
            raise BuildRefused(Code.FAILED, f"cannot check that topic {topic} is the base snapshot's: "
                                            f"{'; '.join(verdict.unreachable.values())}")

    def _apply(self, store: OfflineStore, topic: str, start: Offsets, target: Offsets, deadline: float,
               typed: bool, window_ms: int | None, lag_ms: int | None = None) -> int:
        todo = {p: s for p, s in start.items() if s < target[p]}  # partition -> next offset expected
        if not todo:
            return 0
        c = self._client()
        assignment = [TopicPartition(topic, p, s) for p, s in todo.items()]
        c.assign(assignment)
        assignment = [TopicPartition(topic, p) for p in todo]
        c.resume(assignment)  # librdkafka keeps a partition paused by an earlier build across re-assignment
        consumed = 0
        try:
            while todo:
                self.beat = time.monotonic()
                if self._stop.is_set():
                    raise BuildRefused(Code.STOPPING, "the daemon is stopping")
                if time.monotonic() > deadline:
                    raise BuildRefused(Code.TIMEOUT, f"build did not reach the target in time; left {todo}")
                applied: list[Message] = []
                for m in c.consume(self.config.consume_batch_size, 0.2):
                    p = m.partition()
                    if p is not None and p in todo and self._one(m, p, todo, target):
                        applied.append(m)
                consumed += len(applied)

                def batch(applied: list[Message] = applied) -> Batch:
                    b = store.values_batch()
                    versions = None if window_ms is None else store.history_writer(b, window_ms, lag_ms)
                    fold(applied, b.put, b.delete, store.origin_writer(b) if typed else None,  # the live store's fold
                         versions)
                    if versions is not None:
                        versions.finish()
                    return b

                store.write(batch, "exact snapshot build")
                done = [tp for tp in assignment if tp.partition not in todo]
                if done:  # stop fetching what is no longer needed
                    c.pause(done)
                    assignment = [tp for tp in assignment if tp.partition in todo]
        finally:
            c.unassign()
        return consumed

    @staticmethod
    def _one(m: Message, p: int, todo: dict[int, int], target: Offsets) -> bool:
        """Whether ``m`` is the next record the fold of partition ``p`` needs (then counted in ``todo``); raises
        BuildRefused when the log can no longer give the records below ``target``."""
        offset = m.offset()
        expected, goal = todo[p], target[p]
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._AUTO_OFFSET_RESET:
                raise BuildRefused(Code.BELOW_LOG_START, f"partition {p}: offset {offset} is no longer in the log")
            if err.code() == KafkaError._PARTITION_EOF and offset is not None and offset >= goal:
                # The end is past the target, yet records below it never came (p is still to do).
                raise BuildRefused(Code.COMPACTED, f"partition {p}: records in [{expected}, {goal}) are gone")
            return False
        if offset is None:  # librdkafka gives every record its offset: a record without one cannot be placed
            raise RuntimeError(f"partition {p}: a record without an offset")
        if offset < expected:  # delivered twice (a fetch retried): already applied
            return False
        if offset > expected:  # expected < goal here, so records the fold needs are missing
            raise BuildRefused(Code.COMPACTED,
                               f"partition {p}: expected offset {expected}, got {offset}; records were compacted")
        todo[p] = offset + 1
        if offset + 1 >= goal:
            del todo[p]
        return True


def _first(verified: Sequence[Fingerprint], own: Sequence[Fingerprint]) -> tuple[Fingerprint, ...]:
    """``verified`` rungs, then the base's own that are not among them (each partition read back newest first)."""
    offsets = {f.offset for f in verified}
    return tuple(verified) + tuple(f for f in own if f.offset not in offsets)
