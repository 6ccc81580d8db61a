"""Restore and tail on a modern-protocol broker, with real timestamps. Every check waits for the data (the store
equals the fold of what was produced, which equals the oracle read back from the broker), never for a watermark:
Tansu's ListOffsets answer is the start of a partition's last batch + 1, so the daemon's own restore target there is
too low, and only the data tells when it has everything. What needs the broker's offsets to be right is marked
``real_offsets``: it runs on Kafka 0.9 (tests/integration) and on a modern external broker, not on Tansu."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.harness import Broker, DaemonProcess
from tests.support.oracle import TimestampedTable, fold_timestamped
from tests.tansu.data import BASE_TS, expected_table, timed_records, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

Daemon = Callable[..., DaemonProcess]


def test_restore_then_tail_matches_the_oracle(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t = topic()
    records = timed_records(30_000, keys=8_000, seed=160)
    broker.admin.produce(t, records)
    want = expected_table(records)
    d = daemon({"tbl": t})
    wait_for_table(d, "tbl", want, timeout=90)
    produced = list(records)
    for i, seed in enumerate((161, 162, 163)):
        more = timed_records(1_500, keys=8_000, seed=seed, base_ts=BASE_TS + (i + 1) * 100_000_000)
        broker.admin.produce(t, more)
        produced += more
        want = expected_table(more, want)
        wait_for_table(d, "tbl", want)

    # The offsets the daemon stored are the data's ends, and the oracle folded up to them is the store. The status
    # document is rewritten once per status interval, so it may still name the commit before the one dumped.
    ends = broker.admin.end_offsets(t)
    doc = d.wait_running({"tbl": ends})["tables"]["tbl"]
    offsets = {int(p): o for p, o in doc["offsets"].items()}
    assert offsets == ends
    assert fold_timestamped(broker.settings, t, offsets) == want == d.dump("tbl")
    # Each record was applied once (no compaction on Tansu, one reading from the log start), none stored twice.
    assert doc["records"] == len(produced) and doc["wipes"] == 0
    assert doc["null_keys"] == sum(1 for k, *_ in produced if k is None) > 0


def _mirrored_then_stopped(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                           seed: int) -> tuple[str, DaemonProcess, TimestampedTable]:
    """A topic of 5,000 records, and a daemon stopped (cleanly) once its store held them all."""
    t = topic()
    records = timed_records(5_000, keys=2_000, seed=seed)
    broker.admin.produce(t, records)
    want = expected_table(records)
    d = daemon({"tbl": t})
    wait_for_table(d, "tbl", want)
    assert d.stop() == 0
    return t, d, want


def test_restart_resumes_at_the_stored_offsets(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    """Runs on Tansu too: records produced while the daemon is down put Tansu's (too low) end past the stored
    offsets, so the broker's answer says they are valid, as a real end would."""
    t, d, want = _mirrored_then_stopped(broker, topic, daemon, seed=170)
    newer = timed_records(700, keys=2_000, seed=171, base_ts=BASE_TS + 500_000_000)
    broker.admin.produce(t, newer)
    want = expected_table(newer, want)
    d.start()
    wait_for_table(d, "tbl", want)
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})["tables"]["tbl"]
    assert doc["wipes"] == 0 and doc["records"] == len(newer)  # only the newer records were fetched


@pytest.mark.real_offsets(reason="Tansu's end offset is the start of the last batch + 1: a daemon restarted with "
                                 "nothing new on the topic finds its stored offsets past that end and rebuilds")
def test_idle_restart_keeps_the_store(broker: Broker, topic: Callable[..., str], daemon: Daemon) -> None:
    t, d, want = _mirrored_then_stopped(broker, topic, daemon, seed=172)
    d.start()
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})["tables"]["tbl"]
    assert doc["wipes"] == 0 and doc["records"] == 0
    assert d.dump("tbl") == want
