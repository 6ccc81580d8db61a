"""Is the topic a table mirrors still the one its store holds? The engine's one owner of that question.

A topic deleted and recreated under the same name can reach past the offsets a store holds, so offsets alone cannot
tell it from the old one. The words used about it, here and in ``kafka.identity``:

- **fingerprint**: a record's offset and a hash of its key, value and timestamp (``store.fingerprint``).
- **ladder**, **rung**: per partition, the newest applied record's fingerprint and up to three older ones, spaced
  further apart (the rungs), stored in the same batch as the data.
- **check**: reading the topic back at a ladder's rungs (``kafka.identity.verify``): the same record there is the
  same topic; another record, or a log ending before it, is another topic (a recreation, rebuilt).
- **verified** rungs: those a check found. The next check reads them first, so records applied since, which may be
  the new topic's, cannot vouch for themselves.
- **older rungs**: a first check with nothing verified yet (a store just opened, or restored from empty) reads every
  rung, not the newest alone.
- **shown** offsets: per partition, the offset below which this run showed the store to hold its topic's records.
  What may be served after a recreation is only what lies below them (the snapshots' ``Verified`` event).
- **vanished**: the topic left the cluster's listing; nothing is fetched until a topic of that name is back and
  found to be the same.

The interface: a check at plan (``ask_plan``, ``plan_answer``, ``judge``, ``planned``), a check at refresh
(``ask_refresh``, ``refresh_answer``, ``checked``), ``forget`` on a wipe, and what may be served (``shown``). Every
check runs on the cluster worker's thread (``kafka.worker``); the loop asks, goes on turning, and takes the answer
at a later turn. A table being planned stays unassigned (its last snapshot is served) until its answer is in; a
running table keeps consuming and serving while its refresh check is out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from globald.engine.events import Emit, Verified
from globald.engine.table import TableRuntime
from globald.kafka.clients import TransientKafkaError, partitions, watermarks
from globald.kafka.identity import VERIFY_TIMEOUT_S, Verdict, next_timeout, verify, verify_older
from globald.kafka.worker import Answer, Clients, ClusterWorker
from globald.store.fingerprint import Fingerprint, Ladder

log = logging.getLogger(__name__)

# A refresh's questions: short, since a connected broker answers in milliseconds; a check left unanswered is given
# twice as long the next time (kafka.identity.next_timeout).
REFRESH_TIMEOUT_S = 2.0


def union(verified: Ladder | None, applied: Ladder | None) -> tuple[Fingerprint, ...]:
    """The verified rungs first, then the newer ones applied since."""
    seen = list(verified.rungs if verified else ())
    offsets = {f.offset for f in seen}
    return tuple(seen + [f for f in (applied.rungs if applied else ()) if f.offset not in offsets])


@dataclass(frozen=True)
class PlanFacts:
    """What the cluster said about a table's topic before its plan: partitions, (log start, end) of each, its ID
    where the cluster has IDs, the check of the stored fingerprints (None when the store held none) and, for a
    versioned table, its ``min.compaction.lag.ms`` (None: unknown, or not asked)."""

    partitions: list[int]
    marks: dict[int, tuple[int, int]]
    topic_id: str | None
    verdict: Verdict | None
    compaction_lag_ms: int | None = None


@dataclass(frozen=True)
class RefreshFacts:
    """What a metadata refresh found: the partitions listed, (log start, end) of those added, the end of every known
    one (the consumer's liveness is judged by it, ``cluster_watch``), the topic's ID, and
    the check of the rungs verified before and ``applied`` since (None when partitions were lost or the ID
    changed, which decide alone)."""

    listed: list[int]
    added: dict[int, tuple[int, int]]
    ends: dict[int, int]  # each partition's end (with read_committed, the last stable offset) when asked
    topic_id: str | None
    verdict: Verdict | None
    applied: dict[int, Ladder]


def _plan_key(table: str) -> str:
    return f"plan:{table}"


def _refresh_key(table: str) -> str:
    return f"refresh:{table}"


class TopicIdentity:
    """See the module docstring. Loop thread only."""

    def __init__(self, worker: ClusterWorker, emit: Emit) -> None:
        self._worker = worker
        self._emit = emit
        self._verified: dict[str, dict[int, Ladder]] = {}
        self._shown: dict[str, dict[int, int]] = {}
        self._unverifiable: set[tuple[str, int]] = set()  # (table, partition) whose last check could not be made
        self._timeouts: dict[str, float] = {}  # per table: one bound for all would be reset by another's answer
        self._vanished: set[str] = set()

    def verified(self, table: str) -> dict[int, Ladder]:
        return dict(self._verified.get(table, {}))

    def shown(self, table: str) -> dict[int, int]:
        """What may be served: below these offsets the store holds the topic's records (empty: nothing shown)."""
        return dict(self._shown.get(table, {}))

    # -- vanished topics (the cluster watch pauses them, the loop resumes them) ------------------------------------

    def vanished(self, table: str) -> bool:
        return table in self._vanished

    def vanish(self, table: str) -> bool:
        """``table``'s topic left the cluster's listing; False if it was already known to be gone."""
        if table in self._vanished:
            return False
        self._vanished.add(table)
        return True

    def back(self, table: str) -> bool:
        """``table`` no longer counts as vanished (its topic is back, or it is no longer assigned); True if it
        did, and its fetching is paused."""
        if table not in self._vanished:
            return False
        self._vanished.discard(table)
        return True

    # -- the check at plan --------------------------------------------------------------------------------------

    def ask_plan(self, rt: TableRuntime) -> None:
        """Ask the cluster what ``rt``'s plan needs (once; the answer comes with ``plan_answer``)."""
        key = _plan_key(rt.name)
        if self._worker.asked(key):
            return
        topic, stored, ladders, verified = rt.topic, rt.store.offsets(), rt.store.fingerprints(), self.verified(rt.name)
        recorded_id, versioned = rt.store.topic_id, rt.config.versioned

        def question(c: Clients) -> PlanFacts:
            consumer = c.reader.consumer
            parts = partitions(consumer, topic)
            marks = {p: watermarks(consumer, topic, p) for p in parts}
            topic_id = c.ids.get(topic, VERIFY_TIMEOUT_S)
            # A versioned table's since is set from it (store.history): here, off the loop thread.
            lag = c.ids.compaction_lag_ms(topic, VERIFY_TIMEOUT_S) if versioned else None
            if not stored or (recorded_id and topic_id and topic_id != recorded_id):
                return PlanFacts(parts, marks, topic_id, None, lag)  # nothing to check, or another topic by its ID
            # The rungs this run verified first: records applied since (a rewind in the window before a refresh
            # found a recreation) cannot vouch for themselves.
            rungs = {p: union(verified.get(p), f) for p, f in ladders.items() if p in marks}
            verdict = verify(c.reader, topic, rungs, VERIFY_TIMEOUT_S)
            if not verified:
                verify_older(c.reader, topic, {p: f for p, f in ladders.items() if p in marks}, verdict,
                             VERIFY_TIMEOUT_S)
            return PlanFacts(parts, marks, topic_id, verdict, lag)

        self._worker.ask(key, question)

    def plan_answer(self, rt: TableRuntime) -> PlanFacts | None:
        """The answer to ``ask_plan`` once it is in (asking first if need be); raises what the question raised."""
        answer: Answer[PlanFacts] | None = self._worker.take(_plan_key(rt.name))
        if answer is None:
            self.ask_plan(rt)
            return None
        return answer.result()

    def changed_id(self, rt: TableRuntime, now: str | None) -> str | None:
        """Why ``rt``'s topic is another one by its ID (KIP-516); None when it is the same or either is unknown."""
        stored = rt.store.topic_id
        return None if now is None or stored is None or now == stored else \
            f"its topic ID is {now}, the store mirrors {stored}"

    def judge(self, rt: TableRuntime, verdict: Verdict, checked: Mapping[int, object]) -> str | None:
        """Why ``rt``'s topic is another one by the records read back (None: the same as far as the check could
        say); raises TransientKafkaError when a partition did not answer, since resuming unchecked could mirror
        another topic. Says once what could not be checked."""
        for p, why in sorted(verdict.unverifiable.items()):
            if (rt.name, p) not in self._unverifiable:  # said once until a check succeeds again
                log.warning("table %s: cannot check that partition %d of %s is the topic the store mirrors: %s",
                            rt.name, p, rt.topic, why)
        answered = {(rt.name, p) for p in checked if p not in verdict.unreachable}
        self._unverifiable = (self._unverifiable - answered) | {(rt.name, p) for p in verdict.unverifiable}
        if verdict.recreated:  # conclusive, whatever the partitions that did not answer would have said
            return verdict.describe()
        if verdict.unreachable:
            raise TransientKafkaError(f"cannot check that topic {rt.topic} is the one the store mirrors: "
                                      f"{'; '.join(sorted(set(verdict.unreachable.values())))}")
        return None

    def planned(self, rt: TableRuntime, ladders: Mapping[int, Ladder], start: Mapping[int, int]) -> None:
        """``rt`` is planned from ``start``, checked (or empty): its stored ladders are the verified rungs now, and
        the store holds the topic there now below ``start``."""
        self._verified[rt.name] = dict(ladders)
        self._vanished.discard(rt.name)
        self._show(rt, start, replace=True)

    def added(self, rt: TableRuntime, start: Mapping[int, int]) -> None:
        """Partitions added to ``rt``'s topic start empty at ``start``: shown there."""
        self._show(rt, start)

    # -- the check at refresh -----------------------------------------------------------------------------------

    def ask_refresh(self, rt: TableRuntime, applied: Mapping[int, Ladder]) -> None:
        """Ask whether ``rt``'s topic is still the one mirrored, reading back the rungs verified before, then those
        ``applied`` since; partitions added to it are listed too."""
        if self.refresh_asked(rt.name):
            return
        topic, known, recorded_id = rt.topic, list(rt.partitions), rt.store.topic_id
        verified, applied = self.verified(rt.name), dict(applied)
        timeout = self._timeouts.get(rt.name, REFRESH_TIMEOUT_S)

        def question(c: Clients) -> RefreshFacts:
            consumer = c.reader.consumer
            listed = partitions(consumer, topic, timeout=REFRESH_TIMEOUT_S)
            marks = {p: watermarks(consumer, topic, p, timeout=REFRESH_TIMEOUT_S) for p in listed}
            added = {p: m for p, m in marks.items() if p not in known}
            ends = {p: high for p, (_, high) in marks.items() if p in known}
            topic_id = c.ids.get(topic, VERIFY_TIMEOUT_S) if recorded_id else None
            if any(p not in listed for p in known) or (topic_id and topic_id != recorded_id):
                return RefreshFacts(listed, added, ends, topic_id, None, applied)
            rungs = {p: union(verified.get(p), applied.get(p)) for p in known}
            rungs = {p: r for p, r in rungs.items() if r}
            verdict = verify(c.reader, topic, rungs, timeout)
            if not verified:  # the first check after a restore from empty: those applied may be the new topic's
                verify_older(c.reader, topic, {p: applied[p] for p in rungs if p in applied}, verdict,
                             VERIFY_TIMEOUT_S)
            log.debug("table %s: identity check of %s: %s", rt.name,
                      {p: [f.offset for f in r] for p, r in rungs.items()}, verdict)
            return RefreshFacts(listed, added, ends, topic_id, verdict, applied)

        self._worker.ask(_refresh_key(rt.name), question)

    def refresh_asked(self, table: str) -> bool:
        """A refresh of ``table`` is asked and its answer not taken yet."""
        return self._worker.asked(_refresh_key(table))

    def refresh_answer(self, rt: TableRuntime) -> RefreshFacts | None:
        """The answer to ``ask_refresh`` once it is in; raises what the question raised."""
        answer: Answer[RefreshFacts] | None = self._worker.take(_refresh_key(rt.name))
        if answer is None:
            return None
        facts = answer.result()
        if facts.verdict is not None:
            timeout = self._timeouts.get(rt.name, REFRESH_TIMEOUT_S)
            self._timeouts[rt.name] = next_timeout(timeout, REFRESH_TIMEOUT_S, bool(facts.verdict.unreachable))
        return facts

    def checked(self, rt: TableRuntime, applied: Mapping[int, Ladder], verdict: Verdict) -> None:
        """A refresh's check of ``rt`` (``verdict``, on the rungs verified before and ``applied`` since) found no
        other topic: the ``applied`` fingerprints are the verified ones now, and every partition whose check
        compared a record holds its topic's records up to its newest fingerprint."""
        self._verified[rt.name] = dict(applied)
        doubtful = set(verdict.unverifiable) | set(verdict.unreachable) | set(verdict.mismatches)
        self._show(rt, {p: ladder.rungs[0].offset + 1 for p, ladder in applied.items()
                        if ladder.rungs and p not in doubtful}, force=True)

    # -- wipes --------------------------------------------------------------------------------------------------

    def forget(self, table: str) -> dict[int, int]:
        """``table`` is being wiped: its checks in progress no longer matter, nothing of it is shown until its next
        plan. Returns the offsets shown until now (what the snapshots may keep after a recreation)."""
        self.cancel(table)
        self._verified.pop(table, None)
        return self._shown.pop(table, {})

    def cancel(self, table: str) -> None:
        """``table``'s store or assignment changed: answers to questions asked before are dropped."""
        self._worker.forget(_plan_key(table))
        self._worker.forget(_refresh_key(table))

    def _show(self, rt: TableRuntime, offsets: Mapping[int, int], replace: bool = False, force: bool = False) -> None:
        """Record that ``rt``'s store holds its topic's records below ``offsets`` (never moving one back unless
        ``replace``: a plan's own check); subscribers hear it with the fingerprints verified (``Verified``)."""
        before = self._shown.get(rt.name, {})
        now = dict(offsets) if replace else {**before, **{p: max(o, before.get(p, o)) for p, o in offsets.items()}}
        if now != before or force or replace:
            self._shown[rt.name] = now
            self._emit(Verified(rt.name, dict(now), {p: ladder.rungs
                                                     for p, ladder in self._verified.get(rt.name, {}).items()}))
