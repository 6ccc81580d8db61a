"""The exact-build worker: off the loop thread, builds the snapshots that requests ask for at offsets no snapshot
has (``builder``), and answers each request once: READY, or why not.

A build reads the topic from the closest earlier snapshot (or the log start) to the requested offsets. A table
wiped after a request was admitted (its generation moved on) is refused as REBUILDING, never built on a stale base;
a base snapshot is kept from retention while a build copies it (``SnapshotTable.busy``). The table's state is
``table_state``'s: a build's generation check, manifest and rename run under the table's lock, so a wipe never
lands between them.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from globald.common import swallowed
from globald.common.waits import Deadline
from globald.settings.ref import ConfigRef
from globald.snapshot import manifest as manifests
from globald.snapshot.builder import Builder, BuildRefused
from globald.snapshot.exact_requests import Code, Request, Response
from globald.snapshot.manifest import Manifest, Offsets, snapshot_since
from globald.snapshot.reader import find_exact, manifests_of
from globald.snapshot.space import BuildNeed, build_need
from globald.snapshot.table_state import SnapshotTable
from globald.store import durable
from globald.store import space as store_space
from globald.store.names import SNAPSHOT_BUILD_PREFIX, SNAPSHOT_DB_DIR
from globald.store.space import mb

log = logging.getLogger(__name__)


# How long a stop waits for the build worker (see ExactBuilds.close).
CLOSE_WAIT_S = 10.0
# A build whose last call into a client (each bounded at 5 s) began this long ago is stuck inside librdkafka, whose
# waits are on the wall clock: after a step back, one waits as long as the step (seen: an hour). Its worker is left
# behind and a new one, with new clients, builds the request again (``ExactBuilds.watch``).
STUCK_S = 30.0


@dataclass(frozen=True)
class Job:
    table: str
    request: Request
    generation: int
    deadline: float
    # The topic's min.compaction.lag.ms as the live table's last plan read it (None: unknown, taken as 0): a build
    # from the log start sets its since from it as a replay does (``store.history.replay_since``).
    lag_ms: int | None = None


class BuildHost(Protocol):
    """What the worker needs of the request desk (``desk.RequestDesk``)."""

    def next_id(self) -> str: ...

    def manifest_states(self, table: str) -> tuple[str, str]: ...

    def ready(self, tab: SnapshotTable, req: Request, m: Manifest) -> None: ...

    def answer(self, tab: SnapshotTable, resp: Response) -> None: ...


class _Worker:
    """One build thread, its clients (``builder``) and the job it holds; left behind when stuck (``stop`` set)."""

    def __init__(self, config: ConfigRef, number: int, work: Callable[[_Worker], None]) -> None:
        self.number = number
        self.stop = threading.Event()
        self.builder = Builder(config, self.stop)
        self.job: Job | None = None
        self.thread = threading.Thread(target=work, args=(self,), name=f"globald-snapshots-{number}", daemon=True)


class ExactBuilds:
    """The worker thread and its queue of admitted requests."""

    def __init__(self, config: ConfigRef, tables: Mapping[str, SnapshotTable], host: BuildHost) -> None:
        self._config = config  # the builder takes the config in force at each build
        self._state_dir = config.now.state_dir  # a restart's key
        self._tables = tables
        self._host = host
        self._stop = threading.Event()
        self._jobs: queue.Queue[Job | None] = queue.Queue()  # None: a stop, waking the worker at once
        self._lock = threading.Lock()  # which worker is current, and the job it holds
        self._worker: _Worker | None = None
        self.replaced = 0  # workers left behind, stuck in a client

    def start(self) -> None:
        with self._lock:
            self._start_worker()

    def _start_worker(self) -> None:
        w = _Worker(self._config, self.replaced, self._work)
        self._worker = w
        w.thread.start()

    def close(self, joins: Deadline | None = None) -> None:
        """Stop the build worker, waiting ``CLOSE_WAIT_S`` at most (what is left of ``joins``, a stop's shared
        bound): a waiting worker wakes at once; a build sees the stop at its next record, and then closes its
        consumer, whose destroy can wait as long as a wall-clock step back (the architecture page). A worker still
        inside it is left behind; a half-built snapshot is swept at the next start."""
        self._stop.set()
        self._jobs.put(None)
        with self._lock:
            w = self._worker
        if w is not None:
            w.stop.set()
            wait = (joins or Deadline(CLOSE_WAIT_S)).left(CLOSE_WAIT_S)
            w.thread.join(timeout=wait)
            if w.thread.is_alive():
                log.warning("the exact-build worker did not end within %.1fs of the stop (a build, or a client's "
                            "close, in flight); stopping without it", wait)

    @property
    def generation(self) -> int | None:
        """The generation of the config the current worker's clients were made under (``Builder.generation``)."""
        with self._lock:
            w = self._worker
        return None if w is None else w.builder.generation

    def submit(self, table: str, request: Request, generation: int, deadline: float,
               lag_ms: int | None = None) -> None:
        """Build ``request`` of ``table`` (wiped ``generation`` times when admitted) before ``deadline``; ``lag_ms``:
        its topic's min.compaction.lag.ms as the live table's last plan read it (``Job.lag_ms``)."""
        self._jobs.put(Job(table, request, generation, deadline, lag_ms))

    def watch(self, now: float) -> None:
        """Loop thread, every tick: a build stuck inside a client for ``STUCK_S`` leaves its worker behind (it
        answers nothing when it comes out) and a new worker, with new clients, builds the request again. A C call
        cannot be interrupted; a thread waiting in one can be stopped waiting for."""
        with self._lock:
            w = self._worker
            if w is None or w.job is None or self._stop.is_set() or now - w.builder.beat < STUCK_S:
                return
            job, w.job = w.job, None
            w.stop.set()
            self.replaced += 1
            log.warning("table %s: the exact build of %s has been inside one client call for %.0fs (librdkafka waits "
                        "on the wall clock: a step back leaves it waiting as long as the step); building it again "
                        "with new clients, the stuck worker left behind", job.table, job.request.id,
                        now - w.builder.beat)
            self._start_worker()
            self._jobs.put(job)

    def _current(self, w: _Worker, job: Job) -> bool:
        """Whether ``w`` still owns ``job`` (then it no longer does): a worker left behind answers nothing."""
        with self._lock:
            if self._worker is not w or w.job is not job:
                return False
            w.job = None
            return True

    def _work(self, w: _Worker) -> None:
        try:
            while not (self._stop.is_set() or w.stop.is_set()):
                try:
                    job = self._jobs.get(timeout=0.2)
                except queue.Empty:
                    continue
                if job is None:  # the stop's wake-up
                    continue
                with self._lock:
                    if self._worker is not w:  # left behind between its wait and now: the job is the new one's
                        self._jobs.put(job)
                        return
                    w.job = job
                    w.builder.beat = time.monotonic()
                try:
                    self._serve(w, job)
                except Exception as e:  # the worker must outlive any job, or no exact build is answered again
                    swallowed.record("exact_build", e, log, "table %s: exact %s failed", job.table, job.request.id)
                finally:
                    self._current(w, job)
        finally:
            w.builder.close()
            if self._stop.is_set():
                self._answer_stopping()

    def _answer_stopping(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                continue
            tab = self._tables.get(job.table)
            if tab is not None:
                self._host.answer(tab, Response(job.request.id, Code.STOPPING, "the daemon is stopping"))

    def _serve(self, w: _Worker, job: Job) -> None:
        tab = self._tables.get(job.table)
        if tab is None:  # dropped by a reload since it was admitted: its requests' folder went with it
            log.info("table %s: exact %s not built: the table was dropped by a reload", job.table, job.request.id)
            return
        try:
            m = self._build(w, tab, job)
            if self._current(w, job):
                self._host.ready(tab, job.request, m)
        except BuildRefused as e:
            if self._current(w, job):
                self._host.answer(tab, Response(job.request.id, e.code, str(e)))
        except Exception as e:
            swallowed.record("exact_build", e, log, "table %s: exact snapshot build failed", job.table)
            if self._current(w, job):
                self._host.answer(tab, Response(job.request.id, Code.FAILED, f"{type(e).__name__}: {e}"))

    def _build(self, w: _Worker, tab: SnapshotTable, job: Job) -> Manifest:
        name, target = tab.config.name, job.request.offsets
        if job.generation != tab.generation:
            raise BuildRefused(Code.REBUILDING, f"table {name} was wiped after the request; it is rebuilding")
        done = find_exact(self._state_dir, name, target)
        if done is not None:  # an earlier request for the same offsets built it
            return done
        # Named by the builder too: a worker left behind may still write into its own when it comes out.
        work = tab.dir / f"{SNAPSHOT_BUILD_PREFIX}{job.request.id}-{w.number}"
        with tab.locked():
            found = manifests_of(self._state_dir, name)
            base = base_for(found, target)
            if base is not None:
                tab.hold_base(base.id)
            verified = tab.fingerprints()
        try:
            # Admitted with room (the publisher freed what it may); an earlier build may have taken it since.
            need = build_need(self._state_dir, name, target, base, tab.dir / base.id if base else None,
                              found[0].records if found else 0)
            free = store_space.free_bytes(self._state_dir)
            if free is not None and free < need.total:
                raise BuildRefused(Code.NO_ROOM, no_room(name, target, need, free, 0))
            started = time.perf_counter()
            declared = tab.config
            built = w.builder.build(declared, target, base.offsets if base else None,
                                  tab.dir / base.id if base else None, work, job.deadline, verified, job.lag_ms)
            with tab.locked():
                if job.generation != tab.generation:
                    raise BuildRefused(Code.REBUILDING, f"table {name} was wiped during the build; it is rebuilding")
                if declared.versioned and not tab.config.versioned:  # its history would outlive the live table's
                    raise BuildRefused(Code.REBUILDING, f"a reload removed history from table {name} during the "
                                                        "build; ask again")
                if self._worker is not w:  # left behind (watch): the new worker adds it
                    raise BuildRefused(Code.STOPPING, "this build's worker was left behind; a new one builds it")
                sid = self._host.next_id()
                daemon_state, table_state = self._host.manifest_states(name)
                m = Manifest(table=name, topic=tab.config.topic, id=sid, offsets=dict(target), created=time.time(),
                             daemon_state=daemon_state, table_state=table_state, records=built.records, kind="exact",
                             request=job.request.id, history_ms=tab.config.history,
                             since=snapshot_since(tab.config, work / SNAPSHOT_DB_DIR))
                manifests.write(work, m)
                durable.rename(work, tab.dir / sid)
                tab.built()
            log.info("table %s: exact snapshot %s at %s built from %s with %d records in %.3fs", name, sid, target,
                     base.id if base else "the log start", built.consumed, time.perf_counter() - started)
            return m
        finally:
            if base is not None:
                tab.release_base(base.id)
            shutil.rmtree(work, ignore_errors=True)


def base_for(found: list[Manifest], target: Offsets) -> Manifest | None:
    """The base of a build at ``target``: the newest fresh snapshot (``found`` is newest first) at or below it in
    every partition; None when there is none (the build reads from the log start)."""
    return next((m for m in found if not m.stale and set(m.offsets) == set(target)
                 and all(m.offsets[p] <= o for p, o in target.items())), None)


def no_room(table: str, target: Offsets, need: BuildNeed, free: int, freed: int) -> str:
    """The refusal of a build the state_dir has no room for, naming the bytes missing."""
    missing = need.total - free
    return (f"no room on the state_dir for an exact snapshot of {table} at {target}: {missing} bytes "
            f"({mb(missing)}) missing; it needs {need.describe()}, {mb(free)} free after freeing {mb(freed)} of "
            f"globald's own (trash, abandoned builds, snapshots no reader holds). Free space on the state_dir, or ask "
            f"at offsets a snapshot has")
