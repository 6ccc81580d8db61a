"""The daemon decodes each typed table's CURRENT snapshot into its columnar file, in a process of its own.

Readers (``globald.typed.columnar.ensure_columnar``) decode a snapshot once per host when they first meet it; the
daemon does it ahead of them, so that a Spark worker finds the file and only maps it, and it exports what the file
says about the data (values, decode errors) as metrics and status. Decoding is Python per value (~40 us, holding
the GIL), so it never runs in the daemon: a child process does it (``python -m globald.typed.decode_snapshot``),
at nice 19 and SCHED_BATCH, holding the snapshot with a lease, decoding outside the host lock.

What bounds its cost, so that it cannot slow ingestion:
- one decode process at a time for the whole daemon, started from the loop's operations tick (a ``Popen``, then a
  ``poll`` per tick: no thread, and nothing waited for on the loop);
- per table, at most one decode per ``[snapshots] decode_interval_ms``, counted from the end of the previous one
  and never sooner than that one lasted, so a table updated every second keeps a core at most half busy, and
  ``decode_s / (decode_s + interval)`` of it for short decodes; after failures the wait doubles, up to 16 times;
- only when CURRENT is not the snapshot decoded last, or when the last decode left values pending (their writer
  schema not fetched from the Schema Registry yet: the decode process redoes the file once one can be had,
  ``globald.typed.registry``); only tables with a typed value or key;
- never started while a table restores, the daemon's busiest time (cores, caches and disk are shared, not only
  the scheduler's time). Measured on 2 cores with the daemon itself at nice 19 (so no priority to spare): a
  100k-value decode beside the restore of 300k records of another table cost that restore nothing measurable
  (5.5 s against 5.3 s, 3 rounds each, within noise) on an otherwise quiet machine, but 30 % (7.8-8.8 s against
  5.9-6.6 s) with the cores saturated by other processes; gated, the restore takes the same time as without;
- a decode running longer than ``TIMEOUT_S`` is stopped and counted as failed.

A reload's tables reach it as the engine's events (``on_event``): typed tables it added are decoded from then on,
those it dropped no more (a decode of one in flight is stopped). The process is given the path and the sha256 of the
config file in force (``in_force``; the config itself, ``reconfigure``): it decodes only with those very bytes, so a
file edited since, or a reload refused, is never decoded with (that decode fails, counted, until the file is
reloaded or put back). A table whose declaration a reload changed is decoded again at its next snapshot version,
which the publisher makes at once (``TableRedeclared``).

Stopping the daemon stops the process: SIGTERM (with SIGCONT, should it be stopped), which it answers by removing
its temporary file and releasing its lease; SIGKILL once what is left of the stop's shared bound has passed (the
daemon's ``STOP_JOINS_S``; ``STOP_GRACE_S`` for a decode past its ``TIMEOUT_S``), and then this module removes the
temporary file and the lease it may have left. A failure is counted (``common.swallowed``, place
``snapshot_decode``, and the table's ``failures``), logged, and never more than that.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from globald.common import swallowed
from globald.common.errors import GlobaldError
from globald.common.states import State
from globald.common.waits import Deadline
from globald.engine.events import Event, TableAdded, TableDropped
from globald.settings.config import Config, TableConfig
from globald.snapshot import leases
from globald.status.document import DaemonStatus, DecodeStatus
from globald.store.names import COLUMNAR_PREFIX, TMP_PREFIX, TMP_SUFFIX, snapshots_dir
from globald.typed import decode_snapshot

log = logging.getLogger(__name__)

LEASE_S = 60.0  # renewed every 15 s; if the daemon dies with its decode, the lease holds at most this long
TIMEOUT_S = 1800.0
STOP_GRACE_S = 5.0
KILLED_REAP_S = 0.1
MAX_BACKOFF = 16
COLUMNAR_TMP = f"{TMP_PREFIX}{COLUMNAR_PREFIX}"  # what replace_file names the columnar file while writing it


class DecodeFailed(GlobaldError):
    """The process decoding a snapshot into its columnar file failed; the daemon log above says why. Nothing is
    lost: readers decode the snapshot themselves, and the daemon tries again after ``decode_interval_ms``."""


def is_typed(tc: TableConfig) -> bool:
    return any(f is not None and f.typed for f in (tc.value, tc.key))


@dataclass
class _Table:
    status: DecodeStatus = field(default_factory=DecodeStatus)
    problem: str | None = None  # every value of the snapshot decoded last fails: a status problem, not a figure
    next_at: float = 0.0  # monotonic: no decode of this table starts before
    failed_in_row: int = 0
    tried: str | None = None  # the CURRENT the last run was started for


@dataclass
class _Run:
    table: str
    proc: subprocess.Popen[bytes]
    started: float  # monotonic
    stopping_since: float | None = None  # time.monotonic() when it was told to stop (past TIMEOUT_S)
    # Its table was dropped by a reload: its end records nothing, even should a later reload add the table again
    # before the process is collected (the new table's decodes start afresh).
    dropped: bool = False


class SnapshotDecodes:
    """Starts, watches and stops the decode processes. Every method runs on the loop thread, except ``close``
    (the daemon's main thread, once the loop has ended)."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock  # the throttle's clock: monotonic (a test passes its own)
        self.interval = config.snapshots.decode_interval_ms / 1000
        # Each typed table's decode throttle and problem: this part's state, not which tables exist (the engine's
        # TableSet), made on TableAdded and forgotten on TableDropped.
        self._tables = {t.name: _Table() for t in config.tables if is_typed(t)}
        self._run: _Run | None = None
        self._holder = _holder()
        # The config file in force: (path, sha256), the reload's (``service.reload``); by default the start's.
        self.in_force: Callable[[], tuple[str | None, str | None]] = lambda: (
            str(self.config.source) if self.config.source is not None else None, None)
        if self._tables and self.interval > 0 and config.source is None:
            log.info("typed tables are not decoded by the daemon: its config was not loaded from a file, which the "
                     "decode process must read; readers decode the snapshots themselves")

    @property
    def enabled(self) -> bool:
        return bool(self._tables) and self.interval > 0 and self.config.source is not None

    # -- loop thread -------------------------------------------------------------------------------------------

    def reconfigure(self, config: Config) -> None:
        """A reload's config in force (the config file the decode process reads)."""
        self.config = config

    def on_event(self, event: Event) -> None:
        """A reload's tables (the module docstring): a typed table added is decoded from then on, a dropped one no
        more; a dropped table's decode in flight is told to stop (collected, never waited for, by ``tick``)."""
        match event:
            case TableAdded(config=tc) if is_typed(tc):
                self._tables.setdefault(tc.name, _Table())
            case TableDropped(table=name) if name in self._tables:
                del self._tables[name]
                run = self._run
                if run is not None and run.table == name and not run.dropped:
                    run.dropped = True
                    if run.stopping_since is None:
                        run.stopping_since = time.monotonic()
                        _terminate(run.proc)

    def tick(self, doc: DaemonStatus | None) -> None:
        """Collect a finished decode; else start one if a table's CURRENT (as ``doc`` says) awaits it."""
        now = self._clock()
        if self._run is not None:  # watched even when no typed table is left: a reload dropped the last one
            self._watch(self._run, now)
            return
        if not self.enabled:
            return
        if doc is None or any(t.state == State.RESTORING.value for t in doc.tables.values()):
            return  # a restore is the daemon's busiest time: readers decode for themselves meanwhile
        due = []
        for name, tab in self._tables.items():
            t = doc.tables.get(name)
            current = t.snapshot.current if t is not None and t.snapshot is not None else None
            redo = current != tab.status.snapshot or tab.status.pending > 0
            if current is not None and redo and now >= tab.next_at:
                due.append((tab.next_at, name, current))
        if due:
            _, name, current = min(due)  # the table that has waited longest
            self._start(name, current, now)

    def status(self, table: str) -> DecodeStatus | None:
        tab = self._tables.get(table)
        if tab is None:
            return None
        run = self._run
        running = run.proc.pid if run is not None and run.table == table and not run.dropped else None
        return replace(tab.status, running_pid=running)

    def observe(self, doc: DaemonStatus) -> DaemonStatus:
        """``doc`` with each typed table's decode status (none while the daemon does not decode)."""
        if not self.enabled:
            return doc
        tables = {name: replace(t, decode=self.status(name), last_error=t.last_error or self._tables[name].problem)
                  if name in self._tables else t for name, t in doc.tables.items()}
        return replace(doc, tables=tables)

    def _start(self, table: str, current: str, now: float) -> None:
        path, sha256 = self.in_force()
        assert path is not None
        argv = [sys.executable, "-m", decode_snapshot.__name__, "--config", path, "--table", table,
                "--holder", self._holder_of(table), "--lease-s", str(LEASE_S), "--parent", str(os.getpid()),
                *(["--sha256", sha256] if sha256 is not None else [])]
        tab = self._tables[table]
        tab.tried = current
        try:
            # Its own session: a terminal's Ctrl-C reaches the daemon, which stops it; stderr is the daemon's log.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, close_fds=True,
                                    start_new_session=True)
        except OSError as e:
            self._failed(table, now, now, f"cannot start the decode process: {e}")
            return
        self._run = _Run(table, proc, now)
        log.debug("table %s: decoding snapshot %s in process %d", table, current, proc.pid)

    def _watch(self, run: _Run, now: float) -> None:
        rc = run.proc.poll()
        if rc is None:
            # Past its limit: told to stop, then killed (the grace in real seconds, whatever the throttle's clock
            # says); never waited for here, on the loop thread.
            if run.stopping_since is None and now - run.started > TIMEOUT_S:
                run.stopping_since = time.monotonic()
                _terminate(run.proc)
            elif run.stopping_since is not None and time.monotonic() - run.stopping_since > STOP_GRACE_S:
                run.proc.kill()
            return
        self._run = None
        lines = _lines(run.proc)
        if run.dropped or run.table not in self._tables:  # dropped by a reload meanwhile: nothing to record
            self._cleanup(run, lines)
            return
        done = next((d for d in lines if d.get("event") == "done"), None)
        if rc != 0 or done is None:
            self._cleanup(run, lines)
            why = f"stopped after {TIMEOUT_S:.0f}s without finishing (exit {rc})" if run.stopping_since is not None \
                else f"the decode process exited with {rc} (see the log above)"
            self._failed(run.table, run.started, now, why)
            return
        tab = self._tables[run.table]
        tab.failed_in_row = 0
        tab.next_at = now + max(self.interval, now - run.started)
        s = tab.status
        offsets = {int(p): int(o) for p, o in (done.get("offsets") or {}).items()}
        tab.status = DecodeStatus(
            snapshot=str(done["snapshot"]), offsets=offsets, created=_number(done.get("created")),
            values=int(done.get("values") or 0), errors=int(done.get("errors") or 0),
            pending=int(done.get("pending") or 0),
            key_errors=int(done.get("key_errors") or 0),
            decode_seconds=_number(done.get("decode_seconds")), written=bool(done.get("written")),
            too_large=bool(done.get("too_large")), runs=s.runs + 1, failures=s.failures)
        if tab.status.pending != s.pending and tab.status.pending:
            log.warning("table %s: %d value(s) of snapshot %s wait for writer schemas not yet fetched from the "
                        "registry; decoded again once it answers", run.table, tab.status.pending, tab.status.snapshot)
        elif s.pending and not tab.status.pending:
            log.info("table %s: every pending value of snapshot %s is decoded now", run.table, tab.status.snapshot)
        self._judge(run.table, tab, done.get("first_error"))
        if tab.status.written:  # the decode process logged its figures already; this adds the whole run's time
            log.debug("table %s: snapshot %s decoded into its columnar file: %d values, %d decode errors, %.1fs",
                     run.table, tab.status.snapshot, tab.status.values, tab.status.errors, now - run.started)

    def _judge(self, table: str, tab: _Table, reason: Any) -> None:
        """A snapshot whose values all fail to decode is a WARNING and the table's status problem (its reader and
        writer schemas disagree, or its producers write another format, or, when every failure is a pending one, the
        registry is unreachable); logged when it begins and when it ends."""
        s = tab.status
        problem = None
        if s.values and s.errors == s.values and s.pending == s.errors:  # not the table's fault: an outage
            problem = (f"every value of snapshot {s.snapshot} waits for its writer schema ({s.pending:,} of "
                       f"{s.values:,}): the schema registry is unreachable, e.g.: {reason}; the values will decode "
                       "when it answers, on this snapshot, without a restart")
        elif s.values and s.errors == s.values:
            problem = (f"every value of snapshot {s.snapshot} fails to decode ({s.errors:,} of {s.values:,}), e.g.: "
                       f"{reason}; check [tables.value] and its schema files against what the producers write")
        if problem is not None and tab.problem is None:  # status keeps saying it: the log says when it began
            log.warning("table %s: %s", table, problem)
        elif problem is None and tab.problem is not None:
            log.info("table %s: snapshot %s decodes again (%d of %d values fail)", table, s.snapshot, s.errors,
                     s.values)
        tab.problem = problem

    def _failed(self, table: str, started: float, now: float, why: str) -> None:
        tab = self._tables[table]
        tab.failed_in_row += 1
        backoff = min(2 ** (tab.failed_in_row - 1), MAX_BACKOFF)
        tab.next_at = now + max(self.interval, now - started) * backoff
        tab.status = replace(tab.status, failures=tab.status.failures + 1, last_error=why)
        swallowed.record("snapshot_decode", DecodeFailed(why), log, "table %s: decoding snapshot %s failed: %s; "
                         "readers decode it themselves, the daemon tries again in %.0fs", table, tab.tried, why,
                         tab.next_at - now)

    # -- shutdown (main thread, after the loop) ----------------------------------------------------------------

    def close(self, joins: Deadline | None = None) -> None:
        """Stop a decode in flight: no process and no half-written file outlives the daemon. SIGTERM, answered by
        the process cleaning up after itself; SIGKILL once ``STOP_GRACE_S`` (what is left of ``joins``, a stop's
        shared bound) has passed, and then its leftovers are removed here: at nice 19 on a busy host it may not run
        for seconds, and the stop does not wait for that."""
        run, self._run = self._run, None
        if run is None:
            return
        self._stop(run, (joins or Deadline(STOP_GRACE_S)).left(STOP_GRACE_S))  # not a failure: decoded again next
        rc = run.proc.returncode
        log.info("table %s: decode of snapshot %s stopped with the daemon (exit %s)", run.table,
                 self._tables[run.table].tried, rc if rc is not None else "-9, not yet reaped")

    def _holder_of(self, table: str) -> str:
        return f"{self._holder}-{_label(table)}"

    def _stop(self, run: _Run, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (the daemon's main thread, once the loop has ended). A killed
        process runs none of its own code once ``kill`` returns, so its leftovers are removed at once; it is reaped
        if it is gone within ``KILLED_REAP_S`` (else by init, once the daemon has exited)."""
        proc = run.proc
        if proc.poll() is None:
            _terminate(proc)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(KILLED_REAP_S)
        self._cleanup(run, _lines(proc))

    def _cleanup(self, run: _Run, lines: list[dict[str, Any]]) -> None:
        """After a process that did not end well, what it may have had no chance to remove (SIGKILL, or SIGTERM
        in the middle of its own clean-up): replace_file's temporary and its lease. Its lease is its own: one
        process at a time per holder name."""
        if run.proc.returncode == 0:
            return
        # ValueError: a holder name the lease module refuses, which the process could not have taken either.
        with contextlib.suppress(OSError, ValueError):
            leases.release(snapshots_dir(self.config.state_dir, run.table), self._holder_of(run.table))
        opened = next((d for d in lines if d.get("event") == "open"), None)
        if opened is not None:
            _remove_temporary(Path(str(opened.get("dir"))))


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGCONT: a stopped process acts on SIGTERM only once continued."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
        os.kill(proc.pid, signal.SIGCONT)


def _holder() -> str:
    """This daemon's lease holder prefix, in the holder alphabet (globald.snapshot.leases.HOLDER_RE)."""
    host = "".join(c if c.isalnum() or c in "_.-" else "_" for c in socket.gethostname()).lstrip(".-")[:64]
    return f"{host or 'host'}-{os.getpid()}-decode"


def _label(table: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in table)[:48]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _lines(proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    """The JSON lines a finished (or SIGKILLed) decode process wrote (a few hundred bytes: the pipe never fills),
    read without waiting: a killed process not yet gone writes nothing more, and its pipe is not closed yet."""
    out: IO[bytes] | None = proc.stdout
    if out is None:
        return []
    with contextlib.suppress(OSError, ValueError):
        os.set_blocking(out.fileno(), False)
        raw = out.read() or b""
        out.close()
        docs = []
        for line in raw.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    docs.append(doc)
        return docs
    return []


def _remove_temporary(directory: Path) -> None:
    """The columnar file's temporary of a killed decode, if the host lock says no reader is writing one now."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # retention took the snapshot meanwhile: nothing left to clean
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the lock ensure_columnar writes under
        for entry in os.scandir(directory):
            if entry.name.startswith(COLUMNAR_TMP) and entry.name.endswith(TMP_SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    except OSError:  # a reader holds the lock and writes its own file: its temporary is not ours to remove
        pass
    finally:
        os.close(fd)
