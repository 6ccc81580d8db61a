"""Export events of the campaign (``plan.EXPORT``): ``globald export`` asked inside a phase, then a second store
bootstrapped from the newest export and compared with the fold.

The campaign's daemon exports to ``file://<seed dir>/exports`` only when asked (``interval_s = 0``) and never
bootstraps itself (``bootstrap = false``): a reset or a wipe of a fault must keep restoring from the topic, as the
campaign's restore and bulk-load phases need. The ask goes out while the daemon stands frozen at the phase's hook
(the loop takes the request at its next turn, so an ask made while a commit or a publish is held waits for it);
the phase is released once the export is answered or a few seconds passed.

An export that did not happen proves nothing: the event counts as landed (``Outcome.hit``) only once
``globald export`` exited 0 naming an export id whose manifest is in the storage, and a plain daemon on a state_dir
of its own, with ``bootstrap = true``, installed that table from an export (its status ``origin``), went RUNNING at
the log end and holds what the fold of the topic holds at its offsets. That daemon must stop on SIGTERM, exit 0,
within ``STOP_S``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.harness import REPO, DaemonProcess, write_config
from tests.reliability.checks import check_store

if TYPE_CHECKING:
    from tests.chaos.base import SeedBase
    from tests.chaos.outcome import Outcome
    from tests.chaos.plan import Fault

ANSWERED_S = 5.0  # held this long for the export to be answered inside the phase, then released
EXPORTED_S = 300.0  # from the release to ``globald export``'s answer
BOOTSTRAP_S = 180.0  # the second daemon RUNNING at the log end
STOP_S = 10.0  # the second daemon's stop: a bootstrapped store closes as any other


def section(root: Path, bootstrap: bool) -> dict[str, Any]:
    """The ``[export]`` section of the seed's daemons: a directory under the seed's for the storage."""
    return {"uri": (root / "exports").as_uri(), "interval_s": 0, "keep": 3, "bootstrap": bootstrap}


class ExportEvent:
    def __init__(self, run: SeedBase, fault: Fault, out: Outcome) -> None:
        self.run, self.f, self.out = run, fault, out
        self.d = run.daemon
        self.ask: subprocess.Popen[str] | None = None

    def prepare(self) -> None:
        """Nothing before the phase: the storage is the seed's, the table one of its own."""

    def inject(self) -> None:
        cmd = [sys.executable, "-m", "globald", "export", "--config", str(self.run.config.path), "--table",
               self.f.table, "--json", "--timeout", str(EXPORTED_S)]
        self.ask = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def hold(self) -> None:
        assert self.ask is not None
        t0 = time.monotonic()
        while self.ask.poll() is None and time.monotonic() - t0 < ANSWERED_S and self.d.alive():
            time.sleep(0.1)
        answered = self.ask.poll() is not None
        self.out.notes.append(f"export {'answered' if answered else 'not answered yet'} "
                              f"{time.monotonic() - t0:.1f}s into the held phase")
        self.run.release(self.out)
        try:
            stdout, stderr = self.ask.communicate(timeout=EXPORTED_S + 30)
        except subprocess.TimeoutExpired:
            self.ask.kill()
            stdout, stderr = self.ask.communicate()
        rc, self.ask = self.ask.returncode, None
        export_id = None
        if rc == 0:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                export_id = str(json.loads(stdout)["export"])
        if export_id is None:
            self.out.problems.append(f"globald export exited {rc}: {(stdout + stderr).strip()[-400:]}")
            self.out.hit = False
            return
        manifest = self.run.root / "exports" / self.f.table / "exports" / f"{export_id}.json"
        if not manifest.is_file():
            self.out.problems.append(f"globald export answered export {export_id}, but {manifest} is not there")
            self.out.hit = False
            return
        self.out.notes.append(f"exported {self.f.table} as {export_id}")
        self.out.hit = self._bootstrap(export_id)

    def _bootstrap(self, export_id: str) -> bool:
        """A second daemon bootstraps the table from the storage; its store against the fold."""
        run, out, table = self.run, self.out, self.f.table
        topic = run.topics[table]
        root = run.root / "bootstrap"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        cfg = write_config(root / "globald.toml", root / "state", run.broker.settings, {table: topic},
                           commit_interval_ms=500, metadata_refresh_ms=2000, log_level="INFO",
                           http={"enabled": False}, export=section(run.root, bootstrap=True))
        second = DaemonProcess(cfg, root / "daemon.log").start()
        run.pause_loads()  # a fixed log end to reach; the recovery after this event resumes them
        ends = run.admin.end_offsets(topic)
        try:
            doc = second.wait_running({table: ends}, timeout=BOOTSTRAP_S)
        except AssertionError as e:
            out.problems.append(f"a daemon bootstrapping {table} from the exports did not reach its log end "
                                f"{ends} within {BOOTSTRAP_S:.0f}s: {str(e)[-600:]}")
            self._stop(second)
            return False
        origin = doc["tables"][table].get("origin") or {}
        ok = True
        if origin.get("kind") != "export" or str(origin.get("export")) != export_id:  # none newer was made
            out.problems.append(f"a daemon bootstrapping {table} did not start from export {export_id}, the newest: "
                                f"origin {origin}")
            ok = False
        else:
            out.notes.append(f"second store bootstrapped from export {origin.get('export')} (asked: {export_id}), "
                             f"tail {origin.get('tail')}")
        store = check_store(run.broker, root / "state", table, topic, allow_uncompared=True)
        out.checks += 1
        if store.divergences or not store.compared:
            out.divergences += max(1, store.divergences)
            out.problems.append(f"{table}: the store bootstrapped from an export differs from the oracle at "
                                f"{store.offsets}: {store.error}")
            ok = False
        return self._stop(second) and ok

    def _stop(self, second: DaemonProcess) -> bool:
        assert second.proc is not None
        t0 = time.monotonic()
        os.kill(second.pid, signal.SIGTERM)
        try:
            rc = second.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            rc = None
            second.stop(signal.SIGKILL)
        took = time.monotonic() - t0
        if rc != 0:
            self.out.problems.append(f"the bootstrapped daemon did not stop with 0 within {STOP_S:.0f}s of SIGTERM "
                                     f"(exit {rc}, {took:.1f}s)")
            return False
        self.out.notes.append(f"the bootstrapped daemon stopped in {took:.1f}s")
        return True

    def close(self) -> None:
        if self.ask is not None:
            if self.ask.poll() is None:
                self.ask.kill()
            self.ask.communicate()
            self.ask = None
