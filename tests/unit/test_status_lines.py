"""Plain ``globald status`` (``status.statusfile.status_lines``) shows what once needed ``--json``: the config in force
(generation, sha256, the last reload's time and result) and where each [export] table's store came from (issue 42)."""

from __future__ import annotations

import time

from globald.common.states import State
from globald.status.document import ConfigStatus, DaemonStatus, TableStatus
from globald.status.statusfile import status_lines

SHA = "0123456789abcdef" * 4
WHEN = 1_795_000_000.0


def lines(config: ConfigStatus | None = None, origin: dict[str, object] | None = None,
          pid: int | None = 42) -> list[str]:
    table = TableStatus(state="RUNNING", topic="t", offsets={0: 5}, end_offsets={0: 5}, lag=0, origin=origin)
    return status_lines(DaemonStatus(State.RUNNING, pid, {"tbl": table}, config=config))


def test_the_config_in_force_is_one_line_with_its_generation_sha256_and_last_reload() -> None:
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(WHEN))
    assert f"  config: generation 1, sha256 {SHA}; no reload yet" in lines(ConfigStatus(1, SHA, "/etc/g.toml"))
    applied = ConfigStatus(2, SHA, "/etc/g.toml", {"time": WHEN, "result": "applied", "error": None})
    assert f"  config: generation 2, sha256 {SHA}; last reload {at} applied" in lines(applied)
    refused = ConfigStatus(2, SHA, "/etc/g.toml", {"time": WHEN, "result": "refused", "error": "state_dir: no"})
    assert f"  config: generation 2, sha256 {SHA}; last reload {at} refused: state_dir: no" in lines(refused)
    # A stopped daemon's document (no pid) has no config in force.
    assert not [line for line in lines(ConfigStatus(1, SHA), pid=None) if "config:" in line]


def test_each_tables_origin_says_export_or_topic_and_why() -> None:
    exported = {"kind": "export", "export": "1795000000000001", "bytes_downloaded": 3 * 2**20, "seconds": 1.25,
                "tail": 120, "fallback": None}
    shown = lines(origin=exported)
    row = shown.index(next(line for line in shown if line.lstrip().startswith("tbl ")))
    assert shown[row + 1].strip() == "origin: export 1795000000000001 (3.0 MB in 1.2s), then 120 offsets from the topic"
    topic = {"kind": "topic", "fallback": "no export of table tbl in file:///x", "bytes_downloaded": 0}
    assert "origin: topic (no export of table tbl in file:///x)" in [line.strip() for line in lines(origin=topic)]
    assert "origin: store (in the state_dir at start: no export looked for)" in [
        line.strip() for line in lines(origin={"kind": "store"})]
    assert not [line for line in lines() if "origin:" in line]  # no [export]: no origin
