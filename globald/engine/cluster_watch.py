"""The loop's side that asks the cluster: whether it answers (and a consumer that stopped hearing it replaced),
partitions added, a topic gone or replaced under its name, and ends of partition past the known ends.

Mixed into ``engine.loop.Loop``, which owns the attributes declared below; each method runs on the loop thread
between two polls, with short timeouts, since the loop waits meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException

from globald.engine.problems import KAFKA, Problems
from globald.engine.state_manager import TOPIC_RECREATED, StateManager, union
from globald.engine.table import TableRuntime
from globald.engine.update_task import UpdateTask
from globald.engine.view import LoopStats
from globald.kafka.clients import TopicUnavailableError, TransientKafkaError, partitions, watermarks
from globald.kafka.identity import next_timeout

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 1.0
_REFRESH_TIMEOUT_S = 2.0
# After this long without an answer from the cluster, the consumer is replaced (see _renew_consumer).
_RENEW_CONSUMER_AFTER_S = 30.0
# How often the cluster is listed while a table's topic is missing from it, to rebuild soon after it comes back.
_VANISHED_REFRESH_S = 1.0


class ClusterWatch:
    """Mixed into ``engine.loop.Loop``, which owns these attributes."""

    consumer: Consumer
    manager: StateManager
    problems: Problems
    stats: LoopStats
    task: UpdateTask
    pending: set[str]
    probe_now: bool
    _new_consumer: Callable[[], Consumer]
    _renewed_at: float
    _next_metadata: float
    _check_timeout_s: dict[str, float]

    def rebuild(self, table: str, kind: str, detail: str) -> str | None:
        raise NotImplementedError

    def _probe_kafka(self) -> None:
        self.probe_now = False
        try:  # a question about the cluster, not a topic: one of ours may be missing while the brokers are fine
            up = bool(self.consumer.list_topics(timeout=_PROBE_TIMEOUT_S).brokers)
        except KafkaException:
            up = False
        if up:
            self.problems.resolved(KAFKA)
            return
        self.problems.failed(KAFKA, f"kafka unreachable: no broker answered within {_PROBE_TIMEOUT_S:.0f}s")
        now, silent = time.monotonic(), self.problems.lasted(KAFKA)  # since the cluster's problem started
        if min(silent, now - self._renewed_at) >= _RENEW_CONSUMER_AFTER_S:
            self._renew_consumer(now, silent)

    def _renew_consumer(self, now: float, silent: float) -> None:
        """Replace a consumer that has heard nothing from the cluster for a long while, and re-plan every table from
        what its store holds (nothing fetched is lost: positions are the stores'). Seen in an accelerated soak: after
        a broker was SIGKILLed and restarted, the consumer stayed silent for 9 minutes while a new client was
        answered at once. Against a cluster really down a new consumer costs nothing, and at most once a period."""
        self._renewed_at = now
        log.warning("kafka: no answer for %.0fs; replacing the consumer and re-planning every table", silent)
        for rt in self.manager.tables.values():
            rt.assigned = rt.vanished = False  # a new consumer has neither assignment nor pauses
            self.pending.add(rt.name)
        old, self.consumer = self.consumer, self._new_consumer()
        self.stats.consumer_renewals += 1
        try:
            old.close()
        except (KafkaException, RuntimeError) as e:
            log.warning("closing the replaced consumer: %s", e)

    def _refresh_metadata(self) -> None:
        """Pick up partitions added to a topic; check that each topic is still the one its table mirrors."""
        if self.problems.has(KAFKA):
            return
        for rt in self.manager.tables.values():
            if not rt.assigned:
                continue
            try:  # short timeouts: a connected broker answers in milliseconds, and the loop waits meanwhile
                listed = partitions(self.consumer, rt.topic, timeout=_REFRESH_TIMEOUT_S)
                added = [p for p in listed if p not in rt.partitions]
                marks = {p: watermarks(self.consumer, rt.topic, p, timeout=_REFRESH_TIMEOUT_S) for p in added}
            except TopicUnavailableError as e:  # deleted, or not yet recreated: keep serving, keep waiting
                rt.last_error = str(e)
                self.problems.report(rt.name, f"table {rt.name}: {e}; waiting for it")
                self._vanished(rt)
                continue
            except TransientKafkaError as e:  # the cluster did not answer: the other tables would not get one
                self.problems.report(KAFKA, f"kafka: metadata refresh failed: {e}")
                return
            self.problems.resolved(KAFKA)
            lost = [p for p in rt.partitions if p not in listed]
            if lost:  # a topic never loses partitions: this one was recreated with fewer
                self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} has no partitions {lost} any more")
                continue
            same = self._same_topic(rt)
            if same is False:
                continue
            if same and self.problems.has(rt.name):
                rt.last_error = None
                self.problems.resolved(rt.name)
            if not added:
                continue
            log.info("table %s: partitions %s added to %s", rt.name, added, rt.topic)
            plan = self.manager.add_partitions(rt, marks)
            self.task.start(rt.name, {**self.task.positions(rt.name), **plan.starts})
            self.consumer.incremental_assign(plan.assignment)
            self.manager.restore_added(rt, f"partitions {added} added")

    def _vanished(self, rt: TableRuntime) -> None:
        """``rt``'s topic left the cluster's listing: fetch nothing more of it until the topic that comes back under
        its name is shown to be the same (``_same_topic``), and look again soon."""
        if not rt.vanished:
            rt.vanished = True
            self.consumer.pause(rt.assignment())
            log.warning("table %s: topic %s is gone from the cluster; serving what the store holds, fetching nothing "
                        "until a topic of that name is back and found to be the same one", rt.name, rt.topic)
        self._next_metadata = min(self._next_metadata, time.monotonic() + _VANISHED_REFRESH_S)

    def _same_topic(self, rt: TableRuntime) -> bool | None:
        """Read the topic back at the fingerprints last verified, then at those applied since (kafka.identity).
        Another topic under the same name is rebuilt (False). So is one that came back after it vanished when no
        fingerprint could be compared: the daemon saw it go, and cannot show it is the same. None: undecided (the
        table's problem until a later check answers; the cluster itself answered, so it is not Kafka's)."""
        changed = self.manager.changed_id(rt)
        if changed:
            self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} is not the one the store mirrors: {changed}")
            return False
        applied = self.task.ladders(rt.name)
        rungs = {p: union(rt.verified.get(p), applied.get(p)) for p in rt.partitions}
        rungs = {p: r for p, r in rungs.items() if r}
        timeout = self._check_timeout_s.get(rt.name, _REFRESH_TIMEOUT_S)
        verdict = self.manager.verify(rt, rungs, timeout)  # the loop waits meanwhile: keep it short
        # The first check after a restore from empty: the records applied since may be the new topic's own.
        self.manager.older_rungs(rt, {p: applied[p] for p in rungs if p in applied}, verdict)
        self._check_timeout_s[rt.name] = next_timeout(timeout, _REFRESH_TIMEOUT_S, bool(verdict.unreachable))
        log.debug("table %s: identity check of %s: %s", rt.name, {p: [f.offset for f in r] for p, r in rungs.items()},
                  verdict)
        if verdict.recreated:  # conclusive, whatever the partitions that did not answer would have said
            self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} is not the one the store mirrors: "
                         f"{verdict.describe()}")
            return False
        if verdict.unreachable:  # decided at a later refresh; a vanished topic stays paused meanwhile
            self.problems.report(rt.name, f"table {rt.name}: cannot read {rt.topic} back to check it is the topic "
                                 f"the table mirrors: {'; '.join(sorted(set(verdict.unreachable.values())))}")
            if rt.vanished:
                self._next_metadata = min(self._next_metadata, time.monotonic() + _VANISHED_REFRESH_S)
            return None
        if rt.vanished and verdict.unverifiable:
            self.rebuild(rt.name, TOPIC_RECREATED, f"topic {rt.topic} vanished and came back, and it cannot be "
                         f"shown to be the same: {'; '.join(sorted(set(verdict.unverifiable.values())))}")
            return False
        self.manager.checked(rt, applied, verdict)
        if rt.vanished:
            rt.vanished = False
            self.consumer.resume(rt.assignment())
            log.info("table %s: topic %s is back and holds the records the store applied; fetching again",
                     rt.name, rt.topic)
        return True

    def _confirm_ends(self) -> None:
        """Ask the broker for the end of each partition whose end of partition lay past the known ends. With
        read_committed (managed) its answer is the last stable offset, as the end of partition was."""
        if self.problems.has(KAFKA):
            return
        for name, pending in self.task.unconfirmed_ends.items():
            rt = self.manager.tables[name]
            if not pending or not rt.assigned:
                continue
            try:
                ends = {p: watermarks(self.consumer, rt.topic, p, timeout=_REFRESH_TIMEOUT_S)[1] for p in pending}
            except TransientKafkaError:
                continue  # asked again at the next check
            self.manager.ends_confirmed(rt, ends)
            moved = self.task.confirm_ends(name, ends)
            if moved:
                log.debug("table %s: ends of partition %s confirmed by the broker", name, moved)
