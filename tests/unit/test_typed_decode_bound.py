"""Issue 40 item 6: a decode batch is bounded in bytes as well as in count. Values each within ``max_items`` but
many to a batch (an Avro array of empty records: items of no bytes, some 64 bytes of Python each) used to stay
Python together until the whole 65,536-value batch was built into Arrow: about 60 MB a value at the default bound,
GBs a batch. Now the column is built every ``BUILD_UNITS`` (``Decoder.decode``) and ``build_table`` cuts its
batches at ``DECODE_BATCH_BYTES``; the file is the same whatever the cuts."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald import typed
from globald.settings.typed_spec import ValueFormat
from globald.typed import arrow, columnar
from globald.typed.arrow import Decoder, python_rows
from globald.typed.columnar import META, build_table
from tests.harness import REPO
from tests.unit.typed_fixtures import FIXTURES, varint

EMPTY_ITEMS = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"},
    {"name": "xs", "type": {"type": "array", "items": {"type": "record", "name": "Empty", "fields": []}}},
    {"name": "n", "type": "int"}]}


def decoder(tmp_path: Path, max_items: int = 1_000_000) -> Decoder:
    path = tmp_path / "s.avsc"
    path.write_text(json.dumps(EMPTY_ITEMS))
    return typed.load(ValueFormat(format="avro", schema=path, max_items=max_items), "tables[0].value")


def amplified(i: int, items: int) -> bytes:
    """A record of ``items`` empty records (one block, no bytes for them): ~64 bytes of Python an item."""
    return varint(i) + (varint(items) if items else b"") + b"\0" + varint(i)


def test_a_batch_of_amplifying_values_is_built_in_bounded_python(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """40 values of 10,000 items, the bound scaled down to 25,000 units (a value is 10,006): before, the batch
    held 400,000 dicts at once (~30 MB traced); now about three values' (~2 MB)."""
    monkeypatch.setattr(arrow, "BUILD_UNITS", 25_000, raising=False)
    dec = decoder(tmp_path, max_items=10_000)
    values = pa.array([amplified(i, 10_000) for i in range(40)], pa.binary())
    tracemalloc.start()
    try:
        decoded = dec.decode(values)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoded.error_count == 0 and len(decoded.values) == 40
    assert decoded.values.field("xs").value_lengths().to_pylist() == [10_000] * 40
    assert decoded.values.field("n").to_pylist() == list(range(40))
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MB of Python at once for one batch"


def test_a_value_that_does_not_fit_its_column_is_its_own_row_in_a_later_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The row-by-row fallback of a build that is not the batch's first names the batch's row, not the build's."""
    monkeypatch.setattr(arrow, "BUILD_UNITS", 40, raising=False)  # a build every 4 values or so
    dec = typed.load(ValueFormat(format="json", schema=FIXTURES / "customer.ddl"), "t")
    values = [b'{"id": %d}' % i for i in range(30)]
    values[17] = b'{"id": 17, "scores": {"x": 4294967296}}'
    decoded = dec.decode(pa.array(values, pa.binary()))
    errors = decoded.errors.to_pylist()
    assert [i for i, e in enumerate(errors) if e] == [17] and "does not fit the schema's type" in errors[17]
    assert [None if r is None else r["id"] for r in python_rows(decoded.values)] == [*range(17), None,
                                                                                      *range(18, 30)]


def mixed_content() -> list[tuple[bytes, bytes, int]]:
    """Good values of every size and undecodable ones (an int of a varint too long among them), spread over what
    become several batches and builds."""
    content = []
    for i in range(300):
        if i % 37 == 5:
            value = b"\x01garbage"
        elif i == 211:
            value = varint(i) + b"\0" + varint(1 << 40)  # n is an int: a varint of 6 bytes is refused
        else:
            value = amplified(i, (i * 997) % 3000)
        content.append((b"k%04d" % i, value, i))
    return content


def origins(keys: Any, values: Any, stamps: Any) -> list[tuple[int, int] | None]:
    return [(0, int(ts)) for ts in stamps]


def test_the_file_is_the_same_whatever_the_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dec = decoder(tmp_path)
    content = mixed_content()
    whole = build_table(iter(content), dec, {"snapshot": "1"}, origins=origins)
    errors = whole.column("error").to_pylist()
    assert sum(e is not None for e in errors) == 9 and "int varint" in errors[211]
    assert whole.column(columnar.ERROR_OFFSET).to_pylist()[211] == 211  # where each bad value came from
    # Batches of a few KB and builds of a few values: the same rows, the same errors, where they came from.
    monkeypatch.setattr(columnar, "DECODE_BATCH_BYTES", 20_000, raising=False)
    monkeypatch.setattr(arrow, "BUILD_UNITS", 5_000, raising=False)
    cut = build_table(iter(content), dec, {"snapshot": "1"}, origins=origins)
    cut.validate(full=True)
    assert cut.num_rows == whole.num_rows == len(content)
    assert cut.replace_schema_metadata(None).equals(whole.replace_schema_metadata(None))

    def meta(table: pa.Table) -> dict[str, Any]:
        return {k: v for k, v in json.loads(table.schema.metadata[META.encode()]).items() if k != "decode_s"}

    assert meta(cut) == meta(whole)


def test_batches_are_cut_by_bytes_as_well_as_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnar, "DECODE_BATCH_BYTES", 10_000)
    monkeypatch.setattr(columnar, "DECODE_BATCH", 50)
    sizes = [10, 3000, 9999, 20_000, 1, 1, 4000, 4000, 4000] + [10] * 120
    items = [(b"k%04d" % i, b"v" * n, i) for i, n in enumerate(sizes)]
    batches = list(columnar._batches(iter(items)))
    assert [item for batch in batches for item in batch] == items  # every record, in order
    for batch in batches:
        size = sum(len(k) + len(v) for k, v, _ in batch)
        assert len(batch) <= 50 and (size - len(batch[-1][0]) - len(batch[-1][1]) < 10_000), [len(b) for b in batches]
    assert [len(b) for b in batches] == [3, 1, 5, 50, 50, 20]


# The decode of a snapshot's batch as its own process does it (build_table), at the shipped bounds: values each at
# the default max_items (1M empty records, ~70 MB of Python apiece). The peak of Python's own allocations
# (tracemalloc), where the unbounded growth lived: the process's RSS was not a steady measure (267 MB in most runs,
# 458 and 670 MB in two loaded ones, the same code), the allocators' retention being the machine's.
MEASURED = """
import sys, tracemalloc
from pathlib import Path
from tests.unit.test_typed_decode_bound import amplified, decoder
from globald.typed.columnar import build_table
n = int(sys.argv[1])
dec = decoder(Path(sys.argv[2]))
tracemalloc.start(1)
table = build_table(((b"k%02d" % i, amplified(i, 1_000_000), i) for i in range(n)), dec, {})
assert table.num_rows == n and table.column("error").null_count == n, table.column("error")
print(tracemalloc.get_traced_memory()[1] // 2**20)
"""


# 9 s idle (several M Python objects decoded, traced), more under load: make test's budget is spent, so the long lane.
@pytest.mark.long
def test_a_decode_of_many_values_at_max_items_stays_in_bounded_memory(tmp_path: Path) -> None:
    """Measured in processes of their own: before, each more value at max_items kept its Python objects until the
    batch's end (6 values: about 4 x 70 MB over 2 values; 12 values: 850 MB); now the peak is one build's, however
    many values (159 MB for 3 and for 12)."""
    def peak_mb(n: int) -> int:
        (tmp_path / str(n)).mkdir()
        run = subprocess.run([sys.executable, "-c", MEASURED, str(n), str(tmp_path / str(n))], capture_output=True,
                             text=True, timeout=300, cwd=REPO)
        assert run.returncode == 0, run.stderr[-2000:]
        return int(run.stdout.split()[-1])

    few, many = peak_mb(2), peak_mb(6)
    assert many - few < 64, f"decoding 6 values at max_items peaked at {many} MB of Python, 2 values at {few} MB"
