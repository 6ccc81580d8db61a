"""Power loss during a bootstrap from an export (issues 34, 40 item 5.5): the state_dir on a loop-mounted ext4 image
(``powercut.py``), the daemon frozen at a named point of the bootstrap by the chaos entry's hooks
(``tests/chaos/entry.py``: no hook is in globald itself), then SIGKILLed and the image cut at once. The points: a
file's download begins (the stage holds part of the export), the checked stage is about to be renamed into place,
and it just was. A cut that a random delay placed could land anywhere (the download takes milliseconds); here the
hook's fired file and the frozen process state say the point was reached, the live mount is seen to be in that
phase, and only then does the power go.

Before any daemon opens the copy, a store, if one is there, must equal the oracle fold at its own offsets (never
half a download claiming offsets), ``.checkpoint`` and status.json must claim nothing beyond it, and the store must
be there exactly when the rename had returned. A daemon started on the copy must then reach RUNNING, from the store
the cut left or by bootstrapping again, equal the oracle, and leave no ``.bootstrap-*`` directory. Needs root, as
the power-loss lane does. ``GLOBALD_POWERLOSS_SEED=N`` replays the download point's file."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from globald.export.exporter import live_manifests
from globald.export.manifest import ExportManifest
from globald.export.target import Target
from globald.store.names import (
    BOOTSTRAP_PREFIX,
    DB_DIR,
    META_CF,
    META_TOPIC,
    STATUS_FILE,
    db_dir,
    table_dir,
    tables_dir,
)
from tests.chaos import entry
from tests.harness import (
    STOPPED_STATES,
    Broker,
    DaemonProcess,
    daemon_factory,
    globald,
    open_store_db,
    oracle_at,
    process_state,
    random_records,
)
from tests.reliability.checks import read_store
from tests.reliability.conftest import new_topic
from tests.reliability.powercut import LoopImage, check_cut
from tests.reliability.test_power_loss import SEED, TABLE, assert_whole, disk, running_on  # noqa: F401 (fixture)

pytestmark = pytest.mark.kafka

POINTS = (entry.BOOTSTRAP_DOWNLOAD, entry.BOOTSTRAP_RENAME, entry.BOOTSTRAP_RENAMED)
HOOK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Exported:
    topic: str
    export: dict[str, Any]  # the [export] settings naming the storage
    manifest: ExportManifest  # the one export there, 2,000 records behind the topic's end


@pytest.fixture(scope="module")
def exported(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """One export, shared by every point (the exporting daemon is the slow part): each test only reads it."""
    tmp = tmp_path_factory.mktemp("exported")
    topic = new_topic(broker)
    broker.admin.produce(topic, random_records(40_000, keys=10_000, seed=SEED, tombstones=0.1))
    uri = (tmp / "exports").as_uri()
    export = {"uri": uri, "interval_s": 0}
    with daemon_factory(broker, tmp) as make:
        exporter = make({TABLE: topic}, state_dir=tmp / "exporter", metadata_refresh_ms=300, export=export,
                        snapshots={"interval_ms": 200})
        exporter.wait_running({TABLE: broker.admin.end_offsets(topic)})
        r = globald("export", "--config", str(exporter.config), "--table", TABLE, "--json", timeout=180)
        assert r.returncode == 0, r.stderr
        assert exporter.stop() == 0
    broker.admin.produce(topic, random_records(2_000, keys=10_000, seed=SEED + 1, tombstones=0.1))
    found, bad = live_manifests(Target(uri), TABLE)
    assert len(found) == 1 and not bad, (found, bad)
    return Exported(topic, export, found[0])


def _arm(tmp_path: Path, point: str, ex: Exported, rnd: random.Random) -> Path:
    arm = tmp_path / "arm.json"
    # The download point: the nth file's fetch begins (largest first, DOWNLOADERS at once), so that one and those
    # after it are not on disk yet, while those before may be whole.
    nth = rnd.randint(1, len(ex.manifest.files)) if point == entry.BOOTSTRAP_DOWNLOAD else 1
    arm.write_text(json.dumps({"id": 1, "phase": point, "action": "freeze", "table": TABLE, "nth": nth}))
    return arm


def _table_state(state: Path) -> str | None:
    try:
        return str(json.loads((state / STATUS_FILE).read_bytes())["tables"][TABLE]["state"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` stands stopped (a group stop reaches the threads one by one; /proc/PID/stat shows
    only the main one): none of the downloaders writes on after the freeze was seen."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return bool(tasks) and all(process_state(int(t)) in STOPPED_STATES for t in tasks)


def _frozen_at(d: DaemonProcess, state: Path, arm: Path, point: str) -> dict[str, Any]:
    """Start ``d`` under the chaos entry armed at ``point``; the hook's record once the daemon stands frozen there.
    Fails as soon as the table goes RUNNING (or the daemon exits) without the point reached: never a cut elsewhere."""
    d.module, d.env = entry.__name__, {entry.ARM_ENV: str(arm)}
    d.start()
    fired = arm.with_name(f"{arm.name}.fired-1")
    deadline = time.monotonic() + HOOK_TIMEOUT_S
    while not (fired.exists() and _all_stopped(d.pid)):
        assert d.alive(), f"the daemon exited before the point {point!r}:\n{d.tail()}"
        assert _table_state(state) != "RUNNING", f"table RUNNING, the point {point!r} never reached:\n{d.tail()}"
        assert time.monotonic() < deadline, f"the point {point!r} not reached in {HOOK_TIMEOUT_S} s:\n{d.tail()}"
        time.sleep(0.02)
    doc: dict[str, Any] = json.loads(fired.read_text())
    assert doc["phase"] == point, doc
    return doc


def _held(state: Path) -> dict[int, int]:
    """The offsets of the table's store under ``state``; {} for none, or an emptied one."""
    path = db_dir(state, TABLE)
    return read_store(path)[0] if (path / "CURRENT").exists() else {}


def _listing(state: Path) -> list[str]:
    return sorted(str(Path(root, n).relative_to(state)) for root, dirs, files in os.walk(tables_dir(state))
                  for n in (*dirs, *files))


def _in_phase(state: Path, point: str, m: ExportManifest) -> str:
    """Assert, on the live mount of the frozen daemon, that the bootstrap stands at ``point``; what is there."""
    stage = tables_dir(state) / f"{BOOTSTRAP_PREFIX}{TABLE}"
    if point == entry.BOOTSTRAP_DOWNLOAD:
        sizes = {e.name: e.stat().st_size for e in os.scandir(stage / DB_DIR)}
        whole = [f.name for f in m.files if sizes.get(f.name) == f.size]
        assert set(sizes) <= {f.name for f in m.files} and len(whole) < len(m.files), (sizes, m.files)
        assert not _held(state), "a store is in place during the download"
        return f"downloading: {len(whole)} of {len(m.files)} files whole, {sum(sizes.values())} bytes on disk"
    if point == entry.BOOTSTRAP_RENAME:
        assert (stage / DB_DIR / "CURRENT").exists(), f"no checked stage at {stage}: {_listing(state)}"
        assert not table_dir(state, TABLE).exists(), "the table's old directory is still there"
        return "between the two renames: the old directory gone, the stage whole"
    assert not stage.exists() and _held(state) == m.offsets, f"not installed: {_held(state)} vs {m.offsets}"
    return "installed: the stage renamed into place"


def _no_claim_beyond(state: Path, held: dict[int, int]) -> None:
    """status.json on the cut (written without an fsync: empty, old or gone is allowed) claims no installed export
    the store does not hold (``.checkpoint`` is check_cut's)."""
    try:
        origin = json.loads((state / STATUS_FILE).read_bytes())["tables"][TABLE].get("origin") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if origin.get("kind") == "export":
        claimed = {int(p): o for p, o in (origin.get("offsets") or {}).items()}
        assert all(held.get(p, -1) >= o for p, o in claimed.items()), f"status claims {origin}, the store {held}"


def _cut_at(broker: Broker, make: Callable[..., DaemonProcess], image: LoopImage, ex: Exported, point: str,
            arm: Path, what: str) -> dict[str, Any]:
    """Freeze the daemon at ``point`` on ``image``, cut the power there, check the cut, restart on it; a summary."""
    state = image.mount / "state"
    with running_on(make, state, ex.topic, start=False, export=ex.export) as d:
        _frozen_at(d, state, arm, point)
        seen = _in_phase(state, point, ex.manifest)
        d.stop(signal.SIGKILL)
        with image.cut() as copy:
            cut = copy / "state"
            held = _held(cut)
            report = check_cut(broker, cut, TABLE, ex.topic, require_store=False, require_current=False)
            assert_whole(report, f"the disk after a power loss {what} at {point!r} ({seen})")
            # The rename is durable once it returned, and not before: the store is there exactly after it.
            assert held == (ex.manifest.offsets if point == entry.BOOTSTRAP_RENAMED else {}), (point, held)
            _no_claim_beyond(cut, held)
            origin = _restarts_whole(make, broker, cut, ex, installed=bool(held))
            assert not [p for p in os.listdir(tables_dir(cut)) if p.startswith(BOOTSTRAP_PREFIX)]
    return {"seed": SEED, "point": point, "seen": seen, "installed_before_the_cut": bool(held), "origin": origin}


def _restarts_whole(make: Callable[..., DaemonProcess], broker: Broker, state: Path, ex: Exported,
                    installed: bool) -> str:
    """A daemon on the cut reaches RUNNING equal to the fold: from the store the cut left when one was installed,
    else from the export again (never the topic: the export is usable). The origin it reports."""
    with running_on(make, state, ex.topic, export=ex.export) as again:
        doc = again.wait_running({TABLE: broker.admin.end_offsets(ex.topic)}, timeout=120)
        table = doc["tables"][TABLE]
        origin = table["origin"]
        assert origin["kind"] == ("store" if installed else "export"), origin
        if origin["kind"] == "export":
            assert origin["export"] == ex.manifest.id, origin
            assert {int(p): o for p, o in origin["offsets"].items()} == ex.manifest.offsets, origin
        assert again.stop() == 0
    offsets, data = read_store(db_dir(state, TABLE))  # what it left, read here: a `globald dump` costs a process
    assert offsets == {int(p): o for p, o in table["offsets"].items()}, (offsets, table["offsets"])
    assert data == oracle_at(broker, ex.topic, table["offsets"])
    return str(origin["kind"])


@pytest.mark.long  # the power-loss lane. Per point: a daemon frozen in its bootstrap, an image copy and a restart,
# 7.5-12 s a call over three runs (the shared export: 12-16 s, in the first point's setup)
@pytest.mark.parametrize("point", POINTS)
def test_power_loss_during_a_bootstrap(broker: Broker, exported: Exported, disk: LoopImage,  # noqa: F811
                                       tmp_path: Path, point: str) -> None:
    arm = _arm(tmp_path, point, exported, random.Random(f"{SEED}:bootstrap:{point}"))
    with daemon_factory(broker, tmp_path) as make:
        print(json.dumps(_cut_at(broker, make, disk, exported, point, arm, "during a bootstrap")))


@pytest.mark.long  # the power-loss lane. Per point: a daemon frozen in its refill, an image copy and a restart,
# 8.7-15 s a call over three runs
@pytest.mark.parametrize("point", POINTS)
def test_power_loss_during_a_refill_after_a_wipe(broker: Broker, exported: Exported, disk: LoopImage,  # noqa: F811
                                                 tmp_path: Path, point: str) -> None:
    """The same, for a store the running daemon wiped and refills (``engine.refill``): the table's store says it
    mirrors another topic (corrupt: wiped at open), and the loop moves the checked stage into place itself
    (``TableStore.replace_with``, the same durable rename the hooks watch)."""
    state = disk.mount / "state"
    arm = _arm(tmp_path, point, exported, random.Random(f"{SEED}:refill:{point}"))
    db_dir(state, TABLE).mkdir(parents=True)
    db = open_store_db(db_dir(state, TABLE))
    try:  # a store that claims another topic, so that the daemon's open wipes it (corrupt_store) and refills it
        db.get_column_family(META_CF)[META_TOPIC] = b"another-topic"
    finally:
        db.close()
    with daemon_factory(broker, tmp_path) as make:
        print(json.dumps(_cut_at(broker, make, disk, exported, point, arm, "during a refill after a wipe")))
