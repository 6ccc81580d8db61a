"""The local Spark Connect recipe of ``docs/spark-connect.md`` ("On one machine"), run as written (issue 36, item 6).

As the tutorial's test: ``globald dev --run`` in a terminal of its own (the broker, the seeded ``customers`` table and
its daemon), then the section's ``console`` block in one bash session after ``source .venv/bin/activate`` (its
``export`` lines hold for the commands after them), each command's output compared with the page's. The file the
page gives (``title="connect_join.py"``) is saved first. The one change: the page's port, 15002, becomes a free
one, as every test's ports are. Whatever the recipe fails to stop is stopped here, by the pid file it wrote.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from globald.cli.dev import READY_LINE
from globald.embedded.broker import free_port
from tests.harness import REPO
from tests.integration.test_newcomer_tutorial import VENV, Block, Terminal, commands, same

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PAGE = REPO / "docs" / "spark-connect.md"
SECTION = "### On one machine: a local Connect server beside `globald dev`"
PAGE_PORT = "15002"
MARK = "@@globald-recipe-command@@"


def section() -> str:
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE} has no section {SECTION!r}"
    return text.split(SECTION, 1)[1].split("\n#", 1)[0]


def _stop_server(pid_dir: Path) -> None:
    for pid_file in pid_dir.glob("*SparkConnectServer*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)


@pytest.mark.long  # a broker, a daemon and a Connect server: well over 30 s
@pytest.mark.timeout(900)
def test_the_local_connect_recipe_runs_as_written(tmp_path: Path) -> None:
    found = re.findall(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', section(), flags=re.S | re.M)
    consoles = [Block(kind, body.splitlines()) for kind, title, body in found if kind == "console"]
    files = {title: body for _, title, body in found if title}
    assert len(consoles) == 1 and list(files) == ["connect_join.py"], found
    port = str(free_port())
    cwd = tmp_path / "clone"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(VENV)
    for name, body in files.items():
        assert PAGE_PORT in body
        (cwd / name).write_text(body.replace(PAGE_PORT, port))
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != (VENV / "bin").resolve())
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SPARK_HOME", "PYSPARK_PYTHON", "SPARK_REMOTE",
                        "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_PID_DIR", "SPARK_LOG_DIR")}
    env["PATH"] = path
    steps = commands(consoles[0])
    script = "set -e\nsource .venv/bin/activate\n" + "".join(
        f"echo {MARK}\n{step.command.replace(PAGE_PORT, port)}\n" for step in steps)
    dev = Terminal(cwd, env, "globald dev --run", "dev")
    try:
        dev.wait_for(lambda lines: any(READY_LINE in line for line in lines), "out", "globald dev ready", timeout=180)
        dev.wait_for(lambda lines: any("table customers state RESTORING -> RUNNING" in line for line in lines),
                     "err", "the daemon restored customers", timeout=120)
        r = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        outputs = [chunk.splitlines() for chunk in r.stdout.split(MARK + "\n")[1:]]
        assert r.returncode == 0 and len(outputs) == len(steps), (r.returncode, r.stdout, r.stderr[-3000:])
        for step, output in zip(steps, outputs, strict=True):
            assert same(step.expected, output), (step.command, output, step.expected)
        assert not list((cwd / "spark-run").glob("*.pid")), "stop-connect-server.sh left its pid file"
        assert dev.ctrl_c() == 0
    finally:
        _stop_server(cwd / "spark-run")
        dev.stop()
