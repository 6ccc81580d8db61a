"""Write stalls on the real RocksDB: a stalled write waits with the GIL released and gives up as a store fault.

The stall is made for real: two memtables of 64 KiB, flushed through a rate limiter of 128 KiB/s, so RocksDB holds
writes back for about half a second each time both memtables are full.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from globald.common.errors import StoreIOError
from globald.store.stalls import STALLS
from globald.store.writes import WRITE_STALL, write, write_options


def stalling_db(path: Path) -> Rdict:
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    o.set_write_buffer_size(64 << 10)
    o.set_max_write_buffer_number(2)
    o.set_ratelimiter(128 << 10, 100_000, 10)
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
                  rebuild=lambda: batch_of(landed), patience=0.1)
        waited = time.monotonic() - started
        stop.set()
        counter.join()
        assert 0.1 <= waited < 10, waited  # it gave up once its patience ran out, not before, not never
        # Another Python thread kept running throughout: the wait happened outside RocksDB, GIL released.
        assert ticks > 30, ticks
        assert db.get(landed.to_bytes(8, "big")) is None  # the refused batch left nothing behind
    finally:
        db.close()


def test_a_write_that_finds_writes_held_back_waits_before_writing(tmp_path: Path) -> None:
    db = stalling_db(tmp_path / "db")
    try:
        landed = stall(db)
        before = replace(STALLS)
        # No way to make the batch again is needed: the write is not attempted until RocksDB lets writes through.
        write(db, batch_of(landed), write_options(disable_wal=True), "test write", patience=30)
        assert db.get(landed.to_bytes(8, "big")) == value(landed)
        assert STALLS.waited == before.waited + 1 and STALLS.seconds > before.seconds
    finally:
        db.close()


def test_writes_refused_inside_rocksdb_are_made_again_and_all_land(tmp_path: Path) -> None:
    """A write can start while RocksDB lets writes through and be refused inside, where the memtable it filled is
    switched out and the unflushed ones reach the limit: that batch is consumed, and is made again."""
    db = stalling_db(tmp_path / "db")
    before = replace(STALLS)
    try:
        for i in range(300):
            write(db, batch_of(i), write_options(disable_wal=True), "test write",
                  rebuild=lambda i=i: batch_of(i), patience=30)  # type: ignore[misc]
        assert all(db.get(i.to_bytes(8, "big")) == value(i) for i in range(300))
        assert STALLS.remade > before.remade, STALLS
    finally:
        db.close()


def test_other_errors_are_classified_at_once(tmp_path: Path) -> None:
    db = stalling_db(tmp_path / "db")
    db.close()
    started = time.monotonic()
    with pytest.raises(StoreIOError, match="test write") as raised:
        write(db, batch_of(1), write_options(), "test write")
    assert time.monotonic() - started < 5  # no wait for room: the error is not a stall
    assert WRITE_STALL not in str(raised.value)
