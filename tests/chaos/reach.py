"""Did an injected I/O fault reach the daemon? A failure point nobody hit, or a full disk nobody wrote to, proves
nothing about recovery, so the campaign counts such a fault as not recovered.

Evidence, any one of, since the fault began:

- the daemon's status (``degraded``, a table's or a snapshot's ``last_error``) or its log names a disk error;
- its count of caught exceptions (``globald_swallowed_failures_total`` on /metrics) rose in the same process, at a
  place that catches nothing but OSError on the state_dir (``DISK_PLACES``): the metric does not say what was
  caught, and elsewhere a Kafka error or a bug caught meanwhile would pass for the disk fault;
- RocksDB's own info ``LOG`` of a table's store names one (RocksDB retries or ignores some failures, such as the
  deletion of an obsolete file, without telling globald: that is the daemon meeting the fault too).

While none is there, the campaign keeps the fault in place (failure point armed, disk full) for up to ``GRACE_S``
beyond its planned duration, so that a fault on a rarely used call (``ftruncate``, ``rename``) still meets the
daemon instead of being reported as recovered without ever having happened. A failure point armed ``once`` that
still shows nothing is asked directly (``once_fired``): libfiu disables it when it fails a call, so the daemon
met it if it is no longer armed, even where the caller ignored the error without a word.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from globald.store.names import db_dir
from tests.chaos import entry, plan

if TYPE_CHECKING:
    from tests.chaos.daemon import ChaosDaemon

IO_KINDS = (plan.IO_ERROR, plan.DISK_FULL)
GRACE_S = 30.0
# The errno texts of the faults injected (ENOSPC, EIO): RocksDB's LOG must name one of them, since it also says
# "IO error" of files it merely did not find.
ERRNO_TEXTS = ("no space left on device", "input/output error")
# How the daemon words a disk error in its status and log (lower case): the errno texts, RocksDB's, and globald's own
# for a bulk load whose flush did not land.
FIU_TEXTS = (*ERRNO_TEXTS, "io error", "did not reach the disk")
_SWALLOWED = re.compile(r'^globald_swallowed_failures_total\{where="([^"]*)"\} ([0-9.e+]+)$', re.M)
# The places (``common.swallowed`` labels) whose except clauses catch only OSError, around writes to the state_dir:
# status.json (service.daemon), a snapshot's stale mark (snapshot.publishing) and a reply to an exact request
# (snapshot.desk).
DISK_PLACES = frozenset({"status_file", "snapshot_stale_mark", "snapshot_reply"})


def swallowed(daemon: ChaosDaemon) -> float | None:
    """The daemon's total of caught disk errors (at ``DISK_PLACES``), or None when /metrics does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http_port}/metrics", timeout=1.5) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return None
    return sum(float(v) for where, v in _SWALLOWED.findall(text) if where in DISK_PLACES)


def names_disk_error(text: str, texts: tuple[str, ...] = FIU_TEXTS) -> bool:
    low = text.lower()
    return any(t in low for t in texts)


@dataclass
class Evidence:
    """What the daemon had said when the fault began, to tell what it said since."""

    pid: int | None
    log_mark: int
    swallowed: float | None
    rocks_logs: dict[Path, tuple[int, int]] = field(default_factory=dict)  # each store's LOG -> (inode, size) then

    @classmethod
    def before(cls, daemon: ChaosDaemon, tables: list[str]) -> Evidence:
        logs = {db_dir(daemon.state_dir, t) / "LOG": (0, 0) for t in tables}
        for path in logs:
            with contextlib.suppress(OSError):
                st = path.stat()
                logs[path] = (st.st_ino, st.st_size)
        pid = daemon.pid if daemon.alive() else None
        return cls(pid, daemon.log_size(), swallowed(daemon) if pid is not None else None, logs)

    def met(self, daemon: ChaosDaemon, texts: list[str]) -> str | None:
        """How the daemon met the fault (one line), or None if nothing shows it did."""
        said = next((t for t in texts if names_disk_error(t)), None)
        if said is not None:
            return f"status: {said[:160]}"
        logged = next((x for x in daemon.log_since(self.log_mark, 5000).splitlines() if names_disk_error(x)), None)
        if logged is not None:
            return f"log: {logged[:160]}"
        if daemon.alive():
            now = swallowed(daemon)
            base = self.swallowed if daemon.pid == self.pid else 0.0  # a new process counts from zero
            if now is not None and base is not None and now > base:
                return f"caught disk errors (status.json, stale marks, replies) rose from {base:.0f} to {now:.0f}"
        for path, mark in self.rocks_logs.items():
            line = _new_error_line(path, *mark)
            if line is not None:
                return f"RocksDB LOG of {path.parent.parent.name}: {line[:160]}"
        return None


def once_fired(daemon: ChaosDaemon, arm_path: Path, point: str, log_mark: int, timeout: float = 10.0,
               keep: int | None = None) -> str | None:
    """Whether the once-armed libfiu ``point`` failed a call in the daemon (``tests.chaos.entry.probe_once``): one
    line saying so, or None (not fired, not armed at all, or no answer). With ``keep`` (its errno), a point not
    fired yet is armed again after the answer, as it was."""
    if "CHAOS-FIU not armed" in daemon.log_since(log_mark, 5000):
        return None  # the hook could not arm it: a disabled point would look like a fired one
    probe_id = time.monotonic_ns()
    tmp = arm_path.with_name(arm_path.name + ".probe.tmp")
    tmp.write_text(json.dumps({"id": probe_id, "name": point, **({"keep": keep} if keep is not None else {})}))
    tmp.replace(arm_path.with_name(arm_path.name + ".probe"))
    answer = arm_path.with_name(f"{arm_path.name}.probe-{probe_id}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, entry.PROBE_SIGNAL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.alive():
        with contextlib.suppress(OSError, ValueError):
            if json.loads(answer.read_text()).get("fired"):
                return f"libfiu: the once-armed {point} failed a call, which nothing reported"
            return None
        time.sleep(0.1)
    return None


def _new_error_line(path: Path, inode: int, size: int) -> str | None:
    """The first line naming an injected errno that RocksDB wrote to ``path`` after it was ``size`` bytes long."""
    try:
        with open(path, "rb") as f:
            # A reopened store starts a new LOG (the old one is renamed): then everything in it is new.
            f.seek(size if os.fstat(f.fileno()).st_ino == inode else 0)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return next((x for x in text.splitlines() if names_disk_error(x, ERRNO_TEXTS)), None)
