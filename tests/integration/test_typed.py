"""Typed tables end to end: a real broker, the real daemon, real RocksDB. Avro values with Confluent framing under
two writer schemas (ids 1 and 2) and a few bad records; ``globald dump --decode`` and ``get --decode`` and the
columnar file beside a real snapshot all equal fastavro's own decode of the oracle fold at the offsets they read."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from globald.settings.config import load
from globald.snapshot.reader import open_snapshot
from globald.typed import load_table
from globald.typed.arrow import python_rows
from globald.typed.columnar import ensure_columnar
from tests.harness import Broker, DaemonProcess, globald
from tests.support.oracle import fold, fold_located
from tests.unit.typed_fixtures import FIXTURES, avro_payload, avro_schema, confluent, customer_v1, customer_v2

pytestmark = pytest.mark.kafka

WRITERS = {1: avro_schema("ids/1.avsc"), 2: avro_schema("ids/2.avsc")}
READER = avro_schema("customer_reader.avsc")
SECTION = """[tables.value]
format = "avro"
schema = "schemas/customer_reader.avsc"
framing = "confluent"
writer_schemas = "schemas/ids"
"""


# One Python worker of the host: the table's current snapshot, through its columnar file.
WORKER = """
import json, os, sys
from globald.settings.config import load
from globald.snapshot.reader import open_snapshot
from globald.typed import load_table
from globald.typed.columnar import ensure_columnar
cfg = load(sys.argv[1])
with open_snapshot(cfg.state_dir, "cust") as snap:
    table = ensure_columnar(snap, load_table(cfg, "cust")[1])
print(json.dumps({"path": str(table.path), "inode": os.stat(table.path).st_ino}))
"""


def records(n: int, keys: int, seed: int) -> list[tuple[bytes, bytes | None]]:
    rnd = random.Random(seed)
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(n):
        key = b"cust-%04d" % rnd.randrange(keys)
        roll = rnd.random()
        if roll < 0.05:
            out.append((key, None))
        elif roll < 0.08:  # bad records: an unknown schema id, a truncated payload
            good = avro_payload("customer_v2.avsc", customer_v2(i))
            out.append((key, confluent(9, good) if roll < 0.065 else confluent(2, good[:-3])))
        elif roll < 0.5:
            out.append((key, confluent(1, avro_payload("customer_v1.avsc", customer_v1(i)))))
        else:
            out.append((key, confluent(2, avro_payload("customer_v2.avsc", customer_v2(i)))))
    return out


def reference(value: bytes, reader: Any = READER) -> dict[str, Any] | None:
    """fastavro itself: the writer schema the header names, resolved to ``reader``; None where it cannot."""
    writer = WRITERS.get(int.from_bytes(value[1:5], "big"))
    if writer is None:
        return None
    buf = io.BytesIO(value[5:])
    try:
        record = fastavro.schemaless_reader(buf, writer, reader)
    except (EOFError, IndexError):
        return None
    return record if buf.tell() == len(value) - 5 else None  # type: ignore[return-value]


def as_json(v: Any) -> Any:
    """The documented JSON form: ISO 8601 dates and timestamps, decimals as strings."""
    if isinstance(v, dict):
        return {k: as_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [as_json(x) for x in v]
    if isinstance(v, dt.date | dt.datetime):
        return v.isoformat()
    return str(v) if isinstance(v, decimal.Decimal) else v


def test_dump_get_and_columnar_decode_equal_fastavro_on_the_oracle_fold(
        broker: Broker, topic: Callable[..., str], daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, records(1_500, keys=400, seed=24))
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    d = daemon({"cust": t}, start=False)
    d.config.write_text(d.config.read_text() + SECTION)  # the [[tables]] entry is the file's last
    d.start()
    d.wait_running({"cust": broker.admin.end_offsets(t)})

    r = globald("dump", "--config", str(d.config), "--table", "cust", "--decode", "--json")
    assert r.returncode == 0, r.stderr
    offsets = {int(p): o for p, o in json.loads(r.stderr.strip().splitlines()[-1])["offsets"].items()}
    oracle = fold(broker.settings, t, offsets)
    dumped = [json.loads(line) for line in r.stdout.splitlines()]
    assert [doc["key"].encode() for doc in dumped] == sorted(oracle)
    bad = 0
    for doc in dumped:
        expected = reference(oracle[doc["key"].encode()])
        assert doc["value"] == as_json(expected), doc["key"]
        assert ("error" in doc) == (expected is None), doc
        bad += expected is None
    assert bad and bad < len(dumped)  # the topic's last values include bad ones, and they cost only a null

    good_key = next(doc["key"] for doc in dumped if "error" not in doc)
    g = globald("get", "--config", str(d.config), "--table", "cust", "--decode", "--json", good_key)
    assert g.returncode == 0, g.stderr
    assert json.loads(g.stdout)["value"] == as_json(reference(oracle[good_key.encode()]))
    assert json.loads(g.stdout)["origin"] is None  # only a value that does not decode is located

    # A value that does not decode is named by the partition and offset of the record it came from.
    located = fold_located(broker.settings, t, offsets)
    for bad_key in [doc["key"] for doc in dumped if "error" in doc][:3]:
        g = globald("get", "--config", str(d.config), "--table", "cust", "--decode", "--json", bad_key)
        assert g.returncode == 0, g.stderr
        got = json.loads(g.stdout)
        _, _, partition, offset = located[bad_key.encode()]
        assert (got["value"], got["origin"]) == (None, {"partition": partition, "offset": offset}), got
        assert got["error"]

    # The columnar file of the current snapshot: three workers at once, one decodes and the others map its file.
    _, value_decoder = load_table(load(d.config), "cust")
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(d.config)], stdout=subprocess.PIPE, text=True)
               for _ in range(3)]
    seen = [json.loads(w.communicate(timeout=120)[0]) for w in workers]
    assert len({(doc["path"], doc["inode"]) for doc in seen}) == 1, seen  # one file, never replaced by a second
    with open_snapshot(d.state_dir, "cust") as snap:
        at_snapshot = fold(broker.settings, t, snap.offsets)
        first = ensure_columnar(snap, value_decoder)
        assert first.path is not None and first.path.parent == snap.table_dir / snap.id
        written = first.path.stat().st_mtime_ns
        again = ensure_columnar(snap, value_decoder)
        assert again.path == first.path and first.path.stat().st_mtime_ns == written
    asked = [*sorted(at_snapshot), b"cust-absent"]
    found = again.lookup(pa.array(asked, pa.binary()))
    assert python_rows(found.values) == [reference(at_snapshot[k]) if k in at_snapshot else None for k in asked]
    assert found.error_count == sum(reference(v) is None for v in at_snapshot.values()) == again.error_count
