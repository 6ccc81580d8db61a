"""``python -m tests.measure_upgrade [N]``: how fast plain values move to the timestamped layout.

Builds a plain store of N values of 100 bytes (``tests.layouts``), opens it as the daemon does, runs the background
pass in the daemon's 20 ms slices until done and prints the rate, the slowest slice and the final compaction.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from globald.engine.background_upgrade import UPGRADE_SLICE_SECONDS
from globald.store.names import db_dir
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore
from tests.layouts import write_plain_store


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        state = Path(d)
        write_plain_store(db_dir(state, "tbl"), {b"key-%010d" % i: os.urandom(100) for i in range(n)})
        store = TableStore.open(state, "tbl", "topic", StoreOptions()).store
        migration = store._migration
        assert migration is not None
        slices, worst, started = 0, 0.0, time.perf_counter()
        while True:
            t = time.perf_counter()
            if migration.step(UPGRADE_SLICE_SECONDS):
                break
            worst, slices = max(worst, time.perf_counter() - t), slices + 1
        took = time.perf_counter() - started
        t = time.perf_counter()
        assert store.upgrade_step(UPGRADE_SLICE_SECONDS)  # records the upgrade and compacts the default family
        finish = time.perf_counter() - t
        store.close()
    print(f"{n} plain values moved in {took:.2f}s ({n / took:,.0f}/s), {slices} slices, slowest "
          f"{worst * 1000:.1f} ms; final record + compaction {finish:.2f}s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500_000)
