"""``globald dev --export``'s two configs (issue 42 item 1), as the config loader reads them: a copy of the first
config with only the state_dir changed is what a newcomer tried, and its HTTP port was taken; the second config
``globald dev`` writes must differ from the first in exactly what two daemons on one machine cannot share."""

from __future__ import annotations

from pathlib import Path

from globald.cli.dev import EXPORTS, SECOND_STATE, TABLE, add_second_daemon, write_config
from globald.settings.config import load

KAFKA = {"bootstrap.servers": "127.0.0.1:9", "api.version.request": "false"}


def test_the_second_config_has_its_own_state_dir_and_port_and_bootstraps_from_the_first_ones_exports(
        tmp_path: Path) -> None:
    first_path = write_config(tmp_path, KAFKA, 40001)
    second_path = add_second_daemon(first_path, 40002)
    first, second = load(first_path), load(second_path)

    assert first.state_dir == tmp_path / "state" and second.state_dir == tmp_path / SECOND_STATE
    assert (first.http.port, second.http.port) == (40001, 40002)
    assert first.export is not None and second.export is not None
    assert first.export.uri == second.export.uri == (tmp_path / EXPORTS).as_uri() and (tmp_path / EXPORTS).is_dir()
    assert first.export.interval_s > 0  # the first exports on its own too, not only at `globald export`
    assert second.export.interval_s == 0 and second.export.bootstrap  # the second only bootstraps
    # everything else is the same daemon: broker, tables and the rest
    assert second.kafka == first.kafka and [(t.name, t.topic) for t in second.tables] == [(TABLE, TABLE)]
    assert [(t.name, t.topic) for t in first.tables] == [(TABLE, TABLE)]
    assert (second.commit_interval_ms, second.metadata_refresh_ms) == (first.commit_interval_ms,
                                                                       first.metadata_refresh_ms)
