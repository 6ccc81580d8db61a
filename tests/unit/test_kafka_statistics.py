"""librdkafka's statistics reach operations through a hook the Kafka layer owns (it imports nothing of ops)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from globald.kafka import clients
from globald.ops.memory import KAFKA_STATS
from globald.settings.config import parse


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The settings of every consumer made, instead of a consumer; the statistics sink is restored afterwards."""
    settings: list[dict[str, Any]] = []
    monkeypatch.setattr(clients, "Consumer", lambda conf: settings.append(conf))
    monkeypatch.setattr("globald.kafka.clients._statistics_sink", None)  # put back as it was afterwards
    yield settings


def _config(tmp_path: Path, interval_ms: int) -> Any:
    return parse({"state_dir": str(tmp_path), "tables": [{"name": "t", "topic": "topic"}],
                  "kafka": {"bootstrap.servers": "127.0.0.1:9", "statistics.interval.ms": interval_ms}})


def test_statistics_go_to_the_registered_sink_only_when_the_operator_asks(tmp_path: Path,
                                                                          made: list[dict[str, Any]]) -> None:
    clients.make_consumer(_config(tmp_path, 1000))  # no sink registered yet
    clients.on_statistics(KAFKA_STATS)
    clients.make_consumer(_config(tmp_path, 0))
    clients.make_consumer(_config(tmp_path, 1000))
    assert ["stats_cb" in s for s in made] == [False, False, True]
    assert made[2]["stats_cb"] is KAFKA_STATS
