"""The benchmark data set: 16-byte keys, 100-byte values, 50 % overwrites (5 % of all records tombstones).

Records are generated lazily from a seed, so a 10M-record topic never sits in the benchmark's memory, and the
same seed always gives the same topic. Half of the records introduce a new key; 45 % overwrite a random earlier
key with a new value and 5 % delete one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.admin import Record, TopicAdmin

KEY_SIZE = 16
VALUE_SIZE = 100
NEW_KEY_SHARE = 0.50
TOMBSTONE_SHARE = 0.05


def records(n: int, seed: int = 42) -> Iterator[Record]:
    rnd = random.Random(seed)
    pool = rnd.randbytes(1 << 20)
    span = len(pool) - VALUE_SIZE
    keys = 0
    for _ in range(n):
        r = rnd.random()
        if r < NEW_KEY_SHARE or keys == 0:
            k = keys
            keys += 1
        else:
            k = rnd.randrange(keys)
        key = b"key-%012d" % k
        if NEW_KEY_SHARE <= r < NEW_KEY_SHARE + TOMBSTONE_SHARE:
            yield key, None
        else:
            off = rnd.randrange(span)
            yield key, pool[off:off + VALUE_SIZE]


@dataclass(frozen=True)
class Dataset:
    topic: str
    produced: int
    produce_seconds: float
    offsets: dict[int, tuple[int, int]]  # partition -> (log start, log end) right after producing
    seed: int = 42  # records(produced, seed) gives the topic's records again

    @property
    def in_log(self) -> int:
        """Records between log start and end: what a restore reads unless the cleaner removed some."""
        return sum(hi - lo for lo, hi in self.offsets.values())

    @property
    def ends(self) -> dict[int, int]:
        return {p: hi for p, (_, hi) in self.offsets.items()}


def create(admin: TopicAdmin, topic: str, n: int, partitions: int = 3, seed: int = 42) -> Dataset:
    """Create a compacted topic and fill it as fast as the producer goes (the cleaner has no time to act)."""
    admin.create(topic, partitions=partitions, compact=True)
    started = time.monotonic()
    produced = admin.produce(topic, records(n, seed))
    took = time.monotonic() - started
    return Dataset(topic=topic, produced=produced, produce_seconds=took, offsets=admin.watermarks(topic),
                   seed=seed)
