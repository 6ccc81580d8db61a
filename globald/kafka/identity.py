"""Is the topic in the cluster still the one a store mirrors? Its records read back at the store's fingerprints.

Offsets alone cannot tell a topic from another of the same name that reaches past them (deleted and recreated
with more records): the store would resume in the middle of the new topic and keep keys it never had. So the
records the store fingerprinted (``store.fingerprint``) are read back, newest first, with a consumer of their own:

- the record is there and hashes the same: the same topic (``MATCH``);
- the record is there and hashes differently, or the log ends before it: another topic (``MISMATCH``);
- a later record is found instead (compaction or retention removed it): the next older rung is tried; when none
  is left the check could not be made, and the verdict says so rather than guess.

A consumer that cannot answer in time decides nothing (``unreachable``); callers ask again later.

The records are read by one long-lived consumer (``RecordReader``), assigned and unassigned for each round, and
only on the cluster worker's thread (``kafka.worker``): a client created and destroyed for every check cost threads
and connections at every metadata refresh, and a destroy can wait as long as a wall-clock step (see the
architecture page, "Where a wall-clock step holds librdkafka").

Where the cluster has topic IDs (KIP-516: DescribeTopics, brokers from 2.8 on), ``TopicIds`` gives them too: a
changed ID is a recreation even when no fingerprint could be compared.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from globald.kafka.client_log import kafka_log
from globald.settings.kafka_properties import CONSUMER_DEFAULTS, MANAGED_KAFKA_PROPERTIES
from globald.store.fingerprint import Fingerprint, Ladder, record_fingerprint

_EOF = KafkaError._PARTITION_EOF
_OUT_OF_RANGE = KafkaError._AUTO_OFFSET_RESET
_WAIT_S = 0.005  # between non-blocking polls (a blocking poll is timed on the wall clock, see engine.loop)
_CHECK_FETCH_BYTES = 65_536  # per partition and fetch; librdkafka grows it for a larger record
_CHECK_BATCH = 1_000  # records taken from the queue at once
# How long reading a topic back at its fingerprints may take before the check is left for later (the check runs on
# the cluster worker's thread; the loop goes on meanwhile).
VERIFY_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)

_NO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the all-zero UUID: a broker that has no ID for the topic
_ID_RETRY_S = 300.0  # after a cluster failed to give an ID, how long the check goes by fingerprints alone


@dataclass
class Verdict:
    """What reading ``topic`` back at the fingerprints found."""

    topic: str
    mismatches: dict[int, str] = field(default_factory=dict)  # partition -> why it is another topic
    unverifiable: dict[int, str] = field(default_factory=dict)  # partition -> why no rung could be compared
    unreachable: dict[int, str] = field(default_factory=dict)  # partition -> no answer in time

    @property
    def recreated(self) -> bool:
        return bool(self.mismatches)

    def describe(self) -> str:
        return "; ".join(f"partition {p}: {why}" for p, why in sorted(self.mismatches.items()))


# A check waits this long at most: a broker loaded enough to miss a short bound (seen in an accelerated soak with
# 1.2M records of lag, on a shared 2-core machine) would otherwise leave every check, and the degraded mark it
# raises, undecided for good.
MAX_TIMEOUT_S = 16.0


def next_timeout(current_s: float, base_s: float, unanswered: bool) -> float:
    """The next check's bound: doubled after a check some partition did not answer (up to MAX_TIMEOUT_S), back to
    ``base_s`` after one every partition answered."""
    return min(current_s * 2, MAX_TIMEOUT_S) if unanswered else base_s


def verify(reader: RecordReader, topic: str, rungs: Mapping[int, Sequence[Fingerprint]],
           timeout_s: float) -> Verdict:
    """Read ``topic`` back at ``rungs`` (per partition, newest first) and say whether it holds those records.

    Only for a topic just listed in the cluster: assigning a topic the cluster lacks makes a broker that
    auto-creates topics create it (see ``kafka.clients.partitions``)."""
    verdict = Verdict(topic)
    pending = {p: list(fs) for p, fs in rungs.items() if fs}
    for p in sorted(set(rungs) - set(pending)):
        verdict.unverifiable[p] = "no record fingerprinted yet"
    deadline = time.monotonic() + timeout_s
    while pending:
        # One assignment per round: a record fetched for a newer rung must not answer for an older one.
        asked = {p: fs.pop(0) for p, fs in pending.items()}
        found = reader.read(topic, {p: f.offset for p, f in asked.items()}, deadline)
        for p, f in asked.items():
            outcome = found.get(p)
            if outcome is None:
                verdict.unreachable[p] = f"no answer about offset {f.offset} within {timeout_s:.0f}s"
            elif isinstance(outcome, str):  # no record at or past the rung
                if outcome == "end":
                    verdict.mismatches[p] = f"the log ends before offset {f.offset}, a record the store applied"
                else:
                    _gone(verdict, pending, p, f, outcome)
                continue
            elif outcome[0] != f.offset:
                _gone(verdict, pending, p, f, f"compacted away (next record at {outcome[0]})")
                continue
            elif outcome[1] != f.digest:
                verdict.mismatches[p] = f"the record at offset {f.offset} is not the one the store applied"
            pending.pop(p, None)
        for p in [p for p in pending if p in verdict.unreachable or p in verdict.mismatches]:
            pending.pop(p)
    return verdict


def verify_older(reader: RecordReader, topic: str, ladders: Mapping[int, Ladder], verdict: Verdict,
                 timeout_s: float) -> None:
    """A first check has no verified rungs to read first (a store opened, or restored from empty since the last
    check), and records applied after a recreation the check did not see vouch for themselves: each older rung of
    ``ladders`` is read back too (a round each, at most three, ``timeout_s`` for all); one that differs adds to
    ``verdict``'s mismatches. Nothing when ``verdict`` is already decided or incomplete."""
    if verdict.recreated or verdict.unreachable:
        return
    deadline = time.monotonic() + timeout_s
    for i in range(1, max((len(f.rungs) for f in ladders.values()), default=0)):
        rungs = {p: (f.rungs[i],) for p, f in ladders.items() if len(f.rungs) > i}
        found = verify(reader, topic, rungs, max(0.5, deadline - time.monotonic()))
        verdict.mismatches.update({p: why for p, why in found.mismatches.items() if p not in verdict.mismatches})
        verdict.unreachable.update(found.unreachable)
        if found.unreachable or found.mismatches:
            return


def _gone(verdict: Verdict, pending: dict[int, list[Fingerprint]], p: int, f: Fingerprint, why: str) -> None:
    if not pending.get(p):
        pending.pop(p, None)
        verdict.unverifiable[p] = f"every record fingerprinted is gone (offset {f.offset}: {why})"


Found = tuple[int, bytes] | str  # (offset, digest) of the first record at or past the offset asked, or why none


class RecordReader:
    """One long-lived consumer that reads single records back at given offsets: the identity check's.

    Used by one thread at a time (the cluster worker's). ``wait(seconds)`` waits between non-blocking polls on the
    monotonic clock and says whether to give up (a stop): a blocking librdkafka poll is timed on the wall clock.
    """

    def __init__(self, settings: Mapping[str, Any], wait: Callable[[float], bool]) -> None:
        # One record per partition is wanted. With the daemon's own prefetch (queued.min.messages, a full fetch per
        # partition), a table far behind its log queued thousands of records of each busy partition ahead of the
        # one record of a quiet one, and the check, skipping them one by one, missed its bound (an accelerated
        # soak: every check of a 300k-record lag left the table degraded). Small fetches, nothing prefetched, and a
        # partition answered is paused.
        conf = {**settings, "enable.partition.eof": True, "auto.offset.reset": "error",
                "enable.auto.commit": False, "queued.min.messages": 1,
                "max.partition.fetch.bytes": _CHECK_FETCH_BYTES, "logger": kafka_log}
        self.consumer = Consumer(conf)
        self._wait = wait

    def read(self, topic: str, offsets: Mapping[int, int], deadline: float) -> dict[int, Found]:
        """The first record at or past each partition's offset (its offset and digest), or why there is none;
        a partition missing from the answer did not answer before ``deadline`` (monotonic)."""
        found: dict[int, Found] = {}
        try:
            # assign() replaces the whole assignment and starts a new fetch version: nothing fetched for an earlier
            # round is served to this one (librdkafka drops outdated fetch versions).
            self.consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
            while len(found) < len(offsets) and time.monotonic() < deadline:
                batch = self.consumer.consume(_CHECK_BATCH, 0)
                if not batch:
                    if self._wait(_WAIT_S):
                        break
                    continue
                for m in batch:
                    p = m.partition()
                    if p is None or p not in offsets or p in found or m.topic() != topic:
                        continue
                    _take(m, p, offsets[p], found)
                    if p in found:
                        self.consumer.pause([TopicPartition(topic, p)])
        except KafkaException:
            pass  # whatever was not found is unreachable
        finally:
            with contextlib.suppress(KafkaException, RuntimeError):
                # librdkafka keeps a pause across an unassign: the next round's assignment would never fetch.
                self.consumer.resume([TopicPartition(topic, p) for p in offsets])
                self.consumer.unassign()
        return found

    def close(self) -> None:
        self.consumer.close()


def _take(m: Message, p: int, asked: int, found: dict[int, Found]) -> None:
    err = m.error()
    if err is None:
        offset = m.offset()
        if offset is not None and offset >= asked:
            found[p] = (offset, record_fingerprint(m).digest)
        return
    end = m.offset()
    if err.code() == _EOF and end is not None:
        found[p] = "end" if end <= asked else f"no record left between it and the log end {end}"
    elif err.code() == _OUT_OF_RANGE:
        found[p] = "out of the log's range (retention moved its start past it, or the log ends before it)"


class TopicIds:
    """Topic IDs, asked of the cluster with an admin client of their own (see the module docstring)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self._settings = {k: v for k, v in settings.items()
                          if k not in MANAGED_KAFKA_PROPERTIES and k not in CONSUMER_DEFAULTS and k != "group.id"}
        # Without the version handshake librdkafka speaks the fallback version's protocol, which has no
        # DescribeTopics: asking would only wait for a controller that old metadata never names.
        self._supported = str(settings.get("api.version.request", "true")).lower() != "false"
        self._admin: AdminClient | None = None
        self._retry_at = 0.0

    def close(self) -> None:
        """Let the admin client go: its last reference, dropped on the thread that owns it, destroys it there."""
        self._admin = None

    def _client(self) -> AdminClient:
        if self._admin is None:
            conf: dict[str, Any] = {**self._settings, "logger": kafka_log}
            self._admin = AdminClient(conf)
        return self._admin

    def compaction_lag_ms(self, topic: str, timeout_s: float) -> int | None:
        """``topic``'s ``min.compaction.lag.ms`` (a versioned table's ``since``, ``store.history``); None when it is
        unknown: a broker without DescribeConfigs (Kafka 0.9), one that does not list it (Tansu lists only the
        configs a topic was created with), no answer in time, or a value that is no integer."""
        if not self._supported:
            return None
        try:
            resource = ConfigResource(ResourceType.TOPIC, topic)
            found = self._client().describe_configs([resource], request_timeout=timeout_s)[resource]
            entry = found.result(timeout=timeout_s + 1).get("min.compaction.lag.ms")
            return None if entry is None or entry.value is None else max(0, int(entry.value))
        except Exception as e:  # a KafkaException, the future's own timeout, a value that is no integer
            log.debug("min.compaction.lag.ms of %s unknown: %s", topic, e)
            return None

    def get(self, topic: str, timeout_s: float) -> str | None:
        """``topic``'s ID, or None where the cluster has none or did not answer (then, for a while, not asked)."""
        if not self._supported or time.monotonic() < self._retry_at:
            return None
        try:
            found = self._client().describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic]
            topic_id = str(found.result(timeout=timeout_s + 1).topic_id or "")
        except Exception as e:  # a KafkaException, or the future's own timeout
            err = e.args[0] if isinstance(e, KafkaException) and e.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                self._retry_at = time.monotonic() + _ID_RETRY_S
            return None
        return topic_id if topic_id and topic_id != _NO_ID else None
