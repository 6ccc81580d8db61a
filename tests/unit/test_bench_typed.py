"""The typed benchmark's own parts (``bench.spark_typed_join``, ``bench_memory``), without Spark or a broker:
the records it produces decode under globald's decoder exactly as the user's per-value decode reads them (else
the comparison would time two different outputs), and the /proc readers find this process's memory."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from bench.spark_memory import pyspark_workers, smaps_rollup
from bench.spark_typed_join import FIELDS, Format, key_of, lookups_of


@pytest.fixture(autouse=True)
def _typed_extra() -> None:
    """The decoders this module compares come with the [typed] extra: skip without it, fail in CI (tests/ci.py)."""
    from tests.ci import require_module

    require_module("fastavro", "typed")
    require_module("google.protobuf", "typed")


@pytest.mark.parametrize("name", ["avro", "protobuf"])
def test_both_sides_decode_the_same_records(tmp_path: Path, name: str) -> None:
    fmt = Format(name, tmp_path, 50)
    assert FIELDS >= 8 and len(fmt.items) == 50 and fmt.items[7][0] == key_of(7) and len(key_of(7)) == 16
    decoded = fmt.decoder.decode(pa.array([v for _, v, _ in fmt.items], pa.binary()))
    assert decoded.error_count == 0
    user = pa.array([fmt.user(v) for _, v, _ in fmt.items], fmt.decoder.arrow_type)
    assert decoded.values.equals(user)
    assert str(tmp_path) in fmt.section  # the config section points at the schema files written here


def test_lookups_hit_nine_in_ten() -> None:
    keys = lookups_of(1000, 10_000)
    hits = sum(int(k[5:]) < 1000 for k in keys)
    assert 8_700 < hits < 9_300


def test_memory_readers_see_this_process() -> None:
    mem = smaps_rollup(os.getpid())
    assert mem["rss"] >= mem["pss"] > 0
    assert smaps_rollup(2**31 - 1) == {}
    assert pyspark_workers() == ([], [])  # no Spark started by this test: no pyspark daemon among our children
