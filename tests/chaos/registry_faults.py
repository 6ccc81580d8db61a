"""Schema Registry events of the campaign (``plan.REGISTRY``): the registry a typed table decodes with goes silent,
answers 503 or 429 with ``Retry-After``, 401, or slower than the client's timeout (the double's modes,
tests/support/registry.py), while that table restores, runs, or reloads.

Each event has a daemon of its own beside the campaign's (the campaign's two tables are raw, and its daemon never
loads the decoder): a state_dir of its own, one table ``cust`` on a topic of the event's own, Avro values in the
Confluent framing whose writer ids come from the registry, in the campaign's process. The phase:

- **restore**: the fault is in place before that daemon starts, so its start, restore and first decode meet it;
- **steady state**: the daemon runs, its snapshot decoded with the registry answering, then the fault;
- **reload**: as steady, with the reader schema a subject's version; the fault, then a SIGHUP, whose reload asks
  the registry for the subject again: it must apply, keeping the version taken before;
- **rebuild**: as steady, then the fault, then ``globald reset`` of the table: it is rebuilt from the topic while
  the registry is in trouble (what the daemon already had of it stays: only the new id waits);
- **export**: as steady (with an ``[export]`` section), then the fault, then ``globald export`` of the table: the
  export is made and its manifest is in the storage, the registry in trouble all along;
- **bootstrap**: as steady, exported with the registry answering, stopped; then the fault, the state_dir emptied
  and the daemon started again with ``bootstrap = true``: it installs that export (its status ``origin``) and
  decodes nothing it cannot, since nothing of the registry's is left on its disk (every value waits).

Then, with the fault still in place, records written with a writer id the daemon never met. What must hold:
- values pending, not dropped nor guessed: the snapshot at the log end decoded with ``pending`` equal to the
  number of its keys whose value carries an id the daemon could not have (all of them, in a restore), and no
  other decode error;
- no process change: the same PID from start to the campaign's stop;
- stop within ``STOP_S`` of SIGTERM, exit 0, the registry still in trouble;
- once the registry answers again, a restarted daemon decodes the same snapshot with nothing pending, every value
  equal to fastavro's decode of the oracle fold at its offsets, and the store equal to the fold.

The event counts as landed (``Outcome.hit``) only if the registry met the fault (its ``faulted`` count) and all of
that held.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from typing import TYPE_CHECKING, Any

from tests.chaos import exports, plan
from tests.harness import DaemonProcess, globald, write_config
from tests.integration.test_registry_daemon import (
    READER,
    SECTION,
    V1,
    V2,
    check_decoded,
    decoded_at,
    produced,
    reference,
    subject_section,
)
from tests.reliability.checks import check_store
from tests.support.registry import RegistryDouble
from tests.unit.typed_fixtures import FIXTURES

if TYPE_CHECKING:
    from tests.chaos.base import SeedBase
    from tests.chaos.outcome import Outcome
    from tests.chaos.plan import Fault

TABLE = "cust"
RECORDS, KEYS, NEW_RECORDS = 300, 120, 60
CLIENT_TIMEOUT_S = 2  # [registry] timeout: a silent or slow registry costs this per request
SLOW_S = 3 * CLIENT_TIMEOUT_S  # a slow registry answers after this: past the client's timeout
RUNNING_S = 120.0  # restore to the log end, a snapshot decoded, a reload applied: each within this
STOP_S = 1.0  # SIGTERM to exit, the registry still in trouble


def double(run: SeedBase) -> RegistryDouble:
    """The seed's registry, started at its first registry event, stopped at the seed's teardown."""
    if run.registry is None:
        run.registry = RegistryDouble().start()
    return run.registry


class RegistryEvent:
    def __init__(self, run: SeedBase, fault: Fault, out: Outcome) -> None:
        self.run, self.f, self.out = run, fault, out
        self.root = run.root / f"registry-{fault.index}"
        self.topic = f"chaos-{run.seed}-typed-{fault.index}"
        self.second: DaemonProcess | None = None
        self.registry = double(run)
        self.subject = f"chaos-{run.seed}-{fault.index}-value"  # the event's own: its versions are the event's

    def prepare(self) -> None:
        """The event's topic, written with schema v1 (registered now), and its daemon's config."""
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.copytree(FIXTURES, self.root / "schemas")
        one = self.registry.register(self.subject, V1)
        self.run.admin.create(self.topic, partitions=3)
        self.run.admin.produce(self.topic, produced(one, V1, RECORDS, keys=KEYS, seed=self.f.index + 1))
        cfg = write_config(self.root / "globald.toml", self.root / "state", self.run.broker.settings,
                           {TABLE: self.topic}, commit_interval_ms=500, metadata_refresh_ms=2000, log_level="INFO",
                           http={"enabled": False}, snapshots={"interval_ms": 1000, "decode_interval_ms": 500},
                           registry={"url": self.registry.url, "timeout": CLIENT_TIMEOUT_S},
                           **({"export": exports.section(self.root, bootstrap=self.f.phase == plan.BOOTSTRAP)}
                              if self.f.phase in (plan.EXPORTING, plan.BOOTSTRAP) else {}))
        section = subject_section(self.subject) if self.f.phase == plan.RELOADING else SECTION
        # No retry within a request (write_config cannot spell the dotted key): a silent registry costs one timeout
        # per request, which keeps the CI form's event within its budget.
        timeout = f"timeout = {CLIENT_TIMEOUT_S}\n"
        text = cfg.read_text().replace(timeout, timeout + '"max.retries" = 0\n')
        assert '"max.retries" = 0' in text, text
        cfg.write_text(text + section)
        self.config = cfg

    def inject(self) -> None:
        p = self.f.params
        self.registry.fault(p["mode"], retry_after=int(p["retry_after"]), delay_s=SLOW_S)

    def heal(self) -> None:
        self.registry.heal()

    def hold(self) -> None:
        """Nothing: ``drive`` holds the fault through its own checks."""

    def drive(self) -> None:
        """The whole event: its phase, the fault, the checks while it lasts, the stop, the heal, the checks after.
        Sets ``out.reached``, ``injected`` and ``hit``. A wait the daemon did not meet is a problem of the daemon's,
        not a campaign error."""
        try:
            self._drive()
        except AssertionError as e:
            self.out.problems.append(f"the typed table's daemon: {str(e)[:1500]}")
            self.out.hit = False

    def _drive(self) -> None:
        out, f = self.out, self.f
        if f.phase == plan.RESTORE:
            self.inject()
            out.reached = out.injected = True
            self.second = self._start()
            self._wait(lambda s: s.get("state") == "RUNNING", "RUNNING")
        else:
            self.second = self._start()
            self._wait(lambda s: s.get("state") == "RUNNING", "RUNNING")
            if self._decoded_again("before the fault") is None:  # nothing pending yet: the count below is the fault's
                return
            if f.phase == plan.BOOTSTRAP and not self._bootstrap_in_trouble():
                return
            if f.phase != plan.BOOTSTRAP:
                self.inject()
                out.reached = out.injected = True
            if f.phase == plan.RELOADING:
                self._reload()
            elif f.phase == plan.REBUILD:
                self._rebuild()
            elif f.phase == plan.EXPORTING and self._export() is None:
                return
        assert self.second is not None
        pid = self.second.pid
        new = self.registry.register(self.subject, {**V2, "doc": f"event {f.seed}:{f.index}"})  # an id never met
        self.run.admin.produce(self.topic, produced(new, V2, NEW_RECORDS, keys=KEYS, seed=f.index + 100))
        ok = self._pending(new if f.phase not in (plan.RESTORE, plan.BOOTSTRAP) else None)
        ok = self._same_pid(pid) and ok
        ok = self._stop("the registry still in trouble") and ok
        self.heal()
        self.second = self._start()
        decode = self._decoded_again("after the registry answered again")
        ok = decode is not None and ok
        if decode is not None:
            try:
                reader = self._reader()
                check_decoded(self.second, self.run.broker, self.topic, decode,
                              lambda value: reference(self.registry, value, reader))
                out.checks += 1
            except AssertionError as e:
                out.divergences += 1
                out.problems.append(f"decoded values after the registry answered again differ from fastavro's "
                                    f"decode of the fold: {str(e)[:600]}")
                ok = False
        store = check_store(self.run.broker, self.root / "state", TABLE, self.topic, allow_uncompared=True)
        out.checks += 1
        if store.divergences or not store.compared:
            out.divergences += max(1, store.divergences)
            out.problems.append(f"typed table's store differs from the oracle at {store.offsets}: {store.error}")
            ok = False
        ok = self._stop("the registry answering") and ok
        met = self.registry.faulted[f.params["mode"]]
        out.notes.append(f"the registry met {met} request(s) with its fault")
        out.hit = ok and met > 0

    # -- steps ----------------------------------------------------------------------------------------------

    def _start(self) -> DaemonProcess:
        return DaemonProcess(self.config, self.root / "daemon.log").start()

    def _wait(self, pred: Any, what: str) -> dict[str, Any]:
        assert self.second is not None
        return self.second.wait_for(pred, timeout=RUNNING_S, what=what)

    def _reader(self) -> dict[str, Any]:
        """The reader schema in force: the file's, or the subject's version the daemon pinned (at its restart, the
        latest: the one registered during the fault)."""
        if self.f.phase != plan.RELOADING:
            return READER
        pin = json.loads((self.root / "state" / "registry" / "readers" / f"{TABLE}.value.json").read_text())
        return dict(json.loads(self.registry.schemas[int(pin["id"])].text))

    def _reload(self) -> None:
        """A SIGHUP whose reload meets the fault taking the subject's version: applied, the version kept."""
        assert self.second is not None
        gen = int((self.second.status().get("config") or {}).get("generation") or 0)
        os.kill(self.second.pid, signal.SIGHUP)
        doc = self._wait(lambda s: int((s.get("config") or {}).get("generation") or 0) > gen, "the reload applied")
        last = (doc.get("config") or {}).get("last_reload") or {}
        if last.get("result") != "applied":
            self.out.problems.append(f"a reload meeting the registry's fault was {last.get('result')}: "
                                     f"{last.get('error')}")
        kept = [x for x in self.second.tail(200).splitlines() if "reader schema" in x and "keeping version" in x]
        self.out.notes.append(f"reload during the fault: {kept[-1][-200:] if kept else 'no keeping line logged'}")

    def _rebuild(self) -> None:
        """``globald reset`` of the table, the registry in trouble: rebuilt from the topic, RUNNING again."""
        assert self.second is not None
        r = globald("reset", "--config", str(self.config), "--table", TABLE, "--yes", timeout=90)
        if r.returncode != 0:
            self.out.problems.append(f"globald reset exited {r.returncode}: {r.stderr.strip()[-300:]}")
        ends = self.run.admin.end_offsets(self.topic)
        self.second.wait_running({TABLE: ends}, timeout=RUNNING_S)
        doc = self.second.status()["tables"][TABLE]
        self.out.notes.append(f"rebuilt by globald reset with the registry in trouble: wipes {doc.get('wipes')}")

    def _export(self) -> str | None:
        """``globald export`` of the table: made, its manifest in the storage (the registry's state is none of its
        business). The export id, or None (a problem said why)."""
        r = globald("export", "--config", str(self.config), "--table", TABLE, "--json", "--timeout", "120",
                    timeout=180)
        export_id = None
        if r.returncode == 0:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                export_id = str(json.loads(r.stdout)["export"])
        manifest = self.root / "exports" / TABLE / "exports" / f"{export_id}.json"
        if export_id is None or not manifest.is_file():
            self.out.problems.append(f"globald export of the typed table exited {r.returncode} (manifest there: "
                                     f"{manifest.is_file()}): {(r.stdout + r.stderr).strip()[-400:]}")
            self.out.hit = False
            return None
        self.out.notes.append(f"exported {TABLE} as {export_id}")
        return export_id

    def _bootstrap_in_trouble(self) -> bool:
        """Exported with the registry answering, stopped; the fault; an empty state_dir bootstrapped from that
        export. Whether it went so (else a problem says why)."""
        export_id = self._export()
        if export_id is None or not self._stop("before the bootstrap, the registry answering"):
            return False
        shutil.rmtree(self.root / "state")
        self.inject()
        self.out.reached = self.out.injected = True
        self.second = self._start()
        doc = self._wait(lambda s: s.get("state") == "RUNNING", "RUNNING, bootstrapped")
        origin = doc["tables"][TABLE].get("origin") or {}
        self.out.notes.append(f"bootstrapped with the registry in trouble: origin {origin}"[:300])
        if origin.get("kind") != "export" or str(origin.get("export")) != export_id:
            self.out.problems.append(f"the typed table did not start from export {export_id}: origin {origin}")
            return False
        return True

    def _pending(self, new: int | None) -> bool:
        """The snapshot at the log end decoded, its values of ids the daemon could not have pending, nothing else
        failed. ``new``: the one such id (None: every value, as in a restore from a registry in trouble)."""
        assert self.second is not None
        ends = self.run.admin.end_offsets(self.topic)
        try:
            decode = decoded_at(self.second, ends, timeout=RUNNING_S)
        except AssertionError as e:
            self.out.problems.append(f"the snapshot at {ends} not decoded while the registry was in trouble: "
                                     f"{str(e)[:600]}")
            return False
        from tests.harness import oracle_at

        oracle = oracle_at(self.run.broker, self.topic, decode["offsets"])
        values = [v for v in oracle.values() if v is not None]
        waiting = len(values) if new is None else sum(v[1:5] == new.to_bytes(4, "big") for v in values)
        self.out.notes.append(f"while in trouble: {decode.get('values')} values, {decode.get('pending')} pending, "
                              f"{decode.get('errors')} errors; {waiting} with an id not had")
        if not waiting or decode.get("pending") != waiting or decode.get("errors") != waiting:
            self.out.divergences += 1
            self.out.problems.append(f"values not pending while the registry was in trouble: {waiting} keys carry "
                                     f"an id the daemon could not have, decode status {decode}")
            return False
        return True

    def _same_pid(self, pid: int) -> bool:
        assert self.second is not None
        doc = self.second.status()
        if not self.second.alive() or doc.get("pid") != pid:
            self.out.pid_changes += 1
            self.out.problems.append(f"the typed table's daemon changed process: started as {pid}, status "
                                     f"{doc.get('pid')}, alive {self.second.alive()}")
            return False
        return True

    def _decoded_again(self, when: str) -> dict[str, Any] | None:
        """The registry answering: the snapshot at the log end decoded, nothing pending."""
        assert self.second is not None
        ends = {str(p): o for p, o in self.run.admin.end_offsets(self.topic).items()}

        def done(s: dict[str, Any]) -> bool:
            decode = s["tables"][TABLE].get("decode") or {}
            return (decode.get("offsets") == ends and decode.get("pending") == 0
                    and decode.get("snapshot") == s["tables"][TABLE]["snapshot"]["current"])

        try:
            return dict(self._wait(done, "the pending values decoded")["tables"][TABLE]["decode"])
        except AssertionError as e:
            self.out.problems.append(f"the snapshot at the log end not decoded with nothing pending within "
                                     f"{RUNNING_S:.0f}s, {when}: {str(e)[:600]}")
            return None

    def _stop(self, when: str) -> bool:
        second, self.second = self.second, None
        assert second is not None
        rc, took = second.timed_stop(60)
        self.out.notes.append(f"stopped {took:.2f}s after SIGTERM ({when}), exit {rc}")
        if rc != 0 or took > STOP_S:
            self.out.problems.append(f"the typed table's daemon did not stop with 0 within {STOP_S:.0f}s of SIGTERM "
                                     f"({when}): exit {rc} after {took:.2f}s")
            return False
        return True

    def close(self) -> None:
        """Whatever the event left: the registry healed, its daemon stopped."""
        self.heal()
        if self.second is not None and self.second.alive():
            self.second.stop(signal.SIGKILL)
        self.second = None
