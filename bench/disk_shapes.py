"""The churn load on the store alone, to compare compaction shapes: ``python -m bench.disk_shapes [JSON] ...``.

Each JSON argument is a try: ``StoreOptions`` fields (``level_base_mb``, ``target_file_mb``, ``l0_trigger``, ...)
and ``retain``; ``{}`` is the defaults. The store is driven as the daemon drives it, without Kafka: a bulk-load
restore of ``bench.disk``'s churn records, settled, then ``CHURN_RATE`` updates/s over the same keys for
``CHURN_SECONDS`` with a checkpoint a second, the ``retain`` newest kept. The directory is measured every 0.2 s,
each inode once; write amplification from RocksDB's event log against the user bytes. The daemon's own figure
(with its disk guard, which republishes a CURRENT left holding old files) is ``bench.disk.churn``'s.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from bench.disk import CHURN_RATE, CHURN_RECORDS, CHURN_SECONDS, MB, amplification, churn_records, state_bytes
from globald.store.names import db_dir
from globald.store.options import StoreOptions
from globald.store.table_store import TableStore

TABLE = "tbl"


def settle(st: TableStore, root: Path, quiet_s: float = 5.0) -> None:
    last: list[str] | None = None
    since = time.monotonic()
    while time.monotonic() - since < quiet_s:
        names = sorted(p.name for p in db_dir(root, TABLE).glob("*.sst"))
        if names != last:
            last, since = names, time.monotonic()
        st.offsets()  # the compaction gate and shape are looked at here, as in the daemon
        time.sleep(0.2)


def one(root: Path, variant: dict[str, Any]) -> dict[str, Any]:
    retain = int(variant.pop("retain", 3))
    names = {f.name for f in fields(StoreOptions)}
    st = TableStore.open(root, TABLE, "t", StoreOptions(**{k: v for k, v in variant.items() if k in names})).store
    st.begin_bulk_load()
    source = churn_records(CHURN_RECORDS, seed=33)
    off = 0
    while off < CHURN_RECORDS:
        b = st.new_batch()
        for k, v in (next(source) for _ in range(5000)):
            b.put(k, v)
        off += 5000
        st.put_offsets(b, {0: off})
        st.write(b, rebuild=None)  # a write held back fails the try, loudly
    st.end_bulk_load()
    settle(st, root)
    live = state_bytes(db_dir(root, TABLE))
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(state_bytes(root))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    snaps = root / "snapshots"
    snaps.mkdir()
    since, user, n = int(time.time() * 1e6), 0, 0
    updates = churn_records(int(CHURN_RATE * CHURN_SECONDS), seed=34)
    start = time.monotonic()
    for tick in range(int(CHURN_SECONDS * 10)):
        b = st.new_batch()
        for k, v in (next(updates) for _ in range(CHURN_RATE // 10)):
            b.put(k, v)
            user += len(k) + len(v)
        off += CHURN_RATE // 10
        st.put_offsets(b, {0: off})
        st.write(b, rebuild=None)
        if tick % 10 == 9:
            n += 1
            st.checkpoint(snaps / f"{n:06d}")
            for old in sorted(snaps.iterdir())[:-retain]:
                shutil.rmtree(old)
        time.sleep(max(0.0, start + (tick + 1) / 10 - time.monotonic()))
    settle(st, root, quiet_s=3.0)
    stop.set()
    sampler.join()
    out = {"live_mb": round(live / MB, 1), "live_mb_at_end": round(state_bytes(db_dir(root, TABLE)) / MB, 1),
           "peak_mb": round(max(samples) / MB, 1), "peak_x_live": round(max(samples) / live, 2),
           "levels": st.files_per_level(), **amplification(db_dir(root, TABLE) / "LOG", since, user)}
    st.close()
    return out


def main(argv: list[str]) -> None:
    for arg in argv or ["{}"]:
        root = Path(tempfile.mkdtemp(prefix="globald-disk-shapes-"))
        try:
            print(json.dumps({"try": json.loads(arg), **one(root, json.loads(arg))}), flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
