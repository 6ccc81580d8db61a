"""The loop's side of a refill (``engine.refill.Refiller``), as pure logic: which emptied tables are held back
from their plan, when a stage is installed, and that a cancelled refill never installs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from globald.engine.refill import Refilled, Refiller


class Source:
    def __init__(self, takes: bool = True) -> None:
        self.takes = takes
        self.begun: list[tuple[str, str]] = []
        self.answers: dict[str, Refilled] = {}
        self.cancelled: list[str] = []

    def begin(self, table: str, kind: str) -> bool:
        self.begun.append((table, kind))
        return self.takes

    def result(self, table: str) -> Refilled | None:
        return self.answers.pop(table, None)

    def cancel(self, table: str) -> None:
        self.cancelled.append(table)


class Identity:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, table: str) -> None:
        self.cancelled.append(table)


def _table(emptied: str | None) -> Any:
    store = SimpleNamespace(replaced=[], offsets=lambda: {0: 5})
    store.replace_with = store.replaced.append
    return SimpleNamespace(name="t", emptied=emptied, store=store)


def test_an_emptied_table_is_held_until_its_stage_is_installed() -> None:
    source, identity = Source(), Identity()
    refiller, rt = Refiller(source, identity), _table("invalid_offset")  # type: ignore[arg-type]
    assert refiller.hold(rt) and refiller.hold(rt)  # begun, then still out
    assert source.begun == [("t", "invalid_offset")] and rt.emptied is None
    source.answers["t"] = Refilled(Path("/s/.bootstrap-t"))
    assert not refiller.hold(rt)
    assert rt.store.replaced == [Path("/s/.bootstrap-t")] and identity.cancelled == ["t"]
    assert not refiller.hold(rt) and len(source.begun) == 1  # planned next: nothing is asked again


def test_no_stage_restores_from_the_topic_and_a_declined_or_intact_table_is_not_held() -> None:
    source = Source()
    refiller, rt = Refiller(source, Identity()), _table("topic_recreated")  # type: ignore[arg-type]
    assert refiller.hold(rt)
    source.answers["t"] = Refilled(None)
    assert not refiller.hold(rt) and rt.store.replaced == []
    assert not Refiller(Source(takes=False), Identity()).hold(_table("operator_reset"))  # type: ignore[arg-type]
    untouched = Source()
    assert not Refiller(untouched, Identity()).hold(_table(None)) and untouched.begun == []  # type: ignore[arg-type]
    assert not Refiller(None, Identity()).hold(_table("invalid_offset"))  # type: ignore[arg-type]


def test_a_cancelled_refill_never_installs() -> None:
    source = Source()
    refiller, rt = Refiller(source, Identity()), _table("corrupt_store")  # type: ignore[arg-type]
    assert refiller.hold(rt)
    refiller.cancel("t")
    assert source.cancelled == ["t"]
    source.answers["t"] = Refilled(Path("/s/.bootstrap-t"))  # late: it must not be taken
    assert not refiller.hold(rt) and rt.store.replaced == []
