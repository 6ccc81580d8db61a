"""The suite fails when a JVM outlives what started it (issue 40: two ~650 MB Spark JVMs had parent PID 1 in the middle
of ``make test``). A pytest plugin, loaded by ``tests/conftest.py``.

Which JVMs are this run's: each pytest process (each xdist worker too) puts a fresh marker of its own in its
environment, ``GLOBALD_TEST_RUN=<uuid>``, which every process it starts inherits, however deep and even once
reparented to PID 1 (a daemonised Spark Connect server, a JVM whose parent died). A JVM is this run's when its
``/proc/<pid>/environ`` carries the marker, or when it descends from this process. Only those are ever looked at,
reported or killed: other engineers' pytest runs share the machine, with their own markers.

Who owns a JVM: one that appears while a module-, class-, package- or session-scoped fixture is being set up belongs
to that fixture and must be gone once the fixture is torn down (a module's Spark session at the module's end, the
session broker at the session's end); any other that appears during a test (its call, its function-scoped fixtures)
must be gone when its teardown ends. One still alive then (after ``EXIT_WAIT_S``, for a JVM told to stop that is
still exiting) is a leak: the teardown of that test fails, naming the JVM, its command line and its owner, and the
JVM is killed by its PID so that it does not weigh on the rest of the run.
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

MARKER_ENV = "GLOBALD_TEST_RUN"
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
        base = _PROC / str(self.pid)
        try:
            cmd = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = (base / "environ").read_bytes().split(b"\0")
        except OSError:
            cmd, env = "(gone)", []
        if len(cmd) > 400:  # a JVM's class path comes first, its main class and arguments last
            cmd = f"{cmd[:120]} ... {cmd[-280:]}"
        started = next((e.split(b"=", 1)[1].decode(errors="replace") for e in env
                        if e.startswith(b"PYTEST_CURRENT_TEST=")), "?")
        return f"pid {self.pid} (parent {_ppid(self.pid)}), started during {started}: {cmd}"


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


def _carries(pid: int, marker: bytes) -> bool:
    try:
        return marker in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:  # another user's process, or gone
        return False


def run_jvms(marker: str, names: frozenset[str] = JVM_NAMES) -> set[Jvm]:
    """The live JVMs of the run marked ``marker``: carrying it in their environment, or descending from here."""
    stats = {pid: st for pid, st in ((int(p.name), _stat(int(p.name))) for p in _PROC.iterdir() if p.name.isdigit())
             if st is not None and st.state != "Z"}
    want = f"{MARKER_ENV}={marker}".encode()
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

    def _new(self) -> set[Jvm]:
        new = run_jvms(self.marker, self.names) - self.known
        self.known |= new
        return new

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
        if fixturedef.scope == "function":  # what a function-scoped fixture starts is the test's: checked after it
            return (yield)
        self._new()  # started before (by the test, say) are not this fixture's
        try:
            return (yield)
        finally:
            self.owned.append(_Owned(fixturedef, fixturedef.cached_result, self._new()))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        self._new()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        try:
            return (yield)
        finally:
            leaks = self._leaks(item)
            if leaks:
                kill({j for j, _ in leaks})
                raise LeakedJvm("JVMs outlived what started them (killed now):\n" + "\n".join(
                    f"  {owner}: {text}" for _, (owner, text) in leaks))

    def _leaks(self, item: pytest.Item) -> list[tuple[Jvm, tuple[str, str]]]:
        suspects: dict[Jvm, str] = {j: f"test {item.nodeid}" for j in self._new()}
        for o in list(self.owned):
            if o.fixturedef.cached_result is not o.cached:  # torn down since
                self.owned.remove(o)
                suspects |= {j: f"{o.fixturedef.scope}-scoped fixture {o.fixturedef.argname!r}" for j in o.jvms}
        alive = outliving(set(suspects), self.wait_s)
        return [(j, (suspects[j], j.describe())) for j in sorted(alive, key=lambda j: j.pid)]


def pytest_configure(config: pytest.Config) -> None:
    # A fresh marker in each pytest process, an xdist worker's too (it inherits the controller's: replaced here).
    marker = uuid.uuid4().hex
    os.environ[MARKER_ENV] = marker
    config.pluginmanager.register(JvmWatch(marker, wait_s=EXIT_WAIT_S), "globald-jvm-watch")
