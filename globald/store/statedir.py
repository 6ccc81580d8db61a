"""Owning a state_dir: creating it private (0700) and holding its advisory lock.

Shared by the daemon and the offline commands (reset, migrate, import-kafka-streams), which must exclude a
running daemon the same way it excludes a second daemon; it lives apart from ``daemon`` so that those commands do
not import the daemon and everything it runs.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO

from globald.common.errors import StateDirError, StateDirLockedError
from globald.store.names import LOCK_FILE

log = logging.getLogger(__name__)

# A disk that may heal: the daemon waits for it instead of refusing to start.
TRANSIENT_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})

# The lock is asked about (``lock_holder``: ``globald status``, the tests' waits, a monitoring script) by taking it
# shared for an instant. Such a look at the moment a daemon takes it exclusively made that daemon refuse to start,
# "owned by another globald" (seen in CI under load): the exclusive lock is retried this long, at this interval,
# before the state_dir counts as owned. A real owner holds it for its life, so only its refusal waits.
LOCK_GRACE_S = 1.0
_LOCK_RETRY_S = 0.02


class DiskNotReady(StateDirError):
    """The state_dir's disk is full or failing. The daemon waits for it (degraded); an offline command stops.
    Free space or repair the disk, then run the command again."""

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
        if e.errno in TRANSIENT_DISK_ERRORS:
            raise DiskNotReady(e, f"state_dir {state_dir}") from None
        raise StateDirError(f"state_dir {state_dir}: {e.strerror or e}") from None
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise StateDirError(f"state_dir {state_dir} is not writable by uid {os.getuid()}")


def check_state_dir(state_dir: Path) -> str | None:
    """Try what ``run`` needs of ``state_dir`` without leaving anything behind (``globald check-config``).

    Under the nearest directory that exists (``state_dir`` itself, or the ancestor ``run`` would create it in), a
    scratch directory is created, a file in it locked, and both removed: a file in the way, a read-only or pseudo
    filesystem (``/proc``, ``/sys``) or missing permissions fail here as ``run`` would fail. Raises StateDirError;
    returns a note when another globald holds the state_dir now (``run`` would be refused while it runs).
    """
    existing = state_dir
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        what = "exists and is not a directory" if existing == state_dir else f"cannot be created: {existing} is a file"
        raise StateDirError(f"state_dir {state_dir} {what}")
    try:
        probe = Path(tempfile.mkdtemp(prefix=".globald-check-", dir=existing))
    except OSError as e:
        raise StateDirError(f"state_dir {state_dir}: cannot create a directory in {existing}: "
                            f"{e.strerror or e}") from None
    try:
        with open(probe / LOCK_FILE, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        raise StateDirError(f"state_dir {state_dir}: cannot lock a file in {existing}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    holder = lock_holder(state_dir) if existing == state_dir else None
    return None if holder is None else f"a globald (pid {holder}) runs on this state_dir now; run refuses a second"


def lock_holder(state_dir: Path) -> str | None:
    """The pid of the globald holding ``state_dir``'s lock, or None; asked without taking or creating anything."""
    try:
        f = open(state_dir / LOCK_FILE)  # noqa: SIM115 - closed below, after the flock probe
    except OSError:
        return None
    with f:
        try:  # shared: two looks never exclude each other, only an owner's exclusive lock excludes them
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "unknown"
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _owned(state_dir: Path, owner: str) -> StateDirLockedError:
    return StateDirLockedError(f"state_dir {state_dir} is owned by another globald (pid {owner})")


def refuse_if_owned(state_dir: Path) -> None:
    """Raise StateDirLockedError, as ``lock_state_dir`` would, when another globald holds ``state_dir``; asked
    without creating anything, so that ``run`` refuses a second daemon before any other check."""
    owner = lock_holder(state_dir)
    if owner is not None:
        raise _owned(state_dir, owner)


def _flock_exclusive(f: IO[str], grace_s: float = LOCK_GRACE_S) -> bool:
    """Take ``f``'s flock exclusively, retrying while it is held, for ``grace_s`` at most (``LOCK_GRACE_S``)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_LOCK_RETRY_S)


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold the state_dir's advisory lock for the life of the returned file."""
    path = state_dir / LOCK_FILE
    try:
        f = open(path, "a+")  # noqa: SIM115 - held open for the life of the caller
    except OSError as e:
        if e.errno in TRANSIENT_DISK_ERRORS:
            raise DiskNotReady(e, f"cannot open {path}") from None
        raise StateDirError(f"cannot open {path}: {e.strerror or e}") from None
    if not _flock_exclusive(f):
        f.seek(0)
        owner = f.read().strip() or "unknown"
        f.close()
        raise _owned(state_dir, owner)
    try:  # the PID only names the owner in a refusal: the lock holds without it
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
    except OSError as e:
        log.warning("cannot write the pid into %s (%s); the lock is held all the same", path, e.strerror or e)
    return f
