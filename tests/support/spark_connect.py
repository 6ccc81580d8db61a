"""A real Spark Connect server for tests and benches, started from pyspark's own distribution.

``ConnectServer.start(work_dir)`` runs pyspark's bundled ``sbin/start-connect-server.sh`` (the ``spark-connect`` jar
ships in the pip package) on a free loopback port, with its logs and pid file under ``work_dir``, and returns once a
client session has run a query on it. ``stop()`` ends it by the PID its pid file names. Its Python workers run this
interpreter, so executors import globald as the tests do.

A process can hold a classic session and a Connect session at once, but PySpark chooses between its classic and
Connect implementations of ``pyspark.sql.functions`` (and ``Observation``) by one environment variable,
``SPARK_CONNECT_MODE_ENABLED``, which creating a Connect session sets. ``connect_mode(on)`` sets or clears it for the
code that follows, so tests switch kinds of session without restarting either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from globald.embedded.broker import free_port
from tests.ci import require_module
from tests.support.spark_cluster import spark_home
from tests.support.spark_local import TEST_JVM_OPTIONS

CONNECT_ENV = "SPARK_CONNECT_MODE_ENABLED"
START_TIMEOUT_S = 180.0  # ~20 s on an idle 2-core machine; the suite may share it with a broker and daemons
DEFAULT_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}


class ConnectStartError(RuntimeError):
    """The Connect server did not answer in time: its log (``log_dir``) says why; a JVM that fails to start
    usually lacks memory or finds the port taken."""


@contextlib.contextmanager
def connect_mode(on: bool) -> Iterator[None]:
    """PySpark's functions and Observation build Connect objects inside, classic ones outside (see module doc)."""
    was = os.environ.get(CONNECT_ENV)
    if on:
        os.environ[CONNECT_ENV] = "1"
    else:
        os.environ.pop(CONNECT_ENV, None)
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(CONNECT_ENV, None)
        else:
            os.environ[CONNECT_ENV] = was


def start_command(home: Path) -> list[str]:
    """pyspark's ``sbin/start-connect-server.sh``; PySpark 4.0.0's pip package ships the server's jar but not that
    script, so there, what the script runs (the server class under ``spark-daemon.sh``)."""
    script = home / "sbin" / "start-connect-server.sh"
    if script.exists():
        return [str(script)]
    return [str(home / "sbin" / "spark-daemon.sh"), "submit", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "1", "--name", "Spark Connect server"]


@dataclass
class ConnectServer:
    work_dir: Path
    port: int
    env: dict[str, str]
    pid: int | None = None
    _sessions: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    @classmethod
    def start(cls, work_dir: Path, master: str = "local[2]", conf: Mapping[str, str] | None = None,
              env: Mapping[str, str] | None = None, timeout: float = START_TIMEOUT_S) -> ConnectServer:
        """A server on a free loopback port (``master``: ``local[N]`` or ``spark://host:port``), answering."""
        work_dir.mkdir(parents=True, exist_ok=True)
        home = spark_home()
        run_env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(work_dir / "logs"),
                   "SPARK_PID_DIR": str(work_dir / "pids"), "PYSPARK_PYTHON": sys.executable,
                   "PYSPARK_DRIVER_PYTHON": sys.executable, **(env or {})}
        for var in (CONNECT_ENV, "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE"):
            run_env.pop(var, None)
        server = cls(work_dir, free_port(), run_env)
        args = [*start_command(home), "--master", master,
                "--conf", f"spark.connect.grpc.binding.port={server.port}",
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1"]
        for k, v in {**DEFAULT_CONF, **(conf or {})}.items():
            args += ["--conf", f"{k}={v}"]
        subprocess.run(args, env=run_env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
        try:
            server.pid = server._wait_pid(timeout)
            server._wait_answering(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _pid_file(self) -> Path | None:
        found = sorted((self.work_dir / "pids").glob("*SparkConnectServer*.pid"))
        return found[0] if found else None

    def _wait_pid(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid_file = self._pid_file()
            if pid_file is not None and pid_file.read_text().strip():
                return int(pid_file.read_text().strip())
            time.sleep(0.2)
        raise ConnectStartError(f"no pid file in {self.work_dir / 'pids'} after {timeout:.0f} s; logs: {self.log_dir}")

    def _wait_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ConnectStartError(f"the Connect server (pid {self.pid}) exited while starting:\n"
                                        f"{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.3)
        raise ConnectStartError(f"the Connect server did not listen on {self.port} within {timeout:.0f} s:\n"
                                f"{self.log_tail()}")

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for f in sorted(self.log_dir.glob("*.out")):
            out += f.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def session(self) -> Any:
        """A Connect client session on this server (created outside ``connect_mode``, which it leaves as found)."""
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        with connect_mode(True):
            s = RemoteSparkSession.builder.remote(self.url).create()
        self._sessions.append(s)
        return s

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the client sessions, then the server by its PID (SIGTERM; SIGKILL after ``timeout``)."""
        for s in self._sessions:
            with contextlib.suppress(Exception), connect_mode(True):
                s.stop()
        self._sessions.clear()
        if self.pid is None or not self.alive():
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        pid_file = self._pid_file()
        if pid_file is not None:
            pid_file.unlink(missing_ok=True)


# -- pytest fixtures (import them into a test module to use them) ------------------------------------------------

REUSE_ENV = "GLOBALD_TEST_CONNECT_URL"  # a developer's already running server: sc://host:port (not stopped)
TEST_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "200", "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS}


# Module-scoped: the server is a daemon (spark-daemon.sh, parent PID 1) of ~650 MB; held for the session, it stood
# idle from the end of its worker's first Connect module to the end of the run (issue 40's orphaned JVMs).
@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """One Connect server (local[2]) for a test module, stopped by PID at its end."""
    require_module("pyspark.sql.connect.session", "spark")
    reuse = os.environ.get(REUSE_ENV, "").strip()
    if reuse:
        yield ConnectServer(Path(tmp_path_factory.mktemp("connect-reused")), int(reuse.rsplit(":", 1)[1]), {})
        return
    server = ConnectServer.start(tmp_path_factory.mktemp("spark-connect"), conf=TEST_CONF,
                                 env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def connect_session(connect_server: ConnectServer) -> Any:
    """A Connect client session on ``connect_server``; use it inside ``connect_mode(True)``."""
    s = connect_server.session()
    with connect_mode(True):
        s.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", TEST_CONF[
            "spark.sql.execution.arrow.maxRecordsPerBatch"])
    return s
