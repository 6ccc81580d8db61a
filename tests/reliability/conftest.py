"""Fixtures of the reliability suite: a broker of its own to stop and pause, and the fault ledger.

The session broker (tests/conftest.py) is shared with every other test, so faults that stop, pause or reconfigure
a broker use ``own_broker``: an EmbeddedKafka per module, restarted with the same data and ports. The short
form runs in CI; ``GLOBALD_RELIABILITY_FULL=1`` runs the long outages and more kill points.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Broker, DaemonProcess, daemon_factory
from tests.reliability.ledger import FaultRow, Ledger, report_dir
from tests.support.admin import Record, TopicAdmin
from tests.support.broker import EmbeddedKafka

FULL = os.environ.get("GLOBALD_RELIABILITY_FULL") == "1"
LEDGER = Ledger()
_outcome = pytest.StashKey[pytest.TestReport]()
_names = itertools.count()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    result = yield
    rep = result.get_result()  # type: ignore[attr-defined]
    if rep.when == "call" or (rep.when == "setup" and rep.skipped):
        item.stash[_outcome] = rep


@pytest.fixture
def fault(request: pytest.FixtureRequest) -> Iterator[Callable[[str, str], FaultRow]]:
    """``fault(name, expected_outcome)`` opens a ledger row; the test's result decides its outcome."""
    rows: list[FaultRow] = []

    def make(name: str, expected: str) -> FaultRow:
        row = LEDGER.row(name, request.node.nodeid, expected)
        rows.append(row)
        return row

    yield make
    rep = request.node.stash.get(_outcome, None)
    for row in rows:
        if rep is not None and rep.passed:
            row.outcome = row.expected
        elif rep is not None and rep.skipped:
            row.outcome = "skipped"
        else:
            row.outcome = f"FAILED in {request.node.name}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if LEDGER.rows:
        LEDGER.write(report_dir(), "Reliability suite" + (" (full)" if FULL else " (CI form)"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if LEDGER.rows:
        terminalreporter.write_sep("-", f"fault ledger (also in {report_dir()})")
        terminalreporter.write((report_dir() / "report.md").read_text())


@pytest.fixture(scope="module")
def own_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """An embedded broker for this module alone; ``BROKER_PROPS`` in the module adds server properties."""
    if os.environ.get("GLOBALD_TEST_BOOTSTRAP"):
        pytest.skip("stops, pauses or reconfigures its broker: needs the embedded one, not GLOBALD_TEST_BOOTSTRAP")
    props = getattr(request.module, "BROKER_PROPS", {})
    kafka = EmbeddedKafka(tmp_path_factory.mktemp("own-kafka"), broker_props=props).start()
    admin = TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper)
    try:
        yield Broker(kafka.client_settings, admin, kafka)
    finally:
        admin.close()
        kafka.stop()


@pytest.fixture
def own(own_broker: Broker, tmp_path: Path) -> Iterator[tuple[Broker, Callable[..., DaemonProcess]]]:
    """(broker, daemon factory) on the module's own broker, left running and unpaused after the test."""
    kafka = own_broker.embedded
    assert kafka is not None
    with daemon_factory(own_broker, tmp_path) as make:
        try:
            yield own_broker, make
        finally:  # before the daemons are stopped, so that they can close normally
            if kafka.broker_pid is not None:
                os.kill(kafka.broker_pid, signal.SIGCONT)
            kafka.start_broker()


def new_topic(broker: Broker, partitions: int = 3, compact: bool = True) -> str:
    name = f"r{os.getpid()}-{next(_names)}"
    broker.admin.create(name, partitions=partitions, compact=compact)
    return name


def running(broker: Broker, make: Callable[..., DaemonProcess], topic: str, records: list[Record],
            **config: object) -> DaemonProcess:
    """Produce ``records``, start a daemon mirroring ``topic`` as table ``tbl``, return it once RUNNING at the end."""
    broker.admin.produce(topic, records)
    d = make({"tbl": topic}, **config)
    d.wait_running({"tbl": broker.admin.end_offsets(topic)})
    return d
