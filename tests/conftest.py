from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Broker, DaemonProcess, start_broker, write_config

_counter = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    run_dir = Path(tempfile.mkdtemp(prefix="globald-kafka-"))
    b = start_broker(run_dir)
    try:
        yield b
    finally:
        b.admin.close()
        if b.embedded is not None:
            b.embedded.stop()


@pytest.fixture
def topic(broker: Broker) -> Callable[..., str]:
    """Creates a fresh compacted topic with a unique name."""

    def make(partitions: int = 3, compact: bool = True) -> str:
        name = f"t{os.getpid()}-{next(_counter)}"
        broker.admin.create(name, partitions=partitions, compact=compact)
        return name

    return make


@pytest.fixture
def daemon(broker: Broker, tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Builds a DaemonProcess for {table: topic}; every one still running at the end is stopped."""
    made: list[DaemonProcess] = []

    def make(tables: dict[str, str], start: bool = True, **top: object) -> DaemonProcess:
        top.setdefault("commit_interval_ms", 200)
        top.setdefault("http", {"enabled": False})
        cfg = write_config(tmp_path / f"globald-{len(made)}.toml", tmp_path / "state", broker.settings, tables, **top)
        d = DaemonProcess(cfg, tmp_path / f"daemon-{len(made)}.log")
        made.append(d)
        return d.start() if start else d

    yield make
    for d in made:
        if d.alive():
            d.stop()
