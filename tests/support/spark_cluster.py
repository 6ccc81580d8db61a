"""A throwaway Spark standalone cluster on one machine, for the multi-host tests and benchmarks.

A master and N workers are started with the pyspark package's own ``bin/spark-class``, each on free loopback ports
and in its own process group, and stopped by that group's PID. Executors inherit their worker's environment, so
each worker stands for one executor host with its own settings (its own ``GLOBALD_CONFIG``, hence its own
sidecar). Test support: not shipped in the wheel.
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

from globald.embedded.broker import free_port


class ClusterStartError(RuntimeError):
    """The standalone cluster did not come up. Check that Java 17 and pyspark are installed; logs are in run_dir."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class Worker:
    """One worker: ``env`` is added to its environment (and so to its executors')."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    cores: int = 1
    memory: str = "1g"
    work_dir: Path | None = None  # set by start(): run_dir/<name>
    proc: subprocess.Popen[bytes] | None = None

    def executor_logs(self) -> list[Path]:
        """The stderr files of every executor this worker launched (app-*/<executor id>/stderr)."""
        return sorted(self.work_dir.glob("app-*/*/stderr")) if self.work_dir else []

    def executor_ids(self, app_id: str) -> set[str]:
        """Ids of the executors this worker launched for ``app_id``."""
        base = self.work_dir / app_id if self.work_dir else None
        return {p.name for p in base.iterdir() if p.is_dir()} if base and base.is_dir() else set()


@dataclass
class StandaloneCluster:
    """``start()`` brings up the master and ``workers`` and waits until every worker is ALIVE; ``stop()`` ends them
    all (and the executors they launched) by process group."""

    run_dir: Path
    workers: list[Worker]
    host: str = "127.0.0.1"
    port: int = 0
    webui_port: int = 0
    master: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": self.host, "SPARK_NO_DAEMONIZE": "1", "SPARK_LOG_DIR": str(self.run_dir),
               # The master and workers only schedule: a small heap and no C2 compiler start them sooner.
               "SPARK_DAEMON_MEMORY": "256m", "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
        # The driver's own settings must not leak into the cluster's JVMs.
        for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_CONF_DIR"):
            env.pop(k, None)
        env.update(extra)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with open(self.run_dir / f"{name}.out", "ab") as out:
            # Its own session: stop() signals the whole group (the worker's executors and their Python workers).
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.run_dir,
                                    start_new_session=True)

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.webui_port = self.webui_port or free_port()
        try:
            self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", self.host,
                                                 "--port", str(self.port), "--webui-port", str(self.webui_port)],
                                      # No REST submission server: it would listen on the fixed port 6066.
                                      self._env({"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}))
            deadline = time.monotonic() + timeout
            self._wait(lambda: self.state() is not None, deadline, "the master")
            for w in self.workers:
                w.work_dir = self.run_dir / w.name
                w.work_dir.mkdir(parents=True, exist_ok=True)
                w.proc = self._spawn(w.name, [
                    "org.apache.spark.deploy.worker.Worker", self.url, "--host", self.host,
                    "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(w.cores),
                    "--memory", w.memory, "--work-dir", str(w.work_dir)],
                    self._env({"SPARK_WORKER_DIR": str(w.work_dir), **w.env}))
            self._wait(lambda: self.alive_workers() == len(self.workers), deadline, "the workers")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready: Any, deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            for p in [self.master, *(w.proc for w in self.workers)]:
                if p is not None and p.poll() is not None:
                    raise ClusterStartError(f"a cluster process exited with {p.returncode}; logs in {self.run_dir}")
            if ready():
                return
            time.sleep(0.2)
        raise ClusterStartError(f"{what} did not come up in time; logs in {self.run_dir}")

    def state(self) -> dict[str, Any] | None:
        """The master's JSON state (workers, applications); None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.webui_port}/json/", timeout=2) as r:
                doc = json.loads(r.read())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def alive_workers(self) -> int:
        doc = self.state() or {}
        return sum(1 for w in doc.get("workers", []) if w.get("state") == "ALIVE")

    def session(self, app: str, conf: dict[str, str] | None = None, timeout: float = 90.0) -> Any:
        """A SparkSession on this cluster, its driver on loopback, returned once every worker's executor has
        registered (so the first job can run on all of them). ``conf`` adds or overrides Spark settings."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                    "spark.driver.host": self.host, "spark.driver.bindAddress": self.host,
                    "spark.executor.memory": "512m",
                    "spark.cores.max": str(sum(w.cores for w in self.workers)), **(conf or {})}
        builder = SparkSession.builder.master(self.url).appName(app)
        for k, v in settings.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        if spark.sparkContext.master != self.url:  # getOrCreate hands back a session some caller left running
            raise ClusterStartError(f"a SparkContext on {spark.sparkContext.master} is still running; stop it first")
        spark.sparkContext.setLogLevel("ERROR")
        deadline = time.monotonic() + timeout
        while spark.sparkContext._jsc.sc().getExecutorIds().size() < len(self.workers):
            if time.monotonic() > deadline:
                spark.stop()
                raise ClusterStartError(f"the executors did not register in time; logs in {self.run_dir}")
            time.sleep(0.2)
        return spark

    def stop(self) -> None:
        for p in [*(w.proc for w in self.workers), self.master]:
            _stop_group(p)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_group(proc: subprocess.Popen[bytes] | None, timeout: float = 20.0) -> None:
    """SIGTERM to the process group ``proc`` leads, then SIGKILL if it is still there after ``timeout``."""
    if proc is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.wait()
