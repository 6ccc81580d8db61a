"""The harness reads a daemon's status in the test process (``DaemonProcess.status``) instead of running
``globald status --json`` for every poll: these tests hold it to the command's own output, byte for byte where the
daemon did not republish its status.json in between."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.common.errors import ConfigError
from tests.harness import Broker, DaemonProcess, random_records, write_config

Daemon = Callable[..., DaemonProcess]

# What the daemon changes in status.json with no change of state: the time of the write, and the memory and disk
# figures it samples anew every second. Two reads of different writes may differ there, and only there.
VOLATILE = ("updated", "memory", "disk")


def without_volatile(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in VOLATILE}


def assert_same_as_cli(d: DaemonProcess, tries: int = 5) -> dict[str, Any]:
    """In-process reads on both sides of a CLI read equal it; exactly when one read the same write of status.json
    (same ``updated``), else modulo VOLATILE. Returns the CLI's document."""
    exact = 0
    for _ in range(tries):
        before = d.status()
        cli = d.status_cli()
        after = d.status()
        for doc in (before, after):
            if doc.get("updated") == cli.get("updated"):  # the same write (or no status.json in use at all)
                assert doc == cli
                exact += 1
            else:
                assert without_volatile(doc) == without_volatile(cli)
        if exact:
            break
    return cli


@pytest.mark.kafka
def test_status_in_process_is_the_clis_running_killed_and_stopped(broker: Broker, topic: Callable[..., str],
                                                                 daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=300, seed=41))
    ends = broker.admin.end_offsets(t)
    d = daemon({"tbl": t})
    d.wait_running({"tbl": ends})

    running = assert_same_as_cli(d)
    assert running["state"] == "RUNNING" and running["pid"] == d.pid and running["ready"] is True
    assert running["tables"]["tbl"]["offsets"] == {str(p): o for p, o in ends.items()}
    assert set(VOLATILE) <= running.keys()  # the named fields exist: a renamed one must be named here again

    # Killed: status.json still says RUNNING with a dead pid, which both must see through to the stores.
    d.stop(signal.SIGKILL)
    killed = assert_same_as_cli(d)
    assert killed["state"] == "NOT_RUNNING" and killed["pid"] is None
    assert killed["tables"]["tbl"]["offsets"] == {str(p): o for p, o in ends.items()}

    # Stopped cleanly: status.json says NOT_RUNNING itself.
    d.start()
    d.wait_running({"tbl": ends})
    assert d.stop() == 0
    stopped = assert_same_as_cli(d)
    assert stopped["state"] == "NOT_RUNNING" and stopped["pid"] is None
    assert stopped["tables"]["tbl"]["offsets"] == {str(p): o for p, o in ends.items()}
    assert stopped["tables"]["tbl"]["source"] == "store"


def test_status_goes_on_with_the_last_config_while_the_file_is_half_written(tmp_path: Path) -> None:
    """A reload test rewrites the config while the harness polls: a read that meets the file half-written uses
    the config it last loaded, and a complete rewrite is read again."""
    settings = {"bootstrap.servers": "127.0.0.1:9"}
    cfg = write_config(tmp_path / "globald.toml", tmp_path / "state", settings, {"tbl": "topic-a"})
    d = DaemonProcess(cfg, tmp_path / "daemon.log")  # never started: the offline status, from the config alone
    first = d.status()
    assert first["state"] == "NOT_RUNNING" and list(first["tables"]) == ["tbl"]

    cfg.write_text('state_dir = "')  # caught mid-write
    assert d.status() == first
    with pytest.raises(ConfigError):  # with no config ever loaded there is nothing to fall back on
        DaemonProcess(cfg, tmp_path / "other.log").status()

    write_config(cfg, tmp_path / "state", settings, {"tbl": "topic-a", "more": "topic-b"})
    assert sorted(d.status()["tables"]) == ["more", "tbl"]
    assert d.status() == d.status_cli()
