"""Which malloc the daemon runs on (``allocator`` in the config), and the calls whose form depends on it.

glibc's malloc fragments under the daemon's mix: librdkafka's broker threads allocate a small op per fetched
record and the loop thread frees it, RocksDB's flushes and compactions allocate and free blocks on threads of their
own, and a catch-up after a fault does both by the hundred thousand, interleaved with allocations that live on. The
freed chunks are scattered between live ones, so whole pages rarely come free and ``malloc_trim`` cannot hand
them back: in the accelerated soak memory in use stayed at 14-16 MB while glibc's heap grew by 15-25 MB an hour.
jemalloc, which RocksDB's own guidance recommends, groups allocations by size class in runs of their own and
returns unused pages by itself. ``globald run`` therefore re-executes itself once, at start and before any thread,
with jemalloc preloaded when the config asks for it ("jemalloc") or allows it, it is installed and nothing else is
preloaded ("auto", the default); "glibc" keeps the C library's malloc, tuned by ``tune_glibc``.

Only ``globald run`` switches; the embedded demo, the CLI's readers and the daemon's child processes run on what
they were started with (the preload is taken out of the environment they inherit).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from typing import Any

# Set (to the operator's own LD_PRELOAD, possibly empty) on the re-executed process: it never re-executes again,
# and it restores the operator's LD_PRELOAD for the processes it starts.
REEXEC_ENV = "GLOBALD_ALLOCATOR_PRELOADED"
# jemalloc's own defaults keep freed pages resident for 10 s and purge them on whichever thread allocates next. A
# catch-up after a fault frees tens of MB within a second, and with faults every few seconds RSS never settles
# (the accelerated soak's per-minute RSS scattered by 2.5 MB). One second, purged by jemalloc's own background
# thread, returns them before the next fault without putting madvise calls on the loop thread. An operator's
# MALLOC_CONF replaces this whole (processes the daemon starts run on glibc's malloc, which ignores it).
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
_JEMALLOC = "jemalloc"
_MALLCTL_ARENAS_ALL = 4096  # jemalloc's "every arena" index (MALLCTL_ARENAS_ALL)


def _libc_fn(name: str, restype: Any, argtypes: list[Any]) -> Callable[..., Any] | None:
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_MALLCTL = _libc_fn("mallctl", ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                              ctypes.c_void_p, ctypes.c_size_t])


def active() -> str:
    """The malloc this process runs on: "jemalloc" (preloaded, or linked in) or "glibc"."""
    return _JEMALLOC if _MALLCTL is not None else "glibc"


def choose(wanted: str, loaded: bool, found: str | None, reexecuted: bool, preloaded: str = "") -> str | None:
    """The library to preload by re-executing, or None to run on as is. ``wanted``: the config's ``allocator``;
    ``loaded``: jemalloc already runs here; ``found``: its library, if installed; ``reexecuted``: this process is
    the re-executed one (never twice: a preload that did not take must not loop); ``preloaded``: the operator's own
    LD_PRELOAD. "auto" leaves a process that preloads something else alone: a library that interposes what
    jemalloc calls while it initialises hangs the daemon at start (libfaketime does, on clock_gettime). Raises
    ValueError when jemalloc is demanded and cannot be had."""
    if wanted == "glibc" or loaded or (wanted == "auto" and preloaded.strip()):
        return None
    if found is None or reexecuted:
        if wanted == _JEMALLOC:
            raise ValueError("jemalloc is not installed (Debian/Ubuntu: apt-get install libjemalloc2); "
                             "\"auto\" runs on glibc's malloc without it" if found is None else
                             f"{found} was preloaded but is not in use (LD_PRELOAD refused it?)")
        return None
    return found


def switch(wanted: str) -> None:
    """Re-execute this process with jemalloc preloaded when ``choose`` says so; returns when it does not (or when
    the re-exec itself failed, which is said on stderr: the daemon then runs on glibc's malloc)."""
    reexecuted = REEXEC_ENV in os.environ
    if reexecuted:  # the processes the daemon starts get the operator's LD_PRELOAD back, not ours
        original = os.environ.pop(REEXEC_ENV)
        if original:
            os.environ["LD_PRELOAD"] = original
        else:
            os.environ.pop("LD_PRELOAD", None)
    original = os.environ.get("LD_PRELOAD", "")
    lib = choose(wanted, _MALLCTL is not None, ctypes.util.find_library(_JEMALLOC), reexecuted, original)
    if lib is None:
        return
    env = {"MALLOC_CONF": JEMALLOC_CONF, **os.environ, REEXEC_ENV: original, "LD_PRELOAD": f"{original} {lib}".strip()}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as e:
        print(f"globald: cannot re-execute with {lib} preloaded ({e}); running on glibc's malloc", file=sys.stderr)


# -- the calls that differ ---------------------------------------------------------------------------------------


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_MALLINFO2 = _libc_fn("mallinfo2", _MallInfo2, [])  # glibc >= 2.33; musl and older glibc have none
_MALLOC_TRIM = _libc_fn("malloc_trim", ctypes.c_int, [ctypes.c_size_t])  # glibc only


def jemalloc_number(name: str) -> int | None:
    """A jemalloc statistic or option of size_t's size (``stats.allocated``, ``opt.dirty_decay_ms``); None where
    jemalloc does not run or has no such name."""
    return None if _MALLCTL is None else _jemalloc_stat(name)


def _jemalloc_stat(name: str) -> int | None:
    assert _MALLCTL is not None
    value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    if _MALLCTL(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None  # a jemalloc built without statistics
    return value.value


def heap_bytes() -> dict[str, int] | None:
    """The allocator's heap: bytes handed out (RocksDB, librdkafka and Python's larger objects), and bytes it keeps
    resident without handing them out. What it keeps growing means fragmentation, not a leak. A few us."""
    if _MALLCTL is not None:
        epoch = ctypes.c_uint64(1)  # jemalloc's statistics are a snapshot, refreshed by writing the epoch
        _MALLCTL(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
        allocated, resident = _jemalloc_stat("stats.allocated"), _jemalloc_stat("stats.resident")
        if allocated is None or resident is None:
            return None
        return {"in_use": allocated, "free": max(0, resident - allocated)}
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return {"in_use": m.uordblks + m.hblkhd, "free": m.fordblks}


def can_release() -> bool:
    return _MALLCTL is not None or _MALLOC_TRIM is not None


def release_free_pages() -> None:
    """Hand the pages the allocator keeps free back to the kernel: jemalloc purges every arena's unused pages
    (it also does so by itself, after dirty_decay_ms); glibc's malloc_trim(0) madvises whole free pages."""
    if _MALLCTL is not None:
        _MALLCTL(f"arena.{_MALLCTL_ARENAS_ALL}.purge".encode(), None, None, None, 0)
    elif _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


# glibc's mallopt parameters (malloc.h), the values the daemon sets, and the variables that let an operator choose.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
ARENA_MAX = 2
MMAP_THRESHOLD = 128 * 1024
GLIBC_ENV = {"arena_max": "MALLOC_ARENA_MAX", "mmap_threshold": "MALLOC_MMAP_THRESHOLD_"}


def tune_glibc() -> dict[str, int]:
    """Fixes glibc's malloc arenas at 2 and its mmap threshold at 128 KiB; returns what was set (nothing for what
    the operator set through the environment, or where malloc is not glibc's). Call before threads start.

    A daemon that is never restarted must not let freed memory pile up. glibc gives each contending thread an arena
    of its own (up to eight per core), each keeping its own free memory, and librdkafka and RocksDB start threads
    at every reconnect and store reopen. And glibc raises its mmap threshold to the size of any large block freed
    (up to 32 MiB): from then on fetch buffers and restore batches are carved from the heap, where a small block
    still in use above them keeps their pages resident. A fixed threshold stops that adjustment, so large blocks
    keep going back to the kernel when freed. The GIL already serialises most allocation, so few arenas cost
    little."""
    mallopt = _libc_fn("mallopt", ctypes.c_int, [ctypes.c_int, ctypes.c_int])
    if mallopt is None or _MALLCTL is not None:
        return {}
    wanted = {"arena_max": (_M_ARENA_MAX, ARENA_MAX), "mmap_threshold": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD)}
    done = {}
    for name, (param, value) in wanted.items():
        if not os.environ.get(GLIBC_ENV[name]) and mallopt(param, value) == 1:  # glibc read the variable
            done[name] = value
    return done
