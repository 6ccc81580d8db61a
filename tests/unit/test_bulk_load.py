"""Bulk loads (WAL off) on the real RocksDB: a process killed at any moment leaves data and offsets together."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.common.errors import StoreUnavailableError
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.stores import write_records

BATCH = 5_000
REPO = Path(__file__).resolve().parents[2]

# Writes batches whose offset is the number of keys written so far, then ends the bulk load; a timer thread
# kills the process (os._exit skips every close and flush) after the given delay, or, with a negative delay, the
# writer kills itself as soon as the compaction that follows the load (of the flushes it left in L0) is running.
WRITER = textwrap.dedent(f"""
    import os, sys, threading, time
    from pathlib import Path
    from globald.store.options import StoreOptions
    from globald.store.table_store import TableStore
    from tests.stores import write_records

    state, delay, batches, l0_files = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    options = StoreOptions(write_buffer_mb=2, bulk_l0_mb=2 * l0_files)
    store = TableStore.open(state, "tbl", "topic", options).store
    # The clock starts once the store exists: creating it can take longer than the shortest delay on a slow disk.
    if delay >= 0:
        threading.Thread(target=lambda: (time.sleep(delay), os._exit(9)), daemon=True).start()
    store.begin_bulk_load()
    done = store.offsets().get(0, 0)
    for i in range(batches):
        # Incompressible values when the compaction is the target: it then lasts long enough to be seen running.
        payload = os.urandom(100 * {BATCH}) if delay < 0 else b"v" * (100 * {BATCH})
        records = {{b"k%09d" % k: payload[n * 100:(n + 1) * 100] for n, k in enumerate(range(done, done + {BATCH}))}}
        # Key 0 again: every flushed file then spans the same range, as a restore's files do, and the compaction
        # after the load rewrites them (files with disjoint ranges would only be moved down, in an instant).
        records[b"k%09d" % 0] = payload[:100]
        write_records(store, records, {{0: done + {BATCH}}})
        done += {BATCH}
        if i % 7 == 0:
            store.estimate_keys()
    store.end_bulk_load()
    if delay < 0:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if store.db.property_int_value("rocksdb.num-running-compactions"):
                print("killed during compaction, files per level", store.files_per_level(), file=sys.stderr)
                os._exit(9)
            time.sleep(0.001)
        sys.exit(f"no compaction followed the bulk load; files per level {{store.files_per_level()}}")
    time.sleep(30)
""")


def _kill_during_bulk_load(state: Path, delay: float, batches: int, l0_files: int = 64) -> None:
    proc = subprocess.run([sys.executable, "-c", WRITER, str(state), str(delay), str(batches), str(l0_files)],
                          cwd=REPO,  # where the writer finds tests.stores
                          timeout=60, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr


def _assert_consistent(state: Path) -> int:
    """The durable store holds exactly the keys below its offset: never data without offsets, nor the reverse."""
    with StoreReader(state / "tables" / "tbl" / "db") as r:
        offset = r.offsets().get(0, 0)
        keys = [k for k, _, _ in r.items()]
    assert keys == [b"k%09d" % i for i in range(offset)]
    return offset


# l0_files=4: compactions run during the load too (of every fourth flush), as in a load larger than the bound.
@pytest.mark.parametrize(("delay", "l0_files"), [(0.05, 64), (0.3, 64), (0.6, 64), (1.0, 64), (2.0, 64),
                                                 (0.6, 4), (1.0, 4), (2.0, 4)])
def test_kill_at_any_moment_of_a_bulk_load_keeps_data_and_offsets_together(tmp_path: Path, delay: float,
                                                                          l0_files: int) -> None:
    _kill_during_bulk_load(tmp_path, delay, batches=60, l0_files=l0_files)
    first = _assert_consistent(tmp_path)
    _kill_during_bulk_load(tmp_path, delay, batches=60, l0_files=l0_files)  # resumes from what was durable
    assert _assert_consistent(tmp_path) >= first


def test_kill_during_the_compaction_after_a_bulk_load_keeps_the_load(tmp_path: Path) -> None:
    """The files a load left in L0 are merged after it ended: a crash then loses nothing the load made durable."""
    _kill_during_bulk_load(tmp_path, -1, batches=40)
    assert _assert_consistent(tmp_path) == 40 * BATCH
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store  # the merge starts over, and ends
    try:
        assert _wait_for(lambda: store.files_per_level()[0] < 4, 60), store.files_per_level()
    finally:
        store.close()
    assert _assert_consistent(tmp_path) == 40 * BATCH


def _wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _write_keys(store: TableStore, start: int, batches: int) -> int:
    done = start
    for _ in range(batches):
        write_records(store, {b"k%09d" % k: b"v" * 100 for k in range(done, done + BATCH)}, {0: done + BATCH})
        done += BATCH
    return done


def test_bulk_load_leaves_its_flushes_in_l0_and_they_are_merged_once_it_ends(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions(write_buffer_mb=1)).store
    store.begin_bulk_load()
    done = _write_keys(store, 0, 40)  # ~22 MB: a flush per MB
    assert _wait_for(lambda: store.files_per_level()[0] >= 10, 30), store.files_per_level()
    during = store.files_per_level()
    assert sum(during[1:]) == 0, f"compacted during the load: {during}"
    store.end_bulk_load()
    # Served again: the usual compaction merges the load's files in the background, and writes never wait for it.
    _write_keys(store, done, 1)
    assert _wait_for(lambda: store.files_per_level()[0] < 4, 60), store.files_per_level()
    assert sum(store.files_per_level()[1:]) > 0
    store.close()
    assert _assert_consistent(tmp_path) == done + BATCH


def test_a_load_beyond_the_l0_bound_compacts_during_the_load(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions(write_buffer_mb=1, bulk_l0_mb=4)).store
    store.begin_bulk_load()
    done = _write_keys(store, 0, 40)
    assert _wait_for(lambda: sum(store.files_per_level()[1:]) > 0, 30), store.files_per_level()
    store.end_bulk_load()
    store.close()
    assert _assert_consistent(tmp_path) == done


def test_bulk_load_end_makes_everything_durable_and_reopens_for_serving(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store
    store.begin_bulk_load()
    assert store.bulk
    write_records(store, {b"k%09d" % k: b"v" * 9 for k in range(1000)}, {0: 1000})
    with pytest.raises(StoreUnavailableError):  # nothing is durable yet, so no commit may claim it
        store.sync()
    store.end_bulk_load()
    assert not store.bulk and store.offsets() == {0: 1000}
    assert _assert_consistent(tmp_path) == 1000  # durable without the WAL: readers see the flushed files
    store.close()
