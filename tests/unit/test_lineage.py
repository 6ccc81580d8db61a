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
