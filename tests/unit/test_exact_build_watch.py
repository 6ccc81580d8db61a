"""The exact-build watchdog (``snapshot.exact_builds.ExactBuilds.watch``): a build whose worker has been inside one
client call for ``STUCK_S`` is handed, whole, to a new worker with new clients; the stuck worker is told to stop and
answers nothing when it comes out. Pure logic: the workers here take a job and hold it as a worker inside
librdkafka would (``_work`` replaced); the real case, a wall-clock step during a build, is the clock-step test's
"exact build" phase against a real broker."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

from globald.settings.config import parse
from globald.settings.ref import ConfigRef
from globald.snapshot.exact_builds import STUCK_S, ExactBuilds, Job, _Worker
from globald.snapshot.exact_requests import Request

CONFIG = parse({"state_dir": "/srv/state", "kafka": {"bootstrap.servers": "127.0.0.1:9"},
                "tables": [{"name": "a", "topic": "ta"}]})
REQUEST = Request("r1", "a", {0: 10})
WAIT_S = 60.0  # the workers are threads of their own: generous on a loaded machine


def _held(builds: ExactBuilds, held: list[tuple[int, Job]], release: threading.Event) -> Any:
    def work(w: _Worker) -> None:
        while True:
            try:
                job = builds._jobs.get(timeout=0.02)
                break
            except queue.Empty:
                if release.is_set():
                    return
        with builds._lock:
            w.job = job
        held.append((w.number, job))
        release.wait(WAIT_S)
    return work


def _until(what: str, ok: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_build_stuck_in_a_client_is_built_again_by_a_new_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = ExactBuilds(ConfigRef(CONFIG), {}, host=None)  # type: ignore[arg-type]
    held: list[tuple[int, Job]] = []
    release = threading.Event()
    monkeypatch.setattr(builds, "_work", _held(builds, held, release))
    try:
        builds.start()
        first = builds._worker
        assert first is not None
        builds.submit("a", REQUEST, generation=0, deadline=time.monotonic() + 600)
        _until("the first worker took the job", lambda: len(held) == 1)
        beat = first.builder.beat
        builds.watch(beat + STUCK_S - 1)  # in a call, but not for long: nothing happens
        assert builds._worker is first and builds.replaced == 0 and not first.stop.is_set()
        builds.watch(beat + STUCK_S)
        assert builds.replaced == 1 and first.stop.is_set() and first.job is None  # left behind, owning nothing
        _until("a new worker took the same job", lambda: len(held) == 2)
        assert held[1] == (1, held[0][1]) and builds._worker is not first
        second = builds._worker
        assert second is not None
        builds.watch(second.builder.beat + STUCK_S - 1)  # its own beat counts, not the stuck one's
        assert builds.replaced == 1 and builds._worker is second
    finally:
        release.set()
        builds.close()


def test_an_idle_or_stopping_worker_is_never_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = ExactBuilds(ConfigRef(CONFIG), {}, host=None)  # type: ignore[arg-type]
    release = threading.Event()
    monkeypatch.setattr(builds, "_work", _held(builds, [], release))
    try:
        builds.start()
        builds.watch(time.monotonic() + 100 * STUCK_S)  # no job: an idle worker waits on its queue, not a client
        assert builds.replaced == 0
        builds._stop.set()
        with builds._lock:
            assert builds._worker is not None
            builds._worker.job = Job("a", REQUEST, 0, 0.0)
        builds.watch(time.monotonic() + 100 * STUCK_S)  # a stop under way: no new worker
        assert builds.replaced == 0
    finally:
        release.set()
        builds.close()
