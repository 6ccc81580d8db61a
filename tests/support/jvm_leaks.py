"""The suite fails when a JVM outlives what started it (issue 40: two ~650 MB Spark JVMs had parent PID 1 in the middle
of ``make test``). A pytest plugin, loaded by ``tests/conftest.py``.

Which JVMs are this run's: each pytest process (each xdist worker too) puts a fresh marker of its own in its
environment, ``PYTEST_RUN_MARK=<uuid>``, which every process it starts inherits, however deep and even once
reparented to PID 1 (a daemonised Spark Connect server, a JVM whose parent died). A JVM is this run's when its
``/proc/<pid>/environ`` carries the marker, or when it descends from this process. Only those are ever looked at,
reported or killed: other engineers' pytest runs share the machine, with their own markers.

Who owns a JVM, and when it must be gone (after up to ``EXIT_WAIT_S`` for one told to stop that is still exiting):

- one that appears while a module-, class-, package- or session-scoped fixture is set up is that fixture's: gone
  once the fixture is torn down (a module's Spark session at the module's end, the session broker at the session's);
- one started by a test (its call, its function-scoped fixtures): gone at the end of its module, when the module's
  fixtures are torn down too, since a module fixture may hold what its tests start (a broker a test restarts);
- one tagged ``PYTEST_JVM_SCOPE=session`` in its environment (the session broker's topic server, started by
  whichever test first creates a topic): gone at the end of the session, like everything else of the run.

One still alive then is a leak: that teardown fails, naming the JVM, the test pytest was in when it started, its
command line and its owner, and the JVM is killed by its PID so that it does not weigh on the rest of the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MARKER_ENV = "PYTEST_RUN_MARK"  # not GLOBALD_*: tests compare the GLOBALD_* environment a hook gets
# In a JVM's environment, ``session``: it is held for the whole run by something started lazily by whichever test
# first needs it (the session broker's topic server), so it is checked at the session's end only.
SCOPE_ENV = "PYTEST_JVM_SCOPE"
EXIT_WAIT_S = 30.0  # a JVM told to stop may take seconds to exit on a loaded 2-core machine
JVM_NAMES = frozenset({"java"})  # /proc/<pid>/comm of a JVM (the launcher's name: spark-submit execs java)
_PROC = Path("/proc")


@dataclass(frozen=True)
class Jvm:
    """A process by PID and start time (a PID alone may be reused once the process is gone)."""

    pid: int
    start: int

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start

    def describe(self) -> str:
        """PID, parent, the test pytest was in when it started (its PYTEST_CURRENT_TEST) and its command line."""
        try:
            cmd = (_PROC / str(self.pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "(gone)"
        if len(cmd) > 400:  # a JVM's class path comes first, its main class and arguments last
            cmd = f"{cmd[:120]} ... {cmd[-280:]}"
        started = _environ(self.pid).get(b"PYTEST_CURRENT_TEST", b"?").decode(errors="replace")
        return f"pid {self.pid} (parent {_ppid(self.pid)}), started during {started}: {cmd.strip()}"


@dataclass(frozen=True)
class _Stat:
    name: str
    state: str
    ppid: int
    start: int


def _stat(pid: int) -> _Stat | None:
    """/proc/<pid>/stat's fields this needs (proc(5)); None once gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces and parentheses
    return _Stat(text[text.index("(") + 1:text.rindex(")")], fields[0], int(fields[1]), int(fields[19]))


def _start_time(pid: int) -> int | None:
    """None once gone, a zombie included (killed, not yet reaped by its parent: it holds no memory)."""
    st = _stat(pid)
    return st.start if st is not None and st.state != "Z" else None


def _ppid(pid: int) -> int | None:
    st = _stat(pid)
    return st.ppid if st is not None else None


def _environ(pid: int) -> dict[bytes, bytes]:
    """The environment ``pid`` started with; empty for another user's process, or one gone."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    return dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)


def _carries(pid: int, marker: bytes) -> bool:
    return _environ(pid).get(MARKER_ENV.encode()) == marker


def run_jvms(marker: str, names: frozenset[str] = JVM_NAMES) -> set[Jvm]:
    """The live JVMs of the run marked ``marker``: carrying it in their environment, or descending from here."""
    stats = {pid: st for pid, st in ((int(p.name), _stat(int(p.name))) for p in _PROC.iterdir() if p.name.isdigit())
             if st is not None and st.state != "Z"}
    want = marker.encode()
    me = os.getpid()

    def descends(pid: int) -> bool:
        seen: set[int] = set()
        while pid in stats and pid not in seen:  # up the parents: a cycle cannot be, a vanished parent can
            seen.add(pid)
            pid = stats[pid].ppid
            if pid == me:
                return True
        return False

    return {Jvm(pid, st.start) for pid, st in stats.items()
            if st.name in names and (descends(pid) or _carries(pid, want))}


def outliving(jvms: set[Jvm], wait_s: float) -> set[Jvm]:
    """Those of ``jvms`` still alive after up to ``wait_s`` seconds (returns as soon as none is)."""
    deadline = time.monotonic() + wait_s
    alive = {j for j in jvms if j.alive()}
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {j for j in alive if j.alive()}
    return alive


def kill(jvms: set[Jvm]) -> None:
    """SIGKILL each by its PID, only while that PID is still the same process."""
    for j in jvms:
        if j.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(j.pid, signal.SIGKILL)


def _session_held(j: Jvm) -> bool:
    return _environ(j.pid).get(SCOPE_ENV.encode()) == b"session"


class LeakedJvm(AssertionError):
    """A JVM this test run started outlived the fixture or test that started it. The message names it and its
    owner: make that owner stop it (and wait for it) in its teardown. It has been killed."""


@dataclass
class _Owned:
    fixturedef: Any  # pytest's FixtureDef
    cached: Any  # its cached_result when set up: another value once torn down (or set up again)
    jvms: set[Jvm]


@dataclass(eq=False)  # registered as a plugin: hashed by identity
class JvmWatch:
    """The plugin's state in one pytest process."""

    marker: str
    names: frozenset[str] = JVM_NAMES
    wait_s: float = EXIT_WAIT_S
    known: set[Jvm] = field(default_factory=set)  # every JVM of this run seen so far, owned or not
    owned: list[_Owned] = field(default_factory=list)
    module_started: set[Jvm] = field(default_factory=set)  # by a test of the current module
    session_held: set[Jvm] = field(default_factory=set)  # tagged SCOPE_ENV=session

    def _new(self) -> set[Jvm]:
        new = run_jvms(self.marker, self.names) - self.known
        self.known |= new
        return new

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
        if fixturedef.scope == "function":  # what a function-scoped fixture starts is the test's
            return (yield)
        self._note_started()  # started before (by the test, say) are not this fixture's
        try:
            return (yield)
        finally:
            mine = self._new()
            held = {j for j in mine if _session_held(j)}
            self.session_held |= held
            self.owned.append(_Owned(fixturedef, fixturedef.cached_result, mine - held))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        self._note_started()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        try:
            return (yield)
        finally:
            leaks = self._leaks(module_ends=nextitem is None or nextitem.path != item.path,
                                session_ends=nextitem is None)
            if leaks:
                kill(set(leaks))
                raise LeakedJvm("JVMs outlived what started them (killed now):\n" + "\n".join(
                    f"  {leaks[j]}" for j in sorted(leaks, key=lambda j: j.pid)))

    def _note_started(self) -> None:
        """JVMs started since the last look, outside a fixture's set-up: a test's (its call, its function-scoped
        fixtures), or the session's when tagged so."""
        for j in self._new():
            (self.session_held if _session_held(j) else self.module_started).add(j)

    def _leaks(self, module_ends: bool, session_ends: bool) -> dict[Jvm, str]:
        """The JVMs outliving their owner after this teardown (-> the owner), once given ``wait_s`` to exit."""
        self._note_started()
        suspects: dict[Jvm, str] = {}
        for o in list(self.owned):
            if o.fixturedef.cached_result is not o.cached:  # torn down since
                self.owned.remove(o)
                suspects |= {j: f"{o.fixturedef.scope}-scoped fixture {o.fixturedef.argname!r}" for j in o.jvms}
        if module_ends:
            suspects |= {j: "a test of this module" for j in self.module_started}
            self.module_started.clear()
        if session_ends:  # nothing of this run is to outlive it, whoever started it
            for j in self.session_held | run_jvms(self.marker, self.names):
                suspects.setdefault(j, "the session")  # an owner named above is the better lead
            self.session_held.clear()
        alive = outliving(set(suspects), self.wait_s)
        return {j: f"{suspects[j]}: {j.describe()}" for j in alive}


def pytest_configure(config: pytest.Config) -> None:
    # A fresh marker in each pytest process, an xdist worker's too (it inherits the controller's: replaced here).
    marker = uuid.uuid4().hex
    os.environ[MARKER_ENV] = marker
    config.pluginmanager.register(JvmWatch(marker, wait_s=EXIT_WAIT_S), "globald-jvm-watch")
