"""The cluster worker: one thread of its own for every question the loop asks the cluster, and every client close.

Why a thread: librdkafka times its blocking waits on the wall clock, and a client's destroy joins threads that may
sit in such a wait (the architecture page, "Where a wall-clock step holds librdkafka"), so a metadata request, an
identity check or a close on the loop thread could hold the loop, and the stop, for as long as a clock step. Here
the loop only asks (``ask``) and later picks the answer up (``take``): it never waits for one. The worker's own
clients (``Clients``: a long-lived consumer for metadata and reading records back, an admin client for topic IDs)
are made once, not per question.

A question that has not returned ``stuck_after_s`` after it started leaves its runner behind: ``replace_stuck``
starts a new runner with new clients, and the old one ends on its own once its call returns (its answer is
dropped, its clients closed there). Questions are answered in the order asked; one key has at most one question
whose answer is still wanted (asking again, or ``forget``, drops the earlier one's answer).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import KafkaException

from globald.kafka.identity import RecordReader, TopicIds
from globald.settings.ref import ConfigRef

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long ``close`` waits for the worker when not given a bound: a daemon's stop gives it what is left of the stop's
# shared bound (``common.waits.STOP_JOINS_S``), as a call inside librdkafka cannot be cut short.
CLOSE_WAIT_S = 5.0


class Closable(Protocol):
    def close(self) -> Any: ...


@dataclass
class Clients:
    """The worker's long-lived clients: ``reader.consumer`` answers metadata too."""

    reader: RecordReader
    ids: TopicIds

    def close(self) -> None:
        for client in (self.reader, self.ids):
            with contextlib.suppress(KafkaException, RuntimeError):
                client.close()


@dataclass(frozen=True)
class Answer(Generic[T]):
    """What a question returned, or the exception it raised; ``asked``: when (monotonic) it was asked."""

    value: T | None
    error: BaseException | None
    asked: float

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


@dataclass
class _Job:
    key: str | None  # None: a close, whose answer nobody takes
    serial: int
    fn: Callable[[Any], Any]  # given the runner's Clients (None for a close)
    asked: float = field(default_factory=time.monotonic)


class _Runner(threading.Thread):
    def __init__(self, worker: ClusterWorker, number: int) -> None:
        super().__init__(name=f"globald-cluster-{number}", daemon=True)
        self.worker = worker
        self.job: _Job | None = None
        self.started_job = 0.0
        self.retired = threading.Event()  # replaced while stuck: end after the call in progress

    def run(self) -> None:
        clients: Clients | None = None
        try:
            while not self.retired.is_set():
                job = self.worker._next(self)
                if job is None:
                    break
                if job.key is not None and clients is None:
                    clients = self._made(job)
                    if clients is None:
                        continue
                self.job, self.started_job = job, time.monotonic()
                value: Any = None
                error: BaseException | None = None
                try:
                    value = job.fn(clients)  # a close (key None) takes no clients
                except BaseException as e:  # the question's own failure is its answer
                    error = e
                self.job = None
                # A runner left behind answers too: a stuck question was forgotten, so its late answer is
                # dropped (its serial is no longer wanted); one renewed (``renew``) was still wanted.
                self.worker._answered(job, Answer(value, error, job.asked))
        finally:
            if clients is not None:
                clients.close()

    def _made(self, job: _Job) -> Clients | None:
        try:
            return self.worker._make_clients(self.retired.is_set)
        except Exception as e:  # a bad setting reaches librdkafka only here: the question fails with it
            self.worker._answered(job, Answer(None, e, job.asked))
            return None


class ClusterWorker:
    """See the module docstring. Every method is called from the loop thread; the runners answer from theirs."""

    def __init__(self, config: ConfigRef, stuck_after_s: float) -> None:
        self._config = config  # clients are made from the settings in force when they are made
        self._generation = config.generation
        self._settings = config.now.consumer_settings()  # those of the current runner's clients
        self._stuck_after_s = stuck_after_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._answers: dict[str, Answer[Any]] = {}
        self._wanted: dict[str, int] = {}  # key -> serial of the question whose answer is wanted
        self._serials = itertools.count(1)
        self._numbers = itertools.count(1)
        self._stop = threading.Event()
        self._runners: list[_Runner] = []
        self.replaced = 0  # runners left behind, stuck in a call (status and metrics)
        self._runner: _Runner | None = None  # started by the first question: a state manager in a test asks none
        # Set when an answer comes in: the loop's idle wait between polls ends on it, so a plan's answer is applied
        # at once rather than after the rest of a poll's timeout (the first plan waited a whole idle poll). The loop
        # clears it before it takes answers (``Loop._turn``); ``GlobalThread.stop`` sets it too.
        self.wake = threading.Event()

    def _make_clients(self, stopping: Callable[[], bool]) -> Clients:
        def wait(seconds: float) -> bool:
            return self._stop.wait(seconds) or stopping()

        settings = self._config.now.consumer_settings()
        return Clients(RecordReader(settings, wait), TopicIds(settings))

    def _started(self) -> None:
        if self._runner is None:
            self._runner = self._start_runner()

    def _start_runner(self) -> _Runner:
        runner = _Runner(self, next(self._numbers))
        self._runners.append(runner)
        runner.start()
        return runner

    # -- the loop's side ----------------------------------------------------------------------------------------

    def ask(self, key: str, fn: Callable[[Clients], T]) -> None:
        """Ask ``fn(clients)`` on the worker; its answer (``take(key)``) replaces any earlier one's."""
        self.follow()  # asked after a reload's [kafka]: of clients made with it
        serial = next(self._serials)
        with self._lock:
            self._wanted[key] = serial
            self._answers.pop(key, None)
        self._started()
        self._jobs.put(_Job(key, serial, fn))

    def asked(self, key: str) -> bool:
        """A question under ``key`` is waiting for its answer, or its answer for ``take``."""
        with self._lock:
            return key in self._wanted or key in self._answers

    def take(self, key: str) -> Answer[Any] | None:
        """The answer to the question under ``key``, once (None while it is not in)."""
        with self._lock:
            return self._answers.pop(key, None)

    def forget(self, key: str) -> None:
        """The question under ``key`` no longer matters: its answer is dropped."""
        with self._lock:
            self._wanted.pop(key, None)
            self._answers.pop(key, None)

    def retire(self, client: Closable) -> None:
        """Close ``client`` (one of the loop's) on the worker, after every question asked before: never on the loop
        thread, where a destroy that waits on the wall clock would hold the loop and the stop. The caller never
        touches it again: confluent-kafka serializes every call on a client behind its close, with no bound."""
        def close(_: object) -> None:
            with contextlib.suppress(KafkaException, RuntimeError):
                client.close()

        self._started()
        self._jobs.put(_Job(None, 0, close))

    @property
    def generation(self) -> int:
        """The generation of the config the clients follow: made under it, or under an earlier one with the same
        client settings (status: ``config.clients``)."""
        return self._generation

    def follow(self) -> None:
        """New clients when the config's generation moved and its client settings with it (a reload's [kafka]):
        at each question, and by the loop at each turn (the old clients go even while nothing is asked)."""
        config, generation = self._config.get()
        if generation == self._generation:
            return
        self._generation = generation
        if config.consumer_settings() != self._settings:
            self.renew()

    def renew(self) -> None:
        """New clients (new [kafka] settings, or a silent consumer renewed): the current runner ends after the
        question it is on, whose answer still counts, and a new runner with new clients takes every question after
        it."""
        self._settings = self._config.now.consumer_settings()
        runner = self._runner
        if runner is not None:
            runner.retired.set()
            self._runner = self._start_runner()

    def replace_stuck(self) -> str | None:
        """When the question in progress started over ``stuck_after_s`` ago, leave its runner behind and start a
        new one (new clients); returns what was stuck, for the log. Questions still queued go to the new runner."""
        runner = self._runner
        job = runner.job if runner is not None else None
        if runner is None or job is None or time.monotonic() - runner.started_job < self._stuck_after_s:
            return None
        runner.retired.set()
        self.replaced += 1
        self._runner = self._start_runner()
        if job.key is not None:
            self.forget(job.key)
        return f"{job.key or 'a client close'} has not returned for {time.monotonic() - runner.started_job:.0f}s"

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Stop: questions still queued are dropped, closes still run, each runner closes its clients. Waits
        ``wait_s`` at most in all; False when a runner was still inside a call then (it is left behind, a daemon
        thread the process's end does not wait for). What a runner left behind does afterwards touches no store: a
        question works on its clients and on values the loop gave it when it asked, and its answer only goes to
        ``take``, which nobody calls any more."""
        self._stop.set()
        for _ in self._runners:
            self._jobs.put(None)
        deadline = time.monotonic() + wait_s
        for runner in self._runners:
            runner.join(max(0.0, deadline - time.monotonic()))
        return not any(r.is_alive() for r in self._runners)

    # -- the runners' side --------------------------------------------------------------------------------------

    def _next(self, runner: _Runner) -> _Job | None:
        while True:
            if runner.retired.is_set():
                return None
            try:
                job = self._jobs.get(timeout=0.5)  # a retired runner must not sit here holding a question
            except queue.Empty:
                continue
            if runner.retired.is_set():
                self._jobs.put(job)  # the current runner's, not this one's
                return None
            if job is None or (self._stop.is_set() and job.key is not None):
                if job is None:
                    return None
                continue  # stopping: only closes still run
            return job

    def _answered(self, job: _Job, answer: Answer[Any]) -> None:
        if job.key is None:
            return
        with self._lock:
            if self._wanted.get(job.key) == job.serial:
                del self._wanted[job.key]
                self._answers[job.key] = answer
                self.wake.set()
