"""The campaign's probes (a part of ``campaign.SeedRun``): before any fault, proof that libfiu reaches RocksDB and
that a clock step reaches the daemon's wall clock; a campaign whose probes fail fails, whatever its faults did."""

from __future__ import annotations

import errno as errno_mod
import time
from collections.abc import Callable
from typing import Any

from tests.chaos.base import SeedBase
from tests.chaos.outcome import (
    Probe,
)
from tests.chaos.tools import FIU_SITES, Fiu


class Probes(SeedBase):
    """Do the tools reach the daemon at all?"""

    def probes(self) -> list[Probe]:
        return [self._probe_fiu(), self._probe_clock()]

    def _probe_fiu(self) -> Probe:
        """An fdatasync or fsync failure point must come back as RocksDB's own I/O error in the daemon's status:
        otherwise no io-error fault of the campaign ever reached the store, and a green run would prove nothing."""
        for site in ("fdatasync", "fsync"):
            cmd = Fiu.enable_command(site, errno_mod.EIO, "always")
            problem = self.fiu.control(self.daemon.pid, cmd)
            if problem:
                return Probe("libfiu reaches RocksDB", False, f"fiu-ctrl failed: {problem}")
            mark = self.daemon.log_size()
            seen = self._watch(8.0, stop_when=lambda texts: any("IO error" in t for t in texts))
            self.fiu.control(self.daemon.pid, Fiu.disable_command(site))
            ok, _, doc = self.settle()
            self.resume_loads()
            said = [x for x in self.daemon.log_since(mark, 400).splitlines() if "IO error" in x]
            hits = [t for t in seen if "IO error" in t] + said
            if hits:
                return Probe("libfiu reaches RocksDB", ok,
                             f"{FIU_SITES[site]} with EIO surfaced as: {hits[0][:160]}"
                             + ("" if ok else f"; but the daemon did not recover: {doc}"))
        return Probe("libfiu reaches RocksDB", False, "neither fdatasync nor fsync failures surfaced in the status")

    def _probe_clock(self) -> Probe:
        """A one-day step must show in the time the daemon stamps its status with, and a step back too."""
        day = 86_400
        self.clock.set(day)
        try:
            stepped = self._wait_status(lambda d: d.get("updated", 0) > time.time() + day / 2, 15)
        finally:
            self.clock.set(0)
        back = self._wait_status(lambda d: abs(d.get("updated", 0) - time.time()) < 600, 15)
        ok, _, _ = self.settle()
        self.resume_loads()
        return Probe(f"clock steps ({self.clock.mode}) reach the daemon's wall clock", stepped and back and ok,
                     f"status stamped one day ahead: {stepped}; back to now: {back}; recovered: {ok}")

    def _wait_status(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.daemon.status()):
                return True
            time.sleep(0.3)
        return False
