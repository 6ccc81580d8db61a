"""What the loop asks the cluster between polls, and what it decides from the answers: whether the cluster answers
(and a consumer that stopped hearing it replaced), partitions added, a topic gone or replaced under its name, and
ends of partition past the known ends.

Every question runs on the cluster worker's thread (``kafka.worker``): the watch asks, the loop goes on turning, and
a later turn takes the answer. The watch owns its timers and returns decisions (``Decision``) for the loop to act
on: rebuild, pause, resume, partitions added, ends confirmed, a new consumer. It changes no consumer and no store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException

from globald.engine.identity import REFRESH_TIMEOUT_S, RefreshFacts, TopicIdentity
from globald.engine.problems import KAFKA, Problems
from globald.engine.state_manager import TOPIC_RECREATED
from globald.engine.table import TableRuntime
from globald.kafka.clients import TopicUnavailableError, TransientKafkaError, partitions, watermarks
from globald.kafka.worker import Clients, ClusterWorker
from globald.store.fingerprint import Ladder

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 1.0
_PROBE_KEY = "probe"
# After this long without an answer from the cluster, the consumer is replaced (see ``Renew``).
_RENEW_CONSUMER_AFTER_S = 30.0
# How often the cluster is listed while a table's topic is missing from it, to rebuild soon after it comes back.
_VANISHED_REFRESH_S = 1.0
# How often the broker is asked to confirm ends of partition past the known ends (transactions committed while
# tailing); only while there are some, which topics without transactions never have.
_END_CHECK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Rebuild:
    table: str
    kind: str
    detail: str


@dataclass(frozen=True)
class Pause:
    """Fetch nothing more of the table's topic (it vanished) until a ``Resume``."""

    table: str


@dataclass(frozen=True)
class Resume:
    table: str


@dataclass(frozen=True)
class PartitionsAdded:
    table: str
    marks: dict[int, tuple[int, int]]  # (log start, end) of each partition added


@dataclass(frozen=True)
class EndsConfirmed:
    table: str
    ends: dict[int, int]


@dataclass(frozen=True)
class Renew:
    """Replace the consumer, silent for ``silent`` seconds, and re-plan every table from its store. Seen in an
    accelerated soak: after a broker was SIGKILLed and restarted, the consumer stayed silent for 9 minutes while a
    new client was answered at once. Decided when the cluster has not answered for 30 s, or when it answers the
    worker and holds records the loop's consumer has not fetched for 30 s; at most once a period."""

    silent: float


Decision = Rebuild | Pause | Resume | PartitionsAdded | EndsConfirmed | Renew


@dataclass(frozen=True)
class LoopFacts:
    """What the watch reads of the loop at a turn: each table's ladders and positions as the update task applied
    them, ends of partition past the known ends, and when the consumer last fetched a record (monotonic)."""

    applied: Mapping[str, Mapping[int, Ladder]]
    positions: Mapping[str, Mapping[int, int]]
    unconfirmed: Mapping[str, Mapping[int, int]]
    last_progress: float


class ClusterWatch:
    """See the module docstring. Loop thread only."""

    def __init__(self, tables: Mapping[str, TableRuntime], identity: TopicIdentity, worker: ClusterWorker,
                 problems: Problems, metadata_refresh_s: float) -> None:
        self._tables = tables
        self._identity = identity
        self._worker = worker
        self._problems = problems
        self._refresh_s = metadata_refresh_s
        self.probe_now = False
        self._renewed_at = 0.0
        self._next_metadata = time.monotonic() + metadata_refresh_s
        self._next_end_check = 0.0

    def turn(self, loop: LoopFacts) -> list[Decision]:
        """Ask what is due, and decide from the answers that came in."""
        decisions: list[Decision] = []
        now = time.monotonic()
        if self.probe_now or (self._problems.has(KAFKA) and self._problems.due(KAFKA)):
            self._ask_probe()
        decisions += self._probe_answer(now)
        applied, unconfirmed = loop.applied, loop.unconfirmed
        if now >= self._next_metadata:
            self._next_metadata = now + self._refresh_s
            self._ask_refreshes(applied)
        for rt in self._tables.values():
            decisions += self._refreshed(rt, loop)
        if now >= self._next_end_check and any(unconfirmed.values()):
            self._next_end_check = now + _END_CHECK_INTERVAL_S
            self._ask_ends(unconfirmed)
        decisions += self._ends_answers()
        return decisions

    def renewed(self) -> None:
        """The loop replaced the consumer."""
        self._renewed_at = time.monotonic()

    # -- is the cluster there? ----------------------------------------------------------------------------------

    def _ask_probe(self) -> None:
        self.probe_now = False
        if self._worker.asked(_PROBE_KEY):
            return

        def question(c: Clients) -> bool:
            # A question about the cluster, not a topic: one of ours may be missing while the brokers are fine.
            # Never asked of the loop's consumer from here: confluent-kafka serializes the calls on a client, and
            # the loop's polls would wait behind this one.
            return bool(c.reader.consumer.list_topics(timeout=_PROBE_TIMEOUT_S).brokers)

        self._worker.ask(_PROBE_KEY, question)

    def _probe_answer(self, now: float) -> list[Decision]:
        answer = self._worker.take(_PROBE_KEY)
        if answer is None:
            return []
        try:
            up = answer.result()
        except (KafkaException, RuntimeError):  # RuntimeError: a consumer the loop replaced meanwhile
            up = False
        if up:
            self._problems.resolved(KAFKA)
            return []
        self._problems.failed(KAFKA, f"kafka unreachable: no broker answered within {_PROBE_TIMEOUT_S:.0f}s")
        silent = self._problems.lasted(KAFKA)  # since the cluster's problem started
        if min(silent, now - self._renewed_at) >= _RENEW_CONSUMER_AFTER_S:
            return [Renew(silent)]
        return []

    # -- the metadata refresh: partitions added, topics gone or replaced ----------------------------------------

    def _ask_refreshes(self, applied: Mapping[str, Mapping[int, Ladder]]) -> None:
        if self._problems.has(KAFKA):
            return
        for rt in self._tables.values():
            if rt.assigned:
                self._identity.ask_refresh(rt, applied.get(rt.name, {}))

    def _refreshed(self, rt: TableRuntime, loop: LoopFacts) -> list[Decision]:
        try:
            facts = self._identity.refresh_answer(rt)
        except TopicUnavailableError as e:  # deleted, or not yet recreated: keep serving, keep waiting
            rt.last_error = str(e)
            self._problems.report(rt.name, f"table {rt.name}: {e}; waiting for it")
            return self._vanished(rt)
        except (TransientKafkaError, KafkaException) as e:  # the cluster did not answer
            self._problems.report(KAFKA, f"kafka: metadata refresh failed: {e}")
            return []
        if facts is None or not rt.assigned:  # not in yet, or the table was unassigned since it was asked
            return []
        self._problems.resolved(KAFKA)
        silent = self._silent(rt, facts, loop)
        if silent is not None:
            return [Renew(silent)]
        lost = [p for p in rt.partitions if p not in facts.listed]
        if lost:  # a topic never loses partitions: this one was recreated with fewer
            return [Rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} has no partitions {lost} any more")]
        decisions = self._same_topic(rt, facts)
        if decisions is None:
            return []
        if self._problems.has(rt.name):
            rt.last_error = None
            self._problems.resolved(rt.name)
        if any(isinstance(d, Rebuild) for d in decisions) or not facts.added:
            return decisions
        log.info("table %s: partitions %s added to %s", rt.name, sorted(facts.added), rt.topic)
        return [*decisions, PartitionsAdded(rt.name, dict(facts.added))]

    def _silent(self, rt: TableRuntime, facts: RefreshFacts, loop: LoopFacts) -> float | None:
        """How long the loop's consumer has fetched nothing while the cluster, answering the worker, holds records
        past where ``rt`` stands (None: not silent, or renewed too recently). The cluster answering says nothing of
        the loop's own consumer: after a broker restart one stayed silent for 9 minutes (an accelerated soak)."""
        now = time.monotonic()
        positions = loop.positions.get(rt.name, {})
        behind = any(positions.get(p, end) < end for p, end in facts.ends.items())
        quiet = now - loop.last_progress
        if behind and not self._identity.vanished(rt.name) and \
                min(quiet, now - self._renewed_at) >= _RENEW_CONSUMER_AFTER_S:
            return quiet
        return None

    def _vanished(self, rt: TableRuntime) -> list[Decision]:
        """``rt``'s topic left the cluster's listing: fetch nothing more of it until the topic that comes back under
        its name is shown to be the same (``_same_topic``), and look again soon."""
        self._next_metadata = min(self._next_metadata, time.monotonic() + _VANISHED_REFRESH_S)
        if not self._identity.vanish(rt.name):
            return []
        log.warning("table %s: topic %s is gone from the cluster; serving what the store holds, fetching nothing "
                    "until a topic of that name is back and found to be the same one", rt.name, rt.topic)
        return [Pause(rt.name)]

    def _same_topic(self, rt: TableRuntime, facts: RefreshFacts) -> list[Decision] | None:
        """Another topic under the same name is rebuilt. So is one that came back after it vanished when no
        fingerprint could be compared: the daemon saw it go, and cannot show it is the same. None: undecided (the
        table's problem until a later check answers; the cluster itself answered, so it is not Kafka's)."""
        changed = self._identity.changed_id(rt, facts.topic_id)
        if changed or facts.verdict is None:
            return [Rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} is not the one the store mirrors: "
                            f"{changed or 'its ID changed'}")]
        verdict = facts.verdict
        try:
            recreated = self._identity.judge(rt, verdict, facts.applied)
        except TransientKafkaError as e:  # decided at a later refresh; a vanished topic stays paused meanwhile
            self._problems.report(rt.name, f"table {rt.name}: cannot read {rt.topic} back to check it is the topic "
                                  f"the table mirrors: {'; '.join(sorted(set(verdict.unreachable.values())))}")
            log.debug("table %s: %s", rt.name, e)
            if self._identity.vanished(rt.name):
                self._next_metadata = min(self._next_metadata, time.monotonic() + _VANISHED_REFRESH_S)
            return None
        if recreated:
            return [Rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} is not the one the store mirrors: "
                            f"{recreated}")]
        if self._identity.vanished(rt.name) and verdict.unverifiable:
            return [Rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} vanished and came back, and it cannot be "
                            f"shown to be the same: {'; '.join(sorted(set(verdict.unverifiable.values())))}")]
        self._identity.checked(rt, facts.applied, verdict)
        if self._identity.back(rt.name):
            log.info("table %s: topic %s is back and holds the records the store applied; fetching again",
                     rt.name, rt.topic)
            return [Resume(rt.name)]
        return []

    # -- ends of partition past the known ends ------------------------------------------------------------------

    def _ask_ends(self, unconfirmed: Mapping[str, Mapping[int, int]]) -> None:
        """Ask the broker for the end of each partition whose end of partition lay past the known ends. With
        read_committed (managed) its answer is the last stable offset, as the end of partition was."""
        if self._problems.has(KAFKA):
            return
        for name, pending in unconfirmed.items():
            rt = self._tables[name]
            key = f"ends:{name}"
            if not pending or not rt.assigned or self._worker.asked(key):
                continue
            topic, wanted = rt.topic, sorted(pending)

            def question(c: Clients, topic: str = topic, wanted: list[int] = wanted) -> dict[int, int]:
                consumer = c.reader.consumer
                listed = partitions(consumer, topic, timeout=REFRESH_TIMEOUT_S)  # see watermarks(): listed first
                return {p: watermarks(consumer, topic, p, timeout=REFRESH_TIMEOUT_S)[1] for p in wanted if p in listed}

            self._worker.ask(key, question)

    def _ends_answers(self) -> list[Decision]:
        decisions: list[Decision] = []
        for name, rt in self._tables.items():
            answer = self._worker.take(f"ends:{name}")
            if answer is None or not rt.assigned:
                continue
            try:
                decisions.append(EndsConfirmed(name, answer.result()))
            except (TransientKafkaError, KafkaException):
                continue  # asked again at the next check
        return decisions
