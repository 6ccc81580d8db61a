"""Which sidecar a Spark executor reads (globald.spark.host): ``$GLOBALD_CONFIG`` in its environment wins over the
driver's config path; the state_dir comes from the host's config, the table and topic from the driver; every
failure names the host, the config used, the table and the reason. Real config files, real snapshot resolution
against a state_dir no daemon owns; no Spark, no broker."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from globald.common.errors import ExecutorConfigError, SnapshotUnavailableError
from globald.spark import executor
from globald.spark.host import CONFIG_ENV, FROM_DRIVER, FROM_ENV, config_path, sidecar
from tests.harness import write_config

KAFKA = {"bootstrap.servers": "127.0.0.1:1"}


def configs(tmp_path: Path) -> tuple[Path, Path]:
    """The driver's config and one executor host's, each with its own state_dir, both mirroring tbl <- orders."""
    driver = write_config(tmp_path / "driver.toml", tmp_path / "driver-state", KAFKA, {"tbl": "orders"})
    own = write_config(tmp_path / "host-a.toml", tmp_path / "a-state", KAFKA, {"tbl": "orders", "other": "x"},
                       snapshots={"serve_stale": False})
    return driver, own


def test_environment_wins_over_the_driver_path_and_blank_means_unset() -> None:
    assert config_path("/driver.toml", {CONFIG_ENV: "/etc/globald/host.toml"}) == ("/etc/globald/host.toml", FROM_ENV)
    assert config_path("/driver.toml", {CONFIG_ENV: "  "}) == ("/driver.toml", FROM_DRIVER)
    assert config_path("/driver.toml", {}) == ("/driver.toml", FROM_DRIVER)


def test_state_dir_and_serve_stale_come_from_the_hosts_config(tmp_path: Path) -> None:
    driver, own = configs(tmp_path)
    side = sidecar(str(driver), "tbl", "orders", {CONFIG_ENV: str(own)}, host="exec-7")
    assert (side.state_dir, side.serve_stale, side.config_path) == (tmp_path / "a-state", False, str(own))
    assert side.where() == f"host exec-7, sidecar state_dir {tmp_path / 'a-state'} (config {own}, {FROM_ENV})"
    plain = sidecar(str(driver), "tbl", "orders", {}, host="exec-7")
    assert (plain.state_dir, plain.serve_stale, plain.source) == (tmp_path / "driver-state", True, FROM_DRIVER)


@pytest.mark.parametrize(("table", "topic", "env", "says"), [
    ("tbl", "orders", "missing.toml", "cannot read"),
    ("nope", "orders", "host-a.toml", "no table named 'nope'"),
    ("tbl", "customers", "host-a.toml", "mirrors topic 'orders', the driver's descriptor topic 'customers'"),
])
def test_a_host_config_that_cannot_serve_the_table_is_refused_by_name(tmp_path: Path, table: str, topic: str,
                                                                      env: str, says: str) -> None:
    driver, _ = configs(tmp_path)
    with pytest.raises(ExecutorConfigError) as info:
        sidecar(str(driver), table, topic, {CONFIG_ENV: str(tmp_path / env)}, host="exec-7")
    msg = str(info.value)
    assert msg.startswith(f"host exec-7, config {tmp_path / env} ({FROM_ENV}): table {table}: ") and says in msg
    assert CONFIG_ENV not in msg.split(says)[1]  # the hint to set it is for hosts that did not


def test_without_the_variable_a_missing_driver_path_says_to_set_it(tmp_path: Path) -> None:
    with pytest.raises(ExecutorConfigError, match=f"cannot read .*; set {CONFIG_ENV} in the executors' environment"):
        sidecar(str(tmp_path / "driver-only.toml"), "tbl", "orders", {}, host="exec-7")


def test_executor_reads_the_hosts_sidecar_and_its_errors_name_host_table_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver, own = configs(tmp_path)
    monkeypatch.setenv(CONFIG_ENV, str(own))
    desc = {"table": "tbl", "topic": "orders", "mode": executor.MODE_SNAPSHOT, "offsets": {"0": 5}, "snapshot": None}
    for policy, reason in (("fail", "no running globald"), ("newest", "no snapshot to fall back to")):
        settings = executor.Settings(str(driver), "tbl", wait_timeout_s=1.0, policy=policy)
        with pytest.raises(SnapshotUnavailableError) as info:
            executor.handle(settings, desc)
        # The host's state_dir (a-state) was asked, not the driver's; the error says where, what and why.
        assert info.value.code == "no_daemon"
        msg = str(info.value)
        assert msg.startswith(f"no_daemon: host {socket.gethostname()}, sidecar state_dir {tmp_path / 'a-state'} "
                              f"(config {own}, {FROM_ENV}): table tbl at ")
        assert reason in msg and "driver-state" not in msg
    with pytest.raises(ExecutorConfigError, match="mirrors topic 'orders'"):
        executor.handle(executor.Settings(str(driver), "tbl"), {**desc, "topic": "elsewhere"})
    executor.close_all()
