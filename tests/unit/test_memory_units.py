"""globald.ops.memory and allocator: the status document's memory section, the opt-in tracemalloc recorder, and
the choice of malloc."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from globald.ops import allocator, memory
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.ci import unavailable
from tests.stores import write_records


def test_memory_doc_reports_rss_and_each_open_store(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "t", "topic", StoreOptions(block_cache_mb=1, write_buffer_mb=1)).store
    try:
        write_records(store, {b"key-%05d" % i: b"v" * 100 for i in range(1000)}, {0: 1000})
        store.checkpoint(tmp_path / "copy")  # flushes: the new table file's index and filter go to the cache
        doc = memory.memory_doc({"t": store.memory_usage()})
        t = doc["tables"]["t"]
        assert set(t) == {"block_cache_mb", "block_cache_pinned_mb", "memtables_mb", "table_readers_mb"}
        raw = store.memory_usage()
        assert raw is not None and 0 < raw["block_cache"] <= 1 << 20  # never above block_cache_mb
        assert doc["rss_mb"] > 0
    finally:
        store.close()
    assert store.memory_usage() is None
    assert memory.memory_doc({"t": None})["tables"] == {}  # a closed store is left out, not an error


def test_malloc_counts_what_is_allocated() -> None:
    import ctypes

    before = allocator.heap_bytes()
    if before is None:
        unavailable("this process's malloc reports no heap (neither glibc >= 2.33 nor jemalloc)")
    assert before is not None
    block = ctypes.create_string_buffer(8 << 20)  # above the mmap threshold: counted as in use at once
    after = allocator.heap_bytes()
    assert after is not None and after["in_use"] - before["in_use"] >= 8 << 20
    del block


def test_tracemalloc_recorder_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(memory.TRACEMALLOC_DIR_ENV, raising=False)
    assert memory.TracemallocRecorder.from_env() is None
    monkeypatch.setenv(memory.TRACEMALLOC_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(memory.TRACEMALLOC_INTERVAL_ENV, "60")
    monkeypatch.setenv(memory.TRACEMALLOC_FRAMES_ENV, "3")
    r = memory.TracemallocRecorder.from_env()
    assert r is not None and (r.directory, r.interval, r.frames) == (tmp_path, 60.0, 3)


def test_tracemalloc_recorder_dumps_a_baseline_and_a_last_snapshot(tmp_path: Path) -> None:
    was_tracing = tracemalloc.is_tracing()
    r = memory.TracemallocRecorder(tmp_path, interval=3600, frames=2)
    try:
        r.start()
        r.close()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    dumps = sorted(p.name for p in tmp_path.glob("tracemalloc-*.bin"))
    assert dumps == ["tracemalloc-0000.bin", "tracemalloc-0001.bin"]
    tracemalloc.Snapshot.load(str(tmp_path / dumps[-1]))  # readable by the analysis side
    census = json.loads((tmp_path / "census-0001.json").read_text())
    assert census["builtins.dict"] > 0


def test_a_baseline_dump_outlasting_close_s_wait_keeps_its_own_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """CI, under load: the baseline dump (a walk of the whole heap) was still running when close gave up waiting, and
    close's dump took the same number: one file replaced the other. Here the baseline is held past close's wait."""
    was_tracing = tracemalloc.is_tracing()
    real = tracemalloc.take_snapshot
    entered, release = threading.Event(), threading.Event()

    def held_first() -> tracemalloc.Snapshot:
        if not entered.is_set():
            entered.set()
            assert release.wait(60)
        return real()

    monkeypatch.setattr(memory.tracemalloc, "take_snapshot", held_first)
    monkeypatch.setattr(memory, "_DUMP_JOIN_S", 0.1)
    r = memory.TracemallocRecorder(tmp_path, interval=3600, frames=2)
    try:
        r.start()
        assert entered.wait(60)
        r.close()  # gives up on the held baseline, dumps the last state
        release.set()
        assert r._thread is not None
        r._thread.join(60)
    finally:
        release.set()
        if not was_tracing:
            tracemalloc.stop()
    assert sorted(p.name for p in tmp_path.glob("tracemalloc-*.bin")) == ["tracemalloc-0000.bin",
                                                                        "tracemalloc-0001.bin"]
    assert r.dumps == 2


def test_heap_trimmer_returns_free_pages_below_used_blocks() -> None:
    import ctypes

    if allocator.active() != "glibc" or not allocator.can_release():
        unavailable(f"this process runs on {allocator.active()}, not on glibc's malloc with malloc_trim")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # Blocks below the mmap threshold, touched, every other one freed: the free ones sit between used ones, where
    # glibc's own trimming (top of the heap only) never reaches them.
    blocks = [libc.malloc(64 << 10) for _ in range(512)]
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    for b in blocks[::2]:
        libc.free(b)
    before = memory.rss_bytes()
    trimmer = memory.HeapTrimmer(interval=60)
    assert not trimmer.maybe_trim(0.0)  # not due before its interval
    assert trimmer.maybe_trim(trimmer._next)
    after = memory.rss_bytes()
    for b in blocks[1::2]:
        libc.free(b)
    assert before is not None and after is not None
    assert before - after >= 8 << 20  # of the 16 MB freed, the untouched-since pages went back to the kernel


def test_heap_trimmer_runs_soon_after_a_restore_and_then_by_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(allocator, "can_release", lambda: True)
    monkeypatch.setattr(allocator, "release_free_pages", lambda: calls.append(0))
    trimmer = memory.HeapTrimmer(interval=60)
    start = trimmer._next - 60
    assert not trimmer.maybe_trim(start + 30)
    trimmer.soon()
    assert trimmer.maybe_trim(start + 30)  # soon() is at most TRIM_AFTER_RESTORE_S away
    assert not trimmer.maybe_trim(start + 31)
    assert trimmer.maybe_trim(start + 91)
    assert calls == [0, 0] and trimmer.trims == 2


def test_allocator_tuning_yields_to_the_operators_environment() -> None:
    """glibc takes mallopt's word unless MALLOC_ARENA_MAX / MALLOC_MMAP_THRESHOLD_ were set for it already."""
    code = "from globald.ops.allocator import tune_glibc; print(sorted(tune_glibc()))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    mine = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert mine.stdout.split() == ["['arena_max',", "'mmap_threshold']"]
    theirs = subprocess.run([sys.executable, "-c", code], env={**env, "MALLOC_ARENA_MAX": "4"},
                            capture_output=True, text=True, check=True)
    assert theirs.stdout.strip() == "['mmap_threshold']"


def test_process_memory_finds_each_thread_stack_and_the_heap() -> None:
    import threading

    before = memory.process_memory()
    assert before is not None and before["heap_mb"] > 0 and before["file_mb"] > 0
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        during = memory.process_memory()
    finally:
        release.set()
        for t in threads:
            t.join()
    assert during is not None
    assert during["threads"] == before["threads"] + 4
    # Every live thread's stack is found (told from an arena by its guard page); glibc keeps the stacks of ended
    # threads for reuse, so there may be more than there are threads.
    assert during["stack_mappings"] >= during["threads"] >= 5
    parts = sum(during[f"{k}_mb"] for k in ("heap", "anon", "pymalloc", "stacks", "file"))
    assert abs(parts - during["rss_mb"]) < 0.1  # every resident page is in one part


def test_kafka_stats_sum_the_fetch_queues_of_every_partition() -> None:
    stats = memory.KafkaStats()
    stats(json.dumps({"replyq": 2, "brokers": {"b1": {"outbuf_cnt": 1, "waitresp_cnt": 3}},
                      "topics": {"a": {"partitions": {"0": {"fetchq_size": 3 << 20, "fetchq_cnt": 10},
                                                      "-1": {"fetchq_size": 0, "fetchq_cnt": 0}}},
                                 "b": {"partitions": {"0": {"fetchq_size": 1 << 20, "fetchq_cnt": 5}}}}}))
    assert stats.last is not None
    assert (stats.last["fetchq_mb"], stats.last["fetchq_msgs"], stats.last["broker_bufs"]) == (4.0, 15, 4)
    stats("not json")  # a malformed emission keeps the last good one
    assert stats.last["fetchq_mb"] == 4.0 and stats.emitted == 1


def test_the_allocator_choice_preloads_jemalloc_once_and_only_when_allowed() -> None:
    lib = "libjemalloc.so.2"
    assert allocator.choose("auto", loaded=False, found=lib, reexecuted=False) == lib
    assert allocator.choose("jemalloc", loaded=False, found=lib, reexecuted=False) == lib
    assert allocator.choose("glibc", loaded=False, found=lib, reexecuted=False) is None
    assert allocator.choose("auto", loaded=True, found=lib, reexecuted=True) is None  # already switched
    assert allocator.choose("auto", loaded=False, found=None, reexecuted=False) is None  # not installed: glibc
    assert allocator.choose("auto", loaded=False, found=lib, reexecuted=True) is None  # preload refused: no loop
    faketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # another preload: auto leaves it alone
    assert allocator.choose("auto", loaded=False, found=lib, reexecuted=False, preloaded=faketime) is None
    assert allocator.choose("jemalloc", loaded=False, found=lib, reexecuted=False, preloaded=faketime) == lib
    with pytest.raises(ValueError, match="not installed"):
        allocator.choose("jemalloc", loaded=False, found=None, reexecuted=False)
    with pytest.raises(ValueError, match="not in use"):
        allocator.choose("jemalloc", loaded=False, found=lib, reexecuted=True)


def test_under_jemalloc_the_heap_and_its_release_are_jemallocs() -> None:
    if not ctypes.util.find_library("jemalloc"):
        unavailable("libjemalloc is not installed (Debian package libjemalloc2; `make sysdeps` installs it as root)")
    code = ("from globald.ops import allocator; import ctypes; b = ctypes.create_string_buffer(8 << 20); "
            "h = allocator.heap_bytes(); allocator.release_free_pages(); "
            "print(allocator.active(), h['in_use'] >= 8 << 20, allocator.tune_glibc())")
    env = {**os.environ, "LD_PRELOAD": ctypes.util.find_library("jemalloc") or ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["jemalloc", "True", "{}"]  # glibc's mallopt is left alone: it would tune nothing


def test_jemalloc_returns_freed_pages_within_a_second_unless_the_operator_tunes_it() -> None:
    """``globald run``'s switch to jemalloc sets a 1 s decay with a background purger (allocator.JEMALLOC_CONF);
    an operator's MALLOC_CONF wins whole."""
    if not ctypes.util.find_library("jemalloc"):
        unavailable("libjemalloc is not installed (Debian package libjemalloc2; `make sysdeps` installs it as root)")
    code = ("from globald.ops import allocator; allocator.switch('auto'); "
            "print(allocator.active(), allocator.jemalloc_number('opt.dirty_decay_ms'), "
            "allocator.jemalloc_number('opt.muzzy_decay_ms'))")
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_CONF", "LD_PRELOAD", allocator.REEXEC_ENV)}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert ours.stdout.split() == ["jemalloc", "1000", "0"], ours.stderr
    theirs = subprocess.run([sys.executable, "-c", code], env={**env, "MALLOC_CONF": "dirty_decay_ms:5000"},
                            capture_output=True, text=True, check=True)
    assert theirs.stdout.split()[:2] == ["jemalloc", "5000"], theirs.stderr


_READ_CYCLES = """
import gc, sys, tempfile
from pathlib import Path
from globald.ops import allocator
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.stores import write_records

root = Path(tempfile.mkdtemp(dir=sys.argv[1]))
store = TableStore.open(root, "t", "topic", StoreOptions(block_cache_mb=1, write_buffer_mb=1)).store
write_records(store, {b"k%d" % i: b"v" * 50 for i in range(100)}, {0: 100})
store.checkpoint(root / "copy")
store.close()

def cycle() -> None:
    with StoreReader(root / "copy") as r:
        r.offsets()

for _ in range(300):
    cycle()
gc.collect()
before = allocator.heap_bytes()["in_use"]
for _ in range(4000):
    cycle()
gc.collect()
print((allocator.heap_bytes()["in_use"] - before) / 4000)
"""


def test_opening_a_published_snapshot_keeps_no_memory(tmp_path: Path) -> None:
    """The daemon opens every snapshot it publishes (the offsets the copy holds): up to 25 a second per table.
    Listing its column families with rocksdict's default options kept ~170 B per opening (a comparator never
    freed), the accelerated soak's one steady growth. jemalloc's count of bytes in use, after a warm-up, is exact
    where RSS is not."""
    lib = ctypes.util.find_library("jemalloc")
    if not lib:
        unavailable("libjemalloc is not installed (Debian package libjemalloc2; `make sysdeps` installs it as root)")
    env = {**os.environ, "LD_PRELOAD": lib, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", _READ_CYCLES, str(tmp_path)], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    kept = float(out.stdout.split()[-1])
    assert kept < 60, f"{kept:.0f} bytes kept per opening"  # measured: 6.6 B, within jemalloc's per-thread caches
