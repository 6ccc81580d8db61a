"""The campaign's outside tools: libfiu (``fiu-run``/``fiu-ctrl``) for I/O errors, and the daemon's wall clock.

libfiu comes from Debian (``make sysdeps``: fiu-utils). The daemon is started as ``fiu-run -x -f PREFIX python …``;
fiu-run execs, so the PID the campaign holds is the daemon's.

Wall-clock steps: by default ``tests.chaos.entry`` shifts ``time.time``/``time.time_ns`` in the daemon by an offset
read from a file (``--clock python``). libfaketime (Debian faketime, ``--clock libfaketime``: LD_PRELOAD through a
shell, since fiu-run replaces LD_PRELOAD and ``faketime`` itself would fork) was measured unusable for this on
these machines: with FAKETIME_DONT_FAKE_MONOTONIC=1 (a wall-clock step must not move the monotonic clock) and any
non-zero offset, even one constant from the start, librdkafka's metadata requests time out on a healthy broker
(5 of 6 in 2 s each; 0 of 6 without libfaketime or with offset 0), and with the monotonic clock faked too the
client hangs. A real clock set to yesterday does neither, so every clock fault would report libfaketime's artifact.
libfaketime 0.9.10 also makes an absolute CLOCK_MONOTONIC clock_nanosleep fail with EINVAL (``time.sleep``), which
``tests.chaos.entry`` works around. The Python-level step reaches every wall-clock read globald makes (leases,
manifests, snapshot ids, status), not those of RocksDB or librdkafka, whose timers are monotonic.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.entry import CLOCK_ENV, FIU_SITES, SLEEP_FIX_ENV

FAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                  "/usr/local/lib/faketime/libfaketime.so.1")
ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


def faketime_lib() -> str | None:
    for pattern in FAKETIME_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def missing(clock: str = "python") -> str | None:
    """Why the campaign cannot run here (None when it can): the tools it injects faults with."""
    lacking = [tool for tool in ("fiu-run", "fiu-ctrl") if shutil.which(tool) is None]
    if clock == "libfaketime" and faketime_lib() is None:
        lacking.append("libfaketime.so.1")
    if not lacking:
        return None
    return (f"{', '.join(lacking)} not installed: run `make sysdeps` as root (apt-get install fiu-utils faketime)")


@dataclass
class Clock:
    """The daemon's wall clock: an offset in seconds in a file, re-read by the daemon at most once a second."""

    path: Path
    mode: str = "python"  # or "libfaketime"

    def set(self, offset_s: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        os.replace(tmp, self.path)

    def env(self) -> dict[str, str]:
        """The daemon's environment for this clock."""
        if not self.path.exists():
            self.set(0)
        if self.mode == "python":
            return {CLOCK_ENV: str(self.path)}
        return {"FAKETIME_TIMESTAMP_FILE": str(self.path), "FAKETIME_CACHE_DURATION": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1", SLEEP_FIX_ENV: "1"}

    def preload(self) -> str | None:
        return faketime_lib() if self.mode == "libfaketime" else None


@dataclass
class Fiu:
    """Failure points in a process started by ``prefix()``, armed from outside with fiu-ctrl."""

    fifo_prefix: Path

    def prefix(self, faketime: str | None) -> list[str]:
        """The command that starts a program under libfiu (and libfaketime, given its path). fiu-run replaces
        LD_PRELOAD, so libfaketime is appended by a shell that then execs: one PID for the whole chain."""
        cmd = ["fiu-run", "-x", "-f", str(self.fifo_prefix)]
        if faketime is None:
            return cmd
        return [*cmd, "sh", "-c", f'LD_PRELOAD="$LD_PRELOAD {faketime}" exec "$@"', "sh"]

    def control(self, pid: int, command: str, timeout: float = 10.0) -> str | None:
        """Run one fiu-ctrl command on ``pid``; None on success, else why not. Never on a stopped process: fiu-ctrl
        waits for the process's answer."""
        try:
            r = subprocess.run(["fiu-ctrl", "-f", str(self.fifo_prefix), "-c", command, str(pid)],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"fiu-ctrl {command!r} got no answer from {pid} in {timeout:.0f}s"
        out = (r.stdout + r.stderr).strip()
        return None if r.returncode == 0 and not out else (out or f"fiu-ctrl exited {r.returncode}")

    @staticmethod
    def enable_command(site: str, err: int, mode: str, probability: float = 0.0) -> str:
        name = FIU_SITES[site]
        if mode == "random":
            return f"enable_random name={name},failnum=-1,failinfo={err},probability={probability}"
        return f"enable name={name},failnum=-1,failinfo={err}" + (",onetime" if mode == "once" else "")

    @staticmethod
    def disable_command(site: str) -> str:
        return f"disable name={FIU_SITES[site]}"
