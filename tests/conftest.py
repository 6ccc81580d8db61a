from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.support.jvm_leaks")  # the plugin below, imported first by tests.harness

from tests.harness import Broker, DaemonProcess, daemon_factory, start_broker  # noqa: E402 - after the line above

# Fails a test whose JVMs (Spark, a broker) outlive it or their fixture: issue 40's orphaned Spark JVMs.
pytest_plugins = ["tests.support.jvm_leaks"]

_counter = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    run_dir = Path(tempfile.mkdtemp(prefix="globald-kafka-"))
    b = start_broker(run_dir)
    try:
        yield b
    finally:
        b.stop()


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
    with daemon_factory(broker, tmp_path) as make:
        yield make
