"""Broker faults on a broker of the module's own: stopped during restore and in steady state, killed, paused
(SIGSTOP: a broker that answers slowly), and refusing connections from the daemon's start.

Each time the daemon must keep its PID, say it is degraded while the broker is away, resume by itself once it is
back (same data, same port), and end equal to the oracle with no wipe. The CI form stops the broker for 10 s;
``GLOBALD_RELIABILITY_FULL=1`` adds the 60 s outages.
TODO(/readyz): once globald/ops serves /readyz and /metrics, also assert not-ready and globald_degraded 1 during
each outage here; today the check is the ``degraded`` field of status.json, which both of them are built from.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from globald.snapshot import exact_requests
from globald.snapshot.exact_requests import Code
from globald.store.names import SNAPSHOT_REQUESTS_DIR, SNAPSHOT_RESPONSES_DIR, snapshots_dir
from tests import midway
from tests.harness import SLOW_FETCH, Broker, DaemonProcess, oracle_at, random_records
from tests.integration.snapshot_helpers import snapshot_values, wait_snapshot_at
from tests.reliability.checks import check_store, same_process, watch
from tests.reliability.conftest import FULL, new_topic, running
from tests.reliability.ledger import FaultRow

pytestmark = pytest.mark.kafka

Own = tuple[Broker, Callable[..., DaemonProcess]]
OUTAGES = [10, 60] if FULL else [10]
CONFIG: dict[str, Any] = {"metadata_refresh_ms": 1000, "consume_batch_size": 500}


def _degraded(doc: dict[str, Any]) -> bool:
    return bool(doc.get("degraded"))


def _offsets(doc: dict[str, Any]) -> dict[str, int]:
    return doc.get("tables", {}).get("tbl", {}).get("offsets", {})


def outage(broker: Broker, d: DaemonProcess, seconds: float, how: int = signal.SIGTERM) -> list[dict[str, Any]]:
    """Stop the broker for ``seconds``, watching the daemon; restart it with the same data and port. A broker frozen
    beforehand (``freeze``) serves nothing between the moment it was frozen and its graceful stop."""
    kafka = broker.embedded
    assert kafka is not None
    pid = kafka.broker_pid
    assert pid is not None
    if how == signal.SIGTERM:
        os.kill(pid, signal.SIGTERM)  # pending until SIGCONT when frozen
        os.kill(pid, signal.SIGCONT)
    kafka.stop_broker(how)
    try:
        docs = until_degraded(d, seconds)
    finally:
        kafka.start_broker()
    return docs


def until_degraded(d: DaemonProcess, seconds: float) -> list[dict[str, Any]]:
    """Status documents over at least ``seconds``, and on until one says degraded: the fault is held until the
    daemon has met it (its first metadata request times out after 5 s, counted on a loaded machine's clock), so a
    slow machine cannot end the outage before the report the test asserts. Fails if it never comes."""
    docs = watch(d, seconds)
    if not any(_degraded(doc) for doc in docs):
        docs.append(d.wait_for(_degraded, timeout=120, what="degraded while the broker is away"))
    return docs


def freeze(broker: Broker) -> None:
    kafka = broker.embedded
    assert kafka is not None and kafka.broker_pid is not None
    os.kill(kafka.broker_pid, signal.SIGSTOP)


def finish(broker: Broker, d: DaemonProcess, topic: str, row: FaultRow, pid: int, more: int = 500) -> dict[str, Any]:
    """New records after the fault; the daemon must reach them, undegraded, without a wipe, equal to the oracle."""
    broker.admin.produce(topic, random_records(more, keys=2_000, seed=int(time.time())))
    ends = broker.admin.end_offsets(topic)
    doc = d.wait_for(lambda s: s.get("pid") == pid and s["state"] == "RUNNING" and not s.get("degraded")
                     and all(_offsets(s).get(str(p), -1) >= o for p, o in ends.items()),
                     timeout=120, what="resumed, undegraded, at the log end")
    row.pid_changes += same_process(d, pid)
    check = check_store(broker, d.state_dir, "tbl", topic)
    assert row.diverged(check.divergences) == 0 and check.readable, check
    assert doc["tables"]["tbl"]["wipes"] == 0
    assert row.pid_changes == 0
    return doc


@pytest.mark.parametrize("seconds", OUTAGES)
@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_broker_stopped_during_restore(own: Own, fault: Callable[[str, str], FaultRow], seconds: int) -> None:
    broker, make = own
    row = fault(f"broker stopped {seconds} s during restore", "degraded meanwhile; resumed by itself, no wipe")
    t = new_topic(broker)
    total = 80_000
    broker.admin.produce(t, random_records(total, keys=20_000, seed=1, value_size=64))
    d = make({"tbl": t}, start=False, kafka=SLOW_FETCH, **CONFIG)
    # The daemon stops itself a fifth into its restore and the broker is frozen while it stands there: the restore
    # is cut however fast this machine restores (a restore seen half done from outside may end before the freeze).
    arm_file = d.config.with_name(d.config.name + ".arm")
    midway.arm(d, arm_file)
    midway.freeze_at_restore(arm_file, "tbl", 0.2)
    d.start()
    pid = d.pid
    midway.wait_frozen(d, arm_file)
    freeze(broker)
    os.kill(pid, signal.SIGCONT)
    frozen = d.status()
    assert frozen["state"] == "RESTORING", f"the restore ended before the broker was frozen: {frozen}"
    docs = outage(broker, d, seconds)
    row.injected += 1
    states = [(doc["state"], sum(_offsets(doc).values())) for doc in docs]
    assert all(state == "RESTORING" for state, _ in states), f"(state, records restored) while down: {states}"
    assert any(_degraded(doc) for doc in docs), "never reported degraded while the broker was down"
    finish(broker, d, t, row, pid)


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
@pytest.mark.parametrize("seconds", OUTAGES)
def test_broker_stopped_in_steady_state(own: Own, fault: Callable[[str, str], FaultRow], seconds: int) -> None:
    broker, make = own
    row = fault(f"broker stopped {seconds} s in steady state", "degraded meanwhile; resumed by itself, no wipe")
    t = new_topic(broker)
    d = running(broker, make, t, random_records(5_000, keys=2_000, seed=2), **CONFIG)
    pid = d.pid
    docs = outage(broker, d, seconds)
    row.injected += 1
    assert all(doc["state"] == "RUNNING" for doc in docs), "a broker outage must not take a table out of RUNNING"
    assert any(_degraded(doc) for doc in docs), "never reported degraded while the broker was down"
    finish(broker, d, t, row, pid)


# One kill in make test (the one broker outage it holds), two in a row in the long lane.
@pytest.mark.parametrize("kills", [1, pytest.param(2, marks=pytest.mark.long)])
def test_broker_killed_and_restarted_with_same_data(own: Own, fault: Callable[[str, str], FaultRow],
                                                    kills: int) -> None:
    broker, make = own
    row = fault(f"broker SIGKILLed {kills}x, restarted with the same data", "degraded meanwhile; resumed, no wipe")
    t = new_topic(broker)
    d = running(broker, make, t, random_records(5_000, keys=2_000, seed=3), **CONFIG)
    pid = d.pid
    for _ in range(kills):
        docs = outage(broker, d, 5, how=signal.SIGKILL)
        row.injected += 1
        assert any(_degraded(doc) for doc in docs)
        finish(broker, d, t, row, pid)


@pytest.mark.long  # a 40 s outage: the long lane (make test-long)
def test_a_consumer_silent_past_its_bound_is_replaced_and_the_table_resumes(
        own: Own, fault: Callable[[str, str], FaultRow]) -> None:
    """Past 30 s without an answer the loop replaces its consumer (an accelerated soak saw one stay silent for 9
    minutes after a broker SIGKILL and restart while a new client was answered at once). The replacement must
    re-plan every table from its store and end equal to the oracle, in the same process, with no wipe."""
    broker, make = own
    row = fault("broker SIGKILLed 40 s: the consumer is replaced", "replaced once or more; resumed, no wipe")
    t = new_topic(broker)
    d = running(broker, make, t, random_records(5_000, keys=2_000, seed=4), **CONFIG)
    pid = d.pid
    docs = outage(broker, d, 40, how=signal.SIGKILL)
    row.injected += 1
    assert any(_degraded(doc) for doc in docs)
    finish(broker, d, t, row, pid)
    assert "replacing the consumer and re-planning every table" in d.log.read_text(errors="replace")


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_slow_broker_paused_with_sigstop(own: Own, fault: Callable[[str, str], FaultRow]) -> None:
    broker, make = own
    row = fault("broker paused (SIGSTOP) 12 s", "degraded meanwhile; resumed after SIGCONT, no wipe")
    t = new_topic(broker)
    d = running(broker, make, t, random_records(5_000, keys=2_000, seed=4), **CONFIG)
    pid = d.pid
    kafka = broker.embedded
    assert kafka is not None and kafka.broker_pid is not None
    os.kill(kafka.broker_pid, signal.SIGSTOP)
    try:
        docs = until_degraded(d, 12)
    finally:
        os.kill(kafka.broker_pid, signal.SIGCONT)
    row.injected += 1
    assert any(_degraded(doc) for doc in docs), "a broker that does not answer must show as degraded"
    finish(broker, d, t, row, pid)


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_broker_refusing_connections_from_the_start(own: Own, fault: Callable[[str, str], FaultRow]) -> None:
    broker, make = own
    row = fault("broker refusing connections when the daemon starts", "degraded, waiting; restored once it is up")
    t = new_topic(broker)
    broker.admin.produce(t, random_records(20_000, keys=2_000, seed=5))
    kafka = broker.embedded
    assert kafka is not None
    kafka.stop_broker()
    docs: list[dict[str, Any]] = []

    def seen(doc: dict[str, Any]) -> bool:
        docs.append(doc)
        return doc.get("pid") == pid and _degraded(doc)

    try:
        d = make({"tbl": t}, **CONFIG)
        pid = d.pid
        # Degraded shows only after the first metadata request times out (5 s), counted from a start that takes
        # seconds of its own on a loaded machine: wait for it rather than for a fixed time.
        d.wait_for(seen, what="degraded while the broker refuses connections")
        docs += watch(d, 3)
    finally:
        kafka.start_broker()
    row.injected += 1
    assert all(doc["state"] == "RESTORING" for doc in docs if doc.get("pid") == pid)
    assert any(_degraded(doc) and doc.get("pid") == pid for doc in docs)
    finish(broker, d, t, row, pid)


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_exact_build_waits_out_a_broker_outage(own: Own, fault: Callable[[str, str], FaultRow]) -> None:
    """Chaos campaign seeds 2 #12 and 6 #4: an exact build asked for while the broker was down gave up after 15 s
    (and its consumer could stay disconnected after the broker came back). It must keep asking, with a new consumer
    if need be, until the request's own deadline, and then build exactly the target."""
    broker, make = own
    row = fault("broker SIGKILLed 20 s during an exact build", "build answered after the restart, equal to the oracle")
    t = new_topic(broker)
    d = running(broker, make, t, random_records(3_000, keys=500, seed=41), **CONFIG,
                snapshots={"interval_ms": 200, "retain": 2})
    ends_a = broker.admin.end_offsets(t)
    wait_snapshot_at(d, "tbl", ends_a)
    broker.admin.produce(t, random_records(3_000, keys=500, seed=42))
    ends_b = broker.admin.end_offsets(t)
    wait_snapshot_at(d, "tbl", ends_b)
    target = {p: (ends_a[p] + ends_b[p]) // 2 for p in ends_b}  # no snapshot there: only a build answers it
    kafka = broker.embedded
    assert kafka is not None
    kafka.stop_broker(signal.SIGKILL)
    try:
        req = exact_requests.submit(d.state_dir, "tbl", target)
        # The build must run while the broker is down: the daemon takes the request (its file goes) before the
        # restart, and answers nothing until the broker is back, for longer than the 15 s the builder used to wait.
        asked = snapshots_dir(d.state_dir, "tbl") / SNAPSHOT_REQUESTS_DIR / f"{req.id}.json"
        answer = snapshots_dir(d.state_dir, "tbl") / SNAPSHOT_RESPONSES_DIR / f"{req.id}.json"
        d.wait_for(lambda _: not asked.exists(), timeout=120, what="the exact request taken while the broker is down")
        taken = time.monotonic()
        while time.monotonic() - taken < 20:  # the outage's length, from the moment the build began; not a wait
            assert d.alive(), d.tail()
            assert not answer.exists(), f"answered while the broker was down: {answer.read_text()}"
            time.sleep(0.5)
    finally:
        kafka.start_broker()
    resp = exact_requests.wait(d.state_dir, req, timeout=120)
    row.injected += 1
    assert resp.code == Code.READY and resp.snapshot is not None, resp
    assert snapshot_values(d, "tbl", resp.snapshot) == oracle_at(broker, t, {str(p): o for p, o in target.items()})
    assert d.alive()
