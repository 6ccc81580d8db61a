"""The daemon as the campaign runs it: the harness's DaemonProcess, started under fiu-run and libfaketime through
``tests.chaos.entry``, with its status read over HTTP (status.json may sit on the disk the campaign fills up).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.store.names import STATUS_FILE
from tests.chaos import entry
from tests.harness import REPO, STOPPED_STATES, DaemonProcess, process_state


@dataclass
class ChaosDaemon(DaemonProcess):
    prefix: list[str] = field(default_factory=list)  # fiu-run … (see tools.Fiu.prefix)
    http_port: int = 0
    state: Path = Path()  # the state_dir, known up front: the config is not re-read for every status

    def start(self) -> ChaosDaemon:
        out = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(self.env or {})}
        cmd = [*self.prefix, sys.executable, "-m", entry.__name__, "run", "--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        out.close()
        self.pids.append(self.proc.pid)
        return self

    @property
    def state_dir(self) -> Path:
        return self.state

    def status(self) -> dict[str, Any]:
        """The daemon's status over HTTP; status.json when HTTP does not answer (stopped, starting); {} if neither."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/status", timeout=1.5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            pass
        try:
            return json.loads((self.state / STATUS_FILE).read_bytes())
        except (OSError, ValueError):
            return {}

    def process_state(self) -> str | None:
        """The kernel's one-letter state of the daemon (R, S, T for stopped, Z…), None once it is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        return process_state(self.proc.pid)

    def freeze(self, timeout: float = 10.0) -> bool:
        if not self.alive():
            return False
        os.kill(self.pid, signal.SIGSTOP)
        return self.wait_stopped(timeout)

    def wait_stopped(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.process_state()
            if state in STOPPED_STATES or state is None:
                return state is not None
            time.sleep(0.02)
        return False

    def thaw(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)

    def exit_code(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` for the process to end; its exit code, or None if it still runs."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def stopped_at_hook(d: DaemonProcess, fired: Path, timeout: float) -> bool:
    """Whether the entry's hook fired (its ``fired`` file exists) and the daemon then stands stopped (SIGSTOP) at
    it, within ``timeout``; False once the daemon has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and d.alive():
        if fired.exists() and process_state(d.pid) in STOPPED_STATES:
            return True
        time.sleep(0.02)
    return False
