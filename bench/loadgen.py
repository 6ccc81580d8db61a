"""Steady produce load for the freshness benchmark, run as its own process (``python -m bench.loadgen``).

Every value starts with the CLOCK_MONOTONIC time of its ``produce()`` call (8 bytes, nanoseconds), which the
kernel shares between processes; the delivery reports give each record's partition and offset. The triples
(partition, offset, produced_ns) are written to ``--out`` as native 64-bit integers.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import time
from array import array
from typing import Any

from confluent_kafka import Producer

_NS = struct.Struct(">q")


def run(settings: dict[str, Any], topic: str, rate: int, seconds: float, keys: int, out: str) -> int:
    producer = Producer({**settings, "linger.ms": 5, "log_level": 3, "queue.buffering.max.messages": 1_000_000})
    sent = array("q")
    failed = 0

    def delivered(err: Any, msg: Any) -> None:
        nonlocal failed
        if err is not None:
            failed += 1
            return
        sent.extend((msg.partition(), msg.offset(), _NS.unpack_from(msg.value())[0]))

    rnd = random.Random(7)
    filler = rnd.randbytes(92)
    tick = 0.01
    per_tick = rate * tick
    owed = 0.0
    start = time.monotonic()
    next_tick = start
    while next_tick - start < seconds:
        owed += per_tick
        while owed >= 1:
            owed -= 1
            key = b"fresh-%010d" % rnd.randrange(keys)
            producer.produce(topic, key=key, value=_NS.pack(time.monotonic_ns()) + filler, on_delivery=delivered)
        producer.poll(0)
        next_tick += tick
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    producer.flush(60)
    with open(out, "wb") as f:
        sent.tofile(f)
    return failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--settings", required=True, help="client settings as JSON")
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=int, required=True, help="records per second")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    failed = run(json.loads(a.settings), a.topic, a.rate, a.seconds, a.keys, a.out)
    if failed:
        raise SystemExit(f"{failed} records were not delivered")


if __name__ == "__main__":
    main()
