"""The lineage record (globald.spark.lineage): what each read keeps, its bound, and the kinds it takes."""

from __future__ import annotations

import pytest

from globald.spark import lineage
from globald.spark.lineage import Lineage


def desc(seq: int, snapshot: str | None = "s-1", **more: object) -> dict[str, object]:
    return {"table": "rates", "topic": "fx", "seq": seq, "snapshot": snapshot, "offsets": {"0": 5, "1": 7},
            "exact": True, **more}


def test_a_read_keeps_what_a_rerun_needs_and_its_json_matches_the_descriptor() -> None:
    book = Lineage()
    read = book.record(desc(3, decoder="fp-1"), "join", observe=True)
    assert read.offsets == {0: 5, 1: 7} and read.snapshot == "s-1" and read.seq == 3 and read.exact is True
    assert read.observation is not None and read.observation.startswith("globald:rates:") and read.declaration == "fp-1"
    # unique across views: one query may join two views of a table, and Spark refuses two observations of one name
    assert Lineage().record(desc(3), "join", observe=True).observation != read.observation
    doc = read.to_json()
    assert doc["offsets"] == desc(3)["offsets"] and doc["kind"] == "join" and doc["batch_id"] is None
    batch = book.record(desc(4, snapshot=None), "foreach_batch", batch_id=9)
    assert batch.observation is None and batch.batch_id == 9 and batch.snapshot is None
    assert book.reads() == [read, batch]  # newest last


def test_reads_are_bounded_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lineage, "MAX_READS", 3)
    book = Lineage()
    for seq in range(5):
        book.record(desc(seq), "udf")
    assert [r.seq for r in book.reads()] == [2, 3, 4]


def test_an_unknown_kind_or_bad_offsets_are_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        Lineage().record(desc(1), "scan")
    with pytest.raises(ValueError, match="offset"):
        Lineage().record(desc(1, offsets={"0": -1}), "join")


def test_an_observations_columns_are_built_once_per_descriptor_and_session(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each column costs the driver round trips to the JVM: built per join, they cost a query ~8 ms (issue 44.3).
    built: list[tuple[int, object]] = []

    def metrics(read: lineage.Read, spark: object) -> list[object]:
        built.append((read.seq, spark))
        return [read.seq]

    monkeypatch.setattr(lineage, "read_metrics", metrics)
    book = Lineage()
    one, other = object(), object()
    first = book.metrics(book.record(desc(3), "join", observe=True), one)
    assert book.metrics(book.record(desc(3), "join", observe=True), one) is first  # same descriptor: kept
    assert book.metrics(book.record(desc(4), "join", observe=True), one) == [4]  # a refresh: built anew
    book.metrics(book.record(desc(4), "join", observe=True), other)  # another session: its own columns
    assert built == [(3, one), (4, one), (4, other)]
