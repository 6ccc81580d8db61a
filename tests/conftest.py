from __future__ import annotations

import compileall
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
_REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Compile the repository's Python once, before any test starts a process that imports it.

    Every daemon and CLI run of the suite is a new interpreter importing globald (and the daemons some tests run from
    tests/, and bench). Under PYTHONDONTWRITEBYTECODE, which CI sets, none writes the bytecode it compiles, so each
    compiled the package from source again: about 0.15 s of CPU and 0.5 s of wall time per daemon start, hundreds of
    times a run. Python still reads a __pycache__ it may not write (and recompiles a source newer than its cache);
    the files are ignored by git. In the xdist controller only: the workers start after it."""
    if hasattr(config, "workerinput"):
        return
    for top in ("globald", "tests", "bench"):
        compileall.compile_dir(_REPO / top, quiet=2)


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
