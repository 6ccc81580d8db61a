"""Live reconfiguration: ``globald reload``, SIGHUP and systemd's ``ExecReload=`` all end here.

One thing for all three: read the config file again, check it as ``globald check-config`` does, compute what
differs from the config in force (``settings.changes``) and apply it all or nothing.

- **Which file.** ``globald reload --config F`` names F in its request (an absolute path, symlinks left as given);
  SIGHUP reads the path the daemon was started with. The path is opened again each time, so an edit in place and
  an atomic symlink swap (a Kubernetes ConfigMap) are both seen.
- **Where.** The reading and checking run on a thread of their own (``globald-reload``): check-config runs as a
  child process (``python -m globald check-config --registry-outage-ok``, the very command: a registry in
  trouble is logged, not a refusal, as ``run`` starts through one; a subject it says does not exist is), and a
  registry subject's reader schema is taken again there. The loop thread only applies a checked config between two
  turns (``tick``), in two phases (``service.two_phase``): what can fail is prepared by every part first (a new
  consumer when [kafka] changed, a new listener, an added table's folder), then taken. A signal's relay thread
  only queues.
- **Refused** (a file that fails the check, a key that needs a restart, a file that changed while it was
  checked): one line, logged, shown in status ``config.last_reload`` and answered to ``globald reload`` (exit 2);
  the config in force is not touched.
- **Watched** (``reload_on_change_ms``, off by default): the reload thread also reads the file in force (the one
  the config in force was read from: the start's, or the last reload's) that often and
  reloads it when its bytes differ from those in force; bytes refused once are not tried again until they change.
- **Applied**: ``config.generation`` + 1 and ``config.sha256`` of the bytes applied; each reload applied counts,
  one that changed nothing too (the operator sees it was taken).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import globald
from globald.common import logs
from globald.common.errors import ConfigError
from globald.common.requests import RELOAD, OperatorRequest
from globald.common.waits import Deadline
from globald.settings import config as configmod
from globald.settings.changes import Change, Delta, changes, refusal
from globald.settings.config import Config
from globald.settings.kafka_properties import secret_values
from globald.settings.ref import ConfigRef
from globald.status.document import ConfigStatus

log = logging.getLogger(__name__)

# check-config reaches the registry and reads every schema; a check not done by then is a refusal, not a hang.
CHECK_TIMEOUT_S = 300.0
CLOSE_WAIT_S = 5.0  # a stop's wait for the reload thread when no shared bound is given
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KiB; anything near this is not one


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class ReloadRequest(OperatorRequest):
    """One reload asked for, settled once the loop applied it or it was refused: an operator's request about the
    whole daemon (no table), answered with the generation and sha256 in force."""

    action = RELOAD
    stopped = "the daemon stopped before it applied the config; the old one was in force until the stop"

    def __init__(self, path: Path | None, origin: str) -> None:
        super().__init__("", origin)
        self.path = path  # None: the path the daemon was started with
        self.origin = origin


@dataclass
class _Ready:
    """A request checked on the reload thread, for the loop to apply (``delta`` None: refused, ``error`` says)."""

    request: ReloadRequest
    path: Path
    delta: Delta | None = None
    sha256: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    later: list[Callable[[], None]] = field(default_factory=list)  # the apply's cleanups, run on the reload thread


class Reloader:
    """See the module docstring. ``request`` from any thread; ``tick`` on the loop thread."""

    def __init__(self, config: ConfigRef, path: Path | None,
                 apply: Callable[[Delta], list[Callable[[], None]]],
                 publish: Callable[[], None]) -> None:
        """``apply`` sets ``config`` to a reload's config once applied (``Daemon._reconfigure``), or raises having
        changed nothing (a part's ``prepare`` refused it)."""
        self._config = config
        self.path = path  # as given at start, never resolved: a symlink swap is followed at each reload
        self._apply = apply
        self._publish = publish
        sha = file_sha256(path) if path is not None else None
        # The generation shown is the ConfigRef's, the one every part reads: no second count to drift from it
        self.status = ConfigStatus(config.generation, sha, str(path) if path is not None else None)
        self._queue: queue.SimpleQueue[ReloadRequest | None] = queue.SimpleQueue()
        self._ready: _Ready | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._asked_sha: str | None = None  # bytes the file watch already asked a reload for
        self._current: ReloadRequest | None = None  # the request the reload thread took last
        self._checker = _Checker(self._stopping)

    @property
    def config(self) -> Config:
        """The config in force (read on the reload thread, set on the loop thread: ``ConfigRef`` is thread-safe)."""
        return self._config.now

    # -- any thread -------------------------------------------------------------------------------------------

    def request(self, path: Path | None, origin: str) -> ReloadRequest:
        """Queue a reload of ``path`` (None: the path the daemon was started with). Never blocks: a signal's relay
        thread calls it."""
        r = ReloadRequest(path, origin)
        self._queue.put(r)
        return r

    def from_operator(self, doc: dict[str, Any]) -> ReloadRequest:
        """A ``globald reload`` request file (``ops.operator_requests``): its ``config`` path, absolute."""
        raw = doc.get("config")
        who = doc.get("requested_by")
        origin = f"globald reload (uid {who.get('uid')}, pid {who.get('pid')})" if isinstance(who, dict) \
            else "globald reload"
        if not isinstance(raw, str) or not Path(raw).is_absolute():
            r = ReloadRequest(None, origin)
            r.settle("the reload request names no absolute config path")
            return r
        return self.request(Path(raw), origin)

    # -- lifecycle (main thread) ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="globald-reload", daemon=True)
        self._thread.start()

    def close(self, joins: Deadline | None = None) -> None:
        """After the loop ended: a reload still being checked or waiting for the loop is answered as not applied.
        A check in flight is not waited for beyond ``joins`` (its check-config child is killed; a registry that
        does not answer the thread's own request for a subject holds only that thread, left behind)."""
        self._stopping.set()
        self._queue.put(None)
        ready = self._ready
        if ready is not None:
            ready.done.set()
        self._checker.kill()
        if self._thread is not None:
            self._thread.join(timeout=(joins or Deadline(CLOSE_WAIT_S)).left(CLOSE_WAIT_S))
        current = self._current
        if current is not None and not current.settled:
            current.settle(current.stopped)

    # -- the reload thread ------------------------------------------------------------------------------------

    def _next(self) -> ReloadRequest | None:
        """The next reload to run: one asked for, or (``reload_on_change_ms``) one the file's new bytes ask for.
        A file whose bytes were refused once is not reloaded again until they change."""
        while True:
            every = self.config.reload_on_change_ms / 1000
            watched = Path(self.status.path) if self.status.path is not None else None  # the file in force
            try:
                return self._queue.get(timeout=every if every > 0 and watched is not None else None)
            except queue.Empty:
                pass
            assert watched is not None
            sha = file_sha256(watched)
            if sha is not None and sha not in (self.status.sha256, self._asked_sha):
                self._asked_sha = sha  # asked once: refused bytes are not tried again at every check
                log.info("config file %s changed; reloading it (reload_on_change_ms)", watched)
                return ReloadRequest(watched, "the file changed")

    def _run(self) -> None:
        while (r := self._next()) is not None:
            self._current = r
            path = r.path or self.path
            if self._stopping.is_set() or path is None:
                r.settle("the daemon is stopping" if path is not None else "the daemon was not started from a file")
                continue
            try:
                ready = self._check(r, path)
            except Exception as e:  # a bug here must not leave the asker waiting: refused, the old config stays
                log.exception("reload of %s failed", path)
                ready = _Ready(r, path, error=f"the reload failed: {type(e).__name__}: {e}")
            if ready.error is None:
                log.info("reload of %s (%s) checked; applied at the loop's next turn", path, r.origin)
            self._ready = ready  # the loop's next turn takes it
            while not ready.done.wait(0.5) and not self._stopping.is_set():
                pass  # a stop that came meanwhile: the loop will not take it
            if self._stopping.is_set() and not r.settled:
                r.settle(r.stopped)
            for cleanup in ready.later:  # a replaced hook runner's close, listener's stop: off the loop thread
                try:
                    cleanup()
                except Exception:
                    log.exception("reload: a cleanup of the replaced config failed; ignored")

    def _check(self, r: ReloadRequest, path: Path) -> _Ready:
        """Read, check and compare ``path`` against the config in force; never touches what is running."""
        try:
            before = _read(path)
        except ConfigError as e:
            return _Ready(r, path, error=f"config error: {e}")
        line = self._checker.check(path)
        if line is not None:
            return _Ready(r, path, error=line)
        try:
            data = _read(path)
            if data != before:
                return _Ready(r, path, error=f"{path} changed while it was being checked; nothing was applied, "
                                             "reload again")
            new = configmod.parse(tomllib.loads(data.decode("utf-8")), path.resolve())
        except (ConfigError, ValueError) as e:  # the check passed on bytes that parse: only a swap gets here
            return _Ready(r, path, error=f"config error: {e}")
        found = changes(self.config, new)
        why = refusal(found)
        if why is not None:
            return _Ready(r, path, error=why)
        if any(f is not None and f.subject is not None for t in new.tables for f in (t.value, t.key)):
            found += self._take_reader_schemas(new, found)
        return _Ready(r, path, Delta.of(new, found), hashlib.sha256(data).hexdigest())

    def _take_reader_schemas(self, new: Config, found: list[Change]) -> list[Change]:
        """Take every subject's reader schema again; a table whose pin moved though its declaration did not (the
        subject's latest version is another) is redeclared as one changed in place: the publisher makes a new
        version at once, which the daemon decodes with the new reader schema, rather than keep serving the last
        file decoded with the old one until a record arrives."""
        from globald.typed.registry import reader_pins, take_reader_schemas

        before = reader_pins(new)
        for taken, what in take_reader_schemas(new):
            (log.info if taken else log.warning)("reload: reader schema: %s", what)
        moved = {table for (table, section), pin in reader_pins(new).items() if pin != before[(table, section)]}
        changed = {c.key for c in found}
        olds = {t.name: t for t in self.config.tables}
        return [Change(f"tables.{t.name}", olds[t.name], t) for t in new.tables
                if t.name in moved and t.name in olds and f"tables.{t.name}" not in changed]

    # -- loop thread ------------------------------------------------------------------------------------------

    def tick(self) -> None:
        ready = self._ready
        if ready is None:
            return
        self._ready = None
        try:
            self._conclude(ready)
        finally:
            ready.done.set()

    def _conclude(self, ready: _Ready) -> None:
        r, error = ready.request, ready.error
        if ready.delta is not None:
            try:
                ready.later = self._apply(ready.delta)
            except ConfigError as e:  # a new HTTP address that cannot be bound: every part aborted
                error = f"config error: {e}"
            except Exception as e:  # a prepare failed (the consumer, a folder): every part aborted, nothing applied
                error = f"the new config could not be applied: {type(e).__name__}: {e}; the old one stays in force"
        when = time.time()
        if error is None:
            assert ready.delta is not None
            logs.reconfigure(self.config.log_level, secret_values(self.config))
            self.status = ConfigStatus(self._config.generation, ready.sha256, str(ready.path),  # set by the apply
                                       {"time": when, "result": "applied", "error": None})
            log.info("reload of %s (%s) applied: config generation %d; %s", ready.path, r.origin,
                     self.status.generation, ready.delta.keys)
        else:
            self.status = ConfigStatus(self.status.generation, self.status.sha256, self.status.path,
                                       {"time": when, "result": "refused", "error": error})
            log.error("reload of %s (%s) refused, the config in force is unchanged: %s", ready.path, r.origin, error)
        self._publish()  # status shows the outcome before the asker hears it
        r.settle(error, generation=self.status.generation, sha256=self.status.sha256)


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:  # opened anew: a symlink swapped since is followed
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError("--config", f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("--config", f"{path} is larger than {MAX_CONFIG_BYTES} bytes: not a globald config")
    return data


class _Checker:
    """``globald check-config --config path``, the command itself, in a child process (the reload thread's), which
    a stop kills rather than waits for: a check reaches the registry and may wait on it."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def check(self, path: Path) -> str | None:
        """None when it passed, else its one line (``config error: key: what``)."""
        # The product's entry point (globald/__main__.py), the command an operator types: no module path of the
        # command line, which sits above the daemon, is spelled here.
        # A registry in trouble does not refuse a reload: the start goes through it too, and a file refused once is
        # not tried again by the watcher until its bytes change (a change made during an outage would never be
        # applied).
        argv = [sys.executable, "-m", globald.__name__, "check-config", "--config", str(path), "--registry-outage-ok"]
        with self._lock:
            if self._stopping.is_set():
                return "the daemon is stopping"
            proc = self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = proc.communicate(timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return f"check-config did not finish within {CHECK_TIMEOUT_S:.0f}s (a registry that does not answer?)"
        finally:
            with self._lock:
                self._proc = None
        if self._stopping.is_set() and proc.returncode < 0:
            return "the daemon is stopping"
        if proc.returncode == 0:
            for warning in (x for x in stderr.splitlines() if x.startswith("globald: warning: ")):
                log.warning("reload of %s: %s", path, warning.removeprefix("globald: warning: "))
            return None
        line = (stderr.strip().splitlines() or [f"check-config exited {proc.returncode}"])[-1]
        return line.removeprefix("globald: ")

    def kill(self) -> None:
        """A stop: the check in flight, if any, is killed (the reload it checks is not applied)."""
        with self._lock:
            if self._proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()


def _check_config(path: Path) -> str | None:
    """One check-config of ``path``, outside any daemon (``_Checker.check``)."""
    return _Checker(threading.Event()).check(path)
