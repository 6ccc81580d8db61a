"""Power loss during a bootstrap from an export (issue 34): the state_dir on a loop-mounted ext4 image
(``powercut.py``), the daemon SIGKILLed at a random moment after it started looking for an export (the broker
checks, the download, the install, the tail) and the image cut at once. Before any daemon opens the copy, a store,
if one is there, must equal the oracle fold at its own offsets (never half a download claiming offsets); a daemon
started on the copy must then reach RUNNING, from the store the cut left or by bootstrapping again, and equal the
oracle. Needs root, as the power-loss lane does. ``GLOBALD_POWERLOSS_SEED=N`` replays the cut."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.store.names import META_CF, META_TOPIC, db_dir, tables_dir
from tests.harness import (
    Broker,
    DaemonProcess,
    daemon_factory,
    globald,
    open_store_db,
    oracle_at,
    random_records,
    values_only,
)
from tests.reliability.checks import read_store
from tests.reliability.conftest import new_topic
from tests.reliability.powercut import LoopImage, check_cut
from tests.reliability.test_power_loss import SEED, TABLE, assert_whole, disk, running_on  # noqa: F401 (fixture)

pytestmark = pytest.mark.kafka


def _cut_after(d: DaemonProcess, said: str, rnd: random.Random) -> str:
    """Wait for the daemon to say ``said``, let up to 2 s pass, SIGKILL it; its last lines."""
    deadline = time.monotonic() + 60
    while said not in d.log.read_text(errors="replace"):
        assert time.monotonic() < deadline and d.alive(), d.tail()
        time.sleep(0.02)
    time.sleep(rnd.uniform(0.0, 2.0))  # where the power goes
    d.stop(signal.SIGKILL)
    return d.tail(8)


def _restarts_whole(make: Callable[..., DaemonProcess], broker: Broker, state: Path, topic: str,
                    export: dict[str, Any], installed: bool) -> None:
    """A daemon on the cut reaches RUNNING equal to the fold: from the store the cut left when one was installed,
    else from the export again."""
    with running_on(make, state, topic, export=export) as again:
        doc = again.wait_running({TABLE: broker.admin.end_offsets(topic)}, timeout=120)
        table = doc["tables"][TABLE]
        assert table["origin"]["kind"] == ("store" if installed else "export"), table["origin"]
        assert values_only(again.dump(TABLE)) == oracle_at(broker, topic, table["offsets"])
        assert again.stop() == 0


@pytest.mark.long  # two daemons, a 40,000-record restore and an image copy: about a minute
def test_power_loss_during_a_bootstrap(broker: Broker, disk: LoopImage, tmp_path: Path) -> None:  # noqa: F811
    rnd = random.Random(SEED + 7)
    topic = new_topic(broker)
    broker.admin.produce(topic, random_records(40_000, keys=10_000, seed=SEED, tombstones=0.1))
    export = {"uri": (tmp_path / "exports").as_uri(), "interval_s": 0}
    with daemon_factory(broker, tmp_path) as make:
        exporter = make({TABLE: topic}, state_dir=tmp_path / "exporter", metadata_refresh_ms=300, export=export,
                        snapshots={"interval_ms": 200})
        exporter.wait_running({TABLE: broker.admin.end_offsets(topic)})
        r = globald("export", "--config", str(exporter.config), "--table", TABLE, "--json", timeout=180)
        assert r.returncode == 0, r.stderr
        assert exporter.stop() == 0
        broker.admin.produce(topic, random_records(2_000, keys=10_000, seed=SEED + 1, tombstones=0.1))
        with running_on(make, disk.mount / "state", topic, export=export) as d:
            said = _cut_after(d, "looking for an export", rnd)  # anywhere in the bootstrap or the tail after it
            with disk.cut() as copy:
                state = copy / "state"
                installed = (state / "tables" / TABLE / "db" / "CURRENT").exists()
                report = check_cut(broker, state, TABLE, topic, require_store=False, require_current=False)
                assert_whole(report, f"the disk after a power loss during a bootstrap (store there: {installed}; "
                                     f"the daemon last said:\n{said})")
                _restarts_whole(make, broker, state, topic, export, installed)
                assert not [p for p in os.listdir(tables_dir(state)) if p.startswith(".bootstrap-")]
    print(json.dumps({"seed": SEED, "store_installed_before_the_cut": installed}))


@pytest.mark.long  # three daemons, restores and an image copy: about a minute
def test_power_loss_during_a_refill_after_a_wipe(broker: Broker, disk: LoopImage, tmp_path: Path) -> None:  # noqa: F811
    """The same, for a store the running daemon wiped and refills (``engine.refill``): the table's store says it
    mirrors another topic (corrupt: wiped at open), and the loop moves the checked export into place itself. The
    cut finds the emptied store, no store, or the installed one; never half of one."""
    rnd = random.Random(SEED + 8)
    topic = new_topic(broker)
    broker.admin.produce(topic, random_records(40_000, keys=10_000, seed=SEED + 3, tombstones=0.1))
    export = {"uri": (tmp_path / "exports").as_uri(), "interval_s": 0}
    state = disk.mount / "state"
    with daemon_factory(broker, tmp_path) as make:
        with running_on(make, state, topic) as first:
            first.wait_running({TABLE: broker.admin.end_offsets(topic)})
            assert first.stop() == 0
        db = open_store_db(db_dir(state, TABLE))
        try:  # damaged: the store now claims another topic, so the next open wipes it (corrupt_store)
            db.get_column_family(META_CF)[META_TOPIC] = b"another-topic"
        finally:
            db.close()
        exporter = make({TABLE: topic}, state_dir=tmp_path / "exporter", metadata_refresh_ms=300, export=export,
                        snapshots={"interval_ms": 200})
        exporter.wait_running({TABLE: broker.admin.end_offsets(topic)})
        r = globald("export", "--config", str(exporter.config), "--table", TABLE, "--json", timeout=180)
        assert r.returncode == 0, r.stderr
        assert exporter.stop() == 0
        broker.admin.produce(topic, random_records(2_000, keys=10_000, seed=SEED + 4, tombstones=0.1))
        with running_on(make, state, topic, export=export) as d:
            # anywhere in the refill's checks, download, install or the tail
            said = _cut_after(d, "emptied (corrupt_store); looking for an export", rnd)
            with disk.cut() as copy:
                cut = copy / "state"
                installed = (db_dir(cut, TABLE) / "CURRENT").exists() and bool(read_store(db_dir(cut, TABLE))[0])
                report = check_cut(broker, cut, TABLE, topic, require_store=False, require_current=False)
                assert_whole(report, f"the disk after a power loss during a refill (store installed: {installed}; "
                                     f"the daemon last said:\n{said})")
                _restarts_whole(make, broker, cut, topic, export, installed)  # an emptied store, or none: again
