"""Write stalls on the real RocksDB: a stalled write waits with the GIL released and gives up as a store fault.

The stall is made for real: two memtables of 64 KiB, flushed through a rate limiter of 128 KiB/s, so RocksDB holds
writes back for about half a second each time both memtables are full.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from globald.common.errors import StoreIOError
from globald.store import writes
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
    """The write gives up once its patience runs out, and another Python thread runs while it waits: a wait inside
    RocksDB would hold the GIL through it. Whether the other thread got a turn in a 0.1 s window is up to the
    scheduler of a loaded machine, so the stall is made again until it has (never, if the GIL is held)."""
    db = stalling_db(tmp_path / "db")
    try:
        for _attempt in range(20):
            landed = stall(db)
            ticks: list[float] = []
            stop = threading.Event()

            def count(ticks: list[float] = ticks, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    ticks.append(time.monotonic())
                    time.sleep(0.001)

            counter = threading.Thread(target=count)
            counter.start()
            started = time.monotonic()
            with pytest.raises(StoreIOError, match="held writes back"):
                write(db, batch_of(landed), write_options(disable_wal=True), "test write",
                      rebuild=lambda landed=landed: batch_of(landed), patience=0.1)  # type: ignore[misc]
            ended = time.monotonic()
            stop.set()
            counter.join()
            assert 0.1 <= ended - started < 10, ended - started  # it gave up once its patience ran out, not before
            assert db.get(landed.to_bytes(8, "big")) is None  # the refused batch left nothing behind
            marks = [started, *(at for at in ticks if started < at < ended), ended]
            if max(b - a for a, b in itertools.pairwise(marks)) < (ended - started) / 2:
                break  # another thread ran throughout the write's wait: it waited outside RocksDB, GIL released
        else:
            raise AssertionError("no other Python thread ran throughout a stalled write's wait, in 20 stalls")
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


def test_writes_refused_inside_rocksdb_are_made_again_and_all_land(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A write can start while RocksDB lets writes through and be refused inside, where the memtable it filled is
    switched out and the unflushed ones reach the limit: that batch is consumed, and is made again. The race is
    made certain: RocksDB really holds writes back, and the write's first look at its controller is told it
    does not (as when the controller changes its mind between the look and the write)."""
    db = stalling_db(tmp_path / "db")
    landed = stall(db)
    looks = 0
    real = writes._held_back

    def first_look_misses(db: Rdict, context: str) -> bool:
        nonlocal looks
        looks += 1
        return False if looks == 1 else real(db, context)

    monkeypatch.setattr(writes, "_held_back", first_look_misses)
    before = replace(STALLS)
    try:
        for i in range(landed, landed + 300):
            write(db, batch_of(i), write_options(disable_wal=True), "test write",
                  rebuild=lambda i=i: batch_of(i), patience=30)  # type: ignore[misc]
        assert all(db.get(i.to_bytes(8, "big")) == value(i) for i in range(landed + 300))
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
