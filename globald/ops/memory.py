"""What the daemon's memory is made of (RSS, each table's RocksDB memory, malloc's heap), an opt-in tracemalloc
recorder, and the periodic heap trim that keeps freed memory from staying resident.

RocksDB's native memory is invisible to Python profilers, so the status document carries the store's own
accounting next to RSS: a soak can then tell a block cache warming up to its configured size (which levels off)
from growth that does not. The recorder is for finding Python-level growth in long runs and is off unless
``GLOBALD_TRACEMALLOC_DIR`` names a directory: tracing slows every allocation and holds the GIL while it dumps.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from globald.ops import allocator

log = logging.getLogger(__name__)

TRACEMALLOC_DIR_ENV = "GLOBALD_TRACEMALLOC_DIR"
TRACEMALLOC_INTERVAL_ENV = "GLOBALD_TRACEMALLOC_INTERVAL_S"
TRACEMALLOC_FRAMES_ENV = "GLOBALD_TRACEMALLOC_FRAMES"

_PAGE = os.sysconf("SC_PAGE_SIZE")

# How often the daemon hands free heap pages back to the kernel (see HeapTrimmer), and how soon after a restore.
TRIM_INTERVAL_S = 60.0
TRIM_AFTER_RESTORE_S = 1.0


def rss_bytes() -> int | None:
    """This process's resident set size (one read of /proc/self/statm), or None where /proc has none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class HeapTrimmer:
    """Hands the pages malloc keeps free back to the kernel (``allocator.release_free_pages``), once a minute and
    soon after a restore ends.

    On glibc's malloc (``allocator = "glibc"``, or jemalloc not installed), glibc gives memory back only from the
    top of each arena. What a restore, a store reopen or a burst of reconnects freed below still-used blocks stays
    resident, so each such fault ratchets RSS up a little: in a soak, free heap grew from 15 to 20 MB in 15
    minutes, RSS by steps at faults, while the memory in use stayed within a few MB. malloc_trim(0) releases those
    pages (madvise) without moving anything; on a heap of tens of MB it takes about a millisecond. It cannot
    release a page that still holds one live chunk, which is why jemalloc is the default. Loop thread only."""

    def __init__(self, interval: float = TRIM_INTERVAL_S) -> None:
        self.interval = interval
        self.trims = 0
        self._next = time.monotonic() + interval

    @property
    def available(self) -> bool:
        return allocator.can_release()

    def soon(self) -> None:
        """A restore just ended: its buffers (fetched batches, bulk-load memtables) are free now."""
        self._next = min(self._next, time.monotonic() + TRIM_AFTER_RESTORE_S)

    def maybe_trim(self, now: float) -> bool:
        if not allocator.can_release() or now < self._next:
            return False
        self._next = now + self.interval
        allocator.release_free_pages()
        self.trims += 1
        return True


def python_memory() -> dict[str, float]:
    """Python's own allocator: blocks alive (pymalloc and larger), and what tracemalloc traces when it is on.

    ``sys._debugmallocstats`` would give pymalloc's arena bytes but writes to the C stderr, which is the daemon's
    log; the block count is free and moves with the same objects."""
    out: dict[str, float] = {"allocated_blocks": sys.getallocatedblocks()}
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        # tracemalloc's own tables are resident too: a profiled run's RSS slope must be read net of them.
        out.update(traced_mb=round(current / 2**20, 2), traced_peak_mb=round(peak / 2**20, 2),
                   tracemalloc_self_mb=round(tracemalloc.get_tracemalloc_memory() / 2**20, 2))
    return out


class KafkaStats:
    """The last statistics librdkafka emitted (``statistics.interval.ms``), reduced to the buffers it holds.

    librdkafka allocates through malloc, so its buffers are inside glibc's "in use"; this says how much of that is
    its fetch queues (bounded by ``queued.max.messages.kbytes`` per partition) and its request queues. Off unless
    the operator sets ``statistics.interval.ms``: each emission is a JSON document parsed on the polling thread."""

    def __init__(self) -> None:
        self.last: dict[str, float] | None = None
        self.emitted = 0

    def __call__(self, raw: str) -> None:
        try:
            doc = json.loads(raw)
        except ValueError:
            return
        parts = [p for t in (doc.get("topics") or {}).values() for p in (t.get("partitions") or {}).values()]
        brokers = list((doc.get("brokers") or {}).values())
        self.emitted += 1
        self.last = {
            "fetchq_mb": round(sum(int(p.get("fetchq_size", 0)) for p in parts) / 2**20, 2),
            "fetchq_msgs": sum(int(p.get("fetchq_cnt", 0)) for p in parts),
            "replyq": int(doc.get("replyq", 0)),
            "broker_bufs": sum(int(b.get("outbuf_cnt", 0)) + int(b.get("waitresp_cnt", 0)) for b in brokers),
            "brokers": len(brokers),
            "partitions": len(parts),
            "metadata_cache": int(doc.get("metadata_cache_cnt", 0)),
        }


KAFKA_STATS = KafkaStats()  # the daemon has one consumer; its stats_cb is this object


def memory_doc(stores: Mapping[str, Mapping[str, int] | None]) -> dict[str, Any]:
    """The status document's ``memory`` section: RSS, each open store's RocksDB memory (``stores``: bytes by kind,
    None for a closed store, as ``TableStore.memory_usage`` gives them), which malloc runs and its heap (MB), Python's
    allocator, and librdkafka's buffers when its statistics are on."""
    tables = {name: {f"{k}_mb": round(v / 2**20, 2) for k, v in m.items()}
              for name, m in stores.items() if m is not None}
    rss, heap = rss_bytes(), allocator.heap_bytes()
    return {"rss_mb": None if rss is None else round(rss / 2**20, 1), "tables": tables, "allocator": allocator.active(),
            "malloc": None if heap is None else {f"{k}_mb": round(v / 2**20, 2) for k, v in heap.items()},
            "python": python_memory(), "kafka": KAFKA_STATS.last}


_DUMP_JOIN_S = 120.0  # how long close waits for a dump under way


class TracemallocRecorder:
    """Dumps a tracemalloc snapshot every ``interval`` seconds into ``directory`` (``tracemalloc-NNNN.bin``), with
    the number of live objects of each type beside it (``census-NNNN.json``).

    ``tracemalloc.Snapshot.load`` reads them back; ``compare_to`` between an early and a late one names the lines
    whose allocations grew, and the census says which objects those allocations still are."""

    def __init__(self, directory: Path, interval: float = 300.0, frames: int = 10) -> None:
        self.directory = directory
        self.interval = interval
        self.frames = frames
        self.dumps = 0  # those written
        self._next = 0  # the number the next dump takes
        self._numbering = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls) -> TracemallocRecorder | None:
        where = os.environ.get(TRACEMALLOC_DIR_ENV)
        if not where:
            return None
        try:
            interval = float(os.environ.get(TRACEMALLOC_INTERVAL_ENV) or 300)
            frames = int(os.environ.get(TRACEMALLOC_FRAMES_ENV) or 10)
        except ValueError:
            log.warning("%s/%s are not numbers; using 300 s and 10 frames", TRACEMALLOC_INTERVAL_ENV,
                        TRACEMALLOC_FRAMES_ENV)
            interval, frames = 300.0, 10
        return cls(Path(where), max(1.0, interval), max(1, frames))

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        log.warning("tracemalloc on (%d frames): a snapshot every %.0f s into %s; this daemon runs slower",
                    self.frames, self.interval, self.directory)
        self._thread = threading.Thread(target=self._run, name="globald-tracemalloc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.dump()  # the baseline, taken once startup allocations are done
        while not self._stop.wait(self.interval):
            self.dump()

    def dump(self) -> None:
        with self._numbering:  # the thread's dump and close's never share a number, even past the join's bound
            number = self._next
            self._next += 1
        path = self.directory / f"tracemalloc-{number:04d}.bin"
        try:
            started = time.monotonic()
            tracemalloc.take_snapshot().dump(str(path))
            census = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
            (self.directory / f"census-{number:04d}.json").write_text(json.dumps(dict(census.most_common(200))))
            self.dumps += 1
            log.info("tracemalloc snapshot %s (traced %d bytes) in %.1fs", path.name,
                     tracemalloc.get_traced_memory()[0], time.monotonic() - started)
        except OSError as e:  # a full disk must not end the daemon for the sake of a profile
            log.warning("tracemalloc snapshot to %s failed: %s", path, e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # A dump walks the whole heap (seconds on a large one, longer on a loaded machine): the last dump waits
            # for one under way, or both would take the same number and one file would replace the other. Opt-in
            # diagnostics (``GLOBALD_TRACEMALLOC_DIR``) that already slow the daemon; the bound is for a hung thread.
            self._thread.join(timeout=_DUMP_JOIN_S)
            self.dump()  # the last state, for the comparison with the baseline


def process_memory(pid: int | str = "self") -> dict[str, float] | None:
    """Where a process's RSS lives, in MB, from ``/proc/PID/smaps``: glibc's main heap (``[heap]``), thread stacks,
    other anonymous memory (glibc's other arenas and mmapped blocks, Python's 1 MiB arenas, RocksDB), and
    file-backed pages (libraries, mapped files); with the thread count. None where /proc has no such process.

    A thread stack is a private anonymous mapping right above the guard page glibc puts below it (a small
    ``---p``); an arena's reserve is a large ``---p`` mapping *above* its used part. ``pymalloc``
    counts anonymous mappings of exactly 1 MiB, the size of Python's arenas (3.10+), which glibc's own mmapped
    blocks rarely match. Reading smaps walks every mapping: a few ms, for a sampler outside the daemon."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
        threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        return None
    kb: Counter[str] = Counter()
    pymalloc_arenas = stacks = 0
    prev_end, prev_guard = -1, False
    kind = ""
    for line in text.splitlines():
        head = line.split(None, 5)
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line: range perms offset dev inode path
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            perms, path = head[1], head[5] if len(head) > 5 else ""
            anon = head[4] == "0" and not path.startswith("/")
            if path == "[heap]":
                kind = "heap"
            elif path == "[stack]" or (anon and perms.startswith("rw") and prev_guard and prev_end == lo):
                kind = "stacks"
                stacks += 1
            elif anon:
                kind = "pymalloc" if hi - lo == 2**20 and perms.startswith("rw") else "anon"
                pymalloc_arenas += kind == "pymalloc"
            else:
                kind = "file"
            # A guard page is a page or a few; an arena's reserve is megabytes.
            prev_end, prev_guard = hi, anon and perms.startswith("---") and hi - lo <= 64 * 1024
        elif head[0] == "Rss:":
            kb[kind] += int(head[1])
            kb["rss"] += int(head[1])
    out = {f"{k}_mb": round(v / 1024, 2) for k, v in kb.items()}
    out.update(threads=threads, stack_mappings=stacks, pymalloc_arenas=pymalloc_arenas)
    for k in ("heap", "stacks", "pymalloc", "anon", "file"):
        out.setdefault(f"{k}_mb", 0.0)
    return out
