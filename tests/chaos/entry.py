"""The real daemon with the campaign's phase hooks: ``python -m tests.chaos.entry run --config FILE``.

Signals and fiu-ctrl reach the daemon from outside at random moments, which is enough for steady state. Other
phases last milliseconds (a commit, a snapshot publish, the end of a bulk load, the first store open), so the
campaign arms a hook instead: ``GLOBALD_CHAOS_ARM`` names a JSON file saying which phase, on which table, on the
how-many-th call. When an armed hook is reached, the process writes ``<arm>.fired-<id>`` and then either stops
itself (SIGSTOP: the campaign injects its fault from outside while the daemon stands at that point, then sends
SIGCONT or SIGKILL) or enables a libfiu failure point itself, so that the very next file call fails (fiu-ctrl
could never time that). A hook never raises into the daemon. Everything else is globald's own CLI, unchanged.

The hooks wrap globald functions by name, the first of a few candidates that exists; a phase with none is
reported on stderr at start (``CHAOS-HOOKS … missing: …``) and its faults end as not reached, never as injected.
A hook fires as its function is entered, or, for a phase in ``AFTER_RETURN``, once it has returned. Nothing of this
is in globald itself: a daemon started otherwise carries no hook, and no setting reaches one.

An arm with ``hold`` also keeps its phase from ending before the campaign has lived through the fault: the thread
that runs the phase waits at the phase's end (a restore's ``on_restore_end`` for the armed table; for the other
phases, the return of the hooked call that fired) until the campaign releases it (the directory
``<arm>.release-<id>``) or writes another arm or none, at most ``HOLD_MAX_S``. A phase that lasts milliseconds (a
110k-record restore ended 0.4 s after its hook) could otherwise end before the fault's window, and the fault land
in whatever came next. The held thread first makes the directory ``<arm>.held-<id>``. Holding only makes
directories and stats files: libfiu wraps neither, so a failure point armed for the daemon stays the daemon's.

An arm with ``clock`` (a freeze, in a daemon on the Python-level clock below) lets the phase go on only once that
clock has re-read its offset file since the daemon was resumed, and adds the offset then in force to the fired file
(``clock_offset_s``): a step written while the daemon stood frozen lands inside the phase, where the clock's
once-a-second cache would have carried the old offset past a phase of milliseconds.

The campaign's tools are for the daemon, not for the processes it starts (``check-config`` at a reload, typed
decodes): once the allocator's choice is made (it leaves a process that preloads something alone, so it must see
the preload), LD_PRELOAD and libfiu's variables leave the daemon's environment. A child under libfiu can hang at its
start: pyarrow's allocator, initialised inside ``dlopen``, and jemalloc's background thread, inside libfiu's
``malloc`` wrapper, each wait for the lock the other holds (seen on a reload's check-config with ``[export]``).
For the same reason ``IMPORT_PYARROW_ENV`` has the daemon import pyarrow first, while it has a single thread. That
is not enough by itself: libarrow's own jemalloc (built with ``background_thread:true``) starts its background
thread inside that ``dlopen``, and the thread's start and libarrow's mimalloc init then deadlock the same way (seed
197: the daemon hung before its first log line, the main thread in mimalloc's ``mmap`` waiting on libfiu's lock, the
new ``jemalloc_bg_thd`` inside libfiu's ``malloc`` waiting on the loader's lock). Under libfiu the daemon's pyarrow
therefore runs its jemalloc without the background thread (``JE_ARROW_MALLOC_CONF``); it purges on the
allocating threads instead.

``PROBE_SIGNAL`` asks whether a failure point armed ``once`` has fired: the campaign names it in ``<arm>.probe``
and the answer goes to ``<arm>.probe-<id>``. libfiu disables a onetime point when it fails a call, so a point still
enabled has not: ``fiu_fail`` on it says which (and spends it, which is harmless: the fault is being healed; or,
asked with ``keep``, the point is armed again once answered, so that the campaign can ask while it waits). Every
point the campaign arms is asked so before the request is read: a point still armed on ``open`` would otherwise
fail that very read, and be spent by the probe instead of answering it. The signal is a real-time one: globald's
``run`` takes SIGUSR2 for its stack dumps (faulthandler, installed after this entry's handler, which it replaced:
the probe then dumped stacks and never answered, and every once-armed fault nothing reported counted as unmet).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, SupportsIndex

from tests.chaos.unwrapped import SteppedClock, UnwrappedFile  # SteppedClock: also for tests/reliability

ARM_ENV = "GLOBALD_CHAOS_ARM"
PROBE_SIGNAL = signal.SIGRTMIN + 5  # not SIGUSR2, globald's stack dump (module docstring)
SLEEP_FIX_ENV = "GLOBALD_CHAOS_SLEEP_FIX"
CLOCK_ENV = "GLOBALD_CHAOS_CLOCK"  # a file holding the wall clock's offset in seconds, e.g. "+3600"
IMPORT_PYARROW_ENV = "GLOBALD_CHAOS_IMPORT_PYARROW"  # "1": the config has [export], whose storage is pyarrow's
ARROW_JEMALLOC_CONF_ENV = "JE_ARROW_MALLOC_CONF"  # the MALLOC_CONF of the jemalloc bundled in pyarrow's libarrow
TOOL_ENV = ("LD_PRELOAD", "FIU_CTRL_FIFO", "FIU_ENABLE")  # what the daemon's children are started without
FIU_ONETIME = 1
# How libfiu names the POSIX functions the daemon's own file I/O goes through (RocksDB's WAL and SST appends,
# syncs and renames, globald's .checkpoint, manifests, status.json). Under strace, RocksDB's buffered I/O calls
# write, fdatasync, fsync, ftruncate, rename, unlink and open, never pwrite (direct I/O only, which globald does
# not enable): a pwrite failure point would never fire. Socket calls are left alone: they are the broker's
# faults, injected at the broker. Here, not in tools.py (which imports this module), for ``probe_once``.
FIU_SITES = {
    "write": "posix/io/rw/write",
    "fsync": "posix/io/sync/fsync",
    "fdatasync": "posix/io/sync/fdatasync",
    "rename": "posix/io/dir/rename",
    "open": "posix/io/oc/open",
    "unlink": "posix/io/dir/unlink",
    "ftruncate": "posix/io/rw/ftruncate",
}
HOLD_MAX_S = 300.0  # a hold the campaign never released (it died) ends by itself

# The points of a bootstrap from the export storage: a file's download begins (the others before it may be whole,
# it and those after it are not on disk); the checked stage is about to be renamed into place; it just was.
BOOTSTRAP_DOWNLOAD, BOOTSTRAP_RENAME, BOOTSTRAP_RENAMED = "bootstrap download", "bootstrap rename", "bootstrap renamed"

# phase -> (module, class or "" for a module's function, method, predicate over the arm and the call's arguments)
Predicate = Callable[[dict[str, Any], tuple[Any, ...], dict[str, Any]], bool]


class Restores:
    """How far each table's current restore has come, from the restore callbacks every daemon delivers
    (on_restore_start, on_batch_restored, on_restore_end: the contract user listeners rely on)."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[int, list[int]]] = {}  # table -> partition -> [start, end, position]

    def observe(self, args: tuple[Any, ...]) -> None:
        method, table, partition, *rest = args[1:]
        parts = self.parts.setdefault(table, {})
        if method == "on_restore_start":
            if parts and all(pos >= end for _, end, pos in parts.values()):
                parts.clear()  # a new restore of this table (after a wipe, or a restart of the plan)
            parts[partition] = [rest[0], rest[1], rest[0]]
        elif method == "on_batch_restored" and partition in parts:
            parts[partition][2] = max(parts[partition][2], rest[0])
        elif method == "on_restore_end" and partition in parts:
            parts[partition][2] = parts[partition][1]

    def fraction(self, table: str) -> float:
        parts = self.parts.get(table, {}).values()
        total = sum(end - start for start, end, _ in parts)
        return 1.0 if total <= 0 else sum(min(pos, end) - start for start, end, pos in parts) / total


RESTORES = Restores()
# Durable commits (TableStore.sync outside a bulk load) that returned, per table: a restore hook armed with
# "after_commit" fires only once its table has one, so that a store is surely on disk where it stops.
SYNCED: dict[str, int] = {}


def _any(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _restore_at(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Listeners.restore_event(self, "on_batch_restored", table, …): the armed table is ``fraction`` restored."""
    method, table = args[1], args[2]
    return (method == "on_batch_restored" and arm.get("table") in (None, table)
            and RESTORES.fraction(table) >= float(arm.get("fraction", 0.0))
            and (not arm.get("after_commit") or SYNCED.get(table, 0) > 0))


def _bulk_end(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    store = args[0]
    return bool(store.bulk) and arm.get("table") in (None, store.table)


def _store_of(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return arm.get("table") in (None, args[0].table)


def _durable_commit(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """TableStore.sync: the WAL fsync that a commit (and the end of a restore) starts with; not in a bulk load,
    where it does nothing."""
    return not getattr(args[0], "bulk", False) and _store_of(arm, args, kwargs)


def _build_of(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    table = args[1] if len(args) > 1 else kwargs.get("table")
    return arm.get("table") in (None, getattr(table, "name", None))


def _fetch_of(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Bootstrap._fetch(self, file, dest, halt): one file of the armed table's export download begins."""
    return arm.get("table") in (None, args[0].table.name)


def _stage_rename(arm: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """durable.rename(src, dst) of a bootstrap's checked stage (``tables/.bootstrap-<table>``) to the table's store
    directory: at start (Bootstrap._move) and after a wipe (TableStore.replace_with) alike."""
    src, table = os.path.basename(os.fspath(args[0])), arm.get("table")
    return src.startswith(".bootstrap-") and table in (None, src[len(".bootstrap-"):])


# Per phase, the functions that mark it, best first: the engine is refactored often, and a hook falls back to the
# next candidate rather than going missing. Public store and listener methods come first where they exist.
HOOKS: dict[str, list[tuple[str, str, str, Predicate]]] = {
    "start": [("globald.engine.state_manager", "StateManager", "open_all", _any),
              ("globald.store.table_store", "TableStore", "open_or_wipe", _store_of)],
    "restore": [("globald.common.states", "Listeners", "restore_event", _restore_at)],
    "bulk-load end": [("globald.store.table_store", "TableStore", "end_bulk_load", _bulk_end)],
    "commit": [("globald.store.table_store", "TableStore", "sync", _durable_commit)],
    "snapshot publish": [("globald.store.table_store", "TableStore", "checkpoint", _store_of)],
    "exact build": [("globald.snapshot.builder", "Builder", "build", _build_of)],
    # A record read back to check a topic's identity (at a plan, a refresh or an exact build), on the cluster
    # worker's thread.
    "identity check": [("globald.kafka.identity", "RecordReader", "read", _any)],
    "stop": [("globald.engine.thread", "GlobalThread", "_shutdown", _any),
             ("globald.service.daemon", "Daemon", "_shutdown", _any)],
    # A bootstrap from the export storage (tests/reliability/test_power_loss_bootstrap.py; not in the campaign's
    # matrix). An empty class name wraps a module's function: callers reach it as ``durable.rename``.
    BOOTSTRAP_DOWNLOAD: [("globald.export.bootstrap", "Bootstrap", "_fetch", _fetch_of)],
    BOOTSTRAP_RENAME: [("globald.store.durable", "", "rename", _stage_rename)],
    BOOTSTRAP_RENAMED: [("globald.store.durable", "", "rename", _stage_rename)],
}
# Phases whose hook fires once the hooked call has returned (the point is just after it), not as it is entered.
AFTER_RETURN = {BOOTSTRAP_RENAMED}


class Arm:
    """The campaign's current arm file, re-read whenever it changes."""

    def __init__(self, path: str, clock: SteppedClock | None = None) -> None:
        self.path = path
        self._file = UnwrappedFile(path)
        self.clock = clock  # the Python-level clock, if the daemon runs on it: an arm with "clock" waits for it
        self._lock = threading.Lock()
        self._mtime: tuple[int, int] = (-1, -1)  # inode and mtime: each write is a new file (os.replace)
        self._arm: dict[str, Any] = {}
        self._seen = 0
        self._fired: set[int] = set()
        self._holding: dict[str, Any] = {}  # the fired arm whose phase is held at its end, until released

    def _current(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except OSError:
            return {}
        mtime = (st.st_ino, st.st_mtime_ns)
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._arm = json.loads(self._file.read())
            except (OSError, ValueError):  # a failure point may be armed on open/read right now: keep the last one
                return self._arm
            self._seen = 0
        return self._arm

    def reached(self, phase: str, predicate: Predicate, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Fire the armed action if this call is the armed one; whether it was."""
        with self._lock:
            arm = self._current()
            if arm.get("phase") != phase or arm.get("id") in self._fired or not predicate(arm, args, kwargs):
                return False
            self._seen += 1
            if self._seen < int(arm.get("nth", 1)):
                return False
            self._fired.add(arm["id"])
            if arm.get("hold"):
                self._holding = arm
        # The fired file first: a failure point armed on open or write would otherwise fail the record itself.
        self._record(arm)
        if arm.get("action") == "freeze":
            # Sent to this thread, not the process: a process-directed SIGSTOP may be taken by another thread, and
            # this one then runs on into its next system call (a rename, seen done at a "bootstrap rename" freeze)
            # before the group stop reaches it. This way it stops on the return from this very call.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            if arm.get("clock") and self.clock is not None:
                self._clock_in_force(arm, time.monotonic())
        elif arm.get("action") == "fiu":
            problem = self._enable(arm.get("fiu") or {})
            if problem:  # nothing was armed, so stderr still works
                sys.stderr.write(f"CHAOS-FIU not armed: {problem}\n")
        return True

    def ended(self, phase: str, fired: bool, args: tuple[Any, ...]) -> None:
        """A hooked call of ``phase`` returned (``fired``: it was the one that fired): hold here if this is the end
        of the held phase, until the campaign releases the arm."""
        with self._lock:
            held = self._holding
            if not held or held.get("phase") != phase:
                return
            if phase == "restore":  # the end of the armed table's restore, not the batch that fired
                if args[1] != "on_restore_end" or held.get("table") not in (None, args[2]):
                    return
            elif not fired:
                return
            self._holding = {}
            armed = self._mtime
        # Only mkdir and stat here, which libfiu does not wrap: a failure point armed for the daemon stays its own.
        with contextlib.suppress(OSError):
            os.mkdir(f"{self.path}.held-{held['id']}")
        deadline = time.monotonic() + HOLD_MAX_S
        pause = threading.Event()
        while time.monotonic() < deadline and not os.path.isdir(f"{self.path}.release-{held['id']}"):
            try:
                st = os.stat(self.path)
            except OSError:
                return
            if (st.st_ino, st.st_mtime_ns) != armed:  # disarmed or armed anew
                return
            pause.wait(0.05)  # not time.sleep: libfaketime turns it into an error (tools.py)

    def _clock_in_force(self, arm: dict[str, Any], resumed: float) -> None:
        """Resumed from a freeze armed with "clock" (module docstring). Only when asked: this writes a file, and a
        failure point armed from outside during the freeze is meant for the daemon."""
        assert self.clock is not None
        offset_ns = self.clock.in_force_after(resumed)
        self._record(arm, clock_offset_s=offset_ns / 1e9, clock_wait_s=round(time.monotonic() - resumed, 3))

    @staticmethod
    def _enable(spec: dict[str, Any]) -> str | None:
        """Enable the failure point ``spec`` in this process; None on success, else why not."""
        try:
            lib = ctypes.CDLL(None)  # libfiu is in the process already, loaded by fiu-run's preload library
            name, err = spec["name"].encode(), ctypes.c_void_p(int(spec["errno"]))
            if spec.get("mode") == "random":
                lib.fiu_enable_random.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint,
                                                  ctypes.c_float]
                rc = lib.fiu_enable_random(name, 1, err, 0, float(spec.get("probability", 0.1)))
            else:
                lib.fiu_enable.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
                rc = lib.fiu_enable(name, 1, err, FIU_ONETIME if spec.get("mode") == "once" else 0)
        except (AttributeError, OSError, KeyError, ValueError) as e:
            return f"libfiu unavailable: {e}"
        return None if rc == 0 else f"fiu_enable({spec}) returned {rc}"

    def _record(self, arm: dict[str, Any], **more: Any) -> None:
        doc = {"id": arm["id"], "phase": arm.get("phase"), "action": arm.get("action"), "time": time.time(), **more}
        try:
            with open(f"{self.path}.fired-{arm['id']}", "w") as f:
                f.write(json.dumps(doc))
        except OSError:
            pass


def install(arm: Arm) -> dict[str, str | None]:
    """Wrap, for each phase, the first candidate function that exists; phase -> what was wrapped, or None."""
    installed: dict[str, str | None] = {}
    for phase, candidates in HOOKS.items():
        installed[phase] = None
        for module, cls, method, predicate in candidates:
            try:
                owner: Any = importlib.import_module(module)
                owner = getattr(owner, cls) if cls else owner
                original = getattr(owner, method)
            except (ImportError, AttributeError):
                continue
            setattr(owner, method, _wrap(original, arm, phase, predicate))
            installed[phase] = f"{cls or module}.{method}"
            break
    return installed


def _reached(arm: Arm, phase: str, predicate: Predicate, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        if phase == "restore":
            RESTORES.observe(args)
        return arm.reached(phase, predicate, args, kwargs)
    except Exception as e:  # the hook must never change what the daemon does
        sys.stderr.write(f"CHAOS-HOOK {phase} failed: {e!r}\n")
        return False


def _wrap(original: Callable[..., Any], arm: Arm, phase: str, predicate: Predicate) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        fired = False
        if phase not in AFTER_RETURN:
            fired = _reached(arm, phase, predicate, args, kwargs)
        try:
            result = original(*args, **kwargs)
            if phase in AFTER_RETURN:
                fired = _reached(arm, phase, predicate, args, kwargs)
        finally:
            try:
                arm.ended(phase, fired, args)
            except Exception as e:
                sys.stderr.write(f"CHAOS-HOOK {phase} hold failed: {e!r}\n")
        if phase == "commit" and not getattr(args[0], "bulk", False):
            table = str(getattr(args[0], "table", ""))
            SYNCED[table] = SYNCED.get(table, 0) + 1
        return result

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapped


def probe_once(path: str) -> None:
    """Answer the campaign's ``<path>.probe`` (see the module docstring); never raises into the daemon."""
    try:
        lib = ctypes.CDLL(None)  # libfiu, loaded by fiu-run's preload library
        lib.fiu_fail.argtypes = [ctypes.c_char_p]
        lib.fiu_fail.restype = ctypes.c_int
        # First, before any file call of ours: a onetime point still armed on open or read fails it otherwise.
        armed = {name for name in FIU_SITES.values() if lib.fiu_fail(name.encode()) != 0}
        with open(f"{path}.probe", "rb") as f:
            req = json.loads(f.read())
        name = str(req["name"])
        if name not in FIU_SITES.values():  # not one the campaign arms: asked now (no file call of ours is next)
            armed |= {name} if lib.fiu_fail(name.encode()) != 0 else set()
        with open(f"{path}.probe-{req['id']}", "w") as f:
            f.write(json.dumps({"fired": name not in armed}))
        if name in armed and req.get("keep") is not None:  # asked without spending it: armed again, as it was
            lib.fiu_enable.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
            lib.fiu_enable(name.encode(), 1, ctypes.c_void_p(int(req["keep"])), FIU_ONETIME)
    except Exception as e:
        sys.stderr.write(f"CHAOS-PROBE failed: {e!r}\n")


def relative_sleep(seconds: float | SupportsIndex) -> None:
    """time.sleep without an absolute CLOCK_MONOTONIC clock_nanosleep (see tools.py: libfaketime 0.9.10)."""
    secs = float(seconds)
    if secs < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(secs)


def arrow_without_background_thread() -> None:
    """Under libfiu, pyarrow's jemalloc starts no background thread (see the module docstring)."""
    if "fiu" in os.environ.get("LD_PRELOAD", ""):
        os.environ.setdefault(ARROW_JEMALLOC_CONF_ENV, "background_thread:false")


def children_without_tools() -> None:
    """The allocator's choice made with the preload in view, the campaign's tools leave the environment the daemon's
    children inherit (see the module docstring)."""
    from globald.ops import allocator

    switch = allocator.switch

    def switch_then_drop(wanted: str) -> None:
        switch(wanted)  # returns unless it re-executes, which keeps the preload (the new process comes back here)
        for name in TOOL_ENV:
            os.environ.pop(name, None)

    allocator.switch = switch_then_drop


def main() -> int:
    arrow_without_background_thread()
    if os.environ.get(IMPORT_PYARROW_ENV) == "1":
        import pyarrow.fs  # noqa: F401 - loaded now, on one thread: see the module docstring
    if os.environ.get(SLEEP_FIX_ENV) == "1":
        time.sleep = relative_sleep
    clock = SteppedClock(os.environ[CLOCK_ENV]) if os.environ.get(CLOCK_ENV) else None
    if clock is not None:
        clock.install()
    path = os.environ.get(ARM_ENV)
    if path:
        arm = Arm(path, clock)
        signal.signal(PROBE_SIGNAL, lambda signum, frame: probe_once(path))
        installed = install(arm)
        missing = [phase for phase, where in installed.items() if where is None]
        sys.stderr.write(f"CHAOS-HOOKS installed: {installed}" + (f"; missing: {missing}" if missing else "") + "\n")
        sys.stderr.flush()
    children_without_tools()
    from globald.cli import main as cli

    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
