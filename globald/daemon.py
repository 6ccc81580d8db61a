"""``globald run``: owns the state_dir, runs the global thread in the foreground, publishes status.

One daemon per state_dir, enforced with an advisory lock. SIGTERM and SIGINT commit, close and exit 0. The
state_dir is created private (0700) and a second daemon is refused without touching the first one's files. A
state_dir on a full or failing disk is waited for (degraded, logged), never a reason to exit.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import IO

from globald import statusfile
from globald.config import Config
from globald.engine.thread import GlobalThread
from globald.errors import StateDirError, StateDirLockedError
from globald.ops.progress import ProgressOptions
from globald.ops.runtime import Operations
from globald.snapshot.publisher import SnapshotPublisher
from globald.states import Listeners, State
from globald.store.names import LOCK_FILE

log = logging.getLogger(__name__)

# A disk that may heal: the daemon waits for it instead of refusing to start.
_TRANSIENT_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}
_DISK_RETRY_MAX_S = 10.0


class _DiskNotReady(Exception):
    def __init__(self, error: OSError, what: str) -> None:
        super().__init__(f"{what}: {error.strerror or error}")


def prepare_state_dir(state_dir: Path) -> None:
    if state_dir.exists() and not state_dir.is_dir():  # mkdir would only say "File exists"
        raise StateDirError(f"state_dir {state_dir} exists and is not a directory")
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if state_dir.stat().st_mode & 0o077:
            os.chmod(state_dir, 0o700)
            log.warning("state_dir %s was readable by others; tightened to 0700", state_dir)
    except OSError as e:
        if e.errno in _TRANSIENT_DISK_ERRORS:
            raise _DiskNotReady(e, f"state_dir {state_dir}") from None
        raise StateDirError(f"state_dir {state_dir}: {e.strerror or e}") from None
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise StateDirError(f"state_dir {state_dir} is not writable by uid {os.getuid()}")


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold the state_dir's advisory lock for the life of the returned file."""
    path = state_dir / LOCK_FILE
    try:
        f = open(path, "a+")  # noqa: SIM115 - held open for the life of the daemon
    except OSError as e:
        if e.errno in _TRANSIENT_DISK_ERRORS:
            raise _DiskNotReady(e, f"cannot open {path}") from None
        raise StateDirError(f"cannot open {path}: {e.strerror or e}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "unknown"
        f.close()
        raise StateDirLockedError(f"state_dir {state_dir} is owned by another globald (pid {owner})") from None
    try:  # the PID only names the owner in a refusal: the lock holds without it
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
    except OSError as e:
        log.warning("cannot write the pid into %s (%s); the lock is held all the same", path, e.strerror or e)
    return f


class Daemon:
    def __init__(self, config: Config, listeners: Listeners | None = None,
                 progress: ProgressOptions | None = None) -> None:
        self.config = config
        self.listeners = listeners or Listeners()
        self.thread = GlobalThread(config, self.listeners)
        # Registered before the status listeners below, so a status written on a wipe already shows the stale mark.
        self.snapshots = SnapshotPublisher(config, self.thread)
        self._last_status = 0.0
        self._last_degraded: str | None = None
        self._status_failing = False
        self.listeners.state.append(lambda new, old, reason: self.publish_status())
        self.listeners.table_state.append(lambda table, new, old, reason: self.publish_status())
        self.thread.after_commit.append(self.publish_status)
        self.thread.after_poll.append(self._maybe_publish_status)
        self.ops = Operations(config, self.thread, self.listeners, progress)
        self.ops.snapshots = self.snapshots

    def publish_status(self) -> None:
        self._last_status = time.monotonic()
        doc = self.ops.observe(self.snapshots.annotate(self.thread.status()))
        self._last_degraded = doc.get("degraded")
        try:
            statusfile.write(self.config.state_dir, doc)
        except OSError as e:  # a full or failing disk: the loop handles its own writes; say it once, keep trying
            if not self._status_failing:
                log.warning("cannot publish status.json: %s; retrying with every update", e)
            self._status_failing = True
            return
        if self._status_failing:
            log.info("status.json published again")
        self._status_failing = False

    def _maybe_publish_status(self) -> None:
        # A fault starting or ending is news at once; the rest (offsets, lag) at most once a second.
        if time.monotonic() - self._last_status >= 1.0 or self.thread.degraded != self._last_degraded:
            self.publish_status()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("%s received; committing and stopping", signal.Signals(signum).name)
        self.thread.stop()

    def stop(self) -> None:
        self.thread.stop()

    def _own_state_dir(self) -> IO[str] | None:
        """The state_dir's lock, waiting (degraded) while its disk is full or failing; None if stopped meanwhile."""
        delay = 0.5
        said = False
        while not self.thread.stopping:
            try:
                prepare_state_dir(self.config.state_dir)
                lock = lock_state_dir(self.config.state_dir)
            except _DiskNotReady as e:
                if not said:
                    log.warning("degraded: %s; waiting for the disk, retrying every %.0fs at most", e,
                                _DISK_RETRY_MAX_S)
                    said = True
                self.thread.wait_stop(delay)
                delay = min(delay * 2, _DISK_RETRY_MAX_S)
                continue
            if said:
                log.info("recovered: state_dir %s takes writes again", self.config.state_dir)
            return lock
        return None

    def run(self, handle_signals: bool = True) -> int:
        """Run in the foreground. ``handle_signals=False`` when not on the main thread (the demo): stop() then."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)} if handle_signals else {}
        try:
            lock = self._own_state_dir()
            if lock is None:  # stopped while waiting for the disk
                return 0
            try:
                self.snapshots.start()
                self.ops.start()
                log.info("globald %d starting: %d table(s), state_dir %s", os.getpid(), len(self.config.tables),
                         self.config.state_dir)
                self.thread.run()
                return 0
            finally:
                self.snapshots.close()
                if self.thread.state in (State.NOT_RUNNING, State.ERROR):
                    self.publish_status()
                self.ops.stop()
                lock.close()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
