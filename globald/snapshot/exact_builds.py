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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from globald.common import swallowed
from globald.settings.ref import ConfigRef
from globald.snapshot import manifest as manifests
from globald.snapshot.builder import Builder, BuildRefused
from globald.snapshot.exact_requests import Code, Request, Response
from globald.snapshot.manifest import Manifest, Offsets
from globald.snapshot.reader import find_exact, manifests_of
from globald.snapshot.space import BuildNeed, build_need
from globald.snapshot.table_state import SnapshotTable
from globald.store import durable
from globald.store import space as store_space
from globald.store.names import SNAPSHOT_BUILD_PREFIX
from globald.store.space import mb

log = logging.getLogger(__name__)


# How long a stop waits for the build worker (see ExactBuilds.close).
CLOSE_WAIT_S = 10.0


@dataclass(frozen=True)
class Job:
    table: str
    request: Request
    generation: int
    deadline: float


class BuildHost(Protocol):
    """What the worker needs of the request desk (``desk.RequestDesk``)."""

    def next_id(self) -> str: ...

    def manifest_states(self, table: str) -> tuple[str, str]: ...

    def ready(self, tab: SnapshotTable, req: Request, m: Manifest) -> None: ...

    def answer(self, tab: SnapshotTable, resp: Response) -> None: ...


class ExactBuilds:
    """The worker thread and its queue of admitted requests."""

    def __init__(self, config: ConfigRef, tables: Mapping[str, SnapshotTable], host: BuildHost) -> None:
        self._config = config  # the builder takes the config in force at each build
        self._state_dir = config.now.state_dir  # a restart's key
        self._tables = tables
        self._host = host
        self._stop = threading.Event()
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        self._worker = threading.Thread(target=self._work, name="globald-snapshots", daemon=True)
        self._worker.start()

    def close(self) -> None:
        """Stop the build worker, waiting ``CLOSE_WAIT_S`` at most: a build sees the stop at its next record, and
        then closes its consumer, whose destroy can wait as long as a wall-clock step back (the architecture page).
        A worker still inside it is left behind; a half-built snapshot is swept at the next start."""
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=CLOSE_WAIT_S)
            if self._worker.is_alive():
                log.warning("the exact-build worker did not end within %.0fs of the stop (a client's close stuck in "
                            "librdkafka); stopping without it", CLOSE_WAIT_S)

    def submit(self, table: str, request: Request, generation: int, deadline: float) -> None:
        """Build ``request`` of ``table`` (wiped ``generation`` times when admitted) before ``deadline``."""
        self._jobs.put(Job(table, request, generation, deadline))

    def _work(self) -> None:
        builder = Builder(self._config, self._stop)
        try:
            while not self._stop.is_set():
                try:
                    job = self._jobs.get(timeout=0.2)
                except queue.Empty:
                    continue
                try:
                    self._serve(builder, job)
                except Exception as e:  # the worker must outlive any job, or no exact build is answered again
                    swallowed.record("exact_build", e, log, "table %s: exact %s failed", job.table, job.request.id)
        finally:
            builder.close()
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                tab = self._tables.get(job.table)
                if tab is not None:
                    self._host.answer(tab, Response(job.request.id, Code.STOPPING, "the daemon is stopping"))

    def _serve(self, builder: Builder, job: Job) -> None:
        tab = self._tables.get(job.table)
        if tab is None:  # dropped by a reload since it was admitted: its requests' folder went with it
            log.info("table %s: exact %s not built: the table was dropped by a reload", job.table, job.request.id)
            return
        try:
            m = self._build(builder, tab, job)
            self._host.ready(tab, job.request, m)
        except BuildRefused as e:
            self._host.answer(tab, Response(job.request.id, e.code, str(e)))
        except Exception as e:
            swallowed.record("exact_build", e, log, "table %s: exact snapshot build failed", job.table)
            self._host.answer(tab, Response(job.request.id, Code.FAILED, f"{type(e).__name__}: {e}"))

    def _build(self, builder: Builder, tab: SnapshotTable, job: Job) -> Manifest:
        name, target = tab.config.name, job.request.offsets
        if job.generation != tab.generation:
            raise BuildRefused(Code.REBUILDING, f"table {name} was wiped after the request; it is rebuilding")
        done = find_exact(self._state_dir, name, target)
        if done is not None:  # an earlier request for the same offsets built it
            return done
        work = tab.dir / f"{SNAPSHOT_BUILD_PREFIX}{job.request.id}"
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
            built = builder.build(tab.config, target, base.offsets if base else None,
                                  tab.dir / base.id if base else None, work, job.deadline, verified)
            with tab.locked():
                if job.generation != tab.generation:
                    raise BuildRefused(Code.REBUILDING, f"table {name} was wiped during the build; it is rebuilding")
                sid = self._host.next_id()
                daemon_state, table_state = self._host.manifest_states(name)
                m = Manifest(table=name, topic=tab.config.topic, id=sid, offsets=dict(target), created=time.time(),
                             daemon_state=daemon_state, table_state=table_state, records=built.records, kind="exact",
                             request=job.request.id)
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
