"""globald.spark on a real Spark standalone cluster: a master and two workers started with pyspark's own
``bin/spark-class``, each worker standing for one executor host with its own ``GLOBALD_CONFIG`` and its own running
sidecar (the real daemon, its own state_dir), the driver host with none. Everything binds loopback on free ports and
is stopped by PID at the end.

Shown: a join over 8 partitions equals the oracle fold at the descriptor's offsets with rows served by both sidecars;
after more records and a refresh, both hosts serve the new offsets; with one host's sidecar stopped, policy "fail"
fails that host's tasks with an error naming host, table and reason, and their retries on the other host return the
same rows the two hosts give together; policy "newest" falls back on that host, counted and logged.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from globald.snapshot.reader import listing
from globald.spark import GlobalTableView
from globald.spark.host import CONFIG_ENV
from tests.ci import require_module
from tests.harness import Broker, DaemonProcess, daemon_factory, oracle_at, random_records, write_config
from tests.integration.snapshot_helpers import wait_snapshot_at
from tests.support.spark_cluster import StandaloneCluster, Worker
from tests.support.spark_connect import ConnectServer, connect_mode
from tests.support.spark_local import stop_with_jvm

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.cluster, pytest.mark.long]

PARTITIONS = 8
KEYS = 600


@dataclass
class Host:
    """One executor host: its worker and its sidecar."""

    name: str
    worker: Worker
    sidecar: DaemonProcess

    @property
    def state_dir(self) -> Path:
        return self.sidecar.state_dir

    def snapshots(self) -> dict[str, dict[str, int]]:
        """Every snapshot this host's sidecar lists (``globald snapshots --json``, read in-process): id -> offsets."""
        return {s["id"]: s["offsets"] for s in listing(self.state_dir, "tbl")}

    def restart_sidecar(self, topic_ends: dict[int, int]) -> None:
        self.sidecar.start()
        wait_snapshot_at(self.sidecar, "tbl", topic_ends, timeout=90)


@dataclass
class Cluster:
    spark: Any
    broker: Broker
    topic: str
    driver_config: Path
    hosts: list[Host]
    master_url: str

    def ends(self) -> dict[int, int]:
        return self.broker.admin.end_offsets(self.topic)

    def keys(self) -> Any:
        from pyspark.sql import functions as F

        return self.spark.range(0, KEYS, numPartitions=PARTITIONS).select(F.format_string("key-%06d", "id").alias("k"))

    def join(self, view: GlobalTableView, group: str) -> list[Any]:
        self.spark.sparkContext.setJobGroup(group, group)
        return view.join(self.keys(), "k", snapshot_col="snap").collect()

    def executors(self, host: Host) -> set[str]:
        return host.worker.executor_ids(self.spark.sparkContext.applicationId)


def start_sidecar(make: Callable[..., DaemonProcess], topic: str, state_dir: Path) -> DaemonProcess:
    return make({"tbl": topic}, state_dir=state_dir, snapshots={"interval_ms": 200, "retain": 5})


@pytest.fixture(scope="module")
def cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_module("pyspark", "spark")
    tmp = tmp_path_factory.mktemp("cluster")
    topic = f"cluster{os.getpid()}"
    broker.admin.create(topic, partitions=3)
    broker.admin.produce(topic, random_records(3_000, keys=KEYS - 100, seed=111, tombstones=0.1))
    # The driver's config names the topic and the broker; no sidecar runs on its state_dir.
    driver_config = write_config(tmp / "driver.toml", tmp / "driver-state", broker.settings, {"tbl": topic})
    with daemon_factory(broker, tmp) as make:
        sidecars = {name: start_sidecar(make, topic, tmp / f"{name}-state") for name in ("a", "b")}
        workers = [Worker(name, {CONFIG_ENV: str(d.config)}, memory="768m") for name, d in sidecars.items()]
        spark_cluster = StandaloneCluster(tmp / "spark", workers)
        try:
            spark_cluster.start()
            for d in sidecars.values():
                wait_snapshot_at(d, "tbl", broker.admin.end_offsets(topic), timeout=90)
            # A task that fails on one executor is retried once on the other (never on the same one), and an
            # executor whose tasks failed stays in use for later jobs: the failure tests stay short and independent.
            spark = spark_cluster.session("globald-cluster-test", {
                "spark.task.maxFailures": "3", "spark.excludeOnFailure.enabled": "true",
                "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor": "1",
                "spark.excludeOnFailure.application.maxFailedTasksPerExecutor": "1000",
                # Short jobs on small data: executors start sooner without the C2 compiler.
                "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1"})
            try:
                hosts = [Host(w.name, w, sidecars[w.name]) for w in workers]
                yield Cluster(spark, broker, topic, driver_config, hosts, spark_cluster.url)
            finally:
                stop_with_jvm(spark)  # the driver's gateway JVM too, not left to the end of the worker
        finally:
            spark_cluster.stop()


def assert_oracle(rows: list[Any], expected: dict[bytes, bytes]) -> None:
    """Each row's value is the oracle's for its key (None where absent), with a timestamp exactly when present."""
    got = {r["k"]: None if r["value"] is None else bytes(r["value"]) for r in rows}
    assert rows and len(got) == len(rows) and got == {k: expected.get(k.encode()) for k in got}
    assert all((r["timestamp"] is None) == (r["value"] is None) for r in rows)


def served_by(c: Cluster, rows: list[Any]) -> dict[str, set[str]]:
    """host name -> the snapshot ids its rows carry; every row's snapshot is one its host lists."""
    lists = {h.name: h.snapshots() for h in c.hosts}
    assert not set(lists["a"]) & set(lists["b"]), "the two sidecars listed one snapshot id"
    out: dict[str, set[str]] = {h.name: set() for h in c.hosts}
    for snap in {r["snap"] for r in rows}:
        owner = [name for name, ids in lists.items() if snap in ids]
        assert len(owner) == 1, f"snapshot {snap} is listed by no host ({lists})"
        out[owner[0]].add(snap)
    return out


def snapshot_offsets(host: Host, ids: set[str]) -> set[tuple[tuple[str, int], ...]]:
    listed = host.snapshots()
    return {tuple(sorted(listed[i].items())) for i in ids}


def attempts(c: Cluster, group: str) -> list[tuple[int, str, str, str | None]]:
    """(task index, executor id, status, error) of every task attempt of the job group, from Spark's status store
    (waiting until every task has ended: the listener bus delivers them after the job returns)."""
    sc = c.spark.sparkContext
    store = sc._jsc.sc().statusStore()
    deadline = time.monotonic() + 30
    while True:
        out = []
        for job in sc.statusTracker().getJobIdsForGroup(group):
            for stage in sc.statusTracker().getJobInfo(job).stageIds:
                tasks = store.taskList(stage, 0, 10_000)
                for i in range(tasks.size()):
                    t = tasks.apply(i)
                    err = t.errorMessage()
                    out.append((t.index(), t.executorId(), t.status(), err.get() if err.isDefined() else None))
        done = {i for i, _, status, _ in out if status == "SUCCESS"}
        if len(done) >= PARTITIONS and all(status in ("SUCCESS", "FAILED") for _, _, status, _ in out):
            return out
        assert time.monotonic() < deadline, out
        time.sleep(0.2)


def test_join_reads_both_sidecars_and_follows_a_refresh(cluster: Cluster) -> None:
    c = cluster
    view = GlobalTableView(c.spark, c.driver_config, "tbl", wait_timeout_s=30)
    joins_both_sidecars_before_and_after_a_refresh(c, view, lambda round_: c.join(view, f"join-{round_}"))


def joins_both_sidecars_before_and_after_a_refresh(c: Cluster, view: GlobalTableView,
                                                   join: Callable[[int], list[Any]]) -> None:
    for round_ in range(2):
        if round_:
            c.broker.admin.produce(c.topic, [(b"key-%06d" % i, b"changed-%d" % i) for i in range(0, KEYS, 7)]
                                   + [(b"key-000001", None)])
        desc = view.refresh()
        # The driver host has no sidecar: the descriptor carries the end offsets, the executors resolve them.
        assert desc["snapshot"] is None and desc["offsets"] == {str(p): o for p, o in c.ends().items()}
        rows = join(round_)
        assert len(rows) == KEYS
        assert_oracle(rows, oracle_at(c.broker, c.topic, desc["offsets"]))
        served = served_by(c, rows)
        assert served["a"] and served["b"], f"not both sidecars served rows: {served}"
        want = {tuple(sorted(desc["offsets"].items()))}
        assert all(snapshot_offsets(h, served[h.name]) == want for h in c.hosts)
    assert {r["k"]: r["value"] for r in rows}["key-000007"] == b"changed-7"
    assert view.fallbacks.value == 0
    view.close()


@contextmanager
def sidecar_stopped(c: Cluster, host: Host, seed: int) -> Iterator[None]:
    """``host``'s sidecar stopped, then records it never saw: it has no snapshot at the new offsets and nobody to
    build one. Restarted and caught up afterwards."""
    host.sidecar.stop()
    try:
        c.broker.admin.produce(c.topic, random_records(300, keys=KEYS - 100, seed=seed))
        yield
    finally:
        host.restart_sidecar(c.ends())


def content(rows: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((r["k"], r["value"], r["timestamp"]) for r in rows)


def test_fail_names_host_table_and_reason_and_the_retry_elsewhere_returns_the_same_rows(cluster: Cluster) -> None:
    c = cluster
    a, b = c.hosts
    with sidecar_stopped(c, a, seed=112):
        view = GlobalTableView(c.spark, c.driver_config, "tbl", wait_timeout_s=5, on_timeout="fail")
        desc = view.refresh()
        retried = c.join(view, "fail-retry")
        tasks = attempts(c, "fail-retry")
        failed = [t for t in tasks if t[2] == "FAILED"]
        assert failed, f"no task ran on host a: {tasks}"
        for index, executor, _, error in failed:
            assert executor in c.executors(a) and error is not None
            assert f"no_daemon: host {socket.gethostname()}, sidecar state_dir {a.state_dir} " in error
            assert "table tbl at " in error and "no running globald" in error
            # ... and its retry ran on the other host.
            assert any(i == index and s == "SUCCESS" and e in c.executors(b) for i, e, s, _ in tasks), tasks
        served = served_by(c, retried)
        assert not served["a"] and snapshot_offsets(b, served["b"]) == {tuple(sorted(desc["offsets"].items()))}
        assert len(retried) == KEYS
        assert_oracle(retried, oracle_at(c.broker, c.topic, desc["offsets"]))
    # Both hosts again, same descriptor: the same rows, since the same offsets mean the same content.
    both = c.join(view, "fail-both")
    assert served_by(c, both)["a"]
    assert content(both) == content(retried)
    view.close()


def test_newest_falls_back_on_the_host_without_sidecar_counted_and_logged(cluster: Cluster) -> None:
    c = cluster
    a, b = c.hosts
    with sidecar_stopped(c, a, seed=113):
        before = a.snapshots()
        view = GlobalTableView(c.spark, c.driver_config, "tbl", wait_timeout_s=5, on_timeout="newest")
        desc = view.refresh()
        rows = c.join(view, "newest")
        served = served_by(c, rows)
        assert served["a"] and served["b"], served
        assert view.fallbacks.value >= 1
        # Host a's rows are its newest snapshot, as of its own offsets; host b's are exactly the descriptor's.
        assert snapshot_offsets(b, served["b"]) == {tuple(sorted(desc["offsets"].items()))}
        for sid in served["a"]:
            assert sid in before and before[sid] != desc["offsets"]
            assert_oracle([r for r in rows if r["snap"] == sid], oracle_at(c.broker, c.topic, before[sid]))
        assert_oracle([r for r in rows if r["snap"] in served["b"]], oracle_at(c.broker, c.topic, desc["offsets"]))
        # Logged on host a's executor: where, which table, what was wanted and what was read instead.
        logs = "".join(p.read_text(errors="replace") for p in a.worker.executor_logs())
        assert f"host {socket.gethostname()}, sidecar state_dir {a.state_dir} " in logs
        assert "table tbl: no snapshot at " in logs and "no_daemon" in logs and "using the newest" in logs
        view.close()


# A second application on the cluster (the Connect server and its two executors) after the module's: generous.
@pytest.mark.timeout(900)
def test_a_connect_server_on_the_standalone_master_joins_both_sidecars(cluster: Cluster, tmp_path: Path) -> None:
    """The same join through Spark Connect: a Connect server whose application runs on the standalone master, the
    view on a Connect client. Last in this module: it stops the classic application, whose executors hold both
    workers' only cores."""
    c = cluster
    c.spark.stop()
    server = ConnectServer.start(tmp_path / "connect", master=c.master_url, conf={
        "spark.executor.memory": "512m", "spark.cores.max": str(len(c.hosts)),
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        # The first job waits until both executors registered, so that both hosts serve rows.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"},
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        session = server.session()
        with connect_mode(True):
            from pyspark.sql import functions as F

            view = GlobalTableView(session, c.driver_config, "tbl", wait_timeout_s=30)
            assert view.connect
            keys = session.range(0, KEYS, numPartitions=PARTITIONS).select(
                F.format_string("key-%06d", "id").alias("k"))
            joins_both_sidecars_before_and_after_a_refresh(
                c, view, lambda _: view.join(keys, "k", snapshot_col="snap").collect())
    finally:
        server.stop()
