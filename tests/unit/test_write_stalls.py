"""Write stalls on the real RocksDB: a stalled write waits with the GIL released and gives up as a store fault.

The stall is made for real: two memtables of 64 KiB, flushed through a rate limiter of 32 KiB/s, so RocksDB holds
writes back for about two seconds each time both memtables are full.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from globald.errors import StoreIOError
from globald.store.failures import WRITE_STALL, write, write_options


def stalling_db(path: Path) -> Rdict:
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    o.set_write_buffer_size(64 << 10)
    o.set_max_write_buffer_number(2)
    o.set_ratelimiter(32 << 10, 100_000, 10)
    return Rdict(str(path), o)


def value(i: int) -> bytes:
    return random.Random(i).randbytes(1000)  # incompressible, so a flush writes all of it


def batch_of(i: int) -> WriteBatch:
    b = WriteBatch(raw_mode=True)
    b.put(i.to_bytes(8, "big"), value(i))
    return b


def stall(db: Rdict) -> int:
    """Write until RocksDB holds writes back (both memtables full, a flush under way); the batches that landed."""
    for landed in range(10_000):
        try:
            db.write(batch_of(landed), write_options(disable_wal=True))
        except Exception as e:
            assert WRITE_STALL in str(e), e
            return landed
    raise AssertionError("RocksDB never stalled")


def test_a_stall_that_lasts_becomes_a_store_fault_and_the_gil_stays_free(tmp_path: Path) -> None:
    db = stalling_db(tmp_path / "db")
    try:
        landed = stall(db)
        ticks = 0
        stop = threading.Event()

        def count() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                time.sleep(0.001)

        counter = threading.Thread(target=count)
        counter.start()
        started = time.monotonic()
        with pytest.raises(StoreIOError, match="held writes back"):
            write(db, batch_of(landed), write_options(disable_wal=True), "test write",
                  rebuild=lambda: batch_of(landed), patience=0.3)
        waited = time.monotonic() - started
        stop.set()
        counter.join()
        assert 0.3 <= waited < 1.5, waited
        # Another Python thread kept running throughout: the wait happened outside RocksDB, GIL released.
        assert ticks > 100, ticks
        assert db.get(landed.to_bytes(8, "big")) is None  # the refused batch left nothing behind
    finally:
        db.close()


def test_a_stall_that_clears_lets_the_write_land(tmp_path: Path) -> None:
    db = stalling_db(tmp_path / "db")
    try:
        landed = stall(db)
        rebuilt = 0

        def rebuild() -> WriteBatch:
            nonlocal rebuilt
            rebuilt += 1
            return batch_of(landed)

        started = time.monotonic()
        write(db, batch_of(landed), write_options(disable_wal=True), "test write", rebuild=rebuild, patience=30)
        assert time.monotonic() - started > 0.5  # it did wait for the flush
        assert db.get(landed.to_bytes(8, "big")) == value(landed)
        assert rebuilt >= 1  # rocksdict consumed the refused batch: the write that landed was made again
    finally:
        db.close()


def test_without_a_way_to_make_the_batch_again_a_stalled_write_fails(tmp_path: Path) -> None:
    db = stalling_db(tmp_path / "db")
    try:
        landed = stall(db)
        with pytest.raises(StoreIOError, match="cannot be made again"):
            write(db, batch_of(landed), write_options(disable_wal=True), "test write")
        assert db.get(landed.to_bytes(8, "big")) is None
    finally:
        db.close()


def test_other_errors_are_classified_at_once(tmp_path: Path) -> None:
    db = stalling_db(tmp_path / "db")
    db.close()
    started = time.monotonic()
    with pytest.raises(StoreIOError, match="test write") as raised:
        write(db, batch_of(1), write_options(), "test write")
    assert time.monotonic() - started < 1
    assert WRITE_STALL not in str(raised.value)
