"""The executor's per-batch lookup (globald.spark.batch), by batched multi-get and by in-memory index
(globald.spark.memindex), against per-key lookups of the same data: values, timestamps, absent and null keys, string
and binary keys, pandas Series."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from globald.spark.batch import Columns, MultiGet, lookup_arrow, lookup_pandas, split_stored
from globald.spark.memindex import MemoryIndex
from globald.store.codec import decode_value, encode_value

RND = random.Random(5)
TABLE = {b"key-%012d" % i: encode_value(RND.randrange(-1, 2**62), RND.randbytes(RND.randrange(0, 40)))
         for i in range(300)}
TABLE["ключ-ü".encode()] = encode_value(-1, b"")  # a UTF-8 key, an empty value, no timestamp
FETCHES: list[list[bytes]] = []


def fetch(keys: list[bytes]) -> list[bytes | None]:
    FETCHES.append(keys)
    assert all(isinstance(k, bytes) for k in keys)  # null keys never reach the store
    return [TABLE.get(k) for k in keys]


def _index() -> MemoryIndex:
    index = MemoryIndex.load(((k, *decode_value(v)) for k, v in TABLE.items()), budget=1 << 20)
    assert index is not None and len(index) == len(TABLE)
    return index


LOOKUPS: dict[str, Columns] = {"multi_get": MultiGet(fetch), "memory_index": _index().lookup}


def expected(keys: list[bytes | None]) -> tuple[list[bytes | None], list[int | None]]:
    found = [None if k is None or k not in TABLE else decode_value(TABLE[k]) for k in keys]
    return [None if f is None else f[0] for f in found], [None if f is None else f[1] for f in found]


def probe(n: int, nulls: bool) -> list[bytes | None]:
    keys: list[bytes | None] = [*TABLE]
    out: list[bytes | None] = []
    for _ in range(n):
        r = RND.random()
        out.append(None if nulls and r < 0.1 else b"absent-%d" % RND.randrange(99) if r < 0.3 else RND.choice(keys))
    return out


@pytest.mark.parametrize("path", LOOKUPS)
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("kind", ["binary", "string", "large_string", "large_binary"])
def test_batch_lookup_equals_per_key_lookups(kind: str, nulls: bool, path: str) -> None:
    keys = probe(2_000, nulls)
    typ = getattr(pa, kind)()
    column = pa.array([None if k is None else (k.decode() if "string" in kind else k) for k in keys], typ)
    FETCHES.clear()
    value, ts = lookup_arrow(LOOKUPS[path], column)
    assert value.type == pa.binary() and ts.type == pa.int64()
    value.validate(full=True)
    ts.validate(full=True)
    assert (value.to_pylist(), ts.to_pylist()) == expected(keys)
    if path == "multi_get":
        assert len(FETCHES) == 1 and len(FETCHES[0]) == sum(k is not None for k in keys)  # one multi-get per batch


@pytest.mark.parametrize("path", LOOKUPS)
def test_sliced_chunked_all_null_and_empty_columns(path: str) -> None:
    fetch = LOOKUPS[path]
    keys = probe(500, nulls=True)
    arr = pa.array(keys, pa.binary())
    value, ts = lookup_arrow(fetch, arr.slice(123, 200))  # a non-zero array offset
    assert (value.to_pylist(), ts.to_pylist()) == expected(keys[123:323])
    chunked = pa.chunked_array([arr.slice(0, 100), arr.slice(100)])
    assert lookup_arrow(fetch, chunked)[0].to_pylist() == expected(keys)[0]
    for column in (pa.nulls(7, pa.string()), pa.nulls(7), pa.array([], pa.binary()),
                   pa.array([b"absent-1"] * 5, pa.binary())):
        value, ts = lookup_arrow(fetch, column)
        assert value.to_pylist() == [None] * len(column) and ts.to_pylist() == [None] * len(column)
    with pytest.raises(TypeError):
        lookup_arrow(fetch, pa.array([1, 2]))


def test_a_stored_value_shorter_than_its_timestamp_is_refused() -> None:
    with pytest.raises(ValueError):
        split_stored(pa.array([encode_value(1, b"x"), b"short"], pa.binary()))


@pytest.mark.parametrize("path", LOOKUPS)
@pytest.mark.parametrize("as_str", [True, False])
def test_pandas_lookup(as_str: bool, path: str) -> None:
    fetch = LOOKUPS[path]
    keys = probe(1_000, nulls=True)
    series = pd.Series([None if k is None else (k.decode() if as_str else k) for k in keys], dtype=object)
    if as_str:
        series[3] = float("nan")  # pandas' own null marker
        keys[3] = None
    out = lookup_pandas(fetch, series)
    want_values, want_ts = expected(keys)
    assert [None if pd.isna(v) else v for v in out["value"]] == want_values
    assert str(out["value"].dtype) == "binary[pyarrow]" and str(out["timestamp"].dtype) == "int64[pyarrow]"
    assert out.index.equals(series.index)
    assert [None if pd.isna(t) else int(t) for t in out["timestamp"]] == want_ts
    # str and bytes (not UTF-8) mixed in one Series: each looked up as its bytes.
    mixed = lookup_pandas(MultiGet(lambda ks: [b"\0" * 8 + k for k in ks]),
                          pd.Series(["ü", b"\xff", None], dtype=object))
    assert [None if pd.isna(v) else v for v in mixed["value"]] == ["ü".encode(), b"\xff", None]
    with pytest.raises(TypeError):
        lookup_pandas(fetch, pd.Series([1.5, 2.5]))


def test_memory_index_refuses_content_over_its_budget_and_serves_an_empty_table() -> None:
    items = [(k, *decode_value(v)) for k, v in TABLE.items()]
    size = sum(len(k) + len(v) for k, v, _ in items)
    assert MemoryIndex.load(iter(items), budget=size) is None  # the per-entry overhead does not fit
    empty = MemoryIndex.load(iter([]), budget=0)
    assert empty is not None and len(empty) == 0
    value, ts = empty.lookup(pa.array([b"a", None], pa.binary()))
    assert value.to_pylist() == [None, None] and ts.to_pylist() == [None, None]


def test_memory_index_confirms_the_bytes_behind_a_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that shares a stored key's hash is still absent; a table whose keys share hashes keeps its keys."""
    from globald.spark import memindex

    def first_byte(keys: pa.Array) -> np.ndarray:  # a deliberately weak hash: collisions on purpose
        return np.array([k[0] if k else 0 for k in keys.to_pylist()], np.uint64)

    monkeypatch.setattr(memindex, "_hash", first_byte)
    distinct = MemoryIndex([b"apple", b"banana"], pa.array([b"1", b"2"]), np.array([10, 20], np.int64))
    value, ts = distinct.lookup(pa.array([b"avocado", b"banana", b"apple", None, b"b"], pa.binary()))
    assert value.to_pylist() == [None, b"2", b"1", None, None] and ts.to_pylist() == [None, 20, 10, None, None]
    shared = MemoryIndex([b"apple", b"avocado"], pa.array([b"1", b"2"]), np.array([10, 20], np.int64))
    value, ts = shared.lookup(pa.array([b"avocado", b"apricot", b"apple"], pa.binary()))
    assert value.to_pylist() == [b"2", None, b"1"] and ts.to_pylist() == [20, None, 10]
