"""Bulk loads (WAL off) on the real RocksDB: a process killed at any moment leaves data and offsets together."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from globald.errors import StoreUnavailableError
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore

BATCH = 5_000

# Writes batches whose offset is the number of keys written so far, then ends the bulk load; a timer thread
# kills the process (os._exit skips every close and flush) after the given delay.
WRITER = textwrap.dedent(f"""
    import os, sys, threading, time
    from pathlib import Path
    from globald.store.options import StoreOptions
    from globald.store.table_store import TableStore

    state, delay, batches = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    threading.Thread(target=lambda: (time.sleep(delay), os._exit(9)), daemon=True).start()
    store = TableStore.open(state, "tbl", "topic", StoreOptions(write_buffer_mb=2)).store
    store.begin_bulk_load()
    done = store.offsets().get(0, 0)
    for i in range(batches):
        batch = store.new_batch()
        for k in range(done, done + {BATCH}):
            batch.put(b"k%09d" % k, b"v" * 100)
        done += {BATCH}
        store.put_offsets(batch, {{0: done}})
        store.write(batch)
        if i % 7 == 0:
            store.estimate_keys()
    store.end_bulk_load()
    time.sleep(30)
""")


def _kill_during_bulk_load(state: Path, delay: float, batches: int) -> None:
    proc = subprocess.run([sys.executable, "-c", WRITER, str(state), str(delay), str(batches)], timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr


def _assert_consistent(state: Path) -> int:
    """The durable store holds exactly the keys below its offset: never data without offsets, nor the reverse."""
    with StoreReader(state / "tables" / "tbl" / "db") as r:
        offset = r.offsets().get(0, 0)
        keys = [k for k, _, _ in r.items()]
    assert keys == [b"k%09d" % i for i in range(offset)]
    return offset


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.6, 1.0, 2.0])
def test_kill_at_any_moment_of_a_bulk_load_keeps_data_and_offsets_together(tmp_path: Path, delay: float) -> None:
    _kill_during_bulk_load(tmp_path, delay, batches=60)
    first = _assert_consistent(tmp_path)
    _kill_during_bulk_load(tmp_path, delay, batches=60)  # resumes from what was durable, killed again
    assert _assert_consistent(tmp_path) >= first


def test_bulk_load_end_makes_everything_durable_and_reopens_for_serving(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path, "tbl", "topic", StoreOptions()).store
    store.begin_bulk_load()
    assert store.bulk
    batch = store.new_batch()
    for k in range(1000):
        batch.put(b"k%09d" % k, b"v" * 9)
    store.put_offsets(batch, {0: 1000})
    store.write(batch)
    with pytest.raises(StoreUnavailableError):  # nothing is durable yet, so no commit may claim it
        store.sync()
    store.end_bulk_load()
    assert not store.bulk and store.offsets() == {0: 1000}
    assert _assert_consistent(tmp_path) == 1000  # durable without the WAL: readers see the flushed files
    store.close()
