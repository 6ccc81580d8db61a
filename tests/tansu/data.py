"""Records with explicit CreateTime timestamps, headers, binary keys, tombstones and null keys, and waits that watch
the data (the store's content against the oracle), never a watermark: Tansu's are wrong."""

from __future__ import annotations

import random
import time

from globald.embedded.admin import TimedRecord
from tests.harness import DaemonProcess
from tests.support.oracle import TimestampedTable

BASE_TS = 1_700_000_000_000  # 2023-11-14: far from the wall clock, so a producer- or broker-set time cannot pass


def timed_records(n: int, keys: int, seed: int, base_ts: int = BASE_TS, tombstones: float = 0.1,
                  null_keys: float = 0.02) -> list[TimedRecord]:
    """``n`` records; every other key is binary (NUL, 0xff, invalid UTF-8), a third carry headers, and timestamps
    wander backwards as well as forwards (the last record by offset wins, never the newest timestamp)."""
    rnd = random.Random(seed)
    out: list[TimedRecord] = []
    for i in range(n):
        ts = base_ts + i * 1_000 + rnd.randrange(-5_000, 5_000)
        headers = [("trace", rnd.randbytes(8)), ("source", b"tests")] if i % 3 == 0 else None
        if rnd.random() < null_keys:
            out.append((None, b"null-key-%d" % i, ts, headers))
            continue
        k = rnd.randrange(keys)
        key = b"\x00\xff" + k.to_bytes(4, "big") + b"\xc3" if k % 2 else b"key-%06d" % k
        value = None if rnd.random() < tombstones else (b"v%d-" % i) + rnd.randbytes(rnd.randrange(0, 40))
        out.append((key, value, ts, headers))
    return out


def expected_table(records: list[TimedRecord], table: TimestampedTable | None = None) -> TimestampedTable:
    """The fold of ``records`` in production order (one producer: each partition keeps that order), with the
    timestamps they were produced with."""
    out = dict(table or {})
    for key, value, ts, _ in records:
        if key is None:
            continue
        if value is None:
            out.pop(key, None)
        else:
            assert ts is not None
            out[key] = (value, ts)
    return out


def wait_for_table(d: DaemonProcess, table: str, want: TimestampedTable, timeout: float = 60.0,
                   snapshot: str | None = None) -> None:
    """Until ``globald dump`` (values and timestamps) equals ``want``; ``snapshot`` dumps that snapshot."""
    deadline = time.monotonic() + timeout
    got: dict[bytes, tuple[bytes, int]] = {}
    while time.monotonic() < deadline:
        try:
            got = d.dump(table, snapshot)
        except AssertionError as e:  # exit 3 until the daemon has a first consistent version to serve
            if "no consistent version" not in str(e):
                raise
        if got == want:
            return
        time.sleep(0.2)
    wrong = [(k, got.get(k), want[k]) for k in want if got.get(k) != want[k]][:3]
    extra = [k for k in got if k not in want][:3]
    raise AssertionError(f"{table}: {len(got)} keys, {len(want)} wanted; differing (key, got, want) {wrong}, "
                         f"unexpected {extra}; log:\n{d.tail()}")
