"""One seed's world for the campaign (``tests.chaos.campaign``): its two compacted topics and their produce load,
its config file and daemon, the arm file through which the entry's hooks freeze the daemon at a phase (held until
released), settling at every log end, and the preconditions of a phase (a bulk-sized log, a reset table, an exact
build's target)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from globald.embedded.broker import free_port
from globald.snapshot import exact_requests as snap_requests
from globald.snapshot.reader import manifests_of
from tests.chaos import entry, exports, plan, reach, registry_faults, reloads
from tests.chaos.daemon import ChaosDaemon, stopped_at_hook
from tests.chaos.outcome import (  # noqa: F401  # re-exported: the power-loss campaign and the runner use them
    BULK_KEYS,
    BULK_RECORDS,
    EVENT_KINDS,
    HOOK_TIMEOUT_S,
    LANDED_KINDS,
    PARTITIONS,
    READER,
    READER_LEASE_S,
    SMALL_KEYS,
    SMALL_RECORDS,
    STOP_TIMEOUT_S,
    Outcome,
    Probe,
    Unrecoverable,
    summarize,
)
from tests.chaos.plan import Fault
from tests.chaos.tools import Clock, Fiu
from tests.harness import Broker, globald, random_records
from tests.reliability.load import Load, pinned
from tests.support.admin import Record, TopicAdmin
from tests.support.broker import EmbeddedKafka
from tests.support.registry import RegistryDouble

if TYPE_CHECKING:
    from tests.chaos.runner import Campaign


def produce_pinned(admin: TopicAdmin, topic: str, records: list[Record]) -> int:
    """Each key to the partition its bytes pick, as the Load does: a key in two partitions has no last value."""
    return admin.produce(topic, records, partition_of=pinned(PARTITIONS))


class SeedBase:
    """One seed's world: its topics, load, config and daemon, the arm file of the entry's hooks, settling."""

    config_file: ClassVar[type[reloads.ConfigFile]] = reloads.ConfigFile  # the versioned lane's adds history

    def __init__(self, campaign: Campaign, seed: int) -> None:
        self.c = campaign
        self.seed = seed
        self.root: Path = campaign.root / f"seed-{seed}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.disk: Path | None = campaign.disk
        state = self.state = (self.disk / f"state-{seed}") if self.disk is not None else self.root / "state"
        self.topics = {plan.BULK: f"chaos-{seed}-bulk", plan.SMALL: f"chaos-{seed}-small"}
        self.loads: dict[str, Load] = {}
        self.clock = Clock(self.root / "clock-offset", campaign.args.clock)
        self.fiu = Fiu(self.root / "fiu")
        self.arm_path = self.root / "arm.json"
        self.arm_ids = 0
        self.armed: dict[str, Any] = {}  # the arm written last, until released or disarmed
        self.filler: Path | None = None
        self.may_die: int | None = None  # the PID the campaign SIGKILLed or stopped on purpose in this fault
        self.exact_request: snap_requests.Request | None = None
        self.mark = 0  # the daemon log's size when the current fault began
        self.leased: dict[str, str] = {}  # table -> snapshot the campaign's reader pinned before the fault
        self.evidence: reach.Evidence | None = None  # what the daemon had said when the current fault began
        self.http_port = free_port()
        # the reload, export or registry event under way
        self.event: reloads.ReloadEvent | exports.ExportEvent | registry_faults.RegistryEvent | None = None
        self.registry: RegistryDouble | None = None  # the registry of registry events, from the first one on
        self.extra: str | None = None  # the topic of the table reload events add and drop, once created
        # [export] only for export events: the CI form's daemon stays as it was, pyarrow never loaded under libfiu
        exporting = campaign.args.exports_per_seed > 0
        self.config = self.config_file(self.root / "globald.toml", state, campaign.broker.settings, self.topics,
                                         self.http_port, export=exporting)
        cfg = self.config.write()
        env = {entry.ARM_ENV: str(self.arm_path), **self.clock.env(),
               **({entry.IMPORT_PYARROW_ENV: "1"} if exporting else {})}
        self.daemon = ChaosDaemon(cfg, self.root / "daemon.log", env=env, prefix=self.fiu.prefix(self.clock.preload()),
                                  http_port=self.http_port, state=state)

    @property
    def admin(self) -> TopicAdmin:
        return self.c.broker.admin

    @property
    def broker(self) -> Broker:
        return self.c.broker

    @property
    def kafka(self) -> EmbeddedKafka:
        return self.c.kafka

    # -- setup and teardown ---------------------------------------------------------------------------------

    def setup(self) -> None:
        for i, (table, topic) in enumerate(self.topics.items()):
            self.admin.create(topic, partitions=PARTITIONS)
            n, keys = (BULK_RECORDS, BULK_KEYS) if table == plan.BULK else (SMALL_RECORDS, SMALL_KEYS)
            produce_pinned(self.admin, topic, random_records(n, keys=keys, seed=self.seed * 100 + i))
            rate = 60 if table == plan.BULK else 30
            self.loads[table] = Load(self.admin, topic, rate=rate, keys=keys, seed=self.seed * 100 + 10 + i,
                                     pin_partitions=PARTITIONS)
        self.disarm()
        self.daemon.start()
        ok, _, doc = self.settle(timeout=300)
        if not ok:
            raise Unrecoverable(f"seed {self.seed}: the daemon did not reach RUNNING at the start; status {doc}; "
                                f"log:\n{self.daemon.tail()}")
        for load in self.loads.values():
            load.start()
        self.resume_loads()  # settle() paused them before they started

    def teardown(self) -> None:
        if self.registry is not None:
            self.registry.stop()
        for load in self.loads.values():
            load.stop()
        self.daemon.thaw()
        if self.daemon.alive():
            with contextlib.suppress(AssertionError):  # SIGKILLed by stop() when SIGTERM is not enough
                self.daemon.stop(timeout=STOP_TIMEOUT_S)
        self.clock.set(0)
        self._unfill()
        shutil.rmtree(self.state, ignore_errors=True)  # the next seed's disk-full faults start from the same room

    # -- the daemon -------------------------------------------------------------------------------------------

    def arm(self, phase: str, action: str, fault: Fault, fiu: dict[str, Any] | None = None) -> int:
        self.arm_ids += 1
        # Held: the phase cannot end until the fault's window has passed (release), so the fault lands in it.
        doc: dict[str, Any] = {"id": self.arm_ids, "phase": phase, "action": action, "nth": 1, "hold": True}
        if phase in (plan.RESTORE, plan.BULK_END):
            doc["table"] = fault.table
        if phase == plan.RESTORE:
            doc["fraction"] = fault.params["fraction"]
        if phase in (plan.COMMIT, plan.PUBLISH):
            doc["nth"] = fault.params["nth"]
        if fiu is not None:
            doc["fiu"] = fiu
        self._write_arm(doc)
        self.armed = doc
        return self.arm_ids

    def disarm(self) -> None:
        self._write_arm({})
        self.armed = {}

    def release(self, out: Outcome) -> None:
        """The fault's window has passed: let its phase end (``entry.Arm.ended``). Notes whether the phase had
        reached its end meanwhile (held there) or was still under way, either way inside the phase."""
        if not self.armed:
            return
        held = self.arm_path.with_name(f"{self.arm_path.name}.held-{self.armed['id']}").exists()
        out.notes.append(f"{self.armed['phase']} phase " + ("held at its end through the fault's window" if held
                                                          else "still under way when the fault's window ended"))
        # A directory, not a new arm file: the held daemon only stats (libfiu wraps open and read, not stat).
        self.arm_path.with_name(f"{self.arm_path.name}.release-{self.armed['id']}").mkdir(exist_ok=True)
        self.armed = {}

    def _write_arm(self, doc: dict[str, Any]) -> None:
        tmp = self.arm_path.with_name(self.arm_path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.arm_path)

    def wait_fired(self, arm_id: int, freeze: bool, timeout: float = HOOK_TIMEOUT_S) -> bool:
        fired = self.arm_path.with_name(f"{self.arm_path.name}.fired-{arm_id}")
        if freeze:
            return stopped_at_hook(self.daemon, fired, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.daemon.alive():
            if fired.exists():
                return True
            time.sleep(0.02)
        return False

    def start_daemon(self) -> None:
        self.daemon.start()

    def stop_daemon(self, out: Outcome) -> int | None:
        """SIGTERM and wait; the exit code, or None (and a problem) when it did not stop in time."""
        self.daemon.thaw()
        if not self.daemon.alive():
            return self.daemon.proc.returncode if self.daemon.proc else None
        os.kill(self.daemon.pid, signal.SIGTERM)
        rc = self.daemon.exit_code(STOP_TIMEOUT_S)
        if rc is None:
            out.problems.append(f"did not exit within {STOP_TIMEOUT_S:.0f}s of SIGTERM")
            self.daemon.stop(signal.SIGKILL)
        return rc

    def settle(self, timeout: float | None = None) -> tuple[bool, float, dict[str, Any]]:
        """Pause the load; wait for RUNNING, undegraded, every table RUNNING at exactly its log end.
        Returns (in time, seconds taken, last status)."""
        timeout = self.c.args.recover_timeout if timeout is None else timeout
        self.pause_loads()
        ends = {t: self.admin.end_offsets(topic) for t, topic in self.topics.items()}
        t0 = time.monotonic()
        doc: dict[str, Any] = {}
        while time.monotonic() - t0 < timeout:
            if not self.daemon.alive():
                return False, time.monotonic() - t0, doc
            doc = self.daemon.status()
            if self._settled(doc, ends):
                return True, time.monotonic() - t0, doc
            time.sleep(0.2)
        return False, time.monotonic() - t0, doc

    def _settled(self, doc: dict[str, Any], ends: dict[str, dict[int, int]]) -> bool:
        if doc.get("pid") != self.daemon.pid or doc.get("state") != "RUNNING" or doc.get("degraded"):
            return False
        for table, want in ends.items():
            t = doc.get("tables", {}).get(table)
            if t is None or t.get("state") != "RUNNING":
                return False
            if any(t.get("offsets", {}).get(str(p), 0) != o for p, o in want.items()):
                return False
        return True

    def pause_loads(self) -> None:
        for load in self.loads.values():
            load.pause()

    def resume_loads(self) -> None:
        for load in self.loads.values():
            load.resume()

    def _watch(self, seconds: float, stop_when: Callable[[list[str]], bool] | None = None) -> list[str]:
        """Degraded texts and table errors seen in the status over ``seconds`` (HTTP serves it from memory, so
        it answers on a full disk)."""
        seen: list[str] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.daemon.alive():
            doc = self.daemon.status()
            tables = doc.get("tables", {}).values()
            texts = [doc.get("degraded") or ""] + [t.get("last_error") or "" for t in tables]
            texts += [(t.get("snapshot") or {}).get("last_error") or "" for t in tables]
            seen += [t for t in texts if t and t not in seen]
            if stop_when is not None and stop_when(seen):
                break
            time.sleep(0.3)
        return seen

    # -- preconditions ------------------------------------------------------------------------------------------

    def ensure_bulk(self) -> None:
        """Retention and recreation shrink the bulk topic; a bulk-load phase needs a log of BULK_RECORDS again."""
        topic = self.topics[plan.BULK]
        marks = self.admin.watermarks(topic)
        have = sum(hi - lo for lo, hi in marks.values())
        if have < BULK_RECORDS:
            n = BULK_RECORDS - have + 1_000
            produce_pinned(self.admin, topic, random_records(n, keys=BULK_KEYS, seed=self.seed * 1_000 + have))

    def extra_topic(self) -> str:
        """The topic of the table reload events add and drop: created, small, at the first such event."""
        if self.extra is None:
            topic = f"chaos-{self.seed}-{reloads.EXTRA}"
            reloads.create_extra(self, topic, PARTITIONS)
            self.extra = topic
        return self.extra

    def reset_table(self, table: str) -> str | None:
        r = globald("reset", "--config", str(self.daemon.config), "--table", table, "--yes", timeout=90)
        return None if r.returncode == 0 else f"globald reset exited {r.returncode}: {r.stderr.strip()[-300:]}"

    def exact_target(self, table: str, fraction: float) -> dict[int, int] | None:
        """Offsets below every published snapshot that holds anything, so the build starts from the log start and
        reads a while, and at no snapshot's offsets: an exact match is served without a build. None if no room."""
        marks = self.admin.watermarks(self.topics[table])
        found = manifests_of(self.daemon.state_dir, table)
        snaps = [m for m in found if not m.stale and any(m.offsets.get(p, lo) > lo for p, (lo, _) in marks.items())]
        if not snaps:
            return None
        top = {p: min([m.offsets.get(p, hi) for m in snaps] + [hi]) for p, (_, hi) in marks.items()}
        target = {p: lo + int(fraction * max(0, top[p] - lo)) for p, (lo, _) in marks.items()}
        if any(m.offsets == target for m in found):
            target = {p: max(lo, target[p] - 1) for p, (lo, _) in marks.items()}
        return None if any(m.offsets == target for m in found) else target


    def _unfill(self) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None

    # -- after the fault ----------------------------------------------------------------------------------------------


